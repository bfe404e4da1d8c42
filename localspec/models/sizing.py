"""How much context a load asks for: KV bytes per token from the GGUF headers, and the largest context whose
KV caches fit a share of the memory (`serve` without -c; the router sizes every model it loads by it)."""

from __future__ import annotations

from ..machine import memory_bytes
from .gguf_header import read_header_file
from .placement import kv_per_token

SERVE_CTX_FIT = 32768  # a server's context without -c: Claude Code's first prompt alone is ~19k tokens
KV_MEMORY_SHARE = 0.25  # of the memory available at start, at most this for the KV caches a fitted context takes


def kv_bytes_per_token(paths: list) -> tuple[int, int]:
    """(KV bytes one token of context takes in every model listed, f16; the first model's trained context)."""
    per_token, trained = 0, 0
    for i, path in enumerate(paths):
        h = read_header_file(path)
        arch = h.architecture or ""
        per_token += sum(kv_per_token(h, int(h.get(f"{arch}.block_count", 0) or 0)))
        if i == 0:
            trained = h.get(f"{arch}.context_length", 0) or 0
    return per_token, trained


def fit_tokens(per_token: int, trained: int, ceiling: int, room: int | None = None) -> int:
    """The largest context (a multiple of 256, up to `ceiling` and the trained one) whose KV caches take at most
    KV_MEMORY_SHARE of `room` bytes (default: the memory available now)."""
    if room is None:
        room = memory_bytes()["available"] or 8 << 30  # unknown (not Linux, not macOS): 8 GiB assumed
    fits = int(room * KV_MEMORY_SHARE // per_token) if per_token else ceiling
    return max(256, min(ceiling, trained or ceiling, fits) // 256 * 256)
