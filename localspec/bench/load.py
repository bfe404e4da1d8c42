"""Busy background processes for `localspec bench --background-load N`: laptops always run something
else, so robustness to it is measured like speed. Each process spins one core in pure Python
(`while True: pass`, the load the speed issue was measured with), ends by itself after `limit_s`,
and is killed when the bench finishes or fails."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

SPIN = "import time\nend = time.time() + {limit}\nwhile time.time() < end:\n    pass\n"


@contextmanager
def background_load(n: int, limit_s: float = 3600.0) -> Iterator[list[subprocess.Popen]]:
    procs = [subprocess.Popen([sys.executable, "-c", SPIN.format(limit=limit_s)], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
