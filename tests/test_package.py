"""The package's import: llama.cpp's library before numpy."""

from __future__ import annotations

import subprocess
import sys


def test_llama_cpp_library_loads_before_numpy():
    """With numpy imported first a CUDA build crashed loading any model (docs/MODELS.md), so
    `import localspec` loads llama.cpp's library before anything imports numpy."""
    code = ("import sys, localspec; names = list(sys.modules); "
            "print(names.index('llama_cpp.llama_cpp') < names.index('numpy'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr
