"""More than one cached prompt: snapshots of the target's KV cache in host memory.

The target context holds one sequence. Before a request would throw away a long stretch of it
(a warm-up with other extra context, a jump to another file), the sequence is saved here; a later
request starts from whichever of the live cache and the saved ones shares the longest exact
prefix with its prompt (llama-server's `--cache-ram`). Restoring is a memory copy (≈ 28 KB a
token for a 1.5B model), so it pays as soon as it saves a few tokens of evaluation.

Memory is bounded by `budget_bytes`, least recently used first out; a snapshot whose tokens are a
prefix of a newer one is dropped (the newer one covers it).

A server with parallel requests has one sequence per lane in one unified KV cache (`lanes`): a request
whose prompt another lane already holds (the same system prompt, an agent's side request) shares that
lane's cells (`llama_memory_seq_cp`: no copy, no evaluation) instead of evaluating them again.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ... import paths
from ...backend import Context, common_prefix
from ...backend.mtp import rows_bytes
from ...backend.passes import Cuts
from ...backend.rollback import Checkpoints, reach
from .promptdisk import SAVE_MIN, DiskPrompts, pair_key

KEEP_MIN = 64  # a divergence that would lose fewer cached tokens than this is not worth a snapshot
GAIN_MIN = 16  # share another lane's cells, or read a saved prompt from disk, only for at least this many tokens
RESTORE_TOKENS_PER_GAIN = 1024  # restore a snapshot of n tokens when it saves 1 + n/1024 tokens of evaluation


def restore_pays(gain: int, snapshot_tokens: int) -> bool:
    """Whether restoring a snapshot beats evaluating the `gain` tokens it saves. A restore is a memory copy,
    thousands of times cheaper a token than a short pass (docs/BENCHMARKS.md, "Figures behind the code's
    rules"): a repeated chat question re-evaluated its last tokens under a fixed 16-token rule."""
    return gain >= 1 + snapshot_tokens // RESTORE_TOKENS_PER_GAIN


@dataclass
class Snapshot:
    tokens: list[int]
    state: object  # the ctypes byte array Context.snapshot returned
    used: int = 0
    cuts: Cuts = field(default_factory=Cuts)  # how its rows were computed (backend/passes.py)
    ckpts: Checkpoints | None = None  # a recurrent model's checkpoints within it (backend/rollback.py)


@dataclass
class CacheUse:
    """What the cache did for one prompt (reported in a reply's timings)."""
    restored: bool = False
    entries: int = 0  # snapshots held afterwards
    shared: int = 0  # tokens shared from another lane's sequence


@dataclass
class PromptCache:
    ctx: Context  # the default cache (a Context, or the first lane's sequence)
    budget_bytes: int = 256 << 20
    entries: list[Snapshot] = field(default_factory=list)
    clock: int = 0
    disk: DiskPrompts | None = None  # saved prompts that outlive the process (`localspec serve`)
    lanes: list = field(default_factory=list)  # every lane's sequence of one shared context (batching.SeqView)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def prefix_len(self, tokens: list[int]) -> int:
        """The longest exact prefix of `tokens` held by a live cache or any snapshot."""
        best = max(common_prefix(list(c.tokens), tokens) for c in (self.lanes or [self.ctx]))
        for e in self.entries:
            best = max(best, common_prefix(e.tokens, tokens))
        if self.disk is not None:
            best = max(best, self.disk.best(tokens)[1])
        return best

    def prepare(self, tokens: list[int], cache=None) -> CacheUse:
        """Leave in `cache` (default: the context) the cached state that shares the longest prefix with
        `tokens` (saving the live one first when it would be lost); the caller then evaluates the rest."""
        with self.lock:
            return self._prepare(tokens, cache if cache is not None else self.ctx)

    def _prepare(self, tokens: list[int], cache) -> CacheUse:
        use, kind = CacheUse(), cache.rollback
        live = cache.reusable(common_prefix(cache.tokens, tokens))
        donor, donor_n = None, live + GAIN_MIN - 1  # another lane's sequence: shared, not copied
        for other in self.lanes:
            n = common_prefix(list(other.tokens), tokens) if other is not cache else 0
            n = reach(n, len(other.tokens), other.ckpts.positions(), kind)
            if n > donor_n:
                donor, donor_n = other, n
        live = max(live, donor_n if donor else 0)
        best, best_n = None, live
        for e in self.entries:
            n = reach(common_prefix(e.tokens, tokens), len(e.tokens), e.ckpts.positions() if e.ckpts else [], kind)
            if n > best_n:
                best, best_n = e, n
        if best is not None and not restore_pays(best_n - live, len(best.tokens)):
            best = None
        on_disk, disk_n = self.disk.best(tokens) if self.disk is not None else (None, 0)
        if on_disk is not None:
            disk_n = reach(disk_n, len(on_disk.tokens), [p for p, _ in on_disk.ckpts], kind)
        if on_disk is not None and disk_n >= max(live, best_n if best else 0) + max(GAIN_MIN, SAVE_MIN // 4):
            state, ckpts = self.disk.load(on_disk)
            if state is not None:
                best, best_n = Snapshot(on_disk.tokens, state, cuts=on_disk.cuts, ckpts=ckpts), disk_n
                if len(state) <= self.budget_bytes:  # used again soon (an agent's next turn): kept in memory too
                    self.entries.append(best)
        if len(cache.tokens) - (best_n if best else live) >= KEEP_MIN:
            self.save(cache)
        if best is not None:
            self.clock += 1
            best.used = self.clock
            use.restored = cache.restore(best.state, best.tokens, cuts=best.cuts, ckpts=best.ckpts)
        elif donor is not None:
            use.shared = cache.copy_from(donor, tokens)
        use.entries = len(self.entries)
        return use

    def persist(self, evaluated: int, cache=None) -> None:
        """After a request that evaluated `evaluated` prompt tokens: keep the live sequence on disk when
        that was long work (SAVE_MIN), so no later process pays it again."""
        cache = cache if cache is not None else self.ctx
        if self.disk is not None and evaluated >= SAVE_MIN and cache.tokens:
            with self.lock:
                self.disk.save(list(cache.tokens), cache.snapshot(), cache.cuts.copy(), cache.ckpts.copy())

    def save(self, cache=None) -> int:
        """Snapshot a live sequence (unless a snapshot already covers it); 1 if one was taken."""
        cache = cache if cache is not None else self.ctx
        toks = list(cache.tokens)
        if not toks or any(common_prefix(e.tokens, toks) == len(toks) for e in self.entries):
            return 0
        state = cache.snapshot()
        if len(state) > self.budget_bytes:
            return 0
        self.entries = [e for e in self.entries if common_prefix(e.tokens, toks) < len(e.tokens)]
        self.clock += 1
        self.entries.append(Snapshot(list(toks), state, self.clock, cache.cuts.copy(len(toks)), cache.ckpts.copy()))
        while self.size() > self.budget_bytes:
            self.entries.remove(min(self.entries, key=lambda e: e.used))
        return 1

    def park(self, cache) -> None:
        """Save a sequence a new prompt is about to replace (unless too short to be worth a copy) and free
        its cells: in one unified KV cache without flash attention every pass attends over every cell in
        use, the idle ones too."""
        with self.lock:
            if len(cache.tokens) >= KEEP_MIN:
                self.save(cache)
            cache.reset()

    def size(self) -> int:
        return sum(len(e.state) + rows_bytes(e.state) + (e.ckpts.nbytes() if e.ckpts else 0) for e in self.entries)


def prompt_cache_for(lanes, load, target_path, flash_attn: str) -> "PromptCache | None":
    """The saved prompts a load asks for (LoadConfig.cache_ram_mib, and cache_disk_mib on disk under the data
    root, keyed by the pair and its kernels); None without: each lane keeps its last prompt only."""
    if load.cache_ram_mib <= 0:
        return None
    shared = [x.target for x in lanes] if len(lanes) > 1 else []
    cache = PromptCache(lanes[0].target, load.cache_ram_mib << 20, lanes=shared)
    if load.cache_disk_mib > 0:
        cache.disk = DiskPrompts(paths.prompt_cache_dir(), pair_key(target_path, flash_attn, load.exact),
                                 load.cache_disk_mib << 20)
    return cache
