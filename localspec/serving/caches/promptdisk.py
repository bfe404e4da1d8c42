"""Saved prompts on disk: an agent's long prompt is evaluated once per machine, not once per server start.

Claude Code's first request is ~19k tokens (system prompt and tools) and every later one, in every
session, starts with the same ones; on a laptop CPU that prefix costs minutes to evaluate. After a
request that evaluated a long prompt, the target's KV state (llama_state_seq_get_data) is written here
under the data root, with the exact tokens it holds; a later request, in this process or after a
restart, restores the entry that shares the longest prefix with its prompt and evaluates only the rest.

Each entry is two files: `<id>.kv` (the state, then a recurrent model's checkpoints within it) and
`<id>.json` (format, the pair's key, the tokens, the byte count, a CRC-32 and where the checkpoints are),
written whole or not at all (temporary names, renamed; the .json last,
so an entry exists only once complete). An entry whose key, size or checksum does not match is deleted,
never loaded. The directory is bounded (`budget_bytes`): the least recently used entries go first.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...backend import common_prefix
from ...backend.passes import Cuts
from ...backend.rollback import Checkpoints
from ...paths import write_atomic

FORMAT = 1
SAVE_MIN = 1024  # a prompt is saved once a request had to evaluate at least this many tokens of it


@dataclass
class DiskEntry:
    path: Path  # the .kv file
    tokens: list[int]
    size: int
    crc: int
    cuts: Cuts = field(default_factory=Cuts)  # how its rows were computed (a prompt reuses them by these)
    ckpts: list[tuple[int, int]] = field(default_factory=list)  # (position, bytes) of each checkpoint after the state


def pair_key(target_path: str, flash_attn: str = "auto", exact: bool = False) -> str:
    """What a saved state depends on: the model file (name and size), the llama.cpp build, flash
    attention when set (without it llama.cpp stores V transposed, and refuses the other layout), and
    --exact's cache type (bf16, computed by other kernels)."""
    try:
        import llama_cpp
        build = getattr(llama_cpp, "__version__", "?")
    except ImportError:  # pragma: no cover
        build = "?"
    p = Path(target_path)
    size = p.stat().st_size if p.exists() else 0
    return (f"{p.name}:{size}:llama-cpp-python {build}" + ("" if flash_attn == "auto" else f":fa {flash_attn}")
            + (":exact" if exact else ""))


class DiskPrompts:
    def __init__(self, root: Path, key: str, budget_bytes: int, warn=None):
        """warn(message): where a damaged entry, dropped, is reported (default: stderr)."""
        self.root, self.key, self.budget = Path(root), key, budget_bytes
        self.warn = warn or (lambda message: sys.stderr.write(f"localspec: {message}\n"))
        self.dir = self.root / hashlib.sha256(key.encode()).hexdigest()[:16]
        self.entries: list[DiskEntry] | None = None  # read on first use
        self.lock = threading.Lock()
        self.writer: threading.Thread | None = None

    def _index(self) -> list[DiskEntry]:
        if self.entries is None:
            self.entries = []
            for tmp in self.dir.glob(".*.tmp") if self.dir.is_dir() else []:  # a write a kill cut short
                tmp.unlink(missing_ok=True)
            for meta in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []:
                entry = self._read_meta(meta)
                if entry is not None:
                    self.entries.append(entry)
        return self.entries

    def _read_meta(self, meta: Path) -> DiskEntry | None:
        try:
            m = json.loads(meta.read_text(encoding="utf-8"))
            if not isinstance(m, dict):
                raise ValueError(f"a JSON {type(m).__name__}, not an entry")
            kv = meta.with_suffix(".kv")
            if m.get("format") != FORMAT or m.get("key") != self.key or kv.stat().st_size != m["bytes"]:
                raise ValueError("another format, pair or size")
            ckpts = [(int(p), int(n)) for p, n in m.get("ckpts", [])]
            if sum(n for _, n in ckpts) >= int(m["bytes"]):
                raise ValueError("checkpoints larger than the entry")
            return DiskEntry(kv, [int(t) for t in m["tokens"]], int(m["bytes"]), int(m["crc32"]),
                             Cuts.from_json(m.get("cuts")), ckpts)
        except (OSError, ValueError, KeyError, TypeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
            self.warn(f"dropping the saved prompt {meta} ({why}); its prompt is evaluated again")
            self._drop(meta.with_suffix(".kv"))
            return None

    def best(self, tokens: list[int]) -> tuple[DiskEntry | None, int]:
        """The entry sharing the longest prefix with `tokens`, and that length."""
        with self.lock:
            found, n = None, 0
            for e in self._index():
                k = common_prefix(e.tokens, tokens)
                if k > n:
                    found, n = e, k
            return found, n

    def load(self, entry: DiskEntry) -> tuple[object, Checkpoints] | tuple[None, None]:
        """The entry's state (a ctypes byte array, as Context.snapshot gives) and checkpoints, verified;
        (None, None), and the entry deleted, when it does not check out."""
        try:
            buf = (ctypes.c_uint8 * entry.size)()
            with open(entry.path, "rb") as f:
                whole = f.readinto(buf) == entry.size and not f.read(1)
            if whole and zlib.crc32(buf) == entry.crc:
                os.utime(entry.path)  # recently used: the last to go
                return _split(buf, entry.ckpts)
        except OSError:
            pass
        self.warn(f"dropping the saved prompt {entry.path} (truncated or damaged); its prompt is evaluated again")
        with self.lock:
            self._drop(entry.path)
        return None, None

    def covered(self, tokens: list[int]) -> bool:
        return any(common_prefix(e.tokens, tokens) == len(tokens) for e in self._index())

    def save(self, tokens: list[int], state, cuts: Cuts | None = None, ckpts: Checkpoints | None = None) -> None:
        """Write the state in a background thread (the next request need not wait for the disk)."""
        items = ckpts.items if ckpts is not None else []
        with self.lock:
            if not tokens or self.covered(tokens) or len(state) + sum(len(c) for _, c in items) > self.budget:
                return
        data = bytes(state) + b"".join(bytes(c) for _, c in items)  # copies: the context's buffers change
        where = [(p, len(c)) for p, c in items]
        self.wait()
        self.writer = threading.Thread(target=self._write, args=(list(tokens), data, cuts or Cuts(), where),
                                       name="localspec-save-prompt", daemon=True)
        self.writer.start()

    def wait(self) -> None:
        if self.writer is not None:
            self.writer.join()

    def _write(self, tokens: list[int], data: bytes, cuts: Cuts, where: list[tuple[int, int]]) -> None:
        name = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:24]
        kv = self.dir / f"{name}.kv"
        meta = {"format": FORMAT, "key": self.key, "bytes": len(data), "crc32": zlib.crc32(data), "tokens": tokens,
                "cuts": cuts.to_json(), "ckpts": where}
        try:
            write_atomic(kv, data)
            write_atomic(kv.with_suffix(".json"), json.dumps(meta))
        except OSError:  # a full or unwritable disk: this prompt is simply not kept
            self._drop(kv)
            return
        with self.lock:
            entries = self._index()
            for e in [e for e in entries if e.path != kv and common_prefix(e.tokens, tokens) == len(e.tokens)]:
                self._drop(e.path)  # the new entry covers the ones its tokens start with
            entries[:] = [e for e in entries if e.path != kv] + [DiskEntry(kv, tokens, len(data), meta["crc32"], cuts,
                                                                           where)]
            self._trim(entries)

    def _trim(self, entries: list[DiskEntry]) -> None:
        def used(e: DiskEntry) -> float:
            try:
                return e.path.stat().st_mtime
            except OSError:
                return 0.0
        while sum(e.size for e in entries) > self.budget and len(entries) > 1:
            oldest = min(entries, key=used)
            self._drop(oldest.path)

    def _drop(self, kv: Path) -> None:
        for p in (kv.with_suffix(".json"), kv):
            try:
                p.unlink()
            except OSError:
                pass
        if self.entries is not None:
            self.entries[:] = [e for e in self.entries if e.path != kv]


def _split(buf, where: list[tuple[int, int]]) -> tuple[object, Checkpoints]:
    """An entry's bytes as its state and its checkpoints (views of the one buffer, no copies)."""
    end = len(buf) - sum(n for _, n in where)
    state, ckpts = (ctypes.c_uint8 * end).from_buffer(buf), Checkpoints()
    for pos, n in where:
        ckpts.items.append((pos, np.frombuffer(buf, np.uint8, n, end)))
        end += n
    return state, ckpts
