"""Temperature 0 means one answer: --exact (batch-invariant kernels) and greedy drafting decided by the
request alone. The kernels are llama.cpp's own, so these tests run them, each mode in a fresh process
(llama.cpp reads its kernel switch once per process)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import THREADS
from exactkit import exact_run

from harness.tinygguf import build_tiny_model
from localspec.config import GenConfig, LoadConfig
from localspec.costs.costmodel import CostProfile
from localspec.decoding.policy import REPEATABLE_MIN_MATCH
from localspec.engine import Engine
from localspec.server.apierrors import ApiError
from localspec.server.settings import gen_settings

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def flat_kquant(tmp_path_factory) -> Path:
    """A tiny model wide enough for K-quants (Q4_K_M, the weights --exact needs) with flat logits, so greedy
    decoding meets near-ties where a batched row and a single-token decode can pick different tokens."""
    from localspec.backend import llama

    d = tmp_path_factory.mktemp("kquant")
    build_tiny_model(d / "f16.gguf", seed=0, width=256, out_scale=0.05)
    L = llama()
    params = L.llama_model_quantize_default_params()
    params.ftype = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = 1
    assert L.llama_model_quantize(str(d / "f16.gguf").encode(), str(d / "q4km.gguf").encode(),
                                  ctypes.byref(params)) == 0
    return d / "q4km.gguf"


def first_parting(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def test_exact_speculation_has_plain_decodings_bits_where_default_kernels_part(flat_kquant):
    default = exact_run(flat_kquant, "default")
    # the premise: on this build the default kernels give a batched row other bits, and on this model that
    # changes the greedy text (drafts verified every round, most rejected)
    assert default["gap"] > 0 and first_parting(default["off"], default["on"]) is not None
    for threads in sorted({1, 2}):
        ex = exact_run(flat_kquant, "exact", threads)
        assert ex["gap"] == 0.0
        assert ex["on_drafted"] > 100 and ex["on"] == ex["off"]


def test_exact_refuses_kernels_that_are_not_batch_invariant(tmp_path):
    """A tiny F16 model runs through llama.cpp's llamafile kernels from two rows: measured, refused in one line.
    128 wide: at the tiny models' 64 an AVX2 CPU's vector kernels happen to sum a row as the batched kernel does."""
    build_tiny_model(tmp_path / "target.gguf", seed=0, width=128)
    r = subprocess.run([sys.executable, "-m", "localspec", "run", "--target", str(tmp_path / "target.gguf"), "--exact",
                        "-t", "1", "-n", "4", "hello"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "LOCALSPEC_HOME": str(tmp_path / "home-exact")})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: --exact: a batched row of target.gguf differs from a single-token decode by ")
    assert r.stderr.endswith("(it needs K-quant weights (Q4_K_M, Q5_K_M, Q6_K) and a process that had not decoded "
                             "before); run without --exact\n") and r.stderr.count("\n") == 1


def engine(tiny) -> Engine:
    e = Engine(tiny.target, None, LoadConfig(n_ctx=1024, n_threads=THREADS, n_threads_batch=THREADS))
    # a profile that makes every draft look free: drafting decided by the machine's figures would verify
    # whatever the memory of earlier answers offers
    e.profile = CostProfile(t_decode=1.0, t_verify=[1.0 + 0.001 * n for n in range(64)])
    e.remember_generations = True  # a server's: n-gram drafts may copy earlier answers
    return e


def test_greedy_drafts_come_from_the_request_alone_whatever_ran_before(tiny):
    e = engine(tiny)
    prompt = e.target_model.tokenize("write the code to read a csv file", True)
    cfg = GenConfig(temperature=0.0, spec="auto", drafter="ngram", max_tokens=60)

    def answer(p, c=cfg):
        tokens = [x.token for x in e.generate(p, c) if x.token is not None]
        st = e.last_stats
        return tokens, st.drafted_by_position, st.policy

    fresh = answer(prompt)
    answer(prompt)  # its answer is now in the memory of earlier generations
    other = e.target_model.tokenize("the cache is fast and the model is slow", True)
    answer(other, cfg.with_(temperature=0.7, seed=3))  # and a sampled one, drafting from it
    again = answer(prompt)
    assert again == fresh
    assert "T_verify/T_decode = 1.00, 1.80" in fresh[2]  # priced by the reference curve, not this machine's
    sampled = answer(prompt, cfg.with_(temperature=0.7, seed=3))
    assert "T_verify/T_decode = 1.00, 1.00" in sampled[2]  # sampling keeps the measured figures
    rng = np.random.default_rng(0)
    assert e._drafting(cfg, rng, e.lane, len(prompt))[1].min_match == REPEATABLE_MIN_MATCH  # copies only
    assert e._drafting(cfg.with_(temperature=0.7), rng, e.lane, len(prompt))[1].min_match == 0
    e.close()


def test_a_request_asking_for_exact_output_decodes_plainly_without_exact_kernels(tiny):
    e = engine(tiny)
    prompt = e.target_model.tokenize("the cache is fast and the model is slow", True)
    plain = [x.token for x in e.generate(prompt, GenConfig(temperature=0.0, spec="off", max_tokens=40))]
    asked = [x.token for x in e.generate(prompt, GenConfig(temperature=0.0, spec="on", drafter="ngram",
                                                                max_tokens=40, exact=True))]
    assert asked == plain and e.last_stats.spec_mode == "off" and e.last_stats.drafted == 0
    e.close()


def test_the_exact_request_field_is_validated():
    assert gen_settings({"exact": True}, GenConfig(), oai=True)[0].exact is True
    assert gen_settings({}, GenConfig(), oai=True)[0].exact is False
    with pytest.raises(ApiError) as e:
        gen_settings({"exact": "yes"}, GenConfig(), oai=True)
    assert e.value.status == 400 and '"exact" must be true or false' in str(e.value.body())


def test_a_prompt_is_cut_at_message_starts_and_every_step_within_a_message():
    from localspec.backend.passes import MESSAGE_MIN, SHORT, boundaries, pass_ends

    S = 9  # the turn-start token
    msg = lambda n: [S] + [1] * (n - 1)  # noqa: E731
    # a short system prompt goes with the question; a long one alone; the answer's header with the last message
    assert boundaries(msg(30) + msg(40) + [S, 2, 3], frozenset({S}), 256) == []
    assert boundaries(msg(300) + msg(40) + [S, 2, 3], frozenset({S}), 256) == [300]
    assert boundaries(msg(300) + msg(600) + [S, 2, 3], frozenset({S}), 256) == [300, 556, 812]
    assert boundaries(msg(400) + msg(40) + [S, 2, 3], frozenset({S}), 256) == [256, 400]
    assert boundaries([1] * 520, frozenset(), 256) == [256, 512]  # no template: every 256 tokens
    assert boundaries([1] * 519, frozenset(), 256) == [256]  # never a pass of fewer than SHORT tokens
    toks = msg(100) + msg(MESSAGE_MIN - 1) + msg(40) + [S, 2]
    assert boundaries(toks, frozenset({S}), 256) == [100]  # a message start too close to the last one
    assert pass_ends([100, 356], 0, 400) == [100, 356, 400]
    assert pass_ends([100, 356], 100 - SHORT + 1, 400) == [356, 400]  # resuming after an answer: no tiny pass


def test_a_prompt_reuses_a_cached_prefix_only_where_a_fresh_evaluation_cuts_too():
    from localspec.backend.passes import Cuts, reuse_point

    fresh = Cuts([0, 256, 300, 556])  # a 556-token prompt evaluated fresh (bounds 256, 300)
    assert reuse_point(fresh, 556, 556, [256, 300]) == 300  # again: its last pass again
    assert reuse_point(fresh, 310, 700, [256, 300, 556]) == 300  # sharing a system prompt: up to its end
    assert reuse_point(fresh, 290, 700, [256, 600]) == 256  # sharing part of one: whole passes only
    assert reuse_point(Cuts([0, 400]), 310, 700, [256, 300]) == 0  # cached in one pass: no place to resume
    answered = Cuts([0, 300], dirty_from=300, decoded_from=300)  # then an answer was decoded
    assert reuse_point(answered, 350, 380, [256, 300]) == 350  # the next turn: the answer whole
    assert reuse_point(answered, 300, 380, [256]) == 300  # its prompt whole, the answer re-tokenized otherwise
    continued = Cuts([0, 300, 350, 380], dirty_from=300, decoded_from=300)  # that turn, filled from 350
    assert reuse_point(continued, 380, 380, [256, 300]) == 350  # sent again: the same pass as the first time
    assert Cuts.from_json(continued.to_json()) == continued and Cuts.from_json({"at": "x"}) == Cuts()
    sampled = Cuts([0, 256, 300], dirty_from=280)  # a sampled request's fill from 280, where nothing cuts
    assert reuse_point(sampled, 310, 700, [256, 300]) == 256  # a greedy one builds on none of its rows


def test_a_greedy_prompt_goes_in_a_fresh_evaluations_passes_whatever_the_cache_held(tiny, monkeypatch):
    """The passes pinned (docs/EXACT.md): asked again after other requests (one sharing its system prompt, a
    sampled one), a greedy prompt reuses the whole system prompt and evaluates its question in the very pass
    a fresh evaluation did, and answers the same; a sampled prompt sharing part of the question builds rows
    the greedy one never reuses."""
    from localspec.chat_format import Message

    e = engine(tiny)
    passes: list[tuple[int, int]] = []  # (position, tokens) of each prompt pass
    real = e.target.eval

    def logged(tokens, logits="last", **kw):
        if logits != "all":
            passes.append((len(e.target.tokens), len(tokens)))
        return real(tokens, logits, **kw)

    monkeypatch.setattr(e.target, "eval", logged)
    system = Message("system", "you answer with the code " * 4)  # 100 tokens of the tiny model's
    ask = lambda question: e.prompt_tokens([system, Message("user", question)])  # noqa: E731
    prompt = ask("write the code to read a csv file")
    cfg = GenConfig(temperature=0.0, spec="off", max_tokens=12)

    def answer(p, c=cfg):
        passes.clear()
        out = [x.token for x in e.generate(p, c) if x.token is not None]
        return out, list(passes)

    fresh, fresh_passes = answer(prompt)
    assert len(fresh_passes) == 2 and fresh_passes[1][0] >= 64  # the system prompt, then the question
    answer(ask("the cache is fast and the model is slow"))
    answer(ask("write the code to read a json file"), cfg.with_(temperature=0.7, seed=3))
    again, again_passes = answer(prompt)
    assert again == fresh and again_passes == fresh_passes[1:]
    e.close()
