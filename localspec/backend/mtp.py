"""A target's own NextN (multi-token-prediction) blocks as a drafter, through llama.cpp's MTP context.

The target's passes keep each row's final hidden state (`HiddenRows`, filled by `Context.decode_parts`); the
head (`MtpHead`) is a second context on the same weights (`LLAMA_CONTEXT_TYPE_MTP`, `ctx_other` = the target)
that reads each token beside the target's hidden state of the position before it, and drafts by feeding its
own hidden state back, as llama-server's `draft-mtp` does (common/speculative.cpp).

Four staging functions it needs are exported by libllama only under C++-mangled names in the llama.cpp the
project pins (src/llama-ext.h). `staging()` finds them by those names, only for that version of
llama-cpp-python, and checks they are there before anything calls them; elsewhere a head is refused with one
line, never called at a guessed address.
"""

from __future__ import annotations

import ctypes
import os
import time
from types import SimpleNamespace

import numpy as np

from ..errors import ConfigError
from .fill import common_prefix

PINNED = "0.3.36"  # the llama-cpp-python whose libllama exports the names below
_MANGLED = {
    "set_embeddings_nextn": ("_Z26llama_set_embeddings_nextnP13llama_contextbb", None,
                             [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool]),
    "embeddings_nextn": ("_Z26llama_get_embeddings_nextnP13llama_context", ctypes.POINTER(ctypes.c_float),
                         [ctypes.c_void_p]),
    "embeddings_nextn_ith": ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti", ctypes.POINTER(ctypes.c_float),
                             [ctypes.c_void_p, ctypes.c_int]),
}
MTP_CONTEXT = 1  # LLAMA_CONTEXT_TYPE_MTP
PROCESS_DECODE = 1  # LLAMA_PROCESS_TYPE_DECODE
_staging: SimpleNamespace | str | None = None


def staging(L) -> SimpleNamespace:
    """The staging functions, found once; ConfigError with the reason where they cannot be used."""
    global _staging
    if _staging is None:
        _staging = _find(L)
    if isinstance(_staging, str):
        raise ConfigError(_staging)
    return _staging


def _find(L) -> SimpleNamespace | str:
    """L: the llama_cpp package (backend.model.llama)."""
    if L.__version__ != PINNED:
        return (f"NextN (MTP) drafting needs llama-cpp-python {PINNED} (this is {L.__version__}): its "
                "staging functions have no stable name; use --drafter model or ngram")
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(L.__file__), "lib", "libllama.so"))
        found = {}
        for name, (symbol, restype, argtypes) in _MANGLED.items():
            fn = lib[symbol]
            fn.restype, fn.argtypes = restype, argtypes
            found[name] = fn
    except (OSError, AttributeError) as e:
        return f"this llama.cpp build lacks the NextN (MTP) staging functions ({e}); use --drafter model or ngram"
    if not all(hasattr(L, n) for n in ("llama_process", "llama_batch_ext_init", "llama_batch_ext_set_embd_token")):
        return "this llama-cpp-python has no llama_batch_ext API for NextN (MTP) drafting; use --drafter model or ngram"
    return SimpleNamespace(**found)


def nextn_layers(L, model_ptr) -> int:
    return int(L.llama_model_n_layer_nextn(model_ptr)) if hasattr(L, "llama_model_n_layer_nextn") else 0


def attach(target) -> "HiddenRows | None":
    """Hidden states kept from every pass of `target` (a Context) when its model carries NextN blocks this
    llama.cpp can drive; None otherwise (nothing changes for other models)."""
    if not nextn_layers(target.L, target.model.ptr):
        return None
    try:
        staging(target.L)
    except ConfigError:
        return None  # said when a request asks for the head (`--drafter mtp`)
    n_embd = int(target.L.llama_model_n_embd_out(target.model.ptr))
    return HiddenRows(target.L, target.ptr, target.n_ctx, n_embd, target.n_seq)


class HiddenRows:
    """The target's final hidden state at each position of each sequence, as its passes computed them."""

    def __init__(self, L, ctx_ptr, n_ctx: int, n_embd: int, n_seq: int):
        self.api = staging(L)
        self.api.set_embeddings_nextn(ctx_ptr, True, False)  # every row, not only those with logits
        self.ctx_ptr, self.n_embd, self.n_ctx = ctx_ptr, n_embd, n_ctx
        self.rows = [np.zeros((0, n_embd), np.float32) for _ in range(n_seq)]  # grown with the text, not n_ctx

    def keep(self, spans: list[tuple[int, int, int]], n_tokens: int) -> None:
        """After a pass of n_tokens: spans (seq, first position, tokens), in batch order."""
        every = np.ctypeslib.as_array(self.api.embeddings_nextn(self.ctx_ptr), (n_tokens, self.n_embd))
        at = 0
        for seq, pos, n in spans:
            self.keep_rows(seq, pos, every[at:at + n])
            at += n

    def kept(self, seq: int, n: int) -> np.ndarray:
        """A copy of the first n rows of `seq` (a snapshot's: Context.snapshot)."""
        return self.rows[seq][:n].copy()

    def put(self, seq: int, rows: np.ndarray | None) -> None:
        """`seq`'s first rows, as a snapshot kept them (None: a snapshot without them, from disk; the head then
        drafts worse for that text, never wrongly)."""
        if rows is not None:
            self.keep_rows(seq, 0, rows)

    def keep_rows(self, seq: int, pos: int, rows: np.ndarray) -> None:
        n = len(rows)
        if pos + n > len(self.rows[seq]):
            grown = np.zeros((min(self.n_ctx, max(pos + n, 2 * len(self.rows[seq]))), self.n_embd), np.float32)
            grown[:len(self.rows[seq])] = self.rows[seq]
            self.rows[seq] = grown
        self.rows[seq][pos:pos + n] = rows


def rows_bytes(state) -> int:
    """Bytes of the hidden rows a snapshot carries (Context.snapshot), for a cache's budget."""
    rows = getattr(state, "hidden", None)
    return rows.nbytes if rows is not None else 0


class MtpHead:
    """The NextN blocks of `target`'s model, one sequence per target sequence; `texts[seq]`: what its cache holds."""

    def __init__(self, target, hidden: HiddenRows):
        L = self.L = target.L
        self.target, self.hidden = target, hidden
        self.api = staging(L)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = target.n_ctx, target.n_batch, target.n_batch
        cp.n_seq_max, cp.kv_unified = target.n_seq, target.n_seq > 1  # the target's lanes, its cells shared alike
        cp.n_threads = cp.n_threads_batch = L.llama_n_threads(target.ptr)
        cp.ctx_type, cp.n_rs_seq, cp.ctx_other = MTP_CONTEXT, 0, target.ptr
        cp.no_perf = True
        self.ptr = L.llama_init_from_model(target.model.ptr, cp)
        if not self.ptr:
            raise ConfigError(f"llama.cpp could not make a NextN (MTP) context for {target.model.path.name}")
        self.api.set_embeddings_nextn(self.ptr, True, True)
        self.batch = L.llama_batch_ext_init(self.ptr)
        self.mem = L.llama_get_memory(self.ptr)
        self.n_embd, self.n_vocab = hidden.n_embd, target.n_vocab
        self.texts: list[list[int]] = [[] for _ in range(target.n_seq)]
        self.step_s = 0.0
        for i in range(3):  # timed before a policy prices the head; the first step pays for the graph's setup
            self.step_s = 0.0 if i == 1 else self.step_s
            self.step(0, 0, np.zeros(self.n_embd, np.float32))
            L.llama_memory_seq_rm(self.mem, 0, -1, -1)

    def sync(self, text: list[int], seq: int = 0, then: tuple[int, np.ndarray] | None = None):
        """Its cache of `seq` holds `text` (the confirmed tokens before the pending one), each beside the
        target's hidden state of the position before it. `then`: a draft's first step, (the pending token,
        the state before it), in the same pass as the last of those tokens (a call fewer a round): its
        logits and state returned, as `step`'s."""
        have = self.texts[seq]
        keep = common_prefix(have, text)
        self.L.llama_memory_seq_rm(self.mem, seq, keep, -1)
        del have[keep:]
        rows, zero = self.hidden.rows[seq], np.zeros(self.n_embd, np.float32)
        items = [(text[p], rows[p - 1] if p > 0 else zero) for p in range(keep, len(text))] + ([then] if then else [])
        for start in range(0, len(items), self.target.n_batch):
            part = items[start:start + self.target.n_batch]
            last = then is not None and start + len(part) == len(items)
            self._process(seq, [t for t, _ in part], keep + start, [h for _, h in part], last=last)
            have.extend(t for t, _ in part[:len(part) - last])
        return self._outputs(len(part) - 1) if then is not None else None

    def step(self, token: int, pos: int, h: np.ndarray, seq: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """One drafted position: the head's logits for the token after `token` and its own hidden state;
        `step_s` follows what a step costs (a running average)."""
        t0 = time.perf_counter()
        self._process(seq, [token], pos, [h], last=True)
        out = self._outputs(0)
        dt = time.perf_counter() - t0
        self.step_s = dt if not self.step_s else 0.8 * self.step_s + 0.2 * dt
        return out

    def _outputs(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The logits and the head's own state at row i of the last pass."""
        logits, state = np.empty(self.n_vocab, np.float32), np.empty(self.n_embd, np.float32)
        ctypes.memmove(logits.ctypes.data, self.L.llama_get_logits_ith(self.ptr, i), logits.nbytes)
        ctypes.memmove(state.ctypes.data, self.api.embeddings_nextn_ith(self.ptr, i), state.nbytes)
        return logits, state

    def _process(self, seq: int, tokens: list[int], pos0: int, hs: list[np.ndarray], last: bool = False) -> None:
        L, b = self.L, self.batch
        L.llama_batch_ext_clear(b)
        held = np.ascontiguousarray(np.stack(hs) if len(hs) > 1 else hs[0][None], dtype=np.float32)  # alive until it returns
        pos = (ctypes.c_int * 4)()
        for i, t in enumerate(tokens):
            idx = L.llama_batch_ext_add_token(b, seq, t)
            pos[0] = pos0 + i
            L.llama_batch_ext_set_pos(b, idx, pos)
            row = held[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            L.llama_batch_ext_set_embd_token(b, idx, L.llama_embd(row, 1, self.n_embd))
            if last and i == len(tokens) - 1:
                L.llama_batch_ext_set_output_logits(b, idx, True)
        rc = L.llama_process(self.ptr, PROCESS_DECODE, b)
        if rc != 0:
            raise ConfigError(f"the NextN (MTP) head failed (llama_process {rc})")

    def close(self) -> None:
        if self.ptr:
            self.L.llama_batch_ext_free(self.batch)
            self.L.llama_free(self.ptr)
            self.ptr = None


class HeadSeq:
    """One lane's sequence of a head, what `MtpDrafter` drafts with; `run(fn)`: where fn decodes (a
    server's batch thread: serving/batching.py says why only one thread may)."""

    def __init__(self, head: MtpHead, seq: int, run):
        self.head, self.seq, self.run = head, seq, run
        self.hidden = head.hidden

    @property
    def tokens(self) -> list[int]:
        return self.head.texts[self.seq]

    @property
    def step_s(self) -> float:
        return self.head.step_s

    def sync(self, text: list[int], then: tuple[int, np.ndarray] | None = None):
        return self.run(lambda: self.head.sync(text, self.seq, then))

    def step(self, token: int, pos: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.run(lambda: self.head.step(token, pos, h, self.seq))


class Heads:
    """The target's head (`head`), made on first use where passes run (`run`), so that two lanes' first
    rounds make one; a `HeadSeq` for each lane's sequence."""

    def __init__(self, target, run):
        self.target, self.run = target, run
        self.head: MtpHead | None = None

    def lane(self, seq: int) -> HeadSeq:
        def made() -> MtpHead:
            if self.head is None:
                self.head = MtpHead(self.target, self.target.hidden)
            return self.head
        return HeadSeq(self.head or self.run(made), seq, self.run)

    def close(self) -> None:
        if self.head is not None:
            self.head.close()
