"""A thin layer over llama-cpp-python's low-level API (never `Llama(...)`).

`Model` is a loaded GGUF (weights + vocabulary); `Context` is one llama_context holding one
sequence, the tokens whose K/V it caches, and a reusable `llama_batch`. `Context.eval` asks for
logits only on the rows the caller needs: `Llama(logits_all=True)` would keep an
n_ctx x n_vocab float array (2.5 GB at 4k context for Qwen's 151,936-token vocabulary).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from .compat import VocabInfo
from .errors import ContextFullError, ModelLoadError
from .models.gguf_header import check_model_file

_init_lock = threading.Lock()
_backend_ready = False
_LOG_CB = None  # keep the ctypes callback alive for the process lifetime
_placement: list[str] | None = None  # while a model loads: llama.cpp's lines saying where its layers went
PLACEMENT_WORDS = (b"offloaded", b"buffer size", b"using device")

VOCAB_TYPES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2", 7: "test"}


def _quiet_log(level, text, user_data) -> None:
    """llama.cpp's log, kept out of the user's terminal; while a model loads, the lines that say
    where its layers went are kept (`Model.placement`, shown by `localspec doctor --load`)."""
    if _placement is not None and text and any(w in text for w in PLACEMENT_WORDS):
        _placement.append(text.decode("utf-8", "replace").strip())


def llama():
    """Import llama_cpp once, initialise the backend, and keep llama.cpp's logging quiet
    (LOCALSPEC_DEBUG=1 lets it through to stderr)."""
    global _backend_ready, _LOG_CB
    try:
        import llama_cpp
    except ImportError as e:  # pragma: no cover - install problem, reported in one line
        raise ModelLoadError(f"llama-cpp-python is not importable ({e}); run `pip install llama-cpp-python`")
    with _init_lock:
        if not _backend_ready:
            if not os.environ.get("LOCALSPEC_DEBUG"):
                _LOG_CB = llama_cpp.llama_log_callback(_quiet_log)
                llama_cpp.llama_log_set(_LOG_CB, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _backend_ready = True
    return llama_cpp


class Model:
    def __init__(self, path: str | os.PathLike, n_gpu_layers: int = -1, rpc_servers: str | None = None,
                 mmap: bool = False):
        L = llama()
        self.path = Path(path)
        check_model_file(self.path)
        params = L.llama_model_default_params()
        params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else n_gpu_layers
        if hasattr(params, "load_mode"):  # LLAMA_LOAD_MODE_NONE = 0 (read), LLAMA_LOAD_MODE_MMAP = 1
            params.load_mode = 1 if mmap else 0
        elif hasattr(params, "use_mmap"):
            params.use_mmap = mmap
        if rpc_servers:
            add_rpc_servers(rpc_servers)
        releaser = MappedPageReleaser(self.path) if mmap else None
        if releaser is not None and releaser.supported:
            params.progress_callback = releaser.callback
        global _placement
        _placement = []
        try:
            self.ptr = L.llama_model_load_from_file(str(self.path).encode(), params)
        finally:
            self.placement, _placement = _placement, None
        if not self.ptr:
            raise ModelLoadError(f"llama.cpp could not load {self.path} (truncated, or an architecture "
                                 "this llama-cpp-python does not know); re-download it or upgrade llama-cpp-python")
        self.L = L
        self.vocab = L.llama_model_get_vocab(self.ptr)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.bos = L.llama_vocab_bos(self.vocab)
        self.eos = L.llama_vocab_eos(self.vocab)
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        self._pieces: list[bytes | None] = [None] * self.n_vocab
        self._eog = np.zeros(self.n_vocab, dtype=bool)
        for t in range(self.n_vocab):  # cheap (C calls), and makes is_eog a table lookup
            self._eog[t] = L.llama_vocab_is_eog(self.vocab, t)

    # --- metadata -------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = self.L.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            self.L.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        p = self.L.llama_model_chat_template(self.ptr, None)
        return p.decode("utf-8", errors="replace") if p else None

    def vocab_info(self) -> VocabInfo:
        L = self.L
        return VocabInfo(
            vocab_type=VOCAB_TYPES.get(L.llama_vocab_type(self.vocab), "unknown"),
            n_tokens=self.n_vocab, bos=self.bos, eos=self.eos, add_bos=self.add_bos,
            token_text=lambda i: (L.llama_vocab_get_text(self.vocab, i) or b"").decode("utf-8", "replace"),
        )

    # --- text <-> tokens --------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (ctypes.c_int32 * n_max)()
        n = self.L.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            buf = (ctypes.c_int32 * -n)()
            n = self.L.llama_tokenize(self.vocab, data, len(data), buf, -n, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token renders to; control tokens render as nothing."""
        p = self._pieces[token]
        if p is None:
            buf = ctypes.create_string_buffer(64)
            n = self.L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self.L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            p = self._pieces[token] = buf.raw[:n]
        return p

    def token_text(self, token: int) -> str:
        """The vocabulary's text for a token, control tokens included ("<|im_end|>")."""
        return (self.L.llama_vocab_get_text(self.vocab, token) or b"").decode("utf-8", "replace")

    def fim_tokens(self) -> dict[str, int]:
        """The fill-in-the-middle tokens the GGUF declares (pre, suf, mid, pad, rep, sep); absent ones left out."""
        L, out = self.L, {}
        for name in ("pre", "suf", "mid", "pad", "rep", "sep"):
            t = getattr(L, f"llama_vocab_fim_{name}")(self.vocab)
            if t is not None and t >= 0:
                out[name] = int(t)
        return out

    def is_eog(self, token: int) -> bool:
        return bool(self._eog[token])

    def eog_tokens(self) -> list[int]:
        """Every end-of-generation token of the vocabulary (EOS, EOT, <|im_end|>, FIM's ends, ...)."""
        return [int(t) for t in np.flatnonzero(self._eog)]

    def close(self) -> None:
        if getattr(self, "ptr", None):
            self.L.llama_model_free(self.ptr)
            self.ptr = None

    def __del__(self):  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass


class Context:
    """One llama_context, one sequence (id 0). `tokens` mirrors what its KV cache holds."""

    def __init__(self, model: Model, n_ctx: int = 4096, n_batch: int = 512, n_threads: int | None = None,
                 n_threads_batch: int | None = None):
        L = model.L
        threads = n_threads or (os.cpu_count() or 1)
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_batch
        cp.n_seq_max = 1
        cp.n_threads = threads
        cp.n_threads_batch = n_threads_batch or threads
        cp.no_perf = True
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
        self.mem = L.llama_get_memory(self.ptr)
        self.batch = L.llama_batch_init(n_batch, 0, 1)
        for i in range(n_batch):  # every row belongs to sequence 0, once and for all
            self.batch.n_seq_id[i] = 1
            self.batch.seq_id[i][0] = 0
        self.tokens: list[int] = []
        self.decode_s = 0.0  # wall time spent inside llama_decode (for the overhead figure)
        self.n_decode = 0
        self.observer = None  # called with (tokens, seconds) after each llama_decode (threads.ThreadGovernor)
        self.threads = cp.n_threads  # for single tokens and short passes (decode, verification)
        self.threads_batch = cp.n_threads_batch  # for long passes (prompt evaluation)
        self._batch_now = cp.n_threads_batch  # what llama.cpp uses for passes over more than one token now

    VERIFY_SHAPES = (1, 2, 4, 8, 16)
    pad_verify = False  # pad "all"-logits passes to VERIFY_SHAPES (LoadConfig.verify_buckets)

    def eval(self, tokens: list[int], logits: str = "last") -> np.ndarray | None:
        """Append `tokens` to the sequence. logits: "none" | "last" | "all" (rows for `tokens`).
        Returns a (rows, n_vocab) float32 array (a copy) or None. With `pad_verify`, an "all" pass is
        padded with copies of its last token up to the next shape (the padding stays in the cache,
        past the confirmed text, until the caller truncates it, as it does every draft)."""
        if not tokens:
            return None
        if self.pad_verify and logits == "all" and len(tokens) < self.n_batch:
            size = next((s for s in self.VERIFY_SHAPES if s >= len(tokens)), len(tokens))
            if len(self.tokens) + size <= self.n_ctx and size > len(tokens):
                out = self._eval([*tokens, *[tokens[-1]] * (size - len(tokens))], logits)
                return out[:len(tokens)]
        return self._eval(tokens, logits)

    def _eval(self, tokens: list[int], logits: str) -> np.ndarray | None:
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise ContextFullError(f"context full ({self.n_ctx} tokens); start a new conversation or raise --ctx-size")
        L, b = self.L, self.batch
        out = None
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            self._threads_for(len(chunk))
            last_chunk = start + self.n_batch >= len(tokens)
            n0 = len(self.tokens)
            for i, t in enumerate(chunk):
                b.token[i] = t
                b.pos[i] = n0 + i
                b.logits[i] = logits == "all" and last_chunk
            if last_chunk and logits == "last":
                b.logits[len(chunk) - 1] = True
            b.n_tokens = len(chunk)
            t0 = time.perf_counter()
            rc = L.llama_decode(self.ptr, b)
            if rc != 0:
                self.truncate(n0)
                if rc == 1:
                    raise ContextFullError("llama.cpp found no KV-cache slot; start a new conversation or raise --ctx-size")
                raise ModelLoadError(f"llama_decode failed (code {rc})")
            n_rows = (len(chunk) if logits == "all" else 1) if last_chunk and logits != "none" else 0
            if n_rows:
                ptr = L.llama_get_logits(self.ptr)  # outputs are contiguous, in batch order
                out = np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_vocab)).copy()
            dt = time.perf_counter() - t0
            self.decode_s += dt
            if self.observer is not None:
                self.observer(len(chunk), dt)
            self.n_decode += 1
            self.tokens.extend(chunk)
        return out

    LONG_PASS = 32  # passes over more tokens than this count as prompt evaluation

    def set_threads(self, n: int) -> None:
        """Threads for decoding and short (verification) passes from now on. Long passes keep
        `threads_batch`: measured under load on 2 cores, a 916-token prompt took 16.2 s at 2 threads
        and 18.3 s at 1 (a big batch amortizes the barriers that stall single-token decoding)."""
        self.threads = n
        self._batch_now = -1  # re-applied at the next pass

    def _threads_for(self, n_tokens: int) -> None:
        want = self.threads_batch if n_tokens > self.LONG_PASS else self.threads
        if want != self._batch_now:  # llama_set_n_threads works on a live context
            self.L.llama_set_n_threads(self.ptr, self.threads, want)
            self._batch_now = want

    def truncate(self, n: int) -> None:
        """Drop cached positions >= n (the rejected tail of a draft)."""
        if n < len(self.tokens):
            if not self.L.llama_memory_seq_rm(self.mem, 0, n, -1):
                # a recurrent model cannot drop a partial tail: start the sequence again
                self.L.llama_memory_clear(self.mem, True)
                keep, self.tokens = self.tokens[:n], []
                self.eval(keep, logits="none")
                return
            del self.tokens[n:]

    def sync(self, tokens: list[int], should_stop=None, step: int = 128) -> int:
        """Make the cache hold exactly `tokens`, reusing the longest common prefix (prompt cache
        across chat turns). Returns how many tokens had to be evaluated. With `should_stop`, the
        evaluation goes `step` tokens at a time and ends early (the cache then holds a prefix of
        `tokens`) when it says so: background work gives way to a waiting request."""
        n = common_prefix(self.tokens, tokens)
        self.truncate(n)
        if should_stop is None:
            self.eval(tokens[n:], logits="none")
        else:
            for start in range(n, len(tokens), step):
                if should_stop():
                    break
                self.eval(tokens[start:start + step], logits="none")
        return len(self.tokens) - n

    def snapshot(self):
        """The KV state of the sequence (llama_state_seq_get_data) in a ctypes byte array, to restore later."""
        L = self.L
        size = L.llama_state_seq_get_size(self.ptr, 0)
        buf = (ctypes.c_uint8 * size)()
        if L.llama_state_seq_get_data(self.ptr, buf, size, 0) != size:
            raise ModelLoadError("llama.cpp could not copy the KV cache")
        return buf

    def restore(self, state, tokens: list[int]) -> bool:
        """Put back a snapshot taken when the cache held `tokens`; False (cache emptied) if it does not fit."""
        L = self.L
        L.llama_memory_seq_rm(self.mem, 0, -1, -1)
        if not L.llama_state_seq_set_data(self.ptr, state, len(state), 0):
            self.reset()
            return False
        self.tokens = list(tokens)
        return True

    def reset(self) -> None:
        self.L.llama_memory_clear(self.mem, True)
        self.tokens = []

    def close(self) -> None:
        if getattr(self, "ptr", None):
            self.L.llama_batch_free(self.batch)
            self.L.llama_free(self.ptr)
            self.ptr = None

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass


_rpc_added: set[str] = set()


def add_rpc_servers(servers: str) -> None:
    """Register llama.cpp RPC servers (`rpc-server` on other machines) as ggml devices, the way
    llama.cpp's own `--rpc` does; the model then spreads its layers over them like over local GPUs."""
    L = llama()
    if not L.llama_supports_rpc():
        raise ModelLoadError("rpc_servers given, but this llama.cpp build has no RPC backend; reinstall with "
                             "CMAKE_ARGS=\"-DGGML_RPC=on\" pip install --force-reinstall --no-cache-dir llama-cpp-python")
    from llama_cpp._ggml import libggml as g

    g.ggml_backend_load_all.restype = None
    g.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    g.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    g.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    g.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    g.ggml_backend_register.restype = None
    g.ggml_backend_register.argtypes = [ctypes.c_void_p]
    g.ggml_backend_load_all()
    reg = g.ggml_backend_reg_by_name(b"RPC")
    fn = g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server") if reg else None
    if not fn:
        raise ModelLoadError("this llama.cpp build's RPC backend has no ggml_backend_rpc_add_server; upgrade llama-cpp-python")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(fn)
    for endpoint in (s.strip() for s in servers.split(",")):
        if endpoint and endpoint not in _rpc_added:
            dev_reg = add_server(endpoint.encode())
            if not dev_reg:
                raise ModelLoadError(f"could not reach the llama.cpp rpc-server at {endpoint}; is `rpc-server` running there?")
            g.ggml_backend_register(dev_reg)
            _rpc_added.add(endpoint)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def system_info() -> dict:
    L = llama()
    return {
        "llama_cpp_python": getattr(L, "__version__", "?"),
        "gpu_offload": bool(L.llama_supports_gpu_offload()),
        "rpc": bool(L.llama_supports_rpc()),
        "system_info": (L.llama_print_system_info() or b"").decode(errors="replace").strip(),
    }


class MappedPageReleaser:
    """A load progress callback that drops this process's mapped pages of the model file as
    llama.cpp works through it (madvise MADV_DONTNEED, Linux).

    With mmap llama.cpp reads every weight through the mapping and copies the Q4 ones into its
    repacked CPU layout; the mapped originals would stay resident next to their copies (measured:
    1.86 GB peak for the 1.5B target vs 1.16 GB with this). The mapping is read-only and shared, so
    a page dropped here that is needed later (a tensor used in place, like the token embeddings)
    is simply read back from the page cache: the data never changes."""

    MADV_DONTNEED = 4
    STEP = 0.02  # release after every 2% of the load

    def __init__(self, path: Path):
        self.real = os.path.realpath(path)
        self.last = 0.0
        self.failed = False
        self.supported = sys.platform.startswith("linux") and os.path.exists("/proc/self/maps")
        if self.supported:
            self.libc = ctypes.CDLL(None, use_errno=True)
            self.libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            self.callback = llama().llama_progress_callback(self._progress)  # kept alive with self

    def _progress(self, progress: float, user_data) -> bool:
        try:
            if not self.failed and (progress - self.last >= self.STEP or progress >= 1.0):
                self.last = progress
                # read the mapping afresh each time: just before the last call llama.cpp unmaps the
                # parts it copied to a GPU, and an address range freed there may already belong to
                # another allocation (advising it DONTNEED would zero someone else's memory)
                for start, end in self._mapped_ranges():
                    self.libc.madvise(start, end - start, self.MADV_DONTNEED)
        except Exception:  # never let a memory optimisation break a load
            self.failed = True
        return True  # go on loading

    def _mapped_ranges(self) -> list[tuple[int, int]]:
        out = []
        with open("/proc/self/maps") as f:
            for line in f:
                if line.rstrip().endswith(self.real):
                    start, end = (int(x, 16) for x in line.split()[0].split("-"))
                    out.append((start, end))
        return out


TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # llama_token_data


class GrammarSampler:
    """llama.cpp's own GBNF grammar sampler (what llama-server constrains with) over a model's vocabulary:
    which tokens the grammar allows next, given the tokens accepted so far. Accepting a token it does not
    allow aborts llama.cpp, so callers accept only what `allows` or `mask` let through, and never an EOG."""

    def __init__(self, model: Model, gbnf: str, root: str = "root", _ptr=None):
        self.L, self.model = model.L, model
        self.ptr = _ptr or self.L.llama_sampler_init_grammar(model.vocab, gbnf.encode("utf-8"), root.encode())
        if not self.ptr:
            raise ValueError("the grammar could not be parsed (LOCALSPEC_DEBUG=1 shows llama.cpp's reason)")
        self._one = np.zeros(1, dtype=TOKEN_DATA)
        self._all: np.ndarray | None = None  # the whole vocabulary, made on the first full mask

    def _apply(self, cand: np.ndarray) -> None:
        L = self.L
        arr = L.llama_token_data_array(data=cand.ctypes.data_as(L.llama_token_data_p), size=len(cand),
                                       selected=-1, sorted=False)
        L.llama_sampler_apply(self.ptr, ctypes.byref(arr))

    def allows(self, token: int) -> bool:
        self._one["id"], self._one["logit"] = token, 0.0
        self._apply(self._one)
        return bool(np.isfinite(self._one["logit"][0]))

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """One row of logits with every token the grammar forbids set to -inf (in place)."""
        if self._all is None:
            self._all = np.zeros(self.model.n_vocab, dtype=TOKEN_DATA)
            self._all["id"] = np.arange(self.model.n_vocab)
        self._all["logit"] = 0.0
        self._apply(self._all)
        logits[~np.isfinite(self._all["logit"])] = -np.inf
        return logits

    def accept(self, token: int) -> None:
        if not self.model.is_eog(token):
            self.L.llama_sampler_accept(self.ptr, token)

    def clone(self) -> "GrammarSampler":
        twin = GrammarSampler(self.model, "", _ptr=self.L.llama_sampler_clone(self.ptr))
        twin._all = self._all
        return twin

    def close(self) -> None:
        if getattr(self, "ptr", None):
            self.L.llama_sampler_free(self.ptr)
            self.ptr = None

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
