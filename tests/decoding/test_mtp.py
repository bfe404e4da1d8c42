"""Drafting with the target's own NextN (MTP) blocks (`--drafter mtp`), on a tiny Qwen3.5-style hybrid built
with one NextN block: greedy text equal to plain decoding whatever the head proposes, sampling still the
target's, the drafts counted as the head's own, and a target without a head refused in one line."""

from __future__ import annotations

import numpy as np
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
    held = nextn.heads.head.texts[0]
    assert held == (prompt + tokens)[:len(held)] and len(held) >= len(prompt)


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
    assert nextn.heads.head.step_s > 0  # timed before the first round, then followed
    hybrid = nextn.make_drafter(greedy(spec="auto", drafter="hybrid"), np.random.default_rng(0))
    assert isinstance(hybrid, HybridDrafter) and isinstance(hybrid.model, MtpDrafter)


def test_the_head_drafts_for_every_lane_of_a_server_each_in_its_own_sequence(tmp_path):
    """`localspec serve`'s lanes share one head context, a sequence each, its steps on the batch thread:
    drafted together, each lane's text is plain decoding's (or parts at a batched near-tie), and each
    sequence of the head holds what one lane alone would have put there."""
    from lanekit import assert_plain_or_near_tie, run_together

    from localspec.config import LoadConfig
    from localspec.serving.engine import ServingEngine

    path = build_tiny_arch(tmp_path / "target.gguf", "qwen35", seed=0, nextn=1)
    e = ServingEngine(path, None, LoadConfig(n_ctx=1024, n_threads=THREADS, n_threads_batch=THREADS, n_parallel=3))
    alone = load(path)
    try:
        prompts = [e.prompt_tokens(t, raw=True) for t in PROMPTS]
        out = run_together(e, prompts, greedy(drafter="mtp", draft_max=3, max_tokens=24))
        assert all(st.drafted_by_drafter.get("mtp", 0) > 0 for _, st in out)
        for i, (toks, _) in enumerate(out):  # the head's cache as the lane's drafts left it, read by one step
            held = list(e.heads.head.texts[i])
            assert held and held == (prompts[i] + toks)[:len(held)]
            assert np.allclose(next_head_logits(e, i, held), next_head_logits(alone, 0, held), atol=1e-2)
        assert_plain_or_near_tie(e, prompts, [t for t, _ in out])
    finally:
        alone.close()
        e.close()


def next_head_logits(e, seq: int, text: list[int]) -> np.ndarray:
    """The head's logits after `text` on sequence `seq`: its cache caught up to `text`, without the
    last token, which its step reads beside the target's hidden state before it."""
    lane = e.lanes[seq]
    if lane.target.tokens[:len(text)] != text:
        lane.target.sync(text)
    head = e.heads.lane(seq)
    head.sync(text[:-1])
    logits, _ = head.step(text[-1], len(text) - 1, head.hidden.rows[seq][len(text) - 2])
    e.on_decode_thread(lambda: head.head.L.llama_memory_seq_rm(head.head.mem, seq, len(text) - 1, -1))
    return logits


def test_auto_drafts_with_the_head_first_then_the_draft_model(tmp_path):
    """`--drafter auto` (the default): the target's head where it has one, even beside a draft model (which
    then never loads), else the draft model; `hybrid` keeps the model; either mixed with n-gram copies."""
    from localspec.config import LoadConfig
    from localspec.decoding.drafters import DraftModel, HybridDrafter, MtpDrafter
    from localspec.engine import Engine

    target = build_tiny_arch(tmp_path / "target.gguf", "qwen35", seed=0, nextn=1)
    draft = build_tiny_arch(tmp_path / "draft.gguf", "qwen35", seed=1)
    rng = np.random.default_rng(0)
    for t, drafter, kind in ((target, "auto", MtpDrafter), (target, "hybrid", DraftModel), (draft, "auto", DraftModel)):
        e = Engine(t, draft, LoadConfig(n_ctx=512, n_threads=THREADS, n_threads_batch=THREADS), lazy_draft=True)
        try:
            made = e.make_drafter(greedy(spec="on", drafter=drafter), rng)
            assert isinstance(made, HybridDrafter) and isinstance(made.model, kind), (t.name, drafter)
            if kind is MtpDrafter:
                prompt = e.prompt_tokens(PROMPTS[0], raw=True)
                _, _, st = run(e, prompt, greedy(spec="on", drafter=drafter, max_tokens=8))
                assert "mtp" in st.drafted_by_drafter and e.draft_ctx is None  # the draft model never loaded
        finally:
            e.close()


def test_the_hidden_rows_go_with_a_snapshot_and_a_shared_prefix(nextn):
    """A server parks a lane's text in its prompt cache and puts it back in another lane, or shares a prefix
    between lanes: the head's input for that text comes along, not the rows another text left in that lane."""
    from localspec.backend import Context

    ctx = Context(nextn.target_model, 512, 512, THREADS, THREADS, n_seq=2)
    try:
        ctx.hidden = mtp.attach(ctx)
        a, b = (nextn.prompt_tokens(t, raw=True) for t in PROMPTS[:2])
        ctx.eval(a, "last", seq=0)
        want = ctx.hidden.rows[0][:len(a)].copy()
        state = ctx.snapshot(0)
        ctx.eval(b, "last", seq=1)
        assert ctx.restore(state, a, seq=1) and np.array_equal(ctx.hidden.rows[1][:len(a)], want)
        ctx.clear(0)
        ctx.eval(b, "last", seq=0)  # another text's rows in sequence 0
        n = ctx.copy_prefix(1, 0, a)
        assert n > 0 and np.array_equal(ctx.hidden.rows[0][:n], want[:n])
    finally:
        ctx.close()
