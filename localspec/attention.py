"""Which attention kernel a CPU runs under `-fa auto`: llama.cpp's flash attention or its plain one,
measured once per (model, threads, build) and stored in the data dir.

Neither wins on every CPU, nor at every depth. Flash attention decodes a few percent faster at a
short chat's depth on both CPUs measured here (the Xeon ~2-5%, the EPYC 1-3%), and from a few hundred
tokens deep it verifies long passes slower: the Xeon 4-5% 1,000 deep, the EPYC 5.6% 512 deep and 17%
1,024 deep, where its decodes are 11% slower too. Every answer pays its decodes (a chat with nothing to
draft is where llama-server, whose CPU default is flash attention, is matched or not); a long verify
pass deep is what a copied file's answer pays. So flash attention when it decodes faster 64 deep (by
MARGIN) AND its 16-token passes 512 deep lose no more than that gain; the plain kernel otherwise. The
first load measures it (~3.5 s; ~15 s more where the decode check favours flash attention), stored per
(model, threads, build); `-fa on|off` chooses without measuring.
"""

from __future__ import annotations

import hashlib
import json
from statistics import median

from . import paths
from .backend import Context, Model
from .costmodel import timed_pass

DEPTH = 64  # tokens in the cache while decodes are timed (a short chat; flash attention gains most there)
DECODES = 20  # timed decodes per kernel, alternating
MARGIN = 0.01  # flash attention must decode this much faster (measured 1.8-2.6% on the Xeon, 4 runs)
# ... and its deep passes lose no more than that (the EPYC's decode gain, 0.9% and 2.4% in two first
# loads, alone chose either kernel; with flash attention its edits fell from 2.2x to 1.97x llama-server)
DEEP = 512  # tokens in the cache while the long passes are timed (a copied file's depth, and cheap to reach)
PASS = 16  # tokens in a timed pass (a long draft's verify)
PASSES = 6  # timed passes per kernel, alternating
MIN_PARAMS = 100_000_000  # smaller models (the tests' tiny ones): the plain kernel, nothing measured
KERNELS = ("off", "on")


def cpu_kernel(model: Model, n_threads: int, n_threads_batch: int, notify=None) -> str:
    """"on" or "off" for this model on this CPU: the stored choice, or measured now (once: ~3.5 s, and
    ~15 s more on a CPU whose flash attention decodes faster). notify(message): where that is said."""
    if model.L.llama_model_n_params(model.ptr) < MIN_PARAMS:
        return "off"
    path = _path(model, n_threads)
    try:
        stored = json.loads(path.read_text())["flash_attn"]
        if stored in KERNELS:
            return stored
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or unreadable: measured again
    if notify is not None:
        notify("measuring which attention kernel runs faster on this CPU (once, 4-20 s)...")
    ms = decode_ms(model, n_threads, n_threads_batch)
    record = {"decode_ms": ms, "depth": DEPTH}
    choice = "off"
    if ms["on"] < ms["off"] * (1 - MARGIN):
        deep = pass_ms(model, n_threads, n_threads_batch)
        record |= {"pass_ms": deep, "pass_tokens": PASS, "pass_depth": DEEP}
        choice = "on" if deep["on"] / deep["off"] <= ms["off"] / ms["on"] else "off"
    try:
        paths.write_atomic(path, json.dumps({"flash_attn": choice, **record}))
    except OSError:
        pass  # an unwritable data dir: measured again next time
    return choice


def _timed(model: Model, n_threads: int, n_threads_batch: int, depth: int, tokens: int, repeats: int,
           logits: str) -> dict[str, float]:
    """Median ms of a pass of `tokens` tokens `depth` deep with each kernel, the two alternating (each
    pass rolled back, so every one starts at the same depth)."""
    ctxs = {k: Context(model, depth + tokens + 64, 512, n_threads, n_threads_batch, flash_attn=k)
            for k in KERNELS}
    try:
        text = model.tokenize("def fibonacci(n):\n    " * (depth + tokens), add_special=False)
        prompt, probe = text[:depth], text[depth:depth + tokens]
        for ctx in ctxs.values():
            ctx.eval(prompt, logits="none")
        times: dict[str, list[float]] = {k: [] for k in KERNELS}
        for i in range(repeats):
            for k in KERNELS if i % 2 else KERNELS[::-1]:
                times[k].append(timed_pass(ctxs[k], probe, logits))
        return {k: round(median(v) * 1000, 3) for k, v in times.items()}
    finally:
        for ctx in ctxs.values():
            ctx.close()


def decode_ms(model: Model, n_threads: int, n_threads_batch: int) -> dict[str, float]:
    """Median ms of a decode DEPTH tokens deep with each kernel."""
    return _timed(model, n_threads, n_threads_batch, DEPTH, 1, DECODES, "last")


def pass_ms(model: Model, n_threads: int, n_threads_batch: int) -> dict[str, float]:
    """Median ms of a PASS-token verify pass DEEP tokens deep with each kernel."""
    return _timed(model, n_threads, n_threads_batch, DEEP, PASS, PASSES, "all")


def _path(model: Model, n_threads: int):
    from .backend import system_info
    from .tuning import file_id

    key = json.dumps({"model": file_id(model.path), "threads": n_threads,
                      "llama_cpp_python": system_info()["llama_cpp_python"]}, sort_keys=True)
    return paths.profiles_dir() / f"attention-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
