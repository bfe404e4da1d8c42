"""Running `tests/exact_run.py` in a fresh process (llama.cpp reads its kernel switch once per process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import THREADS

HERE = Path(__file__).resolve().parent


def exact_run(model: Path, mode: str, threads: int = THREADS, draft: Path | None = None) -> dict:
    r = subprocess.run([sys.executable, str(HERE / "exact_run.py"), str(model), mode, str(threads),
                        *([str(draft)] if draft else [])],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)
