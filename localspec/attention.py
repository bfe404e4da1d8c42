"""Which attention kernel a CPU runs under `-fa auto`: llama.cpp's flash attention or its plain one,
measured once per (model, threads, build) and stored in the data dir.

Neither wins on every CPU. On a 2-core AMD EPYC the plain kernel decoded as fast at a chat's depth and
verified long drafts 20-24% faster 1,000 deep; on a 2-core Intel Xeon (AVX-512) flash attention decodes
~5% faster (chat against llama-server plain: 1.01x with it, 0.95x without) and verifies long passes
4-5% slower (whole-file edits 3.2x instead of 3.7x plain). Every answer pays its decodes; a long verify
pass is only paid where drafts are being accepted, which is where the lead is large anyway; a chat
with nothing to draft is where llama-server is matched or not. So: flash attention when it decodes
faster at a short chat's depth (the difference is largest there: 64 deep, 20 decodes each, ~3.5 s on
the first load), the plain kernel otherwise. A CPU whose flash attention decodes faster but verifies
long passes much slower would lose part of its lead on edits, and deep contexts pay (the Xeon, 4,096
deep: a decode 9% slower with flash attention, llama-server's own kernel there); `-fa off` keeps the
plain kernel.
"""

from __future__ import annotations

import hashlib
import json
import time
from statistics import median

from . import paths
from .backend import Context, Model

DEPTH = 64  # tokens in the cache while decodes are timed (a short chat; the kernels part most there)
DECODES = 20  # timed decodes per kernel, alternating
MARGIN = 0.01  # flash attention must decode this much faster (measured 1.8-2.6% on the Xeon, 4 runs)
MIN_PARAMS = 100_000_000  # smaller models (the tests' tiny ones): the plain kernel, nothing measured
KERNELS = ("off", "on")


def cpu_kernel(model: Model, n_threads: int, n_threads_batch: int) -> str:
    """"on" or "off" for this model on this CPU: the stored choice, or measured now (~2-4 s, once)."""
    if model.L.llama_model_n_params(model.ptr) < MIN_PARAMS:
        return "off"
    path = _path(model, n_threads)
    try:
        stored = json.loads(path.read_text())["flash_attn"]
        if stored in KERNELS:
            return stored
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or unreadable: measured again
    ms = decode_ms(model, n_threads, n_threads_batch)
    choice = "on" if ms["on"] < ms["off"] * (1 - MARGIN) else "off"
    try:
        paths.write_atomic(path, json.dumps({"flash_attn": choice, "decode_ms": ms, "depth": DEPTH}))
    except OSError:
        pass  # an unwritable data dir: measured again next time
    return choice


def decode_ms(model: Model, n_threads: int, n_threads_batch: int) -> dict[str, float]:
    """Median ms of a decode DEPTH tokens deep with each kernel, the two alternating."""
    ctxs = {k: Context(model, 512, 256, n_threads, n_threads_batch, flash_attn=k) for k in KERNELS}
    try:
        prompt = model.tokenize("def fibonacci(n):\n    " * DEPTH, add_special=False)[:DEPTH]
        for ctx in ctxs.values():
            ctx.eval(prompt)
        times: dict[str, list[float]] = {k: [] for k in KERNELS}
        for i in range(DECODES):
            for k in KERNELS if i % 2 else KERNELS[::-1]:
                t0 = time.perf_counter()
                ctxs[k].eval([prompt[i % len(prompt)]])
                times[k].append(time.perf_counter() - t0)
        return {k: round(median(v) * 1000, 3) for k, v in times.items()}
    finally:
        for ctx in ctxs.values():
            ctx.close()


def _path(model: Model, n_threads: int):
    from .backend import system_info
    from .tuning import _file_id

    key = json.dumps({"model": _file_id(model.path), "threads": n_threads,
                      "llama_cpp_python": system_info()["llama_cpp_python"]}, sort_keys=True)
    return paths.profiles_dir() / f"attention-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
