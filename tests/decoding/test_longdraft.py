"""Long n-gram drafts priced over the whole pass curve, the copy followed, predicted outputs aligned."""

from __future__ import annotations

import pytest

from localspec.costs.costmodel import CostProfile, densify, implausible_pass
from localspec.costs.tuning import noisy_sizes
from localspec.decoding.draft import Draft
from localspec.decoding.ngram import NgramDrafter
from localspec.decoding.policy import AdaptivePolicy, FixedK


def curve(per_token: float, n: int = 64) -> CostProfile:
    """T(1) = 1 decode, each further token of a pass `per_token` of a decode."""
    return CostProfile(t_decode=1.0, t_verify=[1.0 + per_token * (i - 1) for i in range(1, n + 1)])


# the 2-core CPU's curve as measured (localspec tune, depth 128): the dearest tokens are those of
# passes of 5-12, the cheapest those of 16+
CPU = CostProfile(t_decode=1.0, t_verify=densify(
    [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64],
    [1.0, 1.95, 2.80, 3.45, 4.42, 5.06, 8.41, 10.49, 10.95, 16.89, 19.44, 27.95, 35.74]))


def policy_at(costs: CostProfile, alpha: float, bucket=("ngram", 64)) -> AdaptivePolicy:
    pol = AdaptivePolicy(costs, 64)
    pol.alpha[bucket] = alpha
    return pol


def test_a_cheap_large_batch_earns_a_long_draft():
    assert policy_at(curve(0.1), 0.97).k_for("ngram", 64, 64) >= 16


def test_a_steep_curve_earns_none():
    assert policy_at(curve(1.0), 0.97).k_for("ngram", 64, 64) == 0  # each drafted token costs a decode


def test_on_this_cpu_a_copy_drafts_nothing_or_long_never_mid_length():
    for alpha in (0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.99, 0.999):
        k = policy_at(CPU, alpha).k_for("ngram", 64, 64)
        assert k <= 4 or k >= 15, (alpha, k)
    assert policy_at(CPU, 0.999).k_for("ngram", 64, 64) >= 31
    assert policy_at(CPU, 0.6).k_for("ngram", 64, 64) == 0


def test_acceptance_is_a_long_run_rate_not_the_last_streak():
    """A copy that breaks once every 25 tokens is right 96% of the time: one long streak must not read
    as certainty (it drafted 64 tokens into every edit)."""
    pol = AdaptivePolicy(CPU, 64)
    key = ("ngram", 64)
    for _ in range(20):
        pol.update(Draft(tokens=[0] * 30, probs=[None] * 30, source="ngram", match_len=64), 24, [])
    assert 0.93 < pol.alpha[key] < 0.98
    assert pol.k_for("ngram", 64, 64) < 31


def test_the_drafter_follows_a_copy_through_repeated_lines():
    """The text repeats `A B C` in two places with different continuations; once the answer copies the
    second place, the drafter stays there instead of jumping to the latest `A B C`."""
    A, B, C = 1, 2, 3
    src = [9, A, B, C, 10, 11, 12, 8, A, B, C, 20, 21, 22, 23, 24]
    d = NgramDrafter(2, 3)
    seq = list(src) + [8, A, B, C]  # the answer is copying from position 7 on
    d.begin(seq)
    first = d.propose(seq, 64, FixedK(64))
    assert first.tokens[:3] == [20, 21, 22]
    seq += [20, 21]  # two accepted, then the target's own token equals the copy's next one
    seq += [22]
    again = d.propose(seq, 64, FixedK(64))
    assert again.tokens[:2] == [23, 24] and again.match_len > first.match_len


def copying(src: list[int]) -> tuple[NgramDrafter, list[int]]:
    """A drafter over a prompt holding `src`, the answer having copied its first 12 tokens."""
    d = NgramDrafter(2, 4)
    seq = [1, *src, 2, *src[:12]]
    d.begin(seq)
    assert d.propose(seq, 64, FixedK(64)).tokens[:3] == src[12:15]
    return d, seq


def test_a_copy_resumes_right_after_a_renamed_token():
    """The answer copies the source but the target replaces one token (a rename): the copy goes on
    after it at once, instead of waiting for text after the new name to match somewhere."""
    src = list(range(100, 140))
    d, seq = copying(src)
    seq += [*src[12:15], 7]  # three accepted, then the target's own token where the source has src[15]
    resumed = d.propose(seq, 64, FixedK(64))
    assert resumed.tokens[:3] == src[16:19] and resumed.resync and resumed.match_len == 0
    seq += src[16:20]  # it held: the copy goes on, its evidence counted from the edit
    on = d.propose(seq, 64, FixedK(64))
    assert on.tokens[:2] == src[20:22] and not on.resync and on.match_len == 4


def test_a_copy_resumes_after_an_inserted_token_and_learns_which_kind_of_edit_this_answer_makes():
    src = list(range(100, 160))
    d, seq = copying(src)
    seq += [7]  # a token put in before src[12]: first guessed a replacement (src[13:] proposed)...
    assert d.propose(seq, 64, FixedK(64)).tokens[0] == src[13]
    seq += [src[12]]  # ...the target went on with src[12]: an insertion, and the copy follows it
    assert d.propose(seq, 64, FixedK(64)).tokens[:2] == src[13:15]
    seq += [*src[13:20], 8]  # the next edit of this answer is taken for an insertion first
    assert d.propose(seq, 64, FixedK(64)).tokens[:2] == src[20:22]


def test_a_rename_seen_once_is_drafted_renamed_and_dropped_where_the_answer_does_not_make_it():
    OLD, NEW = 7, 77
    src = [*range(100, 120), OLD, *range(120, 130), OLD, *range(130, 140), OLD, *range(140, 150)]
    d, seq = copying(src)
    seq += [*src[12:20], NEW]  # the first rename (the target's token in a round)...
    assert d.propose(seq, 64, FixedK(64)).resync
    seq += src[21:23]  # ...then the copy held after it
    ahead = d.propose(seq, 64, FixedK(64)).tokens
    assert ahead[:10] == src[23:31] + [NEW] + src[32:33]  # the next OLD is drafted as NEW
    seq += src[23:31] + [OLD]  # the answer keeps OLD here: the rename is no longer drafted
    d.propose(seq, 64, FixedK(64))
    seq += src[32:34]
    assert d.propose(seq, 64, FixedK(64)).tokens[:12] == src[34:42] + [OLD] + src[43:46]


def test_a_short_chance_match_does_not_resume_after_a_mismatch():
    text = [5, 6, 7, 8, 9, 10]
    d = NgramDrafter(2, 4)
    seq = [*text, 1, 5, 6]  # a two-token coincidence, not a copy
    d.begin(seq)
    assert d.propose(seq, 64, FixedK(64)).tokens[:2] == [7, 8]
    seq += [7, 42]
    assert not d.propose(seq, 64, FixedK(64)).resync


def test_a_longer_match_starts_from_what_shorter_matches_showed():
    """A copy's match grows through the buckets 8, 16, 32...; a bucket not tried yet starts from the best
    estimate of a shorter match with enough outcomes behind it, not from the pessimistic prior."""
    pol = AdaptivePolicy(CPU, 64)
    for _ in range(10):
        pol.update(Draft(tokens=[0] * 16, probs=[None] * 16, source="ngram", match_len=8), 16, [])
    assert pol.alpha[("ngram", 8)] > 0.95
    assert pol.estimate(("ngram", 32)) == pol.alpha[("ngram", 8)]
    assert pol.k_for("ngram", 64, 32) >= 15
    fresh = AdaptivePolicy(CPU, 64)
    fresh.update(Draft(tokens=[0] * 2, probs=[None] * 2, source="ngram", match_len=8), 2, [])  # too few outcomes
    assert fresh.estimate(("ngram", 32)) < 0.8


def test_a_prediction_is_drafted_from_the_first_token_and_realigned_after_an_insertion():
    prediction = list(range(100, 140))
    d = NgramDrafter(2, 4)
    seq = [1, 2, 3]  # the prompt
    d.begin(seq, prediction)
    first = d.propose(seq, 64, FixedK(64))
    assert first.tokens == prediction and first.origin == "prediction"
    seq += prediction[:10] + [7, 7]  # the answer inserts two tokens the prediction does not have...
    assert d.propose(seq, 64, FixedK(64)).tokens == []  # ...nothing to align with yet
    seq += prediction[10:13]  # ...then goes on with the prediction
    again = d.propose(seq, 64, FixedK(64))
    assert again.tokens == prediction[13:] and again.origin == "prediction"


def test_a_prediction_is_realigned_after_a_deletion():
    prediction = list(range(100, 160))
    d = NgramDrafter(2, 4)
    seq = [1, 2, 3]
    d.begin(seq, prediction)
    d.propose(seq, 64, FixedK(64))
    seq += prediction[:20] + prediction[30:33]  # ten predicted tokens left out
    assert d.propose(seq, 64, FixedK(64)).tokens == prediction[33:]


def test_a_prediction_with_repeated_lines_aligns_forward():
    line = [50, 51, 52]
    prediction = [1, *line, 60, 2, *line, 70, 3, *line, 80]
    d = NgramDrafter(2, 3)
    seq = [0]
    d.begin(seq, prediction)
    d.propose(seq, 64, FixedK(64))
    seq += [1, *line, 60, 2, 99]  # diverges in the second line...
    d.propose(seq, 64, FixedK(64))
    seq += [*line]  # ...then repeats the line: the next one in order, not the first nor the last
    assert d.propose(seq, 64, FixedK(64)).tokens[:2] == [70, 3]


def test_a_wrong_prediction_is_cheap_and_stops_being_drafted():
    """A prediction that is wrong from the start: the prior drafts at most short proposals, the misses
    bring it to plain decoding within a few rounds, so it costs little against plain (priced on the CPU curve)."""
    pol = AdaptivePolicy(CPU, 64)
    cost = 0.0
    for _ in range(200):
        k = pol.k_for("ngram", 40, 4, "prediction")
        cost += CPU.verify(k + 1)
        pol.update(Draft(tokens=[0] * k, probs=[None] * k, source="ngram", match_len=4, origin="prediction",
                         shadow=None if k else [0] * 40), 0, [])
    assert cost <= 1.05 * 200


def test_densify_keeps_measured_sizes_and_interpolates_between():
    tv = densify([1, 2, 4, 8], [1.0, 2.0, 3.0, 7.0])
    assert tv == pytest.approx([1.0, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0])


def test_a_curve_that_dips_is_kept_and_only_noise_is_measured_again():
    assert implausible_pass(CPU.t_verify) is None  # per-token costs fall from 12 to 16: what the CPU does
    assert implausible_pass([1.0, 1.8, 0.3]) == (3, 1)  # below a single-token decode: noise
    assert noisy_sizes({("t", 4): [1.0, 1.05, 0.98], ("t", 8): [1.0, 2.0, 1.1]}) == [("t", 8)]


def test_beyond_the_curve_a_pass_is_never_cheaper_per_token_than_measured():
    quick = CostProfile(t_decode=1.0, t_verify=densify([1, 2, 4, 8, 16], [1.0, 1.9, 3.4, 8.4, 11.0]))
    assert quick.verify(64) >= 11.0 + 48 * (11.0 - 1.0) / 15 - 1e-9


def test_a_token_put_in_after_a_name_is_drafted_there_from_then_on():
    """rgb_to_yiq -> rgb_to_yiq_color: the answer puts a token in after the source's; the copy resumes
    at once, and the next time the source has that token the draft carries the inserted one too."""
    NAME, SUFFIX = 7, 77
    src = [*range(100, 120), NAME, *range(120, 130), NAME, *range(130, 150)]
    d, seq = copying(src)
    seq += [*src[12:21], SUFFIX]  # the name copied, then the suffix put in after it
    d.propose(seq, 64, FixedK(64))
    seq += [src[21]]  # the copy goes on with the source's next token: an insertion
    seq += src[22:24]
    ahead = d.propose(seq, 64, FixedK(64)).tokens
    assert ahead[:9] == src[24:31] + [NAME, SUFFIX] and ahead[9:11] == src[32:34]
    seq += src[24:31] + [NAME, SUFFIX, *src[32:34]]  # it held through the rewritten place
    assert d.propose(seq, 64, FixedK(64)).tokens[:3] == src[34:37]


def test_a_name_renamed_into_other_tokens_is_learned_where_the_copy_is_found_again():
    """_extension_registry -> _EXTENSION_REGISTRY: two source tokens become four of the answer's. The copy
    is lost at the edit and found again after it; the span between is drafted rewritten at the next
    occurrence, and the rewrite is dropped the first time the answer does not make it."""
    OLD, NEW = [7, 8], [70, 71, 72, 73]
    src = [*range(100, 120), *OLD, *range(120, 135), *OLD, *range(135, 150), *OLD, *range(150, 170)]
    d, seq = copying(src)
    seq += [*src[12:20], NEW[0]]  # the edit begins: the copy breaks
    d.propose(seq, 64, FixedK(64))
    seq += NEW[1:] + src[22:25]  # ...the rest of the new name, then the source again
    found = d.propose(seq, 64, FixedK(64)).tokens
    assert found[:12] == src[25:37]
    assert found[12:16] == NEW and found[16:18] == src[39:41]  # the next occurrence is drafted rewritten
    seq += src[25:37] + NEW + src[39:52]
    assert d.propose(seq, 64, FixedK(64)).tokens[:6] == src[52:54] + NEW
    seq += src[52:54] + OLD  # here the answer keeps the old name: the rewrite is dropped...
    d.propose(seq, 64, FixedK(64))
    assert not d.rewrites
    seq += src[56:58]
    assert d.propose(seq, 64, FixedK(64)).tokens[:3] == src[58:61]  # ...and the copy goes on


def test_an_answer_that_must_repeat_drafts_only_from_a_copy():
    """Greedy answers that must repeat (min_match): a chance match in the text stays a shadow however well its
    bucket did; a match as long as llama-server's --spec-default asks drafts; a copy resuming after an edit
    drafts when the copy had held that long; a request's predicted output drafts from the first token."""
    from localspec.decoding.policy import REPEATABLE_MIN_MATCH as N

    pol = AdaptivePolicy(CPU, 64, min_match=N)
    for b in (4, 16, 32):
        pol.alpha[("ngram", b)] = 0.999
    pol.alpha[("resync", 0)] = pol.alpha[("prediction", 2)] = 0.999
    assert pol.k_for("ngram", 64, N - 1, "text") == 0
    assert pol.k_for("ngram", 64, N, "text") >= 15
    assert pol.k_for("ngram", 64, 0, "text", resync=True, held=N - 1) == 0
    assert pol.k_for("ngram", 64, 0, "text", resync=True, held=N) >= 15
    assert pol.k_for("ngram", 64, 4, "text", held=N) >= 15  # a copy found again after an edit
    assert pol.k_for("ngram", 64, 2, "prediction") >= 15
    free = AdaptivePolicy(CPU, 64)  # any other answer: as before
    free.alpha[("ngram", 16)] = 0.999
    assert free.k_for("ngram", 64, N - 1, "text") >= 15


def test_a_copy_resuming_after_an_edit_is_judged_by_how_long_it_had_held():
    seen = []

    class Recorder(FixedK):
        def k_for(self, source, k_max, match_len=0, origin="", catch_up=None, resync=False, held=0):
            seen.append((held, resync))
            return super().k_for(source, k_max, match_len, origin, catch_up, resync, held)

    src = list(range(100, 160))
    d, seq = copying(src)
    seq += [*src[12:30], 7]  # the copy held 30 tokens, then the target's own token replaced src[30]
    assert d.propose(seq, 64, Recorder(64)).resync
    assert seen[-1] == (30, True)  # its evidence is the 30 tokens it held, not the 0 since the edit


def test_an_answer_that_has_been_one_copy_from_its_first_token_counts_as_fully_held():
    """A file returned whole: once the answer has copied one place for WHOLE_ANSWER_COPY tokens from its start,
    the copy counts as held as long as any, so a greedy answer that must repeat drafts it without waiting for a
    24-token match; the same tokens copied after text of the answer's own count only their match."""
    seen = []

    class Recorder(FixedK):
        def k_for(self, source, k_max, match_len=0, origin="", catch_up=None, resync=False, held=0):
            seen.append(held)
            return super().k_for(source, k_max, match_len, origin, catch_up, resync, held)

    src = list(range(100, 160))
    n = NgramDrafter.WHOLE_ANSWER_COPY
    for own, expected in (([], NgramDrafter.MATCH_CAP), ([7, 8, 9], n)):
        d = NgramDrafter(2, 4)
        seq = [1, *src, 2]
        d.begin(seq)
        seq += [*own, *src[:n]]
        d.propose(seq, 64, Recorder(64))
        assert seen[-1] == expected, own
