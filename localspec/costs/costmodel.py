"""What a speculative round costs and gains, from measured pass costs (never assumed).

Leviathan et al. 2023: with per-token acceptance alpha and k drafted tokens, one target pass
confirms on average (1 - alpha^(k+1)) / (1 - alpha) tokens; it costs k * T_draft + T_verify(k+1).
Plain decoding confirms 1 token per T_decode = T_verify(1). With position-dependent acceptance
a_1..a_k the expectation is 1 + sum_i prod_{j<=i} a_j (the same formula when all a_j = alpha).

Worked example (the bench issue's): k = 4, each round yields 3 tokens, the draft 6x cheaper
than the target, verification priced like one decode. 12 tokens take 4 rounds, each costing
4 x 1/6 + 1 = 1.67 target passes: 6.7 passes instead of 12. On a CPU verification is NOT that
cheap (docs/BENCHMARKS.md, "Pass costs on this CPU"), which is why the profile is measured.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path


def expected_tokens(alpha: float | list[float], k: int) -> float:
    """Expected confirmed tokens per target pass with k drafted tokens."""
    if k <= 0:
        return 1.0
    if isinstance(alpha, (int, float)):
        if alpha >= 1.0:
            return float(k + 1)
        return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    total, reach = 1.0, 1.0
    for i in range(k):
        reach *= alpha[i] if i < len(alpha) else alpha[-1]
        total += reach
    return total


def miss_chance(alpha: float | list[float], k: int) -> float:
    """The chance that a round drafting k tokens has one rejected (and a tail to roll back)."""
    if k <= 0:
        return 0.0
    if isinstance(alpha, (int, float)):
        return 1.0 - min(alpha, 1.0) ** k
    held = 1.0
    for i in range(k):
        held *= alpha[i] if i < len(alpha) else alpha[-1]
    return 1.0 - held


@dataclass
class CostProfile:
    """Measured seconds per pass on one (pair, device, threads)."""
    t_decode: float  # target: one single-token decode
    t_verify: list[float]  # t_verify[n-1] = target pass over n tokens (n = 1..len)
    t_draft: float | None = None  # draft model: one single-token decode (None: no draft model)
    t_ngram: float = 0.0  # n-gram lookup per round (Python; ~µs)
    key: str = ""  # what it was measured on
    measured_at: str = ""
    extra: dict = field(default_factory=dict)
    depth: int = 128  # context depth (tokens in the cache) the figures above were measured at
    by_depth: dict = field(default_factory=dict)  # {"1024": [t_verify(1), ...]}: deeper contexts cost more

    def at_depth(self, n_tokens: int) -> "CostProfile":
        """The profile measured nearest this depth (a long FIM prompt makes every pass dearer, and
        what pays at depth 128 may not at 2,000)."""
        depths = {self.depth: self.t_verify, **{int(d): tv for d, tv in self.by_depth.items()}}
        best = min(depths, key=lambda d: abs(d - n_tokens))
        if best == self.depth:
            return self
        tv = depths[best]
        return replace(self, t_decode=tv[0], t_verify=list(tv), depth=best, by_depth={})

    def verify(self, n: int) -> float:
        """Cost of a target pass over n tokens. Beyond the measured range, each further token costs what
        the measured tokens after the first cost on average: never cheaper than measured (per-token
        costs fall with the batch on a CPU, so this overprices long passes rather than underprice them)."""
        tv = self.t_verify
        if n <= len(tv):
            return tv[n - 1]
        slope = (tv[-1] - tv[0]) / (len(tv) - 1) if len(tv) > 1 else tv[0]
        return tv[-1] + (n - len(tv)) * slope

    def catch_up(self, n_tokens: int) -> float:
        """Seconds for the draft model's cache to evaluate n tokens of text it has not seen: the target's
        per-token price in its longest measured pass (prompt-like), scaled by draft decode / target decode."""
        if n_tokens <= 0 or not self.t_draft:
            return 0.0
        return n_tokens * self.t_verify[-1] / len(self.t_verify) * self.t_draft / self.t_decode

    def draft_cost(self, source: str, k: int) -> float:
        """Seconds to draft k tokens: a step of the draft model or the NextN head each (`t_draft`: the
        engine puts the head's in for a run that drafts with it), an n-gram lookup once."""
        return 0.0 if k == 0 else k * (self.t_draft or 0.0) if source in ("model", "mtp") else self.t_ngram

    def round_cost(self, source: str, k: int) -> float:
        return self.draft_cost(source, k) + self.verify(k + 1)

    def relative_verify(self) -> list[float]:
        return [t / self.t_decode for t in self.t_verify]

    def save(self, path: Path) -> None:
        from ..paths import write_atomic

        write_atomic(path, json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> "CostProfile | None":
        """The stored profile; None when there is none. A file that is not a profile of this version
        (corrupt, truncated, fields of another type) raises ValueError saying what is wrong with it."""
        try:
            raw = path.read_text()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ValueError(f"unreadable: {e.strerror or e}") from None
        try:
            data = json.loads(raw)
        except ValueError:
            raise ValueError("not valid JSON") from None
        problem = _profile_problem(data)
        if problem:
            raise ValueError(problem)
        return cls(**data)


def _is_seconds(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _profile_problem(d) -> str | None:
    """What makes a stored profile unusable (None: nothing): checked field by field, so a file from a
    future version or a hand edit is measured again instead of breaking every run."""
    if not isinstance(d, dict):
        return "not a JSON object"
    unknown = set(d) - set(CostProfile.__dataclass_fields__)
    if unknown:
        return f"unknown field {sorted(unknown)[0]!r}"

    def series(v) -> bool:
        return isinstance(v, list) and len(v) >= 2 and all(_is_seconds(x) and x > 0 for x in v)

    checks = {"t_decode": lambda v: _is_seconds(v) and v > 0, "t_verify": series,
              "t_draft": lambda v: v is None or _is_seconds(v), "t_ngram": _is_seconds,
              "key": lambda v: isinstance(v, str), "measured_at": lambda v: isinstance(v, str),
              "extra": lambda v: isinstance(v, dict),
              "depth": lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
              "by_depth": lambda v: isinstance(v, dict) and all(k.isdigit() and series(x) for k, x in v.items())}
    for name in ("t_decode", "t_verify"):
        if name not in d:
            return f"no {name!r}"
    for name, ok in checks.items():
        if name in d and not ok(d[name]):
            return f"{name!r} has the wrong type or value"
    return None


def predicted_speedup(alpha: float | list[float], k: int, costs: CostProfile, source: str = "model") -> float:
    """Tokens per second of speculation with k drafts over plain decoding."""
    return (expected_tokens(alpha, k) / costs.round_cost(source, k)) / (1.0 / costs.t_decode)


def best_k(alpha: float | list[float], k_max: int, costs: CostProfile, source: str,
           t_miss: float = 0.0) -> tuple[int, float]:
    """The k in 0..k_max with the most expected tokens per second, and that speedup over plain. t_miss:
    what rolling a rejected tail back costs on the loaded target beyond dropping it (a recurrent model's
    checkpoint and replay, backend/rollback.py), paid in the rounds that have a rejection."""
    best, best_rate = 0, 1.0 / costs.verify(1)
    for k in range(1, k_max + 1):
        rate = expected_tokens(alpha, k) / (costs.round_cost(source, k) + miss_chance(alpha, k) * t_miss)
        if rate > best_rate:
            best, best_rate = k, rate
    return best, best_rate * costs.t_decode


def best_k_shared(alpha: float | list[float], k_max: int, costs: CostProfile, source: str,
                  rows: int, others: int, t_miss: float = 0.0) -> tuple[int, float]:
    """best_k for a sequence that shares each pass with `others` sequences putting `rows` tokens in it
    (continuous batching): k drafts make everyone's step cost T(rows + k + 1), so k is chosen for the
    most tokens per second over all of them, (others + E[k]) / T(rows + k + 1), against plain's
    (others + 1) / T(rows + 1). Alone (rows 0) this is best_k."""
    if rows <= 0:
        return best_k(alpha, k_max, costs, source, t_miss)
    plain = (others + 1) / costs.verify(rows + 1)
    best, best_rate = 0, plain
    for k in range(1, k_max + 1):
        rate = (others + expected_tokens(alpha, k)) / (costs.draft_cost(source, k) + costs.verify(rows + k + 1)
                                                       + miss_chance(alpha, k) * t_miss)
        if rate > best_rate:
            best, best_rate = k, rate
    return best, best_rate / plain


# Pass sizes measured: every size up to 6 (where drafts usually live), then ever sparser up to 64
# (long n-gram drafts of copied text); the sizes between are interpolated. On a CPU long passes are
# the cheapest per token, so a profile that stops at 9 and extrapolates prices every long draft wrong.
CURVE_SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
QUICK_SIZES = (1, 2, 4, 8, 16)  # auto's first profile (seconds); longer passes priced pessimistically until measured


# A pass over n tokens in single-token decodes on a typical machine of each kind: the prices a greedy
# request's drafts are chosen by where its answer must not depend on this machine's measurements or load
# (engine.py, `Engine.decides_from_request_alone`); where the figures come from: docs/EXACT.md.
REFERENCE_SIZES = (1, 2, 4, 8, 16, 32, 64)
REFERENCE_VERIFY = {"cpu": (1.0, 1.8, 2.9, 6.9, 8.3, 13.6, 24.1), "gpu": (1.0, 2.66, 2.84, 3.0, 3.3, 4.0, 5.3)}
# a NextN head's step in decodes where prices must not depend on this machine's timings (or nothing timed it
# yet): a 0.8B Qwen3.5 shape twin's, the dearest share of the sizes measured (docs/MODELS.md, "Drafters")
REFERENCE_HEAD_STEP = 0.25


@lru_cache(maxsize=None)
def reference_profile(device: str) -> "CostProfile":
    """The reference pass curve of a "cpu" or "gpu" (no draft model price: a greedy request's draft-model
    proposals depend on its draft cache's history, so they are not priced in)."""
    return CostProfile(t_decode=1.0, t_verify=densify(list(REFERENCE_SIZES), list(REFERENCE_VERIFY[device])),
                       key=f"reference:{device}")


def densify(sizes: list[int], times: list[float]) -> list[float]:
    """T(n) for n = 1..max(sizes), linear between measured sizes (which stay exactly as measured)."""
    out = []
    for n in range(1, sizes[-1] + 1):
        j = next(i for i, s in enumerate(sizes) if s >= n)
        if sizes[j] == n or j == 0:
            out.append(times[j])
        else:
            a, b = sizes[j - 1], sizes[j]
            out.append(times[j - 1] + (times[j] - times[j - 1]) * (n - a) / (b - a))
    return out




SHAPE_PENALTY = 1.25  # interleaved verify passes this much dearer than repeated ones: worth a warning


def shape_penalty(t_verify: list[float], steady: list[float]) -> tuple[int, float] | None:
    """The pass size n where generation's verify cost (relative to its decode) is furthest above the
    backend's steady curve, and by how much; None when within SHAPE_PENALTY everywhere."""
    worst = None
    for n in range(2, min(len(t_verify), len(steady)) + 1):
        ratio = (t_verify[n - 1] / t_verify[0]) / (steady[n - 1] / steady[0])
        if ratio > SHAPE_PENALTY and (worst is None or ratio > worst[1]):
            worst = (n, ratio)
    return worst


DEPTH_BUCKETS = (512, 1024, 2048, 4096, 8192, 16384)  # depths measured on top of the base profile's


def depth_bucket(n_tokens: int) -> int | None:
    """The bucket a context depth is measured under (None: close enough to the base depth)."""
    fits = [b for b in DEPTH_BUCKETS if b <= n_tokens]
    return fits[-1] if fits else None




FLOOR = 0.6  # no pass costs less than this share of a single-token decode: each reads all the weights


def implausible_pass(t_verify: list[float]) -> tuple[int, int] | None:
    """The one plausibility rule for pass costs: a pass over n tokens reads every weight once, as a
    single-token decode does, so it never costs much less than one (FLOOR). A curve that is not
    monotonic beyond that is what some backends do (the kernels change with the batch size) and is
    kept. Returns (n, 1) for the first pass over n tokens measured below FLOOR x T(1), else None."""
    for n in range(1, len(t_verify)):
        if t_verify[n] < FLOOR * t_verify[0]:
            return n + 1, 1
    return None


def plausible(t_verify: list[float]) -> bool:
    return bool(t_verify) and t_verify[0] > 0 and implausible_pass(t_verify) is None

def timed_pass(ctx, tokens: list[int], logits: str = "all", stop=None) -> float:
    """Seconds for one pass over `tokens` (all logits read back, as verification does), rolled back."""
    base = len(ctx.tokens)
    ctx.checkpoint()  # a recurrent model comes back here without evaluating the context again (rollback.py)
    t0 = time.perf_counter()
    if stop is not None:  # asked while the pass runs too: a request arriving ends it (PassInterrupted)
        ctx.eval(tokens, logits=logits, stop=stop)
    else:
        ctx.eval(tokens, logits=logits)
    dt = time.perf_counter() - t0
    ctx.truncate(base)
    return dt
