"""The speculative engine around the loop (loop.speculative_decode): `Engine` loads the pair, formats prompts,
runs the loop on a `Lane`, turns tokens into text and stop reasons, and keeps the `Stats` (data: it prints nothing).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import numpy as np

from .backend import Context, GrammarSampler, Model, exact, fill_to_answer, mtp, system_info
from .config import GenConfig, LoadConfig
from .costs.attention import cpu_kernel
from .costs.costmodel import REFERENCE_HEAD_STEP, reference_profile
from .costs.predictions import estimated_speedup
from .costs.threads import ThreadGovernor
from .decoding.constraints import GrammarConstraint, starts_with_grammar
from .decoding.drafters import DraftModel, MtpDrafter, assemble_drafter
from .decoding.loop import speculative_decode
from .decoding.ngram import NgramDrafter, NgramMemory
from .decoding.policy import REPEATABLE_MIN_MATCH, FixedK, make_policy
from .errors import ConfigError, ContextFullError
from .lane import Lane
from .pairing import require_compatible
from .prompts import Prompts
from .stats import Stats
from .text import Chunk, TextStream

T = TypeVar("T")
BACKGROUND_STEP = 64  # tokens per pass of a prompt evaluation that may be interrupted: a short wait, barely slower
CANCEL_STEP = 256  # a request's own prompt: a hang-up or a newer request from its editor ends it within a pass


class Engine(Prompts):
    """A loaded target (and optional draft model), ready to generate."""

    def __init__(self, target_path: str | Path, draft_path: str | Path | None = None,
                 load: LoadConfig | None = None, profile=None, lazy_draft: bool = False):
        """lazy_draft: load the draft model only when a round first drafts with it (the caller has
        checked the pair's compatibility already, from the GGUF headers); otherwise load it now."""
        self.load = load = load or LoadConfig()
        if load.exact:
            exact.use_batch_invariant_kernels()
        self.target_model = Model(target_path, load.n_gpu_layers_target, load.rpc_servers, mmap=load.mmap,
                                  repack=not load.exact)
        self.draft_path = Path(draft_path) if draft_path else None
        self.draft_model: Model | None = None
        self.draft_ctx: Context | None = None
        self._draft_lock = threading.Lock()
        self.flash_attn = self.flash_attn_in_use(load, self.target_model)
        self.target = Context(self.target_model, load.n_ctx, load.n_batch, load.n_threads, load.n_threads_batch,
                              n_seq=max(1, load.n_parallel), flash_attn=self.flash_attn,
                              kv_type=exact.KV_TYPE if load.exact else "f16")
        self.target.pad_verify = self.pads_verify(load)
        self.target.hidden = mtp.attach(self.target)  # a NextN head's input kept from every target pass
        self.heads = mtp.Heads(self.target, lambda fn: self.on_decode_thread(fn)) if self.target.hidden else None
        self.reference = reference_profile("gpu" if self.on_gpu(load) else "cpu")  # costmodel.REFERENCE_VERIFY
        self.governor = None
        if load.adapt_threads and load.n_threads > 1:
            self.governor = ThreadGovernor(load.n_threads, self._expected_pass_s, self._set_threads,
                                           relative=self._reference_relative)
            self.target.observer = self.governor.after_pass
        if self.draft_path and not lazy_draft:
            self.load_draft()
        self.profile = profile  # measured pass costs (costmodel.CostProfile) for --spec auto
        self.ngram_memory = NgramMemory()
        self.lanes = [Lane(self.target, self.load_draft, NgramDrafter(memory=self.ngram_memory))]  # serving/engine.py: more
        self.lane = self.lanes[0]
        self.remember_generations = load.remember_generations  # n-gram drafts may copy earlier answers
        self.answers_started = 0  # background work (a measurement) gives way once this moves

    @property
    def last_stats(self) -> Stats | None:
        """The stats of the last run on the default lane (the CLI's, the chat app's)."""
        return self.lane.last_stats

    @staticmethod
    def on_gpu(load: LoadConfig) -> bool:
        """Whether the target's layers go to a GPU (asked for, and a GPU backend compiled in)."""
        return load.n_gpu_layers_target != 0 and system_info()["gpu_offload"] and not load.rpc_servers

    @classmethod
    def pads_verify(cls, load: LoadConfig) -> bool:
        """Constant verify shapes: asked for, or (by default) when the target runs on a GPU."""
        return load.verify_buckets if load.verify_buckets is not None else cls.on_gpu(load)

    @classmethod
    def flash_attn_in_use(cls, load: LoadConfig, model: Model | None = None) -> str:
        """llama.cpp's flash attention as this load runs it: what was asked for, or for "auto" llama.cpp's
        own choice on a GPU and on a CPU the kernel costs/attention.py measures faster for `model` ("off"
        without a model: on some CPUs flash attention is the slower one from a few hundred tokens deep)."""
        if load.exact or load.flash_attn != "auto":
            return exact.FLASH_ATTN if load.exact else load.flash_attn
        if cls.on_gpu(load):
            return "auto"
        return cpu_kernel(model, load.n_threads, load.n_threads_batch) if model is not None else "off"

    def decides_from_request_alone(self, cfg: GenConfig) -> bool:
        """Greedy text repeats only with the same passes (drafts, prompt slices): docs/EXACT.md; not under --exact."""
        return cfg.temperature <= 0 and cfg.repeatable and not self.load.exact

    def _reference_relative(self, n_tokens: int) -> float | None:
        """T(n)/T(1) on the reference curve: the governor's prices before this machine measured its own."""
        return self.reference.verify(n_tokens) if n_tokens <= len(self.reference.t_verify) else None

    def _expected_pass_s(self, n_tokens: int) -> float | None:
        """What a target pass over n tokens should cost on a quiet machine (the measured profile)."""
        p = self.profile
        return p.verify(n_tokens) if p is not None and n_tokens <= len(p.t_verify) else None

    @contextmanager
    def unobserved(self):
        """Passes that are no generation's (the server's idle measurements): the thread governor would read
        them as load (a 64-token pass priced by a quick profile's guess) and start the next request at one thread."""
        observer, self.target.observer = self.target.observer, None
        try:
            yield
        finally:
            self.target.observer = observer

    @property
    def decode_threads(self) -> int:
        """The threads single-token and short passes use now (the governor's count, or the fixed one)."""
        return self.governor.threads if self.governor else self.load.n_threads

    def _set_threads(self, n: int) -> None:
        for ctx in (self.target, self.draft_ctx):
            if ctx is not None:
                ctx.set_threads(n)

    def load_draft(self) -> Context | None:
        """The draft model's context, loading the model the first time (thread-safe: the chat app
        loads it in the background while the first reply runs)."""
        with self._draft_lock:
            if self.draft_ctx is None and self.draft_path is not None:
                load = self.load
                model = Model(self.draft_path, load.n_gpu_layers_draft, mmap=load.mmap)
                try:
                    require_compatible(self.target_model.vocab_info(), model.vocab_info())
                    threads = self.decode_threads
                    # no per-token snapshots: its passes are one token, so they never reach back a round
                    self.draft_ctx = Context(model, load.n_ctx, load.n_batch, threads, threads, snapshots=False,
                                             n_seq=max(1, load.n_parallel), flash_attn=self.flash_attn)
                except BaseException:
                    model.close()
                    raise
                self.draft_model = model
            return self.draft_ctx

    def on_decode_thread(self, fn: Callable[[], T]) -> T:
        """fn() on the thread that decodes (a server's batch thread: serving/engine.py), for work that calls
        llama_decode outside a generation (measuring the pass costs)."""
        return fn()

    # --- generation -------------------------------------------------------------------------
    def make_drafter(self, cfg: GenConfig, rng, lane: Lane | None = None):
        lane = lane or self.lane
        head = self.heads.lane(lane.seq) if self.drafts_with_head(cfg) else None
        model = DraftModel(lane.draft, cfg, rng) if self.drafts_with_model(cfg) else None
        # other requests' text only where it cannot change the answer
        return assemble_drafter(cfg, model, lane.ngram, recall=not self.decides_from_request_alone(cfg),
                                mtp=MtpDrafter(head, cfg, rng) if head else None)

    def drafts_with_head(self, cfg: GenConfig) -> bool:
        """The target's own NextN head drafts: asked for, auto's first choice, or hybrid's without a draft model."""
        return self.heads is not None and (cfg.drafter in ("mtp", "auto") or (cfg.drafter == "hybrid" and not self.draft_path))

    def drafts_with_model(self, cfg: GenConfig) -> bool:
        """The draft model drafts (loaded on first use): asked for, hybrid's, or auto's where the target has no head."""
        return self.draft_path is not None and (cfg.drafter in ("model", "hybrid") or (cfg.drafter == "auto" and not self.heads))

    def generate(self, prompt: list[int], cfg: GenConfig, cancel: Callable[[], bool] | None = None,
                 lane: Lane | None = None, priority: bool = False) -> Iterator[Chunk]:
        """Stream confirmed text. Afterwards the lane's `last_stats` (`self.last_stats` for the default
        lane) holds the run's figures. On a server's lane the passes are batched with the other lanes';
        `priority` (an editor's completion) puts them first."""
        lane = lane or self.lane
        m, tgt = self.target_model, lane.target
        self.answers_started += 1
        self.check_prompt(prompt)
        rng = np.random.default_rng(cfg.seed)
        stats = lane.last_stats = Stats(prompt_tokens=len(prompt))
        seq = list(prompt)
        drafter, policy = self._drafting(cfg, rng, lane, len(prompt))
        stats.spec_mode = cfg.spec if drafter else "off"
        decode_before = tgt.decode_s + lane.draft_decode_s()
        t0 = time.perf_counter()
        if self.governor:
            self.governor.before_run()
        first = self._start(lane, priority, seq, stats, cancel, repeatable=self.decides_from_request_alone(cfg))
        if first is None:
            stats.stop_reason = "cancelled"  # during the prompt
            return
        self._begin_rounds(drafter, seq, cfg, stats)

        grammar, heal = self._constraint(cfg)
        text = TextStream(cfg.stop, skip=heal)
        loop = speculative_decode(tgt, drafter, policy, seq, cfg, stats, rng, grammar, first)
        t_gen = time.perf_counter()
        try:
            for tok, src in loop:
                if m.is_eog(tok) or tok in cfg.stop_tokens:
                    stats.stop_reason = "eos"
                    break
                stats.add_token(src)
                if stats.tokens == 1:
                    stats.first_token_s = time.perf_counter() - t_gen
                piece = text.push(m.piece(tok))
                yield Chunk(piece, tok, src)
                if text.stopped:
                    stats.stop_reason, stats.stop_word = "stop", text.stop_word
                    break
                if stats.tokens >= cfg.max_tokens:
                    stats.stop_reason = "length"
                    break
                if cancel and cancel():
                    stats.stop_reason = "cancelled"
                    break
        except ContextFullError:
            stats.stop_reason = "cancelled" if cancel and cancel() else "context"
        finally:
            loop.close()
            self._leave(lane)
            if grammar is not None:
                grammar.close()
            if self.remember_generations:  # later requests may repeat this text: let n-gram drafts find it
                lane.ngram.remember(seq)
            self._close_stats(stats, lane, policy, t0, t_gen, decode_before)
        tail = text.flush()
        if tail:
            yield Chunk(tail)

    def _close_stats(self, stats: Stats, lane: Lane, policy, t0: float, t_gen: float, decode_before: float) -> None:
        stats.generation_s = time.perf_counter() - t_gen
        stats.decode_s = lane.target.decode_s + lane.draft_decode_s() - decode_before
        stats.policy = policy.describe()
        stats.speedup_estimate = estimated_speedup(stats, self.profile) if stats.spec_mode != "off" else None
        stats.threads = self.decode_threads
        if self.governor:
            stats.thread_changes = [[a, b, why] for t, a, b, why in self.governor.changes if t >= t0]

    def _drafting(self, cfg: GenConfig, rng, lane: Lane, depth: int):
        """(drafter, policy) for a run; on a server's lane the policy prices drafts by the shared step."""
        plain = cfg.spec == "off" or (cfg.exact and not self.load.exact)  # plain decoding is its own exact twin
        drafter = None if plain else self.make_drafter(cfg, rng, lane)
        if drafter is None:
            return None, FixedK(0)
        head = self.drafts_with_head(cfg)  # its step priced in the model's place
        if self.decides_from_request_alone(cfg) or self.profile is None:
            # priced alike whatever this machine measured and runs now; or, before it measured anything, drafting
            # only where it pays on any machine of its kind (a long copy, a predicted output)
            costs = replace(self.reference, t_draft=REFERENCE_HEAD_STEP) if head else self.reference
            return drafter, make_policy(cfg, costs, drafter, min_match=REPEATABLE_MIN_MATCH)
        costs = self.profile.at_depth(depth)
        costs = replace(costs, t_draft=self.heads.head.step_s) if head else costs
        return drafter, make_policy(cfg, costs, drafter, self._others_in_step(lane), miss=_miss_cost(lane, costs))

    def _others_in_step(self, lane: Lane):
        """How many other lanes' passes share each step (a server's, serving/); None: this lane's alone."""
        return None

    def _start(self, lane: Lane, priority: bool, seq: list[int], stats: Stats, cancel,
               repeatable: bool = False) -> np.ndarray | None:
        """Join the batch (a server's lane) and bring the cache to the whole prompt, reusing a cached
        prefix: the logits row of its last token (the first token's distribution), or None (the lane left
        again) when cancelled during the prompt."""
        # shared as the prefix without the last token: a waiter's wait for this lane's first token ends once
        # its cache holds more than that, i.e. once this fill's pass (which gives that token) is done
        with self._shared_fill(lane, seq[:-1], cancel):
            self._enter(lane, priority, cancel)
            try:
                first = self._fill(seq, stats, cancel, step=CANCEL_STEP, lane=lane, answer=True, repeatable=repeatable)
                if first is not None:
                    return first
            except BaseException:
                self._leave(lane)
                raise
        self._leave(lane)
        return None

    def _shared_fill(self, lane: Lane, tokens: list[int], should_stop, generates: bool = True):
        return nullcontext()  # a server's lane waits for another one evaluating the same long prefix

    def _begin_rounds(self, drafter, seq: list[int], cfg: GenConfig, stats: Stats) -> None:
        """The prompt is in the cache: the governor learns this depth's pass costs, the drafter starts
        (with the request's predicted output, if any)."""
        if self.governor:
            self.governor.begin_run()
        if drafter:
            predicted = self.target_model.tokenize(cfg.prediction, add_special=False) if cfg.prediction else None
            stats.prediction_tokens = len(predicted or ())
            drafter.begin(seq, predicted)

    def _constraint(self, cfg: GenConfig) -> tuple[GrammarConstraint | None, str]:
        """The request's grammar, or the one token healing needs (the output starts with the healed
        text, which is then not shown); healing is itself a grammar, so it is not combined with another."""
        heal = cfg.heal if not cfg.grammar else ""
        gbnf = cfg.grammar or (starts_with_grammar(heal) if heal else None)
        return (self.grammar(gbnf) if gbnf else None), heal

    def grammar(self, gbnf: str) -> GrammarConstraint:
        """A GBNF grammar over the target's vocabulary, ready to constrain a generation (ConfigError when
        it does not parse)."""
        try:
            return GrammarConstraint(GrammarSampler(self.target_model, gbnf))
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def prefill(self, prompt: list[int], should_stop: Callable[[], bool] | None = None,
                lane: Lane | None = None) -> Stats:
        """Evaluate a prompt into the target's cache without generating (a client warming the cache
        for its next request, llama-server's n_predict 0). `should_stop` makes it background work:
        it then ends early (stop_reason "cancelled", what was evaluated kept) when that says so."""
        lane = lane or self.lane
        self.check_prompt(prompt)
        stats = lane.last_stats = Stats(prompt_tokens=len(prompt), spec_mode="off", stop_reason="length")
        with self._shared_fill(lane, prompt[:-1], should_stop, generates=False):
            self._enter(lane, False)
            try:
                self._fill(prompt[:-1], stats, should_stop, lane=lane)
                if len(lane.target.tokens) != len(prompt) - 1:
                    stats.stop_reason = "cancelled"
            finally:
                self._leave(lane)
        return stats

    def _fill(self, tokens: list[int], stats: Stats, should_stop=None, step: int = BACKGROUND_STEP,
              lane: Lane | None = None, answer: bool = False, repeatable: bool = False) -> np.ndarray | None:
        """Bring the lane's cache to `tokens`, from the best cached prompt when there is a cache; with `answer`, the
        logits row of the last token (in the prompt's pass). It stops short (no row) when `should_stop` ended it
        first (asked between slices: a warm-up's slice in flight is finished; its request needs those tokens)."""
        target = (lane or self.lane).target
        t0 = time.perf_counter()
        self._restore_saved(tokens, target, stats)
        if answer:
            stats.prompt_eval_tokens, row = fill_to_answer(target, tokens, should_stop, step, repeatable)
        else:
            stats.prompt_eval_tokens, row = target.sync(tokens, should_stop, step=step), None
        stats.prompt_eval_s = time.perf_counter() - t0
        return row

    def _restore_saved(self, tokens: list[int], target, stats: Stats) -> None:
        """A server's saved prompts (serving/engine.py): the best one restored into `target` first."""

    def _enter(self, lane: Lane, priority: bool, cancel=None) -> None:  # a server's lane joins the batch here
        lane.last_used = time.monotonic()

    def _leave(self, lane: Lane) -> None:
        lane.last_used = time.monotonic()

    def complete(self, prompt: list[int], cfg: GenConfig) -> tuple[str, Stats]:
        return "".join(c.text for c in self.generate(prompt, cfg)), self.last_stats

    def close(self) -> None:
        for x in (self.heads, self.target, self.draft_ctx, self.target_model, self.draft_model):
            if x is not None:
                x.close()


def _miss_cost(lane: Lane, costs):
    """Seconds a rejected draft costs to roll back on this lane's cache (a recurrent model's: putting a
    checkpoint back, and the tokens evaluated again with the next pass), as measured so far."""
    miss, per_token = lane.target.miss, (costs.verify(8) - costs.verify(1)) / 7
    return lambda: miss.seconds + miss.replay * per_token
