"""Timing a context's passes: the pass-cost curve a `CostProfile` holds (`measure_costs`, sizes interleaved so a
burst of load hits all of them alike), the same at whatever depth the cache holds (`measure_at_depth`, the
server's idle work), and the backend's steady curve (`steady_verify`, each size repeated)."""

from __future__ import annotations

import statistics
import time

from .costmodel import CURVE_SIZES, CostProfile, densify, plausible
from .errors import PassInterrupted


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
    from datetime import datetime, timezone

    sizes = [s for s in sizes if n_max is None or s <= n_max] or [1]
    if n_max is not None and sizes[-1] < n_max:
        sizes.append(n_max)
    tgt = engine.target
    prompt = engine.target_model.tokenize("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", True)
    prompt = (prompt * ((depth + sizes[-1]) // max(1, len(prompt)) + 1))[:depth + sizes[-1]]
    tgt.sync(prompt[:depth])
    batch = prompt[depth:]
    draft = engine.load_draft() if load_draft else engine.draft_ctx  # auto needs T_draft to judge the model draft
    if draft is not None:
        draft.sync(prompt[:depth])
    for _ in range(attempts):
        samples = _sample_passes(tgt, draft, batch, sizes, warmup + repeats, warmup)
        if not noisy_sizes(samples) and plausible([statistics.median(samples[("t", n)]) for n in sizes]):
            break
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
        timed = [(("t", n), timed_pass(tgt, batch[:n])) for n in sizes if n > 1]
        timed.append((("t", 1), _steady_single_s(tgt, batch[:SINGLES])))
        if draft is not None:  # a drafting round: single tokens in a row, as the draft model proposes them
            timed.append((("d", 1), statistics.mean(_timed_singles(draft, batch[:SINGLES]))))
        for key, dt in (timed if r >= warmup else ()):
            samples.setdefault(key, []).append(dt)
    return samples


NOISE = 0.35  # repeats of one pass size further apart than this share of their median: the machine was busy


def noisy_sizes(samples: dict) -> list:
    """The pass sizes whose repeats disagree by more than NOISE (a burst of load during the measurement)."""
    return [key for key, xs in samples.items()
            if len(xs) > 1 and (max(xs) - min(xs)) > NOISE * statistics.median(xs)]


SINGLES = 4  # single-token passes timed in a row (plain decoding; a drafting round of k = 4)


def timed_pass(ctx, tokens: list[int], logits: str = "all", stop=None) -> float:
    """Seconds for one pass over `tokens` (all logits read back, as verification does), rolled back."""
    base = len(ctx.tokens)
    t0 = time.perf_counter()
    if stop is not None:  # asked while the pass runs too: a request arriving ends it (PassInterrupted)
        ctx.eval(tokens, logits=logits, stop=stop)
    else:
        ctx.eval(tokens, logits=logits)
    dt = time.perf_counter() - t0
    ctx.truncate(base)
    return dt


def _steady_single_s(ctx, tokens: list[int]) -> float:
    """Plain decoding's cost: the steady state of a run of single-token passes (the first of the run
    follows a pass of another size, so it is left out)."""
    return statistics.median(_timed_singles(ctx, tokens)[1:])


def _timed_singles(ctx, tokens: list[int]) -> list[float]:
    """Seconds for each of len(tokens) single-token passes in a row, then rolled back."""
    base, out = len(ctx.tokens), []
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
