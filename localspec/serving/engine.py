"""The engine a server runs: `ServingEngine`, an `Engine` with `--parallel` lanes over one context (their passes
batched by batching.py, one sequence each), a full cache's room made by parking idle lanes, prompts shared
while they fill, and saved prompts in memory and on disk (caches/: promptfills, promptcache).

The CLI and the chat app run one generation at a time and load a plain `Engine`; only `localspec serve` builds
this one (`session.open_engine(..., engine_class=ServingEngine)`), so none of it sits on their path.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Callable, TypeVar

from ..backend import common_prefix
from ..config import LoadConfig
from ..decoding.ngram import NgramDrafter
from ..engine import Engine
from ..lane import Lane
from ..stats import Stats
from .batching import Batcher, SeqView
from .caches.promptcache import prompt_cache_for
from .caches.promptfills import PromptFills

T = TypeVar("T")


class ServingEngine(Engine):
    """A loaded pair shared by a server's parallel requests: `lanes` (one per `--parallel` request), the
    `batcher` that runs their passes together (None with one lane), `prompt_cache` (None without --cache-ram)."""

    def __init__(self, target_path: str | Path, draft_path: str | Path | None = None,
                 load: LoadConfig | None = None, profile=None, lazy_draft: bool = False):
        super().__init__(target_path, draft_path, load, profile, lazy_draft)
        load = self.load
        self.batcher: Batcher | None = None
        self.fills: PromptFills | None = None
        try:
            if load.n_parallel > 1:  # one sequence each, their passes batched
                self.batcher = Batcher(self.target, self._make_room)
                self.fills = PromptFills()
                self.lanes = [Lane(SeqView(self.target, s, self.batcher), lambda s=s: self._draft_view(s),
                                   NgramDrafter(memory=self.ngram_memory), s) for s in range(load.n_parallel)]
                self.lane = self.lanes[0]
            self.prompt_cache = prompt_cache_for(self.lanes, load, target_path, self.flash_attn)
        except BaseException:
            self.close()
            raise

    def cached_prefix(self, tokens: list[int]) -> int:
        """How much of `tokens` the saved prompts, or else the first lane, hold already."""
        if self.prompt_cache is not None:
            return self.prompt_cache.prefix_len(tokens)
        return common_prefix(self.lane.target.tokens, tokens)

    def on_decode_thread(self, fn: Callable[[], T]) -> T:
        """fn() on the batch thread (batching.py says why only one thread may decode)."""
        return self.batcher.call(fn) if self.batcher is not None else fn()

    def _draft_view(self, seq: int) -> SeqView | None:
        ctx = self.load_draft()
        return SeqView(ctx, seq, runner=self.batcher) if ctx is not None else None

    def _make_room(self) -> bool:
        """The shared cache is full (the batcher asks): the least recently used idle lane's cells parked in the
        prompt cache (or dropped), for the batch thread to try again; False when no idle lane holds cells."""
        idle = [x for x in self.lanes if x.target.tokens and x.seq not in self.batcher.active]
        if not idle:
            return False
        victim = min(idle, key=lambda x: x.last_used).target
        if self.prompt_cache is not None:
            self.prompt_cache.park(victim)
        else:
            victim.reset()
        return True

    def _others_in_step(self, lane: Lane):
        """How many other lanes share each step: the policy prices drafts by the shared step."""
        return (lambda: self.batcher.others(lane.seq)) if self.batcher is not None else None

    def _shared_fill(self, lane: Lane, tokens: list[int], should_stop, generates: bool = True):
        """Wait for another lane already evaluating the same long prefix (then share it)."""
        if self.fills is None or self.prompt_cache is None:
            return nullcontext()
        return self.fills.evaluating(lane.seq, lane.target, tokens, should_stop,
                                     on_wait=lambda: self.prompt_cache.park(lane.target), generates=generates)

    def _restore_saved(self, tokens: list[int], target, stats: Stats) -> None:
        if self.prompt_cache is not None:
            use = self.prompt_cache.prepare(tokens, target)
            stats.cache_restored, stats.cache_entries = use.restored, use.entries

    def _enter(self, lane: Lane, priority: bool, cancel=None) -> None:
        super()._enter(lane, priority, cancel)
        if self.batcher is not None:
            self.batcher.join(lane.seq, priority, cancel)

    def _leave(self, lane: Lane) -> None:
        super()._leave(lane)
        if self.batcher is not None:
            self.batcher.leave(lane.seq)

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()
        super().close()
