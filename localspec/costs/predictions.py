"""Predicted speedups from measured pass costs, beside the measured ones (the bench and the chat's status bar)."""

from __future__ import annotations

from .costmodel import CostProfile, expected_tokens, plausible

# Predicted speedups from measured pass costs, beside the measured ones.
#
# Two predictions, both relative to plain decoding at 1 token per T_decode:
#
# - `leviathan`: Leviathan et al.'s model. Each drafting round drafts k tokens, each accepted with
#   the same probability alpha given the earlier ones were, so a round confirms
#   (1 - alpha^(k+1)) / (1 - alpha) tokens and costs k * T_draft + T_verify(k+1) (T_draft ~ 0 for an
#   n-gram draft). Rounds that drafted nothing (the n-gram drafter found no match) are plain
#   steps at T_decode, mixed in at their measured share. Only for a fixed k (`--spec on`).
# - `rounds`: the realised rounds priced by the cost model: every round that drafted j tokens
#   costs T_verify(j+1), every model-drafted token T_draft, and the tokens are those the run
#   produced. It holds for every setting (auto too); where it misses the measurement, the cost
#   model (the pass costs, or time outside llama_decode) is what missed, not the acceptance model.
#
# alpha is estimated from the per-position counts the engine keeps: token i is "reached" in a
# round when it was drafted and tokens 0..i-1 were accepted. For drafts of a fixed length that
# count is exact (the rounds that accepted token i-1); when draft lengths vary (n-gram matches near
# the end of the text, --p-min) it is estimated in proportion to the rounds that drafted token i.
# The estimate is then the maximum-likelihood alpha of the i.i.d. model: accepted / reached.


def reached_by_position(drafted: list[int], accepted: list[int]) -> list[float]:
    """Rounds in which draft token i was verified with all earlier draft tokens accepted."""
    reached = []
    for i, d in enumerate(drafted):
        if i == 0:
            r = float(d)
        else:
            prev = drafted[i - 1]
            r = accepted[i - 1] * d / prev if prev else 0.0
        acc = accepted[i] if i < len(accepted) else 0
        reached.append(min(float(d), max(r, float(acc))))
    return reached


def estimate_alpha(drafted: list[int], accepted: list[int]) -> float | None:
    """Per-token acceptance probability under the i.i.d. model (None: nothing was drafted)."""
    reached = sum(reached_by_position(drafted, accepted))
    return sum(accepted) / reached if reached else None


def conditional_by_position(drafted: list[int], accepted: list[int]) -> list[float | None]:
    """P(token i accepted | tokens 0..i-1 accepted), per position."""
    reached = reached_by_position(drafted, accepted)
    return [(accepted[i] / r if r else None) for i, r in enumerate(reached)]


def round_histogram(drafted_by_position: list[int]) -> dict[int, int]:
    """{j: rounds that drafted exactly j tokens} (j >= 1) from the per-position counts."""
    d = drafted_by_position
    return {j: d[j - 1] - (d[j] if j < len(d) else 0) for j in range(1, len(d) + 1)
            if d[j - 1] - (d[j] if j < len(d) else 0) > 0}


def predict_leviathan(alpha: float | None, k: int, costs: CostProfile, model_share: float = 1.0,
                      plain_share: float = 0.0) -> float | None:
    """Speedup over plain of rounds drafting k tokens at per-token acceptance alpha.

    model_share: share of the drafted tokens that came from the draft model (the rest are
    n-gram drafts, free but for t_ngram); plain_share: share of rounds that drafted nothing."""
    if alpha is None or k < 1:
        return None
    t_draft = costs.t_draft or 0.0
    draft_round = k * t_draft * model_share + costs.t_ngram * (1.0 - model_share) + costs.verify(k + 1)
    tokens = (1.0 - plain_share) * expected_tokens(alpha, k) + plain_share
    seconds = (1.0 - plain_share) * draft_round + plain_share * costs.verify(1)
    return tokens / seconds * costs.t_decode


def estimated_speedup(stats, profile: CostProfile | None) -> float | None:
    """Speedup over plain decoding implied by a reply's rounds and the measured pass costs (the chat
    app's status bar, the page's figure under a reply); None without a usable profile."""
    if profile is None or not stats.tokens or not stats.target_passes or not plausible(profile.t_verify):
        return None
    return predict_from_rounds(stats.tokens, stats.rounds_plain, stats.drafted_by_position,
                               stats.drafted_by_drafter, profile)


def predict_from_rounds(tokens: int, rounds_plain: int, drafted_by_position: list[int],
                        drafted_by_drafter: dict[str, int], costs: CostProfile) -> float | None:
    """Speedup over plain of the rounds a run actually made, priced by the measured pass costs."""
    if tokens <= 0:
        return None
    hist = round_histogram(drafted_by_position)
    seconds = rounds_plain * costs.verify(1) + sum(n * costs.verify(j + 1) for j, n in hist.items())
    seconds += drafted_by_drafter.get("model", 0) * (costs.t_draft or 0.0)
    drafted = sum(drafted_by_drafter.values())
    if drafted:  # n-gram lookups: t_ngram per drafting round, apportioned by drafted tokens
        seconds += sum(hist.values()) * costs.t_ngram * drafted_by_drafter.get("ngram", 0) / drafted
    if seconds <= 0:
        return None
    return tokens / seconds * costs.t_decode

