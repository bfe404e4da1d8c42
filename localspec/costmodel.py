"""What a speculative round costs and gains, from measured pass costs (never assumed).

Leviathan et al. 2023: with per-token acceptance alpha and k drafted tokens, one target pass
confirms on average (1 - alpha^(k+1)) / (1 - alpha) tokens; it costs k * T_draft + T_verify(k+1).
Plain decoding confirms 1 token per T_decode = T_verify(1). With position-dependent acceptance
a_1..a_k the expectation is 1 + sum_i prod_{j<=i} a_j (the same formula when all a_j = alpha).

Worked example (the bench issue's): k = 4, each round yields 3 tokens, the draft 6x cheaper
than the target, verification priced like one decode. 12 tokens take 4 rounds, each costing
4 x 1/6 + 1 = 1.67 target passes: 6.7 passes instead of 12. On a CPU verification is NOT that
cheap (T_verify(5) = 3.15 x T_decode measured here), which is why the profile is measured.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
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

    def verify(self, n: int) -> float:
        """Cost of a target pass over n tokens; beyond the measured range, extrapolate linearly."""
        if n <= len(self.t_verify):
            return self.t_verify[n - 1]
        a, b = self.t_verify[-2], self.t_verify[-1]
        return b + (n - len(self.t_verify)) * (b - a)

    def round_cost(self, source: str, k: int) -> float:
        draft = 0.0 if k == 0 else k * (self.t_draft or 0.0) if source == "model" else self.t_ngram
        return draft + self.verify(k + 1)

    def relative_verify(self) -> list[float]:
        return [t / self.t_decode for t in self.t_verify]

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "CostProfile | None":
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


def predicted_speedup(alpha: float | list[float], k: int, costs: CostProfile, source: str = "model") -> float:
    """Tokens per second of speculation with k drafts over plain decoding."""
    return (expected_tokens(alpha, k) / costs.round_cost(source, k)) / (1.0 / costs.t_decode)


def best_k(alpha: float | list[float], k_max: int, costs: CostProfile, source: str) -> tuple[int, float]:
    """The k in 0..k_max with the most expected tokens per second, and that speedup over plain."""
    best, best_rate = 0, 1.0 / costs.verify(1)
    for k in range(1, k_max + 1):
        rate = expected_tokens(alpha, k) / costs.round_cost(source, k)
        if rate > best_rate:
            best, best_rate = k, rate
    return best, best_rate * costs.t_decode


def measure_costs(engine, n_max: int = 8, repeats: int = 5, warmup: int = 2, attempts: int = 3) -> CostProfile:
    """Time T_decode, T_verify(n) for n = 1..n_max and T_draft on the loaded pair (a few seconds).

    The pass sizes are interleaved (1, 2, ..., n_max, 1, 2, ...) so a burst of load from another
    process hits all of them alike, and each figure is a median over `repeats`. Every pass runs at
    the same depth and is rolled back. A profile that is implausible (a pass over more tokens
    cheaper than over fewer, beyond noise) is measured again, up to `attempts` times in all."""
    from datetime import datetime, timezone

    tgt = engine.target
    prompt = engine.target_model.tokenize("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", True)
    prompt = (prompt * 8)[:128]
    tgt.sync(prompt)
    if engine.draft_ctx is not None:
        engine.draft_ctx.sync(prompt)

    def one_pass(ctx, n: int) -> float:
        base = len(ctx.tokens)
        t0 = time.perf_counter()
        ctx.eval(prompt[:n], logits="all")
        dt = time.perf_counter() - t0
        ctx.truncate(base)
        return dt

    for _ in range(attempts):
        samples: dict[tuple[str, int], list[float]] = {}
        for r in range(warmup + repeats):
            for n in range(1, n_max + 1):
                dt = one_pass(tgt, n)
                if r >= warmup:
                    samples.setdefault(("t", n), []).append(dt)
            if engine.draft_ctx is not None:
                dt = one_pass(engine.draft_ctx, 1)
                if r >= warmup:
                    samples.setdefault(("d", 1), []).append(dt)
        t_verify = [statistics.median(samples[("t", n)]) for n in range(1, n_max + 1)]
        t_draft = statistics.median(samples[("d", 1)]) if ("d", 1) in samples else None
        if plausible(t_verify):
            break
    return CostProfile(t_decode=t_verify[0], t_verify=t_verify, t_draft=t_draft,
                       measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def plausible(t_verify: list[float]) -> bool:
    """A pass over more tokens never costs much less than one over fewer (allowing 20% noise)."""
    return all(t_verify[j] >= 0.8 * t_verify[i] for i in range(len(t_verify)) for j in range(i + 1, len(t_verify)))
