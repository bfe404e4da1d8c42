"""Drafting with the target's own NextN (MTP) blocks (`--drafter mtp`), on a tiny Qwen3.5-style hybrid built
with one NextN block: greedy text equal to plain decoding whatever the head proposes, sampling still the
target's, the drafts counted as the head's own, and a target without a head refused in one line."""

from __future__ import annotations

import pytest
from conftest import THREADS, invoke
from enginekit import assert_second_token_is_the_targets, greedy, load, run

from harness.tinyarch import build_tiny_arch
from localspec.backend import mtp

PROMPTS = ["the cache model token draft", "write the code to read a csv file", "def parse ( data ) : return data"]


@pytest.fixture(scope="module")
def nextn(tmp_path_factory):
    d = tmp_path_factory.mktemp("nextn")
    e = load(build_tiny_arch(d / "target.gguf", "qwen35", seed=0, nextn=1))
    yield e
    e.close()


def test_the_staging_functions_are_found_by_their_names_in_the_pinned_version(nextn):
    api = mtp.staging(nextn.target.L)
    assert callable(api.set_embeddings_nextn) and callable(api.embeddings_nextn_ith)
    assert mtp.nextn_layers(nextn.target.L, nextn.target_model.ptr) == 1 and nextn.target.hidden is not None


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_text_with_the_head_equals_plain_decoding(nextn, k):
    for text in PROMPTS:
        prompt = nextn.prompt_tokens(text, raw=True)
        plain, _, _ = run(nextn, prompt, greedy(spec="off", max_tokens=32))
        drafted, _, st = run(nextn, prompt, greedy(drafter="mtp", draft_max=k, max_tokens=32))
        assert drafted == plain
        assert st.drafted_by_drafter.get("mtp", 0) > 0 and set(st.drafted_by_drafter) == {"mtp"}


def test_the_heads_cache_follows_the_text_after_rejections(nextn):
    """Every round's drafts are dropped from the head's cache before the next catch-up: it holds the
    confirmed text and nothing else."""
    prompt = nextn.prompt_tokens(PROMPTS[0], raw=True)
    tokens, _, _ = run(nextn, prompt, greedy(drafter="mtp", draft_max=4, max_tokens=16))
    head = nextn.mtp_head
    assert head is not None and head.tokens == (prompt + tokens)[:len(head.tokens)]
    assert len(head.tokens) >= len(prompt)


def test_sampling_with_the_head_stays_the_targets(nextn):
    prompt = nextn.prompt_tokens(PROMPTS[1], raw=True)
    cfg = greedy(drafter="mtp", draft_max=3, max_tokens=2, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    assert_second_token_is_the_targets(nextn, prompt, cfg, seeds=600, min_samples=100)


def test_a_target_without_a_head_is_refused_in_one_line(tiny, tmp_path):
    r = invoke("run", "--target", str(tiny.target), "--threads", str(THREADS), "-c", "256", "-n", "4",
               "--spec", "on", "--drafter", "mtp", "hello", home=tmp_path)
    assert r.code != 0 and "needs a target with NextN (MTP) blocks" in r.err and "Traceback" not in r.err


def test_auto_prices_the_head_by_its_measured_step_and_hybrid_takes_it_in_the_models_place(nextn):
    from localspec.decoding.drafters import HybridDrafter, MtpDrafter

    prompt = nextn.prompt_tokens(PROMPTS[2], raw=True)
    plain, _, _ = run(nextn, prompt, greedy(spec="off", max_tokens=24))
    for drafter in ("mtp", "hybrid"):
        tokens, _, st = run(nextn, prompt, greedy(spec="auto", drafter=drafter, max_tokens=24))
        assert tokens == plain and st.spec_mode == "auto"
    assert nextn.mtp_head.step_s > 0  # timed before the first round, then followed
    import numpy as np
    hybrid = nextn.make_drafter(greedy(spec="auto", drafter="hybrid"), np.random.default_rng(0))
    assert isinstance(hybrid, HybridDrafter) and isinstance(hybrid.model, MtpDrafter)
