"""Batch-invariant kernels for `--exact`: a row of a verify pass gets the same bits as a single-token decode.

llama.cpp's CPU kernels differ by batch size, so a batched row can part from a single-token decode at a
near-tie (docs/EXACT.md says which kernels and why). These choices make every row's arithmetic independent
of the batch, the thread count and how a prompt was split:
- the weights in their file layout (no repacking: repacked K-quants use one kernel for 1-3 rows, another
  for 4 and more), multiplied by llama.cpp's per-row dot products (its tiled K-quant kernel, taken from 8
  rows, turned off through GGML_CPU_TILED_MM before the first multiplication in the process);
- flash attention over a bf16 KV cache: for f16 or f32 caches llama.cpp splits a single token's attention
  across threads and tiles batches, while for other cache types every query row runs the same loop.
The weights' types matter too: llama.cpp's llamafile kernels (compiled in, not switchable) take Q8_0, Q4_0,
Q5_0, IQ4_NL, F16 and F32 weights from two rows, so --exact needs K-quant weights (Q4_K_M, Q5_K_M, Q6_K...).
Whether it holds is measured when the engine loads (`invariance_gap`), never assumed.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import ConfigError

TILED_MM_ENV = "GGML_CPU_TILED_MM"
KV_TYPE = "bf16"
FLASH_ATTN = "on"
PROBE_TEXT = ("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
              "The quick brown fox jumps over the lazy dog; then it naps in the warm afternoon sun.")
PROBE_ROWS = 9  # past the tiled kernel's 8 rows and repacking's 4


def use_batch_invariant_kernels() -> None:
    """Turn llama.cpp's tiled K-quant kernel off for this process (read once, at the first multiplication)."""
    os.environ[TILED_MM_ENV] = "0"


def invariance_gap(ctx, tokens: list[int], rows: int = PROBE_ROWS) -> float:
    """Largest |logit difference| between one pass over the last `rows` tokens and single-token decodes
    of the same tokens (0.0: bit-identical). Uses and then clears sequence 0 of `ctx`."""
    head, tail = tokens[:-rows], tokens[-rows:]
    try:
        ctx.sync(head)
        batched = ctx.eval(tail, logits="all")
        ctx.truncate(len(head))
        single = np.stack([ctx.eval([t], logits="last")[0] for t in tail])
    finally:
        ctx.clear()
    return float(np.abs(batched - single).max())


def require_batch_invariance(ctx, model, on_gpu: bool) -> None:
    """ConfigError unless a batched row of `model` in `ctx` has a single-token decode's bits."""
    gap = invariance_gap(ctx, model.tokenize(PROBE_TEXT))
    if gap == 0.0:
        return
    why = ("its GPU kernels differ by batch size; add -ngl 0" if on_gpu else
           "it needs K-quant weights (Q4_K_M, Q5_K_M, Q6_K) and a process that had not decoded before")
    raise ConfigError(f"--exact: a batched row of {model.path.name} differs from a single-token decode by "
                      f"{gap:.3g} logits on this build ({why}); run without --exact")
