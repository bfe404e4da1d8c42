"""`Context`: one llama_context, its sequences' tokens, batched decoding, KV rollback and snapshots."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from typing import Callable

import numpy as np

from ..errors import ContextFullError, ModelLoadError, PassInterrupted
from . import rollback
from .abort import PassAbort
from .fill import common_prefix, sync_cache
from .model import Model
from .passes import Cuts
from .rollback import PARTIAL, SNAPSHOT, Checkpoints, MissCost

FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type
KV_TYPES = {"f16": 1, "bf16": 30}  # ggml_type of the K and V caches
OWED_MAX = 8  # a verify pass carries at most this many owed tokens (they would otherwise pile up, miss after miss)


class Context:
    """One llama_context. Sequence 0 is the default one (`tokens`); with n_seq > 1 the sequences share
    one unified KV cache (a server's parallel requests, `serving/batching.py`), each with its tokens in
    `seq_tokens`. Every call into llama.cpp holds `lock`, so threads may share a context."""

    def __init__(self, model: Model, n_ctx: int = 4096, n_batch: int = 512, n_threads: int | None = None,
                 n_threads_batch: int | None = None, n_seq: int = 1, flash_attn: str = "auto",
                 kv_type: str = "f16", snapshots: bool = True):
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
        if snapshots and rollback.recurrent(L, model.ptr):  # llama.cpp keeps none where the architecture has none
            cp.n_rs_seq = rollback.SNAPSHOTS
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
        # per sequence: its tokens, how their rows were computed (passes.py); a recurrent model's checkpoints, its
        # last pass's tokens (snapshots reach back within it, once), and the tail owed after a rollback by
        # checkpoint, which goes in with its next pass (llama-server's replay), so a miss costs no pass of its own
        self.seq_tokens: dict[int, list[int]] = {}
        self.seq_cuts: dict[int, Cuts] = {}
        self.seq_ckpts: dict[int, Checkpoints] = {}
        self._last_pass: dict[int, int] = {}
        self._owed: dict[int, list[int]] = {}
        for s in range(n_seq):
            self._forget(s)
        self.lock = threading.RLock()
        self.rollback, self.n_rs = rollback.classify(L, model.ptr, self.ptr)  # how a rejected tail goes
        self.miss = MissCost()
        self.decode_s = 0.0  # wall time spent inside llama_decode (for the overhead figure)
        self.n_decode = 0
        self.observer = None  # called with (tokens, seconds) after each llama_decode (threads.ThreadGovernor)
        self.hidden = None  # mtp.HiddenRows: each row's final hidden state, for a NextN head (snapshots carry them)
        self.threads = cp.n_threads  # for single tokens and short passes (decode, verification)
        self.threads_batch = cp.n_threads_batch  # for long passes (prompt evaluation)
        self._batch_now = cp.n_threads_batch  # what llama.cpp uses for passes over more than one token now
        self.aborts = PassAbort(L, self.ptr)  # whether to give a pass up, asked by llama.cpp while it runs

    VERIFY_SHAPES = (1, 2, 4, 8, 16)
    pad_verify = False  # pad "all"-logits passes to VERIFY_SHAPES (LoadConfig.verify_buckets)

    tokens = property(lambda self: self.seq_tokens[0])
    cuts = property(lambda self: self.seq_cuts[0])
    ckpts = property(lambda self: self.seq_ckpts[0])
    turn_starts = property(lambda self: self.model.turn_starts)

    def eval(self, tokens: list[int], logits: str = "last", seq: int = 0,
             stop: Callable[[], bool] | None = None) -> np.ndarray | None:
        """Append `tokens` to sequence `seq`; a float32 copy of the rows `logits` asks for ("none", "last", "all"), or
        None. `stop`: whether to give way, asked while the pass runs (PassInterrupted, the pass rolled back). With
        `pad_verify` an "all" pass is padded with its last token up to the next shape (in the cache until truncated)."""
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
        """ONE llama_decode over several sequences' tokens, each part (seq, tokens, logits mode) appended at the
        end of its sequence; at most n_batch tokens in all. Returns each part's logits rows (None for "none").
        On failure every part is rolled back and the error raised (PassInterrupted when `abort()` said so)."""
        L, b = self.L, self.batch
        with self.lock:
            for seq, toks, _ in parts:
                if len(self.seq_tokens[seq]) + len(toks) > self.n_ctx:
                    raise ContextFullError(f"context full ({self.n_ctx} tokens); start a new conversation "
                                           "or raise --ctx-size")
            self._before_pass(parts)
            i, starts, rows = 0, [], []
            for seq, toks, mode in parts:
                owed = self._owed[seq]
                n0 = len(self.seq_tokens[seq]) - len(owed)
                starts.append(n0)
                for j, t in enumerate(owed + toks):
                    own = j - len(owed)  # the part's own tokens' rows come back, the owed ones' do not
                    b.token[i], b.pos[i], b.seq_id[i][0] = t, n0 + j, seq
                    b.logits[i] = own >= 0 and (mode == "all" or (mode == "last" and own == len(toks) - 1))
                    i += 1
                rows.append(len(toks) if mode == "all" else 1 if mode == "last" and toks else 0)
            b.n_tokens = i
            self._threads_for(i)
            t0 = time.perf_counter()
            rc = self.aborts.decode(b, abort)
            if rc != 0:  # a recurrent state may hold part of the pass: back to a checkpoint
                for (seq, _, _), n0 in zip(parts, starts):
                    if self.rollback == PARTIAL:
                        self.truncate(n0, seq)
                    else:
                        self._roll_back(len(self.seq_tokens[seq]), seq)
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
            self._after_pass(parts, starts, i, dt)
        if self.observer is not None:
            self.observer(i, dt)
        return outs

    def _after_pass(self, parts, starts: list[int], n_tokens: int, dt: float) -> None:
        self.decode_s += dt
        self.n_decode += 1
        if n_tokens == 1 and self.rollback != PARTIAL:  # what a step costs beside a save (rollback.MissCost)
            self.miss.stepped(dt)
        if self.hidden is not None:
            self.hidden.keep([(s, n0, len(self._owed[s]) + len(t)) for (s, t, _), n0 in zip(parts, starts)], n_tokens)
        for seq, toks, _ in parts:
            self.seq_tokens[seq].extend(toks)
            self._last_pass[seq] = len(self._owed[seq]) + len(toks)
            self._owed[seq] = []

    def _before_pass(self, parts) -> None:
        """A recurrent state saved before a verify pass snapshots do not cover; owed tokens first if they pile up."""
        if self.rollback == PARTIAL:  # a transformer's pass: nothing to save, nothing owed
            return
        big = sum(len(t) + len(self._owed[s]) for s, t, _ in parts) > self.n_batch
        for seq, toks, mode in parts:
            verify = mode == "all" and len(toks) > 1 and not self._snapshots_cover(seq, len(toks) - 1, len(toks))
            if big or (verify and len(self._owed[seq]) > OWED_MAX):
                self._settle(seq)
            if verify:
                self.checkpoint(seq, brief=True)

    LONG_PASS = 32  # passes over more tokens than this count as prompt evaluation

    def set_threads(self, n: int) -> None:
        """Threads for decoding and short passes from now on; long ones keep `threads_batch` (docs/BENCHMARKS.md)."""
        self.threads = n
        self._batch_now = -1  # re-applied at the next pass

    def _threads_for(self, n_tokens: int) -> None:
        want = self.threads_batch if n_tokens > self.LONG_PASS else self.threads
        if want != self._batch_now:  # llama_set_n_threads works on a live context
            self.L.llama_set_n_threads(self.ptr, self.threads, want)
            self._batch_now = want

    def truncate(self, n: int, seq: int = 0) -> None:
        """Drop cached positions >= n (a rejected draft): cells, or a state by snapshot or checkpoint (rollback.py)."""
        with self.lock:
            toks, owed = self.seq_tokens[seq], self._owed[seq]
            if n >= len(toks):
                return
            if owed:  # dropping what is still owed costs nothing
                real = len(toks) - len(owed)
                del toks[max(n, real):], owed[max(n - real, 0):]
                if n >= real:
                    self.seq_cuts[seq].truncate(n)
                    return
            if n == 0:  # nothing kept: nothing to evaluate again
                self.clear(seq)
                return
            if self.rollback == PARTIAL or self._snapshots_cover(seq, len(toks) - n):
                if self.L.llama_memory_seq_rm(self.mem, seq, n, -1):
                    self._dropped(seq, n)
                    return
            t0 = time.perf_counter()
            self.miss.record(t0, self._roll_back(n, seq))

    def _dropped(self, seq: int, n: int) -> None:  # cells after n gone
        del self.seq_tokens[seq][n:]
        self.seq_cuts[seq].truncate(n)
        self.seq_ckpts[seq].drop_after(n)
        self._last_pass[seq] = 0  # a snapshot is good for one rollback only

    def _snapshots_cover(self, seq: int, back: int, pass_len: int | None = None) -> bool:
        """Can llama.cpp's snapshots take it `back` tokens back? Within its last pass (pass_len tokens), once."""
        pass_len = self._last_pass[seq] if pass_len is None else pass_len
        return self.rollback == SNAPSHOT and 0 < back <= min(self.n_rs, pass_len - 1)

    def _roll_back(self, n: int, seq: int) -> int:
        """A recurrent sequence back to n tokens: its latest checkpoint at or before n, the tokens after it owed
        (with none, the whole kept text evaluated: the last resort, counted). Returns how many go in again."""
        toks, self._owed[seq] = self.seq_tokens[seq], []  # what was owed is in `toks` again
        best = self.seq_ckpts[seq].best(n)
        if best is not None and rollback.load_state(self.L, self.ptr, seq, best[1]) \
                and self.L.llama_memory_seq_rm(self.mem, seq, best[0], -1):
            p = best[0]
            owed = toks[p:n]  # no copy of the whole text: a miss costs the same at any depth
            self._dropped(seq, p)
        else:
            self.miss.fallbacks += 1
            self.L.llama_memory_seq_rm(self.mem, seq, -1, -1)
            keep, self.seq_tokens[seq], self.seq_ckpts[seq] = toks[:n], [], Checkpoints()
            self.eval(keep, logits="none", seq=seq)  # in passes of its own: it can be long
            cuts = self.seq_cuts[seq]
            cuts.truncate(n)
            cuts.at, cuts.dirty_from = [n], 0  # its rows now from one pass: none reused as a fresh one's
            return n
        if owed:  # evaluated again with the next pass
            toks.extend(owed)
            self._owed[seq] = owed
            self.seq_cuts[seq].truncate(n)
            self.seq_cuts[seq].dirty(p)  # rows after p come from another pass than before
        return n - p

    def _settle(self, seq: int) -> None:  # what a rollback left owed evaluated now, in a pass of its own
        owed = self._owed[seq]
        if owed:
            self._owed[seq], self.seq_tokens[seq] = [], self.seq_tokens[seq][:-len(owed)]
            self.eval(owed, logits="none", seq=seq)

    def checkpoint(self, seq: int = 0, brief: bool = False, keep: int = Checkpoints.ROLLBACK_KEEP) -> None:
        """Save a recurrent sequence's state here, for a later prompt to come back to (`brief`: for the next
        rejected draft, dropped once `keep` newer ones are kept); nothing to do for a transformer."""
        if self.rollback == PARTIAL:
            return
        with self.lock:
            pos = len(self.seq_tokens[seq]) - len(self._owed[seq])  # where the state is
            ckpts = self.seq_ckpts[seq]
            if pos == 0 or ckpts.has(pos):
                return
            t0 = time.perf_counter()
            state = rollback.save_state(self.L, self.ptr, seq)
            if state is not None:
                self.miss.saved(time.perf_counter() - t0)
                ckpts.add(pos, state, brief, keep)

    def reusable(self, n: int, seq: int = 0) -> int:
        """The longest prefix, up to n tokens, the sequence can keep without evaluating anything again."""
        toks = self.seq_tokens[seq]
        if self._snapshots_cover(seq, len(toks) - n):
            return n
        return rollback.reach(n, len(toks) - len(self._owed[seq]), self.seq_ckpts[seq].positions(), self.rollback)

    def sync(self, tokens: list[int], should_stop=None, step: int = 128, background: bool = False) -> int:
        return sync_cache(self, tokens, should_stop, step, background)

    def copy_prefix(self, src: int, dst: int, tokens: list[int]) -> int:
        """`dst` made to hold the longest prefix of `tokens` that `src` holds, sharing its cells; its length. A recurrent
        state is never shared (llama.cpp would hand over all of `src`'s): cells up to a checkpoint, and its state."""
        with self.lock:
            self._settle(src)
            n = common_prefix(self.seq_tokens[src], tokens)
            self.L.llama_memory_seq_rm(self.mem, dst, -1, -1)
            self._owed[dst] = []
            self.seq_tokens[dst], self.seq_cuts[dst], self.seq_ckpts[dst] = [], Cuts(), Checkpoints()
            self._last_pass[dst] = 0
            state = None
            if self.rollback != PARTIAL:
                if n == len(self.seq_tokens[src]):
                    self.checkpoint(src)
                best = self.seq_ckpts[src].best(n)
                n, state = best if best is not None else (0, None)
            if n == 0:
                return 0
            self.L.llama_memory_seq_cp(self.mem, src, dst, 0, n)
            if state is not None and not rollback.load_state(self.L, self.ptr, dst, state):
                self.clear(dst)
                return 0
            self.seq_tokens[dst] = self.seq_tokens[src][:n]
            if self.hidden is not None:
                self.hidden.put(dst, self.hidden.kept(src, n))
            self.seq_cuts[dst] = self.seq_cuts[src].copy(n)
            self.seq_ckpts[dst] = self.seq_ckpts[src].copy(n)
            return n

    def snapshot(self, seq: int = 0):
        """The KV state of a sequence (llama_state_seq_get_data) in a ctypes byte array, to restore later."""
        L = self.L
        with self.lock:
            self._settle(seq)
            size = L.llama_state_seq_get_size(self.ptr, seq)
            buf = (ctypes.c_uint8 * size)()
            if L.llama_state_seq_get_data(self.ptr, buf, size, seq) != size:
                raise ModelLoadError("llama.cpp could not copy the KV cache")
            buf.hidden = self.hidden.kept(seq, len(self.seq_tokens[seq])) if self.hidden is not None else None
            return buf

    def restore(self, state, tokens: list[int], seq: int = 0, cuts: Cuts | None = None,
                ckpts: Checkpoints | None = None) -> bool:
        """Put back a snapshot taken when a sequence held `tokens` (rows computed as `cuts` says; unknown: none reused
        until cut as a prompt's own; a recurrent model's checkpoints with it); False (emptied) if it does not fit."""
        L = self.L
        with self.lock:
            L.llama_memory_seq_rm(self.mem, seq, -1, -1)
            if not L.llama_state_seq_set_data(self.ptr, state, len(state), seq):
                self.clear(seq)
                return False
            self._forget(seq, tokens, cuts, ckpts)
            if self.hidden is not None:
                self.hidden.put(seq, getattr(state, "hidden", None))
            return True

    def _forget(self, seq: int, tokens=(), cuts: Cuts | None = None, ckpts: Checkpoints | None = None) -> None:
        """A sequence's record set afresh: what its cells (the caller's to set) now hold."""
        self.seq_tokens[seq] = list(tokens)
        self.seq_cuts[seq] = cuts.copy(len(tokens)) if cuts is not None else Cuts()
        self.seq_ckpts[seq] = ckpts.copy(len(tokens)) if ckpts is not None else Checkpoints()
        self._last_pass[seq], self._owed[seq] = 0, []

    def clear(self, seq: int = 0) -> None:
        with self.lock:
            self.L.llama_memory_seq_rm(self.mem, seq, -1, -1)
            self._forget(seq)

    def reset(self) -> None:
        with self.lock:
            self.L.llama_memory_clear(self.mem, True)
            for seq in range(self.n_seq):
                self._forget(seq)

    def close(self) -> None:
        if getattr(self, "ptr", None):
            with self.lock:
                self.L.llama_batch_free(self.batch)
                self.L.llama_free(self.ptr)
                self.ptr = None

    def __del__(self):  # pragma: no cover
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to free
            self.close()
