"""`Context`: one llama_context, its sequences' tokens, batched decoding, KV rollback and snapshots."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Callable

import numpy as np

from ..errors import ContextFullError, ModelLoadError, PassInterrupted
from .model import Model
from .passes import Cuts, boundaries, pass_ends, reuse_point


FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type
KV_TYPES = {"f16": 1, "bf16": 30}  # ggml_type of the K and V caches


class Context:
    """One llama_context. Sequence 0 is the default one (`tokens`); with n_seq > 1 the sequences share
    one unified KV cache (a server's parallel requests, `batching.py`), each with its tokens in
    `seq_tokens`. Every call into llama.cpp holds `lock`, so threads may share a context."""

    def __init__(self, model: Model, n_ctx: int = 4096, n_batch: int = 512, n_threads: int | None = None,
                 n_threads_batch: int | None = None, n_seq: int = 1, flash_attn: str = "auto",
                 kv_type: str = "f16"):
        L = model.L
        threads = n_threads or (os.cpu_count() or 1)
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_batch
        cp.n_seq_max = n_seq
        cp.kv_unified = n_seq > 1  # every sequence may grow to n_ctx; cells go to whichever needs them
        cp.n_threads = threads
        cp.n_threads_batch = n_threads_batch or threads
        cp.no_perf = True
        cp.flash_attn_type = FLASH_ATTN[flash_attn]
        cp.type_k = cp.type_v = KV_TYPES[kv_type]
        self.ptr = L.llama_init_from_model(model.ptr, cp)
        if not self.ptr:
            raise ModelLoadError(f"llama.cpp could not create a {n_ctx}-token context for {model.path.name} "
                                 "(out of memory?); try a smaller --ctx-size")
        self.L, self.model = L, model
        self.n_ctx = L.llama_n_ctx(self.ptr)
        # llama.cpp may round n_ctx up (to 256 at least) while clamping n_batch to the n_ctx asked
        # for: chunk by the batch size it actually has, or llama_decode aborts the process
        self.n_batch = min(n_batch, L.llama_n_batch(self.ptr))
        self.n_vocab = model.n_vocab
        self.n_seq = n_seq
        self.mem = L.llama_get_memory(self.ptr)
        self.batch = L.llama_batch_init(n_batch, 0, 1)
        for i in range(n_batch):
            self.batch.n_seq_id[i] = 1
        self.seq_tokens: dict[int, list[int]] = {s: [] for s in range(n_seq)}
        self.seq_cuts: dict[int, Cuts] = {s: Cuts() for s in range(n_seq)}  # how each one's rows were computed
        self.lock = threading.RLock()
        self.decode_s = 0.0  # wall time spent inside llama_decode (for the overhead figure)
        self.n_decode = 0
        self.observer = None  # called with (tokens, seconds) after each llama_decode (threads.ThreadGovernor)
        self.threads = cp.n_threads  # for single tokens and short passes (decode, verification)
        self.threads_batch = cp.n_threads_batch  # for long passes (prompt evaluation)
        self._batch_now = cp.n_threads_batch  # what llama.cpp uses for passes over more than one token now
        # llama.cpp asks this between the graph's nodes whether to give the pass up (set only around
        # passes that may give way: a Python call per node, nothing while unset)
        self._abort: Callable[[], bool] | None = None
        self._abort_next = 0.0  # the question is put to `_abort` at most every ABORT_POLL_S
        self._abort_cb = L.ggml_abort_callback(self._should_abort)
        self._no_abort_cb = L.ggml_abort_callback()  # NULL: llama.cpp asks nothing

    VERIFY_SHAPES = (1, 2, 4, 8, 16)
    pad_verify = False  # pad "all"-logits passes to VERIFY_SHAPES (LoadConfig.verify_buckets)

    @property
    def tokens(self) -> list[int]:
        return self.seq_tokens[0]

    @property
    def cuts(self) -> Cuts:
        return self.seq_cuts[0]

    @property
    def turn_starts(self) -> frozenset[int]:
        return self.model.turn_starts

    def eval(self, tokens: list[int], logits: str = "last", seq: int = 0,
             stop: Callable[[], bool] | None = None) -> np.ndarray | None:
        """Append `tokens` to sequence `seq`. logits: "none" | "last" | "all" (rows for `tokens`).
        `stop`: background work's question whether to give way; asked while the pass runs, it ends
        the pass inside llama_decode (PassInterrupted, the pass rolled back).
        Returns a (rows, n_vocab) float32 array (a copy) or None. With `pad_verify`, an "all" pass is
        padded with copies of its last token up to the next shape (the padding stays in the cache,
        past the confirmed text, until the caller truncates it, as it does every draft)."""
        if not tokens:
            return None
        if self.pad_verify and logits == "all" and len(tokens) < self.n_batch:
            size = next((s for s in self.VERIFY_SHAPES if s >= len(tokens)), len(tokens))
            if len(self.seq_tokens[seq]) + size <= self.n_ctx and size > len(tokens):
                out = self._eval([*tokens, *[tokens[-1]] * (size - len(tokens))], logits, seq)
                return out[:len(tokens)]
        return self._eval(tokens, logits, seq, stop)

    def _eval(self, tokens: list[int], logits: str, seq: int, stop=None) -> np.ndarray | None:
        out = None
        for start in range(0, len(tokens), self.n_batch):
            last_chunk = start + self.n_batch >= len(tokens)
            mode = logits if last_chunk else "none"
            out = self.decode_parts([(seq, tokens[start:start + self.n_batch], mode)], stop)[0]
        return out

    def decode_parts(self, parts: list[tuple[int, list[int], str]],
                     abort: Callable[[], bool] | None = None) -> list[np.ndarray | None]:
        """ONE llama_decode over several sequences' tokens, each part (seq, tokens, logits mode)
        appended at the end of its sequence; at most n_batch tokens in all. Returns each part's
        logits rows (None for "none"). On failure every part is rolled back and the error raised:
        PassInterrupted when `abort()`, asked while the pass runs, said to give it up."""
        L, b = self.L, self.batch
        with self.lock:
            for seq, toks, _ in parts:
                if len(self.seq_tokens[seq]) + len(toks) > self.n_ctx:
                    raise ContextFullError(f"context full ({self.n_ctx} tokens); start a new conversation "
                                           "or raise --ctx-size")
            i, starts, rows = 0, [], []
            for seq, toks, mode in parts:
                n0 = len(self.seq_tokens[seq])
                starts.append(n0)
                for j, t in enumerate(toks):
                    b.token[i], b.pos[i], b.seq_id[i][0] = t, n0 + j, seq
                    b.logits[i] = mode == "all" or (mode == "last" and j == len(toks) - 1)
                    i += 1
                rows.append(len(toks) if mode == "all" else 1 if mode == "last" and toks else 0)
            b.n_tokens = i
            self._threads_for(i)
            t0 = time.perf_counter()
            rc = self._decode(b, abort)
            if rc != 0:
                for (seq, _, _), n0 in zip(parts, starts):
                    self.truncate(n0, seq)
                if rc == 2 and abort is not None:
                    raise PassInterrupted("a background pass gave way to a request")
                if rc == 1:
                    raise ContextFullError("llama.cpp found no KV-cache slot; start a new conversation or raise "
                                           "--ctx-size")
                raise ModelLoadError(f"llama_decode failed (code {rc})")
            outs: list[np.ndarray | None] = []
            if sum(rows):
                ptr = L.llama_get_logits(self.ptr)  # outputs are contiguous, in batch order
                every = np.ctypeslib.as_array(ptr, shape=(sum(rows), self.n_vocab))
                at = 0
                for n in rows:
                    outs.append(every[at:at + n].copy() if n else None)
                    at += n
            else:
                outs = [None] * len(parts)
            dt = time.perf_counter() - t0
            self.decode_s += dt
            self.n_decode += 1
            for seq, toks, _ in parts:
                self.seq_tokens[seq].extend(toks)
        if self.observer is not None:
            self.observer(i, dt)
        return outs

    def _decode(self, batch, abort: Callable[[], bool] | None) -> int:
        if abort is None:
            return self.L.llama_decode(self.ptr, batch)
        self._abort, self._abort_next = abort, 0.0
        self.L.llama_set_abort_callback(self.ptr, self._abort_cb, None)
        try:
            return self.L.llama_decode(self.ptr, batch)
        finally:
            self.L.llama_set_abort_callback(self.ptr, self._no_abort_cb, None)
            self._abort = None

    ABORT_POLL_S = 0.005  # a request waits about this long at most for a background pass to end

    def _should_abort(self, _data) -> bool:
        now = time.perf_counter()
        if now < self._abort_next:
            return False
        self._abort_next = now + self.ABORT_POLL_S
        try:
            return bool(self._abort is not None and self._abort())
        except Exception:  # an exception cannot cross into llama.cpp: go on with the pass
            return False

    LONG_PASS = 32  # passes over more tokens than this count as prompt evaluation

    def set_threads(self, n: int) -> None:
        """Threads for decoding and short (verification) passes from now on. Long passes keep
        `threads_batch`: a big batch amortizes the barriers that stall single-token decoding under load
        (docs/BENCHMARKS.md, "A busy machine")."""
        self.threads = n
        self._batch_now = -1  # re-applied at the next pass

    def _threads_for(self, n_tokens: int) -> None:
        want = self.threads_batch if n_tokens > self.LONG_PASS else self.threads
        if want != self._batch_now:  # llama_set_n_threads works on a live context
            self.L.llama_set_n_threads(self.ptr, self.threads, want)
            self._batch_now = want

    def truncate(self, n: int, seq: int = 0) -> None:
        """Drop the sequence's cached positions >= n (the rejected tail of a draft)."""
        with self.lock:
            toks = self.seq_tokens[seq]
            if n < len(toks):
                if not self.L.llama_memory_seq_rm(self.mem, seq, n, -1):
                    # a recurrent model cannot drop a partial tail: start the sequence again
                    self.L.llama_memory_seq_rm(self.mem, seq, -1, -1)
                    keep, self.seq_tokens[seq] = toks[:n], []
                    self.eval(keep, logits="none", seq=seq)
                    self.seq_cuts[seq].truncate(n)  # its rows now from one pass: none reused as a fresh one's
                    self.seq_cuts[seq].at, self.seq_cuts[seq].dirty_from = [n], 0
                    return
                del toks[n:]
                self.seq_cuts[seq].truncate(n)

    def sync(self, tokens: list[int], should_stop=None, step: int = 128, background: bool = False) -> int:
        return sync_cache(self, tokens, should_stop, step, background)

    def copy_prefix(self, src: int, dst: int, tokens: list[int]) -> int:
        """Make sequence `dst` hold the longest prefix of `tokens` that sequence `src` holds, sharing its
        cells (in a unified cache a copy costs no memory and no time). Returns that prefix's length."""
        with self.lock:
            n = common_prefix(self.seq_tokens[src], tokens)
            self.L.llama_memory_seq_rm(self.mem, dst, -1, -1)
            self.L.llama_memory_seq_cp(self.mem, src, dst, 0, n)
            self.seq_tokens[dst] = self.seq_tokens[src][:n]
            self.seq_cuts[dst] = self.seq_cuts[src].copy(n)
            return n

    def snapshot(self, seq: int = 0):
        """The KV state of a sequence (llama_state_seq_get_data) in a ctypes byte array, to restore later."""
        L = self.L
        with self.lock:
            size = L.llama_state_seq_get_size(self.ptr, seq)
            buf = (ctypes.c_uint8 * size)()
            if L.llama_state_seq_get_data(self.ptr, buf, size, seq) != size:
                raise ModelLoadError("llama.cpp could not copy the KV cache")
        return buf

    def restore(self, state, tokens: list[int], seq: int = 0, cuts: Cuts | None = None) -> bool:
        """Put back a snapshot taken when a sequence held `tokens` (its rows computed as `cuts` says; unknown:
        a prompt reuses none of them until cut as its own); False (sequence emptied) if it does not fit."""
        L = self.L
        with self.lock:
            L.llama_memory_seq_rm(self.mem, seq, -1, -1)
            if not L.llama_state_seq_set_data(self.ptr, state, len(state), seq):
                self.clear(seq)
                return False
            self.seq_tokens[seq] = list(tokens)
            self.seq_cuts[seq] = cuts.copy(len(tokens)) if cuts is not None else Cuts()
            return True

    def clear(self, seq: int = 0) -> None:
        with self.lock:
            self.L.llama_memory_seq_rm(self.mem, seq, -1, -1)
            self.seq_tokens[seq] = []
            self.seq_cuts[seq] = Cuts()

    def reset(self) -> None:
        with self.lock:
            self.L.llama_memory_clear(self.mem, True)
            self.seq_tokens = {s: [] for s in range(self.n_seq)}
            self.seq_cuts = {s: Cuts() for s in range(self.n_seq)}

    def close(self) -> None:
        if getattr(self, "ptr", None):
            with self.lock:
                self.L.llama_batch_free(self.batch)
                self.L.llama_free(self.ptr)
                self.ptr = None

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass


def sync_cache(cache, tokens: list[int], should_stop=None, step: int = 128, background: bool = False) -> int:
    """Make a cache (a Context's sequence 0, or one sequence of a shared one) hold exactly `tokens`,
    reusing the longest common prefix (prompt cache across chat turns). Returns how many tokens had to
    be evaluated. With `should_stop`, the evaluation goes `step` tokens at a time and ends early (the
    cache then holds a prefix of `tokens`) when it says so: background work gives way to a request, and
    with `background` its passes are asked too while they run (a request's own fill, which stops only
    when its client hangs up, is not: `should_stop` is then asked between slices)."""
    n = common_prefix(cache.tokens, tokens)
    _begin(cache, n, clean=False)
    _evaluate(cache, tokens, n, _slices(n, len(tokens), step, should_stop), "none", should_stop, background)
    return len(cache.tokens) - n


def fill_to_answer(cache, tokens: list[int], should_stop=None, step: int = 128,
                   repeatable: bool = False) -> tuple[int, np.ndarray | None]:
    """sync_cache for a prompt about to be answered: the prompt's last token goes in the prompt's own
    (last) pass, and that pass's last logits row, the first token's distribution, comes back with the
    count of tokens evaluated; None when `should_stop` ended the fill first. Evaluated alone, as the
    first round's pass, that token would cost a whole decode step where one more row of the prompt's pass
    costs little: llama-server's first token comes from the prompt's pass too. `repeatable` (a greedy
    request's): the prompt goes in the passes a fresh evaluation makes (passes.py), so its answer does not
    depend on what the cache held; otherwise as much of the cache as matches is reused, as llama-server does."""
    shared = common_prefix(cache.tokens, tokens)
    if repeatable:
        bounds = boundaries(tokens, cache.turn_starts, step)
        n = reuse_point(cache.cuts, shared, len(tokens), bounds)
        ends, clean = pass_ends(bounds, n, len(tokens)), n == 0 or n in bounds
    else:
        n = min(shared, len(tokens) - 1)
        ends, clean = _slices(n, len(tokens), step, should_stop), False
    _begin(cache, n, clean)
    row = _evaluate(cache, tokens, n, ends, "last", should_stop, False)
    cache.cuts.decoded(len(cache.tokens))  # what follows is the answer's
    return len(cache.tokens) - n, row


def _slices(start: int, length: int, step: int, should_stop) -> list[int]:
    """Pass ends every `step` tokens when the fill may be stopped between them, else one pass."""
    return [*range(start + step, length, step), length] if should_stop is not None else [length]


def _begin(cache, n: int, clean: bool) -> None:
    """Keep the first n cached rows, from where the fill begins; rows after n come from its passes, which
    a fresh evaluation makes too only when `clean`."""
    cache.truncate(n)
    cuts = cache.cuts
    if clean or (cuts.dirty_from is not None and cuts.dirty_from < n):  # else a pass before may straddle n
        cuts.add(n)
    if not clean:
        cuts.dirty(n)


def _evaluate(cache, tokens: list[int], start: int, ends: list[int], logits: str, should_stop,
              background: bool) -> np.ndarray | None:
    """Evaluate tokens[start:] in passes ending at `ends`, asking `should_stop` between them; with logits
    "last", the last row once every token went in (None if it stopped first)."""
    out = None
    for a, b in zip([start, *ends], ends):
        if a >= b:
            continue
        if should_stop is not None and should_stop():
            return None
        try:
            out = cache.eval(tokens[a:b], logits=logits if b == ends[-1] else "none",
                             stop=should_stop if background else None)
        except PassInterrupted:  # a request came while the pass ran: it was given up, rolled back
            return None
        cache.cuts.add(b)
    return None if out is None else out[-1]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
