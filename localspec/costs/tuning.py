"""Pass costs per (pair, device, threads): measured, stored in the data dir for --spec auto, and reused.

The first `run`/`chat` on a new combination measures T_decode, T_verify(n) and T_draft in a few seconds while
idle (`measure_costs`, sizes interleaved so a burst of load hits all of them alike) and saves them; `localspec
tune` measures again. A server also measures at whatever depth its cache holds (`measure_at_depth`), and
`steady_verify` gives the backend's own curve (each size repeated), `keep_depth_curve` stores one measured at
a new depth. When they are measured is costs/idle.py's (`measure_due`); the pair-compatibility verdicts are
kept by models/check.py, the thread hints by threads.py.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import dataclass, field

from .. import paths
from ..errors import PassInterrupted
from .costmodel import CURVE_SIZES, QUICK_SIZES, CostProfile, densify, depth_bucket, plausible, timed_pass


def profile_key(engine) -> str:
    from ..backend import system_info

    load = engine.load
    info = system_info()
    device = "gpu" if info["gpu_offload"] and load.n_gpu_layers_target != 0 else "cpu"
    parts = {
        "target": paths.file_id(engine.target_model.path),
        "draft": paths.file_id(engine.draft_path) if engine.draft_path else None,
        "device": device,
        "threads": load.n_threads,
        "threads_batch": load.n_threads_batch,
        "gpu_layers": [load.n_gpu_layers_target, load.n_gpu_layers_draft],
        "llama_cpp_python": info["llama_cpp_python"],
        "curve": CURVE_VERSION,
    }
    if device == "gpu":  # which card: a data root carried to another machine measures again
        from ..backend.devices import gpu_devices

        parts["gpus"] = [d["description"] for d in gpu_devices()]
    if load.rpc_servers:  # a split pays the network on every pass: its own curve, per set of hosts
        parts["rpc"] = load.rpc_servers
    if engine.flash_attn != "auto":  # other pass costs; profiles measured before the flag keep their key
        parts["flash_attn"] = engine.flash_attn
    if load.exact:  # other kernels, other costs
        parts["exact"] = True
    return json.dumps(parts, sort_keys=True)


CURVE_VERSION = 2  # profiles priced to 64-token passes; older ones (to 6-12) are measured again


def profile_path(key: str):
    return paths.profiles_dir() / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")


def load_profile(engine, notify=None) -> CostProfile | None:
    """The stored profile of this engine's (pair, device, threads), or None. A stored file that is not
    usable is reported in one line through `notify` and treated as absent (it is measured again)."""
    key = profile_key(engine)
    path = profile_path(key)
    try:
        prof = CostProfile.load(path)
    except ValueError as e:
        if notify is not None:
            notify(f"note: ignoring {path} ({e}); measuring the pass costs again")
        return None
    return prof if prof and prof.key == key else None


def tune(engine, n_max: int | None = None, repeats: int = 3, warmup: int = 1, quick: bool = False,
         save: bool = True) -> CostProfile:
    """Measure this engine's pass costs and store them as the profile of its (pair, device, threads):
    the one way a profile is made (`localspec tune`, `bench --costs --save`, auto's first run).
    quick: auto's first profile, measured in seconds while idle: fewer, shallower passes,
    and a draft model not loaded yet is priced from its size instead of being loaded to be timed.
    save=False: the caller stores it (keep_profile) once it knows the machine was quiet meanwhile."""
    key = profile_key(engine)
    if quick:
        prof = measure_costs(engine, repeats=2, warmup=1, depth=32, load_draft=False, sizes=QUICK_SIZES)
        prof.extra["quick"] = True
    else:
        prof = measure_costs(engine, n_max=n_max, repeats=repeats, warmup=warmup)
        prof.extra["steady_verify"] = steady_verify(engine.target, 12)  # for doctor's shape check
    prof.key = key
    if save:
        keep_profile(prof)
    return prof


@dataclass
class CostRounds:
    """Interleaved rounds of timed passes (T(n) for `sizes`, T_draft), kept across a measurement's interruptions."""
    sizes: tuple[int, ...]
    samples: dict = field(default_factory=dict)
    done: int = 0


QUICK_DEPTH, QUICK_WARMUP, QUICK_REPEATS = 32, 1, 2  # auto's first profile: shallow, few rounds (seconds)


def quick_profile(engine, rounds: CostRounds, stop, attempts: int = 3) -> CostProfile | None:
    """auto's first profile, measured a round at a time on the thread that decodes (the caller holds the
    first lane), giving way between passes when `stop()` says: None then, the finished rounds kept in
    `rounds` for the next attempt. Rounds whose repeats disagree (noise) are measured again, up to
    `attempts` times in all, then kept as they are (as measure_costs does)."""
    for attempt in range(attempts):
        prof = _quick_attempt(engine, rounds, stop, last=attempt == attempts - 1)
        if prof is not None or rounds.done:  # measured, or given way (its rounds kept)
            return prof
        if stop():
            return None
    return None


def _quick_attempt(engine, rounds: CostRounds, stop, last: bool) -> CostProfile | None:
    sizes = list(rounds.sizes)
    prompt = _fill_prompt(engine, QUICK_DEPTH + sizes[-1])
    draft = engine.draft_ctx  # not loaded for this: priced from its size until it is (measure_costs)

    def one_round():
        engine.target.sync(prompt[:QUICK_DEPTH])
        return _one_round(engine.target, draft, prompt[QUICK_DEPTH:], sizes, stop)

    while rounds.done < QUICK_WARMUP + QUICK_REPEATS:
        if stop():
            return None
        try:
            with engine.unobserved():
                timed = engine.on_decode_thread(one_round)
        except PassInterrupted:
            return None
        for key, dt in (timed if rounds.done >= QUICK_WARMUP else ()):
            rounds.samples.setdefault(key, []).append(dt)
        rounds.done += 1
    samples, rounds.samples, rounds.done = rounds.samples, {}, 0
    if not last and (noisy_sizes(samples) or not plausible([statistics.median(samples[("t", n)]) for n in sizes])):
        return None
    prof = _profile(engine, samples, sizes, QUICK_DEPTH)
    prof.extra["quick"], prof.key = True, profile_key(engine)
    return prof


def _fill_prompt(engine, n: int) -> list[int]:
    """n tokens of code to time passes over (the passes' cost does not depend on which tokens)."""
    prompt = engine.target_model.tokenize("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", True)
    return (prompt * (n // max(1, len(prompt)) + 1))[:n]


def keep_depth_curve(prof: CostProfile, tv: list[float], depth: int, quick: bool) -> None:
    """A pass-cost curve measured at `depth` added to the profile (a quick profile's whole curve replaced by
    it) and stored."""
    if quick:
        prof.t_decode, prof.t_verify, prof.depth = tv[0], tv, depth
        prof.extra.update(quick=False, sizes=list(CURVE_SIZES))
    if depth_bucket(depth) is not None:
        prof.by_depth[str(depth)] = tv
    if prof.key:
        keep_profile(prof)


def keep_profile(prof: CostProfile) -> None:
    try:
        prof.save(profile_path(prof.key))
    except OSError:  # a read-only data dir: use it now, measure again next time
        pass


# --- timing a context's passes ---------------------------------------------------------------


def measure_costs(engine, n_max: int | None = None, repeats: int = 5, warmup: int = 2, attempts: int = 3,
                  depth: int = 128, load_draft: bool = True, sizes: tuple[int, ...] = CURVE_SIZES) -> CostProfile:
    """Time T_decode, T_verify(n) for the pass sizes in `sizes` (up to n_max) and T_draft on the loaded pair.

    The pass sizes are interleaved (1, 2, ..., 64, 1, 2, ...) so a burst of load from another
    process hits all of them alike, and each figure is a median over `repeats`. Every pass runs at
    the same depth and is rolled back. Single-token passes are timed as they run in generation, a
    few in a row (SINGLES): a GPU build replays a captured graph for repeated single-token passes
    (CUDA graphs), so one pass between passes of other sizes costs about twice a decode step there
    (docs/BENCHMARKS.md, GPU). A profile whose repeats disagree (noise: `noisy_sizes`) is
    measured again, up to `attempts` times in all; a curve that is not monotonic is kept when its
    repeats agree, since that is what the backend does (kernels change with the batch size).
    Without `load_draft`, a draft model not loaded yet is not loaded for this: its cost is estimated
    from the file sizes (decoding reads every weight once), marked in `extra`, until `localspec tune`."""
    sizes = [s for s in sizes if n_max is None or s <= n_max] or [1]
    if n_max is not None and sizes[-1] < n_max:
        sizes.append(n_max)
    tgt = engine.target
    prompt = _fill_prompt(engine, depth + sizes[-1])
    tgt.sync(prompt[:depth])
    batch = prompt[depth:]
    draft = engine.load_draft() if load_draft else engine.draft_ctx  # auto needs T_draft to judge the model draft
    if draft is not None:
        draft.sync(prompt[:depth])
    for _ in range(attempts):
        samples = _sample_passes(tgt, draft, batch, sizes, warmup + repeats, warmup)
        if not noisy_sizes(samples) and plausible([statistics.median(samples[("t", n)]) for n in sizes]):
            break
    return _profile(engine, samples, sizes, depth)


def _profile(engine, samples: dict, sizes: list[int], depth: int) -> CostProfile:
    """A profile from timed rounds' samples (medians), T_draft estimated from the files where it was not timed."""
    from datetime import datetime, timezone

    measured = [statistics.median(samples[("t", n)]) for n in sizes]
    t_verify = densify(sizes, measured)
    t_draft = statistics.median(samples[("d", 1)]) if ("d", 1) in samples else None
    extra: dict = {"sizes": sizes}
    if t_draft is None and engine.draft_path is not None:
        ratio = engine.draft_path.stat().st_size / engine.target_model.path.stat().st_size
        t_draft, extra["t_draft"] = t_verify[0] * ratio, "estimated from file sizes"
    return CostProfile(t_decode=t_verify[0], t_verify=t_verify, t_draft=t_draft, depth=depth, extra=extra,
                       measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def _sample_passes(tgt, draft, batch: list[int], sizes: list[int], rounds: int, warmup: int) -> dict:
    """{("t", n): [seconds, ...], ("d", 1): [...]} over `rounds` interleaved rounds, the first `warmup` dropped."""
    samples: dict[tuple[str, int], list[float]] = {}
    for r in range(rounds):
        timed = _one_round(tgt, draft, batch, sizes)
        for key, dt in (timed if r >= warmup else ()):
            samples.setdefault(key, []).append(dt)
    return samples


def _one_round(tgt, draft, batch: list[int], sizes: list[int], stop=None) -> list[tuple[tuple[str, int], float]]:
    """One pass of each size, then single tokens in a row (and the draft model's); with `stop`, asked
    between passes (PassInterrupted when it says to give way)."""
    timed = []
    for n in [s for s in sizes if s > 1] + [1]:
        if stop is not None and stop():
            raise PassInterrupted("a measurement gave way")
        timed.append((("t", n), timed_pass(tgt, batch[:n]) if n > 1 else _steady_single_s(tgt, batch[:SINGLES])))
    if draft is not None:  # a drafting round: single tokens in a row, as the draft model proposes them
        timed.append((("d", 1), statistics.mean(_timed_singles(draft, batch[:SINGLES]))))
    return timed


NOISE = 0.35  # repeats of one pass size further apart than this share of their median: the machine was busy


def noisy_sizes(samples: dict) -> list:
    """The pass sizes whose repeats disagree by more than NOISE (a burst of load during the measurement)."""
    return [key for key, xs in samples.items()
            if len(xs) > 1 and (max(xs) - min(xs)) > NOISE * statistics.median(xs)]


SINGLES = 4  # single-token passes timed in a row (plain decoding; a drafting round of k = 4)




def _steady_single_s(ctx, tokens: list[int]) -> float:
    """Plain decoding's cost: the steady state of a run of single-token passes (the first of the run
    follows a pass of another size, so it is left out)."""
    return statistics.median(_timed_singles(ctx, tokens)[1:])


def _timed_singles(ctx, tokens: list[int]) -> list[float]:
    """Seconds for each of len(tokens) single-token passes in a row, then rolled back."""
    base, out = len(ctx.tokens), []
    ctx.checkpoint()  # a recurrent model comes back here without evaluating the context again (rollback.py)
    for t in tokens:
        t0 = time.perf_counter()
        ctx.eval([t], logits="last")
        out.append(time.perf_counter() - t0)
    ctx.truncate(base)
    return out


def steady_verify(ctx, n_max: int, runs: int = 5, logits: str = "all") -> list[float]:
    """T(n), n = 1..n_max, with each shape repeated `runs` times in a row before the next, as
    llama-bench times it (`-p 1,2,4,...,n -n 0`): the backend's own curve, against which the
    interleaved costs generation sees (`measure_costs`) are judged. Every pass is rolled back."""
    base = len(ctx.tokens)
    toks = ctx.tokens[-n_max:] if base >= n_max else [0] * n_max
    out = []
    for n in range(1, n_max + 1):
        times = [timed_pass(ctx, toks[:n], logits) for _ in range(runs + 1)][1:]  # the first of a shape warms up
        out.append(statistics.median(times))
    ctx.truncate(base)
    return out


def measure_at_depth(ctx, n_max: int, repeats: int = 3, should_stop=None) -> list[float] | None:
    """T_verify(n), n = 1..n_max (the curve's sizes up to n_max, interpolated between), over whatever
    the context holds now (its depth), every pass rolled back so the cache is left as it was. None
    when `should_stop()` said to give up (a request came) or the repeats disagreed (noise)."""
    base = len(ctx.tokens)
    sizes = [s for s in CURVE_SIZES if s <= n_max]
    toks = ctx.tokens[-sizes[-1]:]
    if base < sizes[-1] or base + max(sizes[-1], SINGLES) > ctx.n_ctx:
        return None
    samples: dict[int, list[float]] = {}
    for r in range(repeats + 1):  # the first round warms up
        for n in sizes:
            if should_stop is not None and should_stop():
                return None
            try:  # passes longer than a draft's give way inside llama_decode to a request
                dt = _steady_single_s(ctx, toks[:SINGLES]) if n == 1 else \
                    timed_pass(ctx, toks[:n], stop=should_stop if n > 8 else None)
            except PassInterrupted:
                return None
            if r:
                samples.setdefault(n, []).append(dt)
    tv = densify(sizes, [statistics.median(samples[n]) for n in sizes])
    return tv if plausible(tv) and not noisy_sizes(samples) else None
