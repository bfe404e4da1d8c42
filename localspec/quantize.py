"""Requantize a draft model to Q4_0 with llama.cpp (`llama_model_quantize`).

On x86 and ARM CPUs llama.cpp repacks Q4_0 weights into its interleaved CPU layout at load time,
which makes a Q4_0 draft noticeably cheaper per token than Q8_0/Q4_K (docs/BENCHMARKS.md, "Figures
behind the code's rules"). Cheaper drafts move the break-even acceptance down; whether the
coarser weights cost acceptance is measured before the file is recommended (`localspec tune`).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from . import paths
from .backend import llama
from .errors import LocalspecError
from .models.gguf_header import check_model_file

LLAMA_FTYPE_MOSTLY_Q4_0 = 2


def q4_0_path_for(src: Path) -> Path:
    return paths.models_dir() / f"{src.stem}.q4_0.gguf"


def quantize_q4_0(src: Path, dst: Path | None = None, threads: int | None = None) -> Path:
    """Write a Q4_0 copy of `src` (temp file, then rename: never a half-written model)."""
    L = llama()
    src = Path(src)
    check_model_file(src)
    dst = Path(dst) if dst else q4_0_path_for(src)
    if dst.exists():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".partial")
    params = L.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPE_MOSTLY_Q4_0
    params.nthread = threads or (os.cpu_count() or 1)
    params.allow_requantize = True  # the shipped draft is already Q4_K_M; llama.cpp refuses without this
    rc = L.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        raise LocalspecError(f"llama.cpp could not quantize {src.name} (code {rc}); check free disk space "
                             "(LOCALSPEC_DEBUG=1 shows llama.cpp's reason)")
    tmp.replace(dst)
    return dst
