"""The cost model and the bench's predictions, against cases worked out by hand."""

from __future__ import annotations

import pytest
from conftest import THREADS

from localspec.config import LoadConfig
from localspec.costs import predictions as predict
from localspec.costs import tuning
from localspec.costs.costmodel import CostProfile, best_k, expected_tokens, predicted_speedup
from localspec.engine import Engine


def flat(t_draft: float, n: int = 16, t_decode: float = 1.0) -> CostProfile:
    """Verification priced like one decode, whatever the batch size."""
    return CostProfile(t_decode=t_decode, t_verify=[t_decode] * n, t_draft=t_draft)


# Issue 6's CPU: T_verify(n)/T_decode = 1.00/1.72/2.30/2.50/3.15 for n = 1..5, draft 0.49 x target.
CPU = CostProfile(t_decode=1.0, t_verify=[1.00, 1.72, 2.30, 2.50, 3.15], t_draft=0.49)


def test_worked_example_twelve_tokens_cost_under_seven_passes():
    """k = 4, each round yields 3 tokens, draft 6x cheaper, verification priced like one decode:
    12 tokens take 4 rounds of 4/6 + 1 = 5/3 passes each = 6.67 target passes instead of 12."""
    costs = flat(t_draft=1 / 6)
    per_round = costs.round_cost("model", 4)
    assert per_round == pytest.approx(4 / 6 + 1)
    rounds = 12 / 3
    assert rounds * per_round == pytest.approx(6.67, abs=0.005)
    # the same through the expected-tokens formula: 2 drafts accepted then a miss -> 3 tokens a round
    alpha = [1.0, 1.0, 0.0, 0.0]
    assert expected_tokens(alpha, 4) == pytest.approx(3.0)
    assert predicted_speedup(alpha, 4, costs, "model") == pytest.approx(12 / 6.6667, rel=1e-3)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 0.8, 0.9, 0.999])
@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 6, 8])
def test_expected_tokens_closed_form_matches_per_position_form(alpha, k):
    closed = expected_tokens(alpha, k)
    assert closed == pytest.approx(expected_tokens([alpha] * max(k, 1), k))
    assert closed == pytest.approx(sum(alpha ** i for i in range(k + 1)))


def test_expected_tokens_hand_values():
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    assert expected_tokens(1.0, 4) == 5.0  # every draft accepted, plus the bonus token
    assert expected_tokens(0.0, 4) == 1.0  # only the target's own token
    assert expected_tokens([0.9, 0.5], 2) == pytest.approx(1 + 0.9 + 0.45)
    assert expected_tokens([0.9, 0.5], 4) == pytest.approx(1 + 0.9 + 0.45 + 0.225 + 0.1125)  # last rate repeats


def test_round_cost_and_verify_extrapolation():
    c = CostProfile(t_decode=1.0, t_verify=[1.0, 1.5, 2.0], t_draft=0.25, t_ngram=0.01)
    assert c.round_cost("model", 0) == 1.0  # a plain step
    assert c.round_cost("model", 2) == pytest.approx(2 * 0.25 + 2.0)
    assert c.round_cost("ngram", 2) == pytest.approx(0.01 + 2.0)  # one lookup, whatever k
    assert c.verify(5) == pytest.approx(3.0)  # linear beyond the measured n = 3
    assert c.relative_verify() == [1.0, 1.5, 2.0]


def test_best_k_is_plain_when_verification_is_expensive_and_drafting_costly():
    # no batching benefit at all (T_verify(n) = n x T_decode) and a draft at half the target's cost
    linear = CostProfile(t_decode=1.0, t_verify=[float(n) for n in range(1, 9)], t_draft=0.5)
    assert best_k(0.9, 8, linear, "model") == (0, pytest.approx(1.0))
    # issue 6's CPU: even at 94% acceptance the model draft cannot win ...
    k, gain = best_k(0.94, 4, CPU, "model")
    assert (k, gain) == (0, pytest.approx(1.0))
    for kk, expect in [(1, 1.94 / 2.21), (3, (1 + 0.94 + 0.94 ** 2 + 0.94 ** 3) / (3 * 0.49 + 2.50))]:
        assert predicted_speedup(0.94, kk, CPU, "model") == pytest.approx(expect, rel=1e-3)
        assert predicted_speedup(0.94, kk, CPU, "model") < 1.0
    # ... but a free n-gram draft does: k = 3 gives 3.65 tokens per 2.50 decodes = 1.46x
    k, gain = best_k(0.94, 4, CPU, "ngram")
    assert k == 3
    assert gain == pytest.approx((1 + 0.94 + 0.94 ** 2 + 0.94 ** 3) / 2.50, rel=1e-6)


def test_best_k_is_the_argmax_when_verification_is_cheap():
    costs = flat(t_draft=0.05)
    k, gain = best_k(0.8, 8, costs, "model")
    rates = {kk: expected_tokens(0.8, kk) / costs.round_cost("model", kk) for kk in range(9)}
    assert k == max(rates, key=rates.get) and k > 0
    assert gain == pytest.approx(rates[k] * costs.t_decode)
    assert best_k(0.0, 8, costs, "model")[0] == 0  # drafts that are never accepted never pay


def test_profile_roundtrip(tmp_path):
    c = CostProfile(t_decode=0.045, t_verify=[0.045, 0.077], t_draft=0.022, key="k", measured_at="now")
    c.save(tmp_path / "p.json")
    assert CostProfile.load(tmp_path / "p.json") == c
    assert CostProfile.load(tmp_path / "missing.json") is None


# --- the bench's estimates from the engine's per-position counts -------------------------------

def test_alpha_estimate_is_the_mle_for_fixed_length_drafts():
    # four rounds of k = 3 accepting 3, 1, 0 and 2 drafts: tokens tried = 3 + 2 + 1 + 3 = 9, accepted 6
    drafted, accepted = [4, 4, 4], [3, 2, 1]
    assert predict.reached_by_position(drafted, accepted) == [4, 3, 2]
    assert predict.estimate_alpha(drafted, accepted) == pytest.approx(6 / 9)
    assert predict.conditional_by_position(drafted, accepted) == [pytest.approx(3 / 4), pytest.approx(2 / 3), 0.5]
    assert predict.estimate_alpha([], []) is None


def test_alpha_estimate_with_drafts_of_varying_length():
    # rounds drafting 2, 2, 1 tokens: position 1 drafted in 2 of the 3 rounds, accepted in 1
    drafted, accepted = [3, 2], [2, 1]
    # reached(1) = accepted(0) x 2/3 = 4/3 rounds (in proportion); alpha = 3 / (3 + 4/3)
    assert predict.estimate_alpha(drafted, accepted) == pytest.approx(3 / (3 + 4 / 3))
    # never fewer rounds reached a position than accepted it
    assert predict.reached_by_position([10, 5], [6, 5]) == [10, 5]


def test_round_histogram():
    assert predict.round_histogram([5, 3, 3, 1]) == {1: 2, 3: 2, 4: 1}
    assert predict.round_histogram([]) == {}


def test_leviathan_prediction_equals_the_cost_model_when_every_round_drafts():
    costs = CostProfile(t_decode=1.0, t_verify=[1.0, 1.3, 1.6, 1.9, 2.2], t_draft=0.2)
    assert predict.predict_leviathan(0.7, 4, costs) == pytest.approx(predicted_speedup(0.7, 4, costs, "model"))
    assert predict.predict_leviathan(0.7, 4, costs, model_share=0.0) == pytest.approx(
        predicted_speedup(0.7, 4, costs, "ngram"))
    # half the rounds plain (no n-gram match): tokens (E + 1) / 2 per (T_verify(5) + T_decode) / 2
    e = expected_tokens(0.7, 4)
    assert predict.predict_leviathan(0.7, 4, costs, model_share=0.0, plain_share=0.5) == pytest.approx(
        (e + 1) / (2.2 + 1.0))
    assert predict.predict_leviathan(None, 4, costs) is None


def test_prediction_from_realised_rounds_by_hand():
    costs = CostProfile(t_decode=1.0, t_verify=[1.0, 1.5, 2.0, 2.5], t_draft=0.25)
    # 10 tokens from 2 plain rounds, 1 round drafting 1 token and 2 rounds drafting 3 (model)
    drafted_by_position = [3, 2, 2]
    seconds = 2 * 1.0 + 1 * 1.5 + 2 * 2.5 + 7 * 0.25
    got = predict.predict_from_rounds(10, 2, drafted_by_position, {"model": 7}, costs)
    assert got == pytest.approx(10 / seconds)
    # the same rounds drafted by n-grams cost no drafting time
    assert predict.predict_from_rounds(10, 2, drafted_by_position, {"ngram": 7}, costs) == pytest.approx(
        10 / (seconds - 7 * 0.25))
    # plain decoding priced by the same model is exactly 1x
    assert predict.predict_from_rounds(5, 5, [], {}, costs) == pytest.approx(1.0)
    assert predict.predict_from_rounds(0, 0, [], {}, costs) is None


def test_disturbed_costs_are_flagged():
    from localspec.bench.report import cost_warnings

    assert cost_warnings(CPU) == []
    # measured while another process hogged the cores: one token slower than four
    busy = CostProfile(t_decode=6.4, t_verify=[6.4, 0.38, 0.64, 0.96], t_draft=0.2)
    (msg,) = cost_warnings(busy)
    assert "T_verify(2)" in msg and "busy" in msg


def test_profile_at_depth_picks_the_nearest_measured_depth():
    from localspec.costs.costmodel import CostProfile, depth_bucket

    p = CostProfile(t_decode=1.0, t_verify=[1.0, 1.8, 2.4], by_depth={"1100": [2.0, 3.0, 3.5], "4200": [4.0, 5.0, 6.0]})
    assert p.at_depth(100) is p and p.at_depth(400) is p
    deep = p.at_depth(1500)
    assert (deep.t_decode, deep.t_verify, deep.depth) == (2.0, [2.0, 3.0, 3.5], 1100)
    assert p.at_depth(9000).t_verify == [4.0, 5.0, 6.0]
    assert depth_bucket(300) is None and depth_bucket(1100) == 1024 and depth_bucket(5000) == 4096


def test_measure_at_depth_leaves_the_cache_as_it_was(tiny):
    from localspec.costs.tuning import measure_at_depth

    e = Engine(tiny.target, None, LoadConfig(n_ctx=1024, n_threads=THREADS, n_threads_batch=THREADS))
    toks = e.prompt_tokens("the cache of the model " * 40, raw=True)
    e.target.sync(toks)
    tv = measure_at_depth(e.target, 4, repeats=1)
    assert (tv is None or len(tv) == 4) and e.target.tokens == toks  # None: timings too noisy to keep
    assert measure_at_depth(e.target, 4, should_stop=lambda: True) is None and e.target.tokens == toks
    e.close()


class GraphReplayContext:
    """A context priced like a GPU build with CUDA graphs: a single-token pass right after another
    single-token pass replays the captured graph (1 unit); any other pass builds its graph anew."""

    def __init__(self, clock: list[float], scale: float = 1.0):
        self.clock, self.scale, self.tokens, self.last_n = clock, scale, [], 0

    def sync(self, tokens):
        self.tokens = list(tokens)
        self.last_n = len(tokens)

    def eval(self, tokens, logits="last"):
        n = len(tokens)
        self.clock[0] += self.scale * (1.0 if n == 1 and self.last_n == 1 else 2.6 + 0.05 * n)
        self.tokens += list(tokens)
        self.last_n = n

    def truncate(self, n):
        del self.tokens[n:]

    def checkpoint(self, brief=False):  # a transformer's: nothing to save
        pass


def test_measured_decode_is_the_steady_single_token_pass(monkeypatch):
    """Plain decoding runs single-token passes back to back, so T_decode is timed that way: a pass
    between passes of other sizes (a rebuilt GPU graph) would make verification look cheap."""
    from types import SimpleNamespace

    clock = [0.0]
    monkeypatch.setattr(tuning.time, "perf_counter", lambda: clock[0])
    target, draft = GraphReplayContext(clock), GraphReplayContext(clock, scale=0.5)
    engine = SimpleNamespace(target=target, target_model=SimpleNamespace(tokenize=lambda text, special: list(range(20))),
                             load_draft=lambda: draft, draft_ctx=draft, draft_path="draft.gguf")
    prof = tuning.measure_costs(engine, n_max=4, repeats=3, warmup=1)
    assert prof.t_decode == prof.t_verify[0] == 1.0
    assert prof.t_verify[1:] == pytest.approx([2.7, 2.75, 2.8])
    assert prof.t_draft == pytest.approx(0.5)  # the draft's singles run back to back too
    assert target.tokens == draft.tokens == (list(range(20)) * 7)[:128]  # every pass rolled back


def test_verify_much_dearer_than_the_backends_own_curve_is_named():
    from localspec.bench.report import cost_warnings
    from localspec.costs.costmodel import shape_penalty

    gpu_seen = CostProfile(t_decode=1.0, t_verify=[1.0, 2.66, 2.8, 3.0])  # H100 as generation ran it
    llama_bench = [1.0, 1.05, 1.10, 1.15]  # the same GPU with each shape repeated
    n, ratio = shape_penalty(gpu_seen.t_verify, llama_bench)
    assert n == 4 and ratio > 2.5 or n == 2
    assert any(w.startswith("verifying") for w in cost_warnings(gpu_seen, steady=llama_bench))
    cpu = CostProfile(t_decode=1.0, t_verify=[1.0, 1.8, 2.4, 3.2])
    assert shape_penalty(cpu.t_verify, [1.0, 1.75, 2.5, 3.1]) is None
    assert cost_warnings(cpu, steady=[1.0, 1.75, 2.5, 3.1]) == []


def test_the_steady_curve_is_measured_and_leaves_the_cache(tiny):
    from localspec.costs.tuning import steady_verify

    e = Engine(tiny.target, None, LoadConfig(n_ctx=512, n_threads=THREADS, n_threads_batch=THREADS))
    try:
        e.target.sync(e.target_model.tokenize("the cache is fast and the model is slow", add_special=True))
        before = list(e.target.tokens)
        curve = steady_verify(e.target, 4, runs=2)
        assert len(curve) == 4 and all(t > 0 for t in curve)
        assert e.target.tokens == before
    finally:
        e.close()
