"""Read a GGUF file's header (its key/value metadata) and nothing else.

A GGUF file is: magic "GGUF", version, tensor count, key/value count, the key/values, the tensor
descriptions, then the weights. Everything `localspec check` needs (architecture, tokenizer, BOS/EOS)
is in the key/values, so this reader stops there. It only calls `read(n)` on the file object, in
chunks that grow from 256 KiB to 8 MiB: a tiny model costs one small read, Qwen's 151,936-token
vocabulary (a header of several megabytes) a handful, and a remote file opened through huggingface-hub's
`HfFileSystem` turns each read into one HTTP range request, so no weights are ever downloaded.

`check_pair_files(target_ref, draft_ref)` runs llama.cpp's draft/target rules (pairing.py) on two
headers. A ref is a local path, `ORG/REPO/FILE.gguf` on the Hugging Face Hub (read from the local
HF cache when it is there, else over the network with range reads unless HF_HUB_OFFLINE=1), or a
pair name from models.yaml (the pair's target or draft, depending on the side).
"""

from __future__ import annotations

import functools
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import LocalspecError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
FIRST_READ_BYTES = 256 * 1024
MAX_READ_BYTES = 8 * 1024 * 1024
# Sanity limits so a corrupt length field fails with a message instead of allocating terabytes.
MAX_STRING_BYTES = 64 * 1024 * 1024
MAX_ARRAY_ITEMS = 1 << 31
MAX_KV_COUNT = 1 << 20

# GGUF value types (gguf.h: enum gguf_type)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR_FORMATS = {
    UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
    FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d",
}

# The arrays worth keeping; all others (merges, scores, token types) are skipped over, only counted.
KEPT_ARRAYS = frozenset({"tokenizer.ggml.tokens"})
# per-layer hyperparameters a hybrid's header gives as arrays (0 KV heads: a recurrent layer); kept, they are small
KEPT_ARRAY_SUFFIXES = (".attention.head_count_kv", ".attention.head_count")

# tokenizer.ggml.model -> llama.cpp's vocab type name (llama-vocab.cpp, llama_vocab::impl::load)
VOCAB_TYPES = {"llama": "spm", "gpt2": "bpe", "bert": "wpm", "t5": "ugm", "rwkv": "rwkv",
               "plamo2": "plamo2", "no_vocab": "none", "none": "none"}
# BOS/EOS ids llama.cpp assumes when the file does not say (same function); -1 = no such token
DEFAULT_BOS_EOS = {"spm": (1, 2), "bpe": (11, 11), "wpm": (101, -1), "ugm": (-1, 1), "rwkv": (-1, -1),
                   "plamo2": (-1, -1), "none": (-1, -1)}

# general.file_type -> the quantization name used in GGUF file names (llama.h: enum llama_ftype)
FILE_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 7: "q8_0", 8: "q5_0", 9: "q5_1", 10: "q2_k",
              11: "q3_k_s", 12: "q3_k_m", 13: "q3_k_l", 14: "q4_k_s", 15: "q4_k_m", 16: "q5_k_s",
              17: "q5_k_m", 18: "q6_k", 19: "iq2_xxs", 20: "iq2_xs", 21: "q2_k_s", 22: "iq3_xs",
              23: "iq3_xxs", 24: "iq1_s", 25: "iq4_nl", 26: "iq3_s", 27: "iq3_m", 28: "iq2_s",
              29: "iq2_m", 30: "iq4_xs", 31: "iq1_m", 32: "bf16", 36: "tq1_0", 37: "tq2_0"}


class GgufHeaderError(LocalspecError):
    """The file is not a usable GGUF language model (wrong magic, truncated, an adapter, ...)."""


@dataclass(frozen=True)
class SkippedArray:
    """An array in the header that was walked over but not kept (e.g. 151,387 BPE merges)."""
    item_type: int
    count: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int = 0  # where its data starts, from the start of the data section

    @property
    def n_bytes(self) -> int:
        block, size = GGML_TYPE_SIZES.get(self.ggml_type, (1, 4))  # an unknown type priced as f32
        n = 1
        for d in self.shape:
            n *= d
        return n // block * size


# ggml type id -> (elements per block, bytes per block): ggml.c's type_traits
GGML_TYPE_SIZES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
                   9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
                   15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18),
                   21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8),
                   28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17)}
MAX_TENSOR_DIMS = 4


@dataclass
class GgufHeader:
    version: int
    n_tensors: int
    metadata: dict[str, Any]
    header_bytes: int  # offset where the key/value section ends (the tensor descriptions start)
    bytes_read: int  # bytes actually taken from the file object (whole read chunks)
    tensors: list[TensorInfo] | None = None  # read only when asked for (read_layout_file)
    data_start: int = 0  # with the tensors: the file offset of the data section (aligned)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    @property
    def file_type_name(self) -> str | None:
        ft = self.metadata.get("general.file_type")
        return None if ft is None else FILE_TYPES.get(ft, f"type{ft}")


class _ChunkReader:
    """Sequential reads of exact sizes out of a file object, fetched in growing chunks."""

    def __init__(self, f: BinaryIO, where: str):
        self.f = f
        self.where = where
        self.buf = b""
        self.pos = 0  # read position inside buf
        self.consumed_before_buf = 0  # file offset of buf[0]
        self.next_chunk = FIRST_READ_BYTES
        self.bytes_read = 0

    @property
    def offset(self) -> int:
        return self.consumed_before_buf + self.pos

    def _fill(self, need: int) -> None:
        """Make buf[pos:pos+need] available, reading more chunks as needed."""
        parts = [self.buf[self.pos:]]
        have = len(parts[0])
        self.consumed_before_buf += self.pos
        while have < need:
            chunk = self.f.read(max(self.next_chunk, need - have))
            if not chunk:
                raise GgufHeaderError(
                    f"{self.where} is truncated: it ends inside its header (at byte {self.consumed_before_buf + have}); "
                    "download it again")
            self.bytes_read += len(chunk)
            self.next_chunk = min(self.next_chunk * 2, MAX_READ_BYTES)
            parts.append(chunk)
            have += len(chunk)
        self.buf = b"".join(parts)
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            self._fill(n)
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, size: int) -> Any:
        if self.pos + size > len(self.buf):
            self._fill(size)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self) -> str:
        n = self.unpack("<Q", 8)
        if n > MAX_STRING_BYTES:
            raise GgufHeaderError(f"{self.where} has a corrupt header (a {n}-byte string); download it again")
        # surrogateescape: token text is compared byte for byte, like llama.cpp's std::string
        return self.take(n).decode("utf-8", errors="surrogateescape")

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            n = self.unpack("<Q", 8)
            if n > MAX_STRING_BYTES:
                raise GgufHeaderError(f"{self.where} has a corrupt header (a {n}-byte string); download it again")
            self.skip(n)

    def skip(self, n: int) -> None:
        while n > 0:
            if self.pos >= len(self.buf):
                self._fill(1)
            step = min(n, len(self.buf) - self.pos)
            self.pos += step
            n -= step


def _read_value(r: _ChunkReader, vtype: int, key: str) -> Any:
    if vtype == STRING:
        return r.string()
    if vtype == ARRAY:
        item_type = r.unpack("<I", 4)
        count = r.unpack("<Q", 8)
        if count > MAX_ARRAY_ITEMS:
            raise GgufHeaderError(f"{r.where} has a corrupt header ({count} items in {key}); download it again")
        if key in KEPT_ARRAYS or (key.endswith(KEPT_ARRAY_SUFFIXES) and item_type in _SCALAR_FORMATS and count <= 4096):
            return [_read_value(r, item_type, key) for _ in range(count)]
        if item_type == STRING:
            r.skip_strings(count)
        elif item_type in _SCALAR_FORMATS:
            r.skip(count * struct.calcsize(_SCALAR_FORMATS[item_type]))
        else:  # arrays of arrays exist in the format but not in any model header we need
            for _ in range(count):
                _read_value(r, item_type, key)
        return SkippedArray(item_type, count)
    fmt = _SCALAR_FORMATS.get(vtype)
    if fmt is None:
        raise GgufHeaderError(f"{r.where} has a corrupt header (unknown value type {vtype} for {key}); "
                              "download it again")
    return r.unpack(fmt, struct.calcsize(fmt))


def read_header(f: BinaryIO, where: str = "the file", tensors: bool = False) -> GgufHeader:
    """Parse magic, version, counts and every key/value; stop before the tensor descriptions (or, with
    `tensors`, after them: names, shapes and types, still no weights)."""
    r = _ChunkReader(f, where)
    version = _read_preamble(r, where)
    n_tensors = r.unpack("<Q", 8)
    n_kv = r.unpack("<Q", 8)
    if n_kv > MAX_KV_COUNT:
        raise GgufHeaderError(f"{where} has a corrupt header ({n_kv} keys); download it again")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string()
        vtype = r.unpack("<I", 4)
        metadata[key] = _read_value(r, vtype, key)
    header_bytes = r.offset
    infos = [_read_tensor_info(r, where) for _ in range(n_tensors)] if tensors else None
    align = int(metadata.get("general.alignment", 32) or 32)
    data_start = -(-r.offset // align) * align if tensors else 0
    return GgufHeader(version, n_tensors, metadata, header_bytes=header_bytes, bytes_read=r.bytes_read, tensors=infos,
                      data_start=data_start)


def _read_tensor_info(r: _ChunkReader, where: str) -> TensorInfo:
    name = r.string()
    n_dims = r.unpack("<I", 4)
    if n_dims > MAX_TENSOR_DIMS:
        raise GgufHeaderError(f"{where} has a corrupt header ({n_dims} dimensions in {name}); download it again")
    shape = tuple(r.unpack("<Q", 8) for _ in range(n_dims))
    ggml_type = r.unpack("<I", 4)
    return TensorInfo(name, shape, ggml_type, r.unpack("<Q", 8))


def _read_preamble(r: _ChunkReader, where: str) -> int:
    """Magic and version: what tells a GGUF file from anything else. Returns the version."""
    try:
        magic = r.take(4)
    except GgufHeaderError:
        raise GgufHeaderError(f"{where} is not a GGUF model file (it is empty or shorter than 4 bytes); "
                              "pass a .gguf file") from None
    if magic != GGUF_MAGIC:
        raise GgufHeaderError(f"{where} is not a GGUF model file (it starts with {magic!r}); pass a .gguf file")
    version = r.unpack("<I", 4)
    if version not in SUPPORTED_VERSIONS:
        if version > 0xFFFF:  # byte-swapped: a big-endian GGUF (s390x conversions)
            raise GgufHeaderError(f"{where} is a big-endian GGUF; use the little-endian file")
        raise GgufHeaderError(f"{where} uses GGUF version {version}; only versions 2 and 3 are supported "
                              "(reconvert it with a current llama.cpp)")
    return version


MIN_MODEL_BYTES = 1024  # a real model is far larger; anything smaller was cut short


def check_model_file(path: str | os.PathLike) -> None:
    """Fail with one actionable line before llama.cpp sees a file it would choke on (it aborts or
    prints pages of log): missing, a directory, not GGUF, an unsupported version, truncated."""
    path = Path(path)
    if path.is_dir():
        raise GgufHeaderError(f"{path} is a directory; pass the .gguf file inside it")
    try:
        with open(path, "rb") as f:
            _read_preamble(_ChunkReader(f, str(path)), str(path))
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise GgufHeaderError(f"model file not found: {path}") from None
    if size < MIN_MODEL_BYTES:
        raise GgufHeaderError(f"{path} is truncated ({size} bytes); download it again")


def read_header_file(path: str | os.PathLike) -> GgufHeader:
    """The file's header, parsed once per process while its size and modification time stay the same: a large
    vocabulary is slow to walk in Python, and a load and the router read it several times (docs/BENCHMARKS.md,
    "Several models behind one server")."""
    path = Path(path)
    if path.is_dir():
        raise GgufHeaderError(f"{path} is a directory; pass the .gguf file inside it")
    try:
        st = path.stat()
        return _read_header_once(str(path), st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        raise GgufHeaderError(f"model file not found: {path}") from None


@functools.lru_cache(maxsize=64)
def _read_header_once(path: str, size: int, mtime_ns: int, tensors: bool = False) -> GgufHeader:
    with open(path, "rb") as f:
        return read_header(f, path, tensors=tensors)


def read_layout_file(path: str | os.PathLike) -> GgufHeader:
    """The header with its tensor descriptions (what placement.py sizes a load by), cached as read_header_file."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise GgufHeaderError(f"model file not found: {path}") from None
    return _read_header_once(str(path), st.st_size, st.st_mtime_ns, True)


def require_language_model(header: GgufHeader, where: str) -> None:
    """A speculative pair needs two text models with a vocabulary; say what the file is otherwise."""
    arch = header.architecture
    kind = header.get("general.type")
    if kind == "adapter":
        raise GgufHeaderError(f"{where} is a {header.get('adapter.type', 'LoRA')} adapter, not a language model; "
                              "pass the base model's .gguf")
    if arch == "clip" or kind == "mmproj":
        raise GgufHeaderError(f"{where} is a multimodal projector (mmproj), not a language model; "
                              "pass the text model's .gguf")
    if not arch:
        raise GgufHeaderError(f"{where} is a GGUF file but not a language model (no general.architecture); "
                              "pass a model .gguf")
    tokens = header.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise GgufHeaderError(f"{where} is a GGUF {arch} file without a tokenizer, not a language model "
                              "llama.cpp can chat with; pass a model .gguf that embeds its vocabulary")


def vocab_fields(header: GgufHeader, where: str = "the file") -> dict[str, Any]:
    """The fields llama.cpp's compatibility rules look at (compat.VocabInfo's), with llama.cpp's
    defaults for absent keys."""
    require_language_model(header, where)
    tokenizer_model = header.get("tokenizer.ggml.model", "llama")
    vocab_type = VOCAB_TYPES.get(tokenizer_model, tokenizer_model)
    default_bos, default_eos = DEFAULT_BOS_EOS.get(vocab_type, (-1, -1))
    tokens = header.get("tokenizer.ggml.tokens")
    return {
        "vocab_type": vocab_type,
        "n_tokens": len(tokens),
        "bos": int(header.get("tokenizer.ggml.bos_token_id", default_bos)),
        "eos": int(header.get("tokenizer.ggml.eos_token_id", default_eos)),
        "add_bos": bool(header.get("tokenizer.ggml.add_bos_token", vocab_type == "spm")),
        "token_text": tokens,
    }
