"""Loading llama.cpp and a GGUF model: `llama()`, `Model`, RPC devices, the mapped-page releaser."""

from __future__ import annotations

import ctypes
import os
import socket
import sys
import threading
from functools import cached_property
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError
from ..machine import amx_build_at_risk
from ..models.gguf_header import check_model_file
from ..pairing import VocabInfo

_init_lock = threading.Lock()
_backend_ready = False
_LOG_CB = None  # keep the ctypes callback alive for the process lifetime
_placement: list[str] | None = None  # while a model loads: llama.cpp's lines saying where its layers went
PLACEMENT_WORDS = (b"offloaded", b"buffer size", b"using device", b"assigned to device")

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
                 mmap: bool = False, repack: bool = True, vocab_only: bool = False):
        """repack: let llama.cpp put the weights in its extra CPU layouts (faster; off for --exact, whose
        kernels must give a row the same bits whatever the batch: exact.py). vocab_only: the tokenizer and
        metadata alone, no weights (a server's side of a model that runs in another process)."""
        L = llama()
        self.path = Path(path)
        check_model_file(self.path)
        params = L.llama_model_default_params()
        params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else n_gpu_layers
        if hasattr(params, "load_mode"):  # LLAMA_LOAD_MODE_NONE = 0 (read), LLAMA_LOAD_MODE_MMAP = 1
            params.load_mode = 1 if mmap else 0
        elif hasattr(params, "use_mmap"):
            params.use_mmap = mmap
        if hasattr(params, "load_mtp"):  # a file's NextN (MTP) blocks, when it has any: its own drafter
            params.load_mtp = True
        params.vocab_only = vocab_only
        if rpc_servers and not vocab_only:
            add_rpc_servers(rpc_servers)
        elif _rpc_added and not vocab_only:  # RPC hosts are every model's devices once registered: a draft
            self._devices = local_devices()  # stays on this machine's own (its CPU, or its GPUs)
            params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        if not repack or amx_kernel_avoided():  # AMX: its kernel would crash here (machine.py)
            params.use_extra_bufts = False
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

    @cached_property
    def turn_starts(self) -> frozenset[int]:
        """The control tokens that are no end of generation: the chat templates' message starts (<|im_start|>,
        <start_of_turn>, <|start_header_id|>...) among them, where a prompt's passes are cut (passes.py)."""
        L, v = self.L, self.vocab
        return frozenset(t for t in range(self.n_vocab) if L.llama_vocab_is_control(v, t) and not self._eog[t])

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


_rpc_added: set[str] = set()


def add_rpc_servers(servers: str) -> None:
    """Register llama.cpp RPC servers (`rpc-server` on other machines) as ggml devices, the way
    llama.cpp's own `--rpc` does; the model then spreads its layers over them like over local GPUs."""
    L = llama()
    if not L.llama_supports_rpc():
        raise ModelLoadError("rpc_servers given, but this llama.cpp build has no RPC backend; reinstall with "
                             "CMAKE_ARGS=\"-DGGML_RPC=on\" pip install --force-reinstall --no-cache-dir llama-cpp-python")
    from .devices import ggml_lib

    g = ggml_lib()
    reg = g.ggml_backend_reg_by_name(b"RPC") if g is not None else None
    fn = g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server") if reg else None
    if not fn:
        raise ModelLoadError("this llama.cpp build's RPC backend has no ggml_backend_rpc_add_server; upgrade llama-cpp-python")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(fn)
    for endpoint in (s.strip() for s in servers.split(",")):
        if endpoint and endpoint not in _rpc_added:
            require_answering(endpoint)  # llama.cpp aborts the process on a host it cannot reach
            dev_reg = add_server(endpoint.encode())
            if not dev_reg:
                raise ModelLoadError(f"could not reach the llama.cpp rpc-server at {endpoint}; is `rpc-server` running there?")
            g.ggml_backend_register(dev_reg)
            _rpc_added.add(endpoint)


def local_devices():
    """This machine's GPUs as llama.cpp's NULL-terminated device list (empty: the CPU alone)."""
    from .devices import ggml_lib, is_local_gpu

    g = ggml_lib()
    devs = []
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        kind = {1: "gpu", 2: "igpu"}.get(g.ggml_backend_dev_type(dev), "cpu")
        if is_local_gpu({"type": kind, "name": g.ggml_backend_dev_name(dev).decode()}):
            devs.append(dev)
    return (ctypes.c_void_p * (len(devs) + 1))(*devs, None)


def require_answering(endpoint: str, timeout_s: float = 3.0) -> None:
    """A TCP connection to an RPC host, or a one-line error (llama.cpp's own attempt would abort)."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except ValueError:
        raise ModelLoadError(f"rpc server {endpoint!r} is not host:port") from None
    except OSError as e:
        raise ModelLoadError(f"could not reach the llama.cpp rpc-server at {endpoint} ({e.strerror or e}); is "
                             "`scripts/rpc-host` running there?") from None


def amx_kernel_avoided() -> bool:
    """Load models without llama.cpp's extra weight layouts (its AMX kernel among them) because this build
    would run the AMX kernel on this CPU? (LOCALSPEC_AMX=1 keeps them, for a build where it works.)"""
    if os.environ.get("LOCALSPEC_AMX") == "1":
        return False
    return amx_build_at_risk(system_info()["system_info"])


def system_info() -> dict:
    from .devices import has_gpu_device

    L = llama()
    return {
        "llama_cpp_python": getattr(L, "__version__", "?"),
        "gpu_offload": bool(L.llama_supports_gpu_offload()) and has_gpu_device(),
        "rpc": bool(L.llama_supports_rpc()),
        "system_info": (L.llama_print_system_info() or b"").decode(errors="replace").strip(),
    }


class MappedPageReleaser:
    """A load progress callback that drops this process's mapped pages of the model file as
    llama.cpp works through it (madvise MADV_DONTNEED, Linux).

    With mmap llama.cpp reads every weight through the mapping and copies the Q4 ones into its
    repacked CPU layout; the mapped originals would stay resident next to their copies (docs/BENCHMARKS.md,
    "Start-up and memory"). The mapping is read-only and shared, so
    a page dropped here that is needed later (a tensor used in place, like the token embeddings)
    is simply read back from the page cache: the data never changes."""

    MADV_DONTNEED = 4
    STEP = 0.02  # release after every fiftieth of the load

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
