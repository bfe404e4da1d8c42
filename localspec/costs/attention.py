"""Which attention kernel a CPU runs under `-fa auto`: llama.cpp's flash attention or its plain one.

Neither wins on every CPU, nor at every depth: flash attention tends to decode a little faster at a short
chat's depth and to verify long passes slower deep (docs/BENCHMARKS.md, "Figures behind the code's
rules"). A chat's every token is a decode, where llama-server (whose CPU kernel is flash attention) is
matched or not, since nothing else speeds it up; a copied file's tokens come ~16 to a verify pass, deep.
So the two are weighed per token of the answer the user waits for: a chat token's gain (a decode 64
deep) against a copied token's loss (1/16 of a 16-token pass 1,024 deep), and the decodes of a long
conversation (1,024 deep). Flash attention when it decodes faster shallow (by MARGIN), no more than
DEEP_TIE slower deep, and a copied token loses less than COPY_TIE chat tokens gain: within that the two
cost the user about the same and llama-server's kernel keeps plain decoding level with it.

Until a CPU is measured it runs llama-server's choice; the measurement runs when the machine is idle (a
server's idle time, the chat app after a reply), is given up for any request, is kept only if no other
program used the cores meanwhile, and is stored per (model, threads, build) for the next load;
`-fa on|off` chooses without measuring.
"""

from __future__ import annotations

import hashlib
import json
from statistics import median

from .. import paths
from ..backend import Context, Model
from ..errors import PassInterrupted
from .costmodel import timed_pass

DEPTH = 64  # tokens in the cache while decodes are timed (a short chat; flash attention gains most there)
DECODES = 20  # timed decodes per kernel, alternating
MARGIN = 0.01  # flash attention must decode this much faster shallow: a smaller gain is noise between loads
DEEP_TIE = 0.03  # ... and no more than this slower DEEP
COPY_TIE = 2.0  # ... and a copied token lose less than this many chat tokens gain
DEEP = 1024  # tokens in the cache while long passes and deep decodes are timed (a copied file's depth)
PASS = 16  # tokens in a timed pass (a long draft's verify; a copied token's share of it is 1/PASS)
PASSES = 6  # timed passes per kernel, alternating
DEEP_DECODES = 10  # timed decodes per kernel at DEEP, alternating
RULE = 2  # the rule's version, in the stored file's key: a new rule measures again
MIN_PARAMS = 100_000_000  # smaller models (the tests' tiny ones): the plain kernel, nothing measured
KERNELS = ("off", "on")
FILL_SLICE = 64  # tokens a pass while the deep cache fills: each given up inside llama_decode when asked
SERVER_CHOICE = "on"  # llama-server's -fa auto on a CPU: flash attention, what runs until this CPU is measured


def cpu_kernel(model: Model, n_threads: int, n_threads_batch: int) -> str:
    """"on" or "off" for this model on this CPU: the stored choice, else llama-server's (SERVER_CHOICE) until
    `measure_kernel` has measured this CPU while it was idle: a first answer never waits for the measurement."""
    if model.L.llama_model_n_params(model.ptr) < MIN_PARAMS:
        return "off"
    return stored_kernel(model, n_threads) or SERVER_CHOICE


def stored_kernel(model: Model, n_threads: int) -> str | None:
    try:
        stored = json.loads(_path(model, n_threads).read_text())["flash_attn"]
        return stored if stored in KERNELS else None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none yet, or unreadable: measured again


def kernel_pending(model: Model, n_threads: int) -> bool:
    """Is this CPU's kernel for `model` still to be measured?"""
    return model.L.llama_model_n_params(model.ptr) >= MIN_PARAMS and stored_kernel(model, n_threads) is None


def measure_kernel(model: Model, n_threads: int, n_threads_batch: int, stop=None, busy=None) -> str | None:
    """Measure which kernel pays on this CPU (a few seconds; longer where flash attention decodes faster)
    and store it. None, nothing stored, when `stop()` (asked between passes) ended it or `busy()` says other
    programs used the cores meanwhile: a figure measured on a busy machine is not this machine's."""
    key = (str(_path(model, n_threads)), n_threads_batch)
    stages = _STAGES.setdefault(key, {})  # kept when a later stage gives way: the next attempt goes on from there
    try:
        if "decode" not in stages:
            stages["decode"] = decode_ms(model, n_threads, n_threads_batch, stop)
        ms, choice = stages["decode"], "off"
        record = {"decode_ms": ms, "depth": DEPTH}
        if ms["on"] < ms["off"] * (1 - MARGIN):
            if "deep" not in stages:
                stages["deep"] = deep_ms(model, n_threads, n_threads_batch, stop)
            record |= {"deep_ms": stages["deep"], "pass_tokens": PASS, "deep_depth": DEEP}
            choice = "on" if flash_pays(ms, stages["deep"]) else "off"
    except Stopped:
        return None
    finally:
        if busy is not None and busy():  # measured beside another program: not this machine's figures
            _STAGES.pop(key, None)
            stages.clear()
    if not stages:
        return None
    _STAGES.pop(key, None)
    try:
        paths.write_atomic(_path(model, n_threads), json.dumps({"flash_attn": choice, **record}))
    except OSError:
        pass  # an unwritable data dir: measured again next time
    return choice


def engine_pending(engine) -> bool:
    """Does this loaded engine run llama-server's kernel on a CPU not measured yet (so `measure_for` pays)?"""
    load = engine.load
    return (load.flash_attn == "auto" and not load.exact and not engine.on_gpu(load)
            and kernel_pending(engine.target_model, load.n_threads))


def measure_for(engine, stop=None, busy=None) -> str | None:
    """measure_kernel for a loaded engine whose kernel is still to be measured (None otherwise), on the thread
    that decodes (serving/batching.py says why only one may); the choice applies from the next load."""
    if not engine_pending(engine):
        return None
    load = engine.load
    return engine.on_decode_thread(lambda: measure_kernel(engine.target_model, load.n_threads, load.n_threads_batch,
                                                  stop, busy))


_STAGES: dict[tuple, dict] = {}  # stages of a measurement that gave way, per (model, threads): kept in memory


class Stopped(Exception):
    """A measurement given up for a request (or another program) that needs the cores."""


def flash_pays(shallow: dict[str, float], deep: dict[str, dict[str, float]]) -> bool:
    """Given flash attention decodes faster shallow (ms a decode per kernel) and the DEEP figures ({"pass":
    ms a PASS-token pass, "decode": ms a decode}): whether its deep decodes are within DEEP_TIE and a copied
    token (1/PASS of a long pass) loses less with it than COPY_TIE chat tokens gain."""
    chat_gain = shallow["off"] - shallow["on"]
    copy_loss = (deep["pass"]["on"] - deep["pass"]["off"]) / PASS
    return deep["decode"]["on"] <= deep["decode"]["off"] * (1 + DEEP_TIE) and copy_loss <= COPY_TIE * chat_gain


def _timed(model: Model, n_threads: int, n_threads_batch: int, depth: int,
           probes: dict[str, tuple[int, int, str]], stop=None) -> dict[str, dict[str, float]]:
    """{probe: {kernel: median ms}}: each probe (tokens, repeats, logits) is a pass of `tokens` tokens
    `depth` deep, with each kernel, the two alternating (each pass rolled back, so every one starts at
    the same depth); one fill per kernel serves every probe."""
    longest = max(tokens for tokens, _, _ in probes.values())
    ctxs = {k: Context(model, depth + longest + 64, 512, n_threads, n_threads_batch, flash_attn=k)
            for k in KERNELS}
    try:
        text = model.tokenize("def fibonacci(n):\n    " * (depth + longest), add_special=False)
        prompt, probe = text[:depth], text[depth:depth + longest]
        for ctx in ctxs.values():  # in slices a request or another program stops within one of them
            for i in range(0, len(prompt), FILL_SLICE):
                if stop is not None and stop():
                    raise Stopped()
                try:
                    ctx.eval(prompt[i:i + FILL_SLICE], logits="none", stop=stop)
                except PassInterrupted:
                    raise Stopped() from None
        out = {}
        for name, (tokens, repeats, logits) in probes.items():
            times: dict[str, list[float]] = {k: [] for k in KERNELS}
            for i in range(repeats):
                if stop is not None and stop():
                    raise Stopped()
                for k in KERNELS if i % 2 else KERNELS[::-1]:
                    times[k].append(timed_pass(ctxs[k], probe[:tokens], logits))
            out[name] = {k: round(median(v) * 1000, 3) for k, v in times.items()}
        return out
    finally:
        for ctx in ctxs.values():
            ctx.close()


def decode_ms(model: Model, n_threads: int, n_threads_batch: int, stop=None) -> dict[str, float]:
    """Median ms of a decode DEPTH tokens deep with each kernel."""
    return _timed(model, n_threads, n_threads_batch, DEPTH, {"decode": (1, DECODES, "last")}, stop)["decode"]


def deep_ms(model: Model, n_threads: int, n_threads_batch: int, stop=None) -> dict[str, dict[str, float]]:
    """Median ms of a PASS-token verify pass and of a decode DEEP tokens deep with each kernel."""
    return _timed(model, n_threads, n_threads_batch, DEEP,
                  {"pass": (PASS, PASSES, "all"), "decode": (1, DEEP_DECODES, "last")}, stop)


def _path(model: Model, n_threads: int):
    from ..backend import system_info

    key = json.dumps({"model": paths.file_id(model.path), "threads": n_threads, "rule": RULE,
                      "llama_cpp_python": system_info()["llama_cpp_python"]}, sort_keys=True)
    return paths.profiles_dir() / f"attention-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
