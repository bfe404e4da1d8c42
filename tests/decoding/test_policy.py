"""How many tokens a round drafts: priced against the pass costs, learned from shadow drafts."""

from __future__ import annotations

from localspec.costs.costmodel import CostProfile
from localspec.decoding.policy import AdaptivePolicy


def test_adaptive_policy_prefers_plain_when_verification_is_expensive():
    cpu = CostProfile(t_decode=1.0, t_verify=[1.0, 1.72, 2.30, 2.50, 3.15, 3.76], t_draft=0.49)
    pol = AdaptivePolicy(cpu, 4)
    assert pol.k_for("model", 4) == 0  # a model draft at 0.49 of the target cannot pay here
    pol.alpha[("ngram", 4)] = 0.95
    assert pol.k_for("ngram", 4, match_len=4) >= 3  # a free draft that is usually right does
    gpu = CostProfile(t_decode=1.0, t_verify=[1.0, 1.02, 1.04, 1.06, 1.08, 1.1], t_draft=0.15)
    assert AdaptivePolicy(gpu, 4).k_for("model", 4) >= 3


def test_a_model_probe_is_skipped_when_the_draft_must_first_catch_up_with_a_long_text():
    # a CPU-like curve where a model right 95% of the time could pay, but today's estimate does not
    cpu = CostProfile(t_decode=1.0, t_verify=[1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4], t_draft=0.3)
    for lag, probes in ((8, True), (2000, False)):
        pol = AdaptivePolicy(cpu, 4)
        pol.alpha[("model", 0)] = 0.05
        assert pol.model_ceiling >= 1.1
        asked = []
        ks = [pol.k_for("model", 4, catch_up=lambda: asked.append(1) or lag) for _ in range(2 * pol.PROBE_EVERY)]
        assert (sum(ks) == 2) is probes and ks.count(0) >= 2 * pol.PROBE_EVERY - 2
        assert len(asked) == 2  # the text is measured only when a probe is due, not every round
    assert cpu.catch_up(2000) == 2000 * (2.4 / 8) * 0.3 and cpu.catch_up(0) == 0.0
    # a round the estimate says pays is still refused when the catch-up would not be paid back
    gpu = CostProfile(t_decode=1.0, t_verify=[1.0, 1.02, 1.04, 1.06, 1.08, 1.1], t_draft=0.15)
    assert AdaptivePolicy(gpu, 4).k_for("model", 4, catch_up=lambda: 100) >= 3
    assert AdaptivePolicy(gpu, 4).k_for("model", 4, catch_up=lambda: 100_000) == 0


def test_adaptive_policy_learns_from_shadow_drafts():
    from localspec.decoding.draft import Draft

    cpu = CostProfile(t_decode=1.0, t_verify=[1.0, 1.72, 2.30, 2.50, 3.15], t_draft=None)
    pol = AdaptivePolicy(cpu, 4)
    pol.alpha[("ngram", 2)] = 0.1
    assert pol.k_for("ngram", 4, 2) == 0
    seq = [1, 2, 3]
    for _ in range(30):  # the text keeps repeating what the n-gram proposed: acceptance rises
        proposal = [7, 8, 9, 10]
        pol.update(Draft(source="ngram", match_len=2, shadow=proposal), 0, seq + [7])
        seq = seq + [7]
        for t in proposal[1:]:
            seq = seq + [t]
            pol.update(Draft(), 0, seq)
    assert pol.alpha[("ngram", 2)] > 0.8
    assert pol.k_for("ngram", 4, 2) > 0


def test_a_nextn_head_the_prior_says_no_to_is_probed_now_and_then():
    """A measured curve where the head's prior acceptance does not pay but a head right 95% of the time
    would (a trained one on code): one token every PROBE_EVERY rounds, so its real acceptance is learnt."""
    twin = CostProfile(t_decode=1.0, t_verify=[1.0, 1.46, 1.74, 2.01, 2.26, 2.50], t_draft=0.24)
    pol = AdaptivePolicy(twin, 4)
    assert pol.model_ceiling >= 1.1
    ks = [pol.k_for("mtp", 4) for _ in range(2 * pol.PROBE_EVERY)]
    assert sum(ks) == 2 and set(ks) == {0, 1}


def test_a_heads_acceptance_is_learnt_per_position():
    """A NextN head's later positions are guesses on guesses: each position has its own estimate, the prior
    falling with depth, so a head right on its first token and wrong on its second drafts one token."""
    import pytest

    from localspec.decoding.draft import Draft

    gpu = CostProfile(t_decode=1.0, t_verify=[1.0, 1.02, 1.04, 1.06, 1.08, 1.1], t_draft=0.1)
    pol = AdaptivePolicy(gpu, 4)
    assert pol.estimate(("mtp", 1)) < pol.estimate(("mtp", 0)) and pol.k_for("mtp", 4) >= 2
    for _ in range(60):
        pol.update(Draft(source="mtp", tokens=[1, 2, 3, 4]), 1, [])  # the first token kept, the second not
    assert pol.estimate(("mtp", 0)) > 0.9 and pol.estimate(("mtp", 1)) < 0.1
    assert pol.estimate(("mtp", 2)) == pytest.approx(0.7 * pol.HEAD_DEPTH_DECAY ** 2)  # never judged
    assert pol.k_for("mtp", 4) == 1
