"""The speculative guarantees, asserted on tiny GGUF models run by the real llama.cpp."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import THREADS
from enginekit import _chi2_fails, assert_second_token_is_the_targets, greedy, load, pool_eog, run

from localspec.backend import Context, common_prefix
from localspec.chat_format import Message
from localspec.config import GenConfig
from localspec.decoding.sampling import logits_to_probs
from localspec.errors import IncompatiblePairError
from localspec.verify import logit_noise, verify_exactness

PROMPTS = ["hello world", "write the code to read a csv file", "the cache is fast and the model is slow",
           "def parse ( data ) : return data"]


def margins_and_pair_noise(e, prompt: list[int], tokens: list[int]) -> tuple[np.ndarray, float]:
    """The target's top-1/top-2 margin at each emitted token (one batched pass over the output), and
    the largest logit difference there between that pass and the draft model run one token at a
    time: zero when both run the same weights on the same backend, rounding noise when the target
    and the draft sit on different devices (or the device's batched kernels round differently)."""
    seq = prompt + tokens
    e.target.reset()
    e.target.eval(prompt[:-1], logits="none")
    batched = e.target.eval(seq[len(prompt) - 1:-1], logits="all")
    e.draft_ctx.reset()
    e.draft_ctx.eval(prompt[:-1], logits="none")
    single = np.stack([e.draft_ctx.eval([t], logits="last")[0] for t in seq[len(prompt) - 1:-1]])
    e.target.reset()
    e.draft_ctx.reset()
    top2 = np.sort(batched, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0], float(np.abs(batched - single).max())


def test_identical_draft_accepts_everything(same):
    """A draft with the target's weights is rejected only where the two runs can disagree: at a
    near-tie no wider than the measured noise between them (none at all on one CPU backend)."""
    for text in PROMPTS:
        prompt = same.prompt_tokens(text)
        chunks = list(same.generate(prompt, greedy()))
        st = same.last_stats
        assert st.drafted > 0
        tokens = [c.token for c in chunks if c.token is not None]
        margins, noise = margins_and_pair_noise(same, prompt, tokens)
        near_ties = int((margins[:len(tokens)] <= 2 * noise + 1e-5).sum())
        # one disagreement costs the rest of its round's draft, so count rounds that stopped short
        # (lavapipe target, CPU draft: 1 such round, 3 tokens, at 2 near-ties)
        assert st.draft_rounds - st.full_rounds <= near_ties, (text, st.accepted, st.drafted, noise)
        assert st.tokens_by_source.get("model", 0) > 0.7 * st.tokens


def test_greedy_tokens_are_target_argmax(perturbed):
    """Re-evaluating prompt+output in one pass: every emitted token is the target's argmax there,
    or within the measured batched-vs-single logit noise of it (a near-tie)."""
    e = perturbed
    for text in PROMPTS:
        prompt = e.prompt_tokens(text)
        noise = logit_noise(e, prompt)
        tokens, _, st = run(e, prompt, greedy())
        assert 0 < st.accepted < st.drafted  # partial acceptance: both paths exercised
        seq = prompt + tokens
        rows = seq[len(prompt) - 1:-1]
        e.target.reset()
        e.target.eval(prompt[:-1], logits="none")
        logits = e.target.eval(rows, logits="all")  # row i predicts tokens[i]
        # the noise of this one long batch against single-token passes, on these very rows: a GPU
        # backend may take other kernels for a long batch than for the short ones measured on the
        # prompt (lavapipe from Mesa 25: 0.016 logit here, 8e-6 there)
        e.target.truncate(len(prompt) - 1)
        singles = np.stack([e.target.eval([t], logits="last")[0] for t in rows])
        bound = 2 * max(noise, float(np.abs(logits - singles).max())) + 1e-5
        for i, tok in enumerate(tokens):
            best = int(logits[i].argmax())
            assert tok == best or logits[i][best] - logits[i][tok] <= bound, (text, i)


def test_speculative_greedy_parts_from_plain_only_at_near_ties(perturbed, bad):
    for e in (perturbed, bad):
        for drafter in ("model", "ngram", "hybrid"):
            cfg = greedy(drafter=drafter)
            report = verify_exactness(e, [e.prompt_tokens(p) for p in PROMPTS], cfg)
            assert report["verdict"] == "OK", report
            assert report["noise"] < 0.1  # tiny F16 model: rounding-level noise only


def test_padded_verify_shapes_keep_the_output_exact(perturbed):
    """Constant verify shapes (a GPU's default): the padding is cache past the confirmed text, rolled
    back with the rejected drafts; the output is the target's as without it."""
    e = perturbed
    assert not e.target.pad_verify  # a CPU build pads nothing by default
    observer = e.target.observer
    try:
        e.target.pad_verify = True
        for drafter in ("model", "ngram"):
            report = verify_exactness(e, [e.prompt_tokens(p) for p in PROMPTS], greedy(drafter=drafter))
            assert report["verdict"] == "OK", report
        sizes = []
        e.target.observer = lambda n, dt: sizes.append(n)
        run(e, e.prompt_tokens(PROMPTS[1]), greedy(max_tokens=24, draft_max=3))
        assert set(sizes[1:]) <= set(e.target.VERIFY_SHAPES)  # after the prompt, only the fixed shapes
    finally:
        e.target.pad_verify = False
        e.target.observer = observer


def test_kv_rollback_matches_fresh_evaluation(perturbed, tiny):
    e = perturbed
    prompt = e.prompt_tokens(PROMPTS[1])
    tokens, _, st = run(e, prompt, greedy(max_tokens=40))
    assert st.drafted > st.accepted  # there were rejections to roll back
    seq = prompt + tokens
    # after generation the cache may hold a few more confirmed tokens than were emitted (the round
    # that hit max_tokens); the emitted text is a prefix of what the cache describes
    assert e.target.tokens[:len(seq) - 1] == seq[:-1]
    e.target.truncate(len(seq) - 1)
    after = e.target.eval([seq[-1]], logits="last")[0]
    expect = fresh_logits(e, seq, batched=True)
    # how far apart two correct caches can be: filled in one batch, or one token at a time (a CPU
    # build rounds both alike; a GPU build, or a CPU one offloading big batches, does not)
    spread = float(np.abs(fresh_logits(e, seq, batched=False) - expect).max())
    # a cache left holding one rejected draft token gives clearly different logits
    stale = fresh_logits(e, seq[:-2] + [tokens[0]] + seq[-1:], batched=True)
    # (3x: without flash attention, the CPU default, a cache filled by verify passes of several sizes
    # differed from one batched fill by 2.4x the batched-vs-single spread)
    tol = 3 * spread + 1e-3
    assert np.abs(after - expect).max() <= tol
    assert int(after.argmax()) == int(expect.argmax())
    assert np.abs(stale - expect).max() > 4 * tol, (float(np.abs(stale - expect).max()), spread)


def fresh_logits(e, seq: list[int], batched: bool) -> np.ndarray:
    """The target's logits for the last token of seq in a new context, its cache filled in one
    batch or one token at a time."""
    fresh = Context(e.target_model, 512, 512, THREADS, THREADS)
    try:
        if batched:
            fresh.eval(seq[:-1], logits="none")
        else:
            for t in seq[:-1]:
                fresh.eval([t], logits="none")
        return fresh.eval([seq[-1]], logits="last")[0]
    finally:
        fresh.close()


def test_draft_cache_stays_in_step_without_reprefill(perturbed):
    e = perturbed
    prompt = e.prompt_tokens(PROMPTS[2])
    e.draft_ctx.reset()
    calls_before = e.draft_ctx.n_decode
    tokens, _, st = run(e, prompt, greedy(max_tokens=40))
    draft_decodes = e.draft_ctx.n_decode - calls_before
    # one prefill, then per round: one catch-up eval + (k - 1) single-token drafts
    assert draft_decodes <= 1 + st.draft_rounds * 4
    assert e.draft_ctx.tokens[:len(prompt)] == prompt


@pytest.mark.parametrize("drafter,fixture", [("model", "bad"), ("model", "perturbed"), ("ngram", "perturbed"),
                                             ("hybrid", "bad")])
def test_stochastic_exactness_first_tokens(drafter, fixture, request):
    """Speculative sampling reproduces the target's distribution, even with a bad draft."""
    e = request.getfixturevalue(fixture)
    # the prompt repeats itself so the n-gram drafter has something to propose at position 0
    prompt = e.target_model.tokenize("the cache is fast . the cache is fast . the cache is", True)
    cfg = GenConfig(temperature=1.0, top_k=30, top_p=0.95, min_p=0.0, spec="on", drafter=drafter,
                    draft_max=3, max_tokens=1)
    e.target.sync(prompt[:-1])
    p = logits_to_probs(e.target.eval([prompt[-1]], logits="last")[0], cfg)
    e.target.truncate(len(prompt) - 1)
    p = pool_eog(e, p)
    n = 1500
    counts = np.zeros(p.size)
    drafted = 0
    for seed in range(n):
        tokens, _, st = run(e, prompt, cfg.with_(seed=seed))
        counts[tokens[0] if tokens else -1] += 1  # no token: an end-of-generation token came first
        drafted += st.drafted
    assert drafted > n * 0.5  # the speculative path really ran
    fails, chi2, crit = _chi2_fails(counts, p, n)
    assert not fails, f"chi2 {chi2:.1f} > {crit:.1f}"
    # the test has power: the draft's own distribution (what a broken accept rule would emit) fails it
    if drafter == "model" and fixture == "bad":
        e.draft_ctx.sync(prompt[:-1])
        q = pool_eog(e, logits_to_probs(e.draft_ctx.eval([prompt[-1]], logits="last")[0], cfg))
        q_counts = np.random.default_rng(0).multinomial(n, q)
        assert _chi2_fails(q_counts.astype(float), p, n)[0]


def test_stochastic_exactness_with_k_changing_every_round(perturbed):
    """Second-token distribution under the adaptive policy (k varies round to round)."""
    from localspec.costs.costmodel import CostProfile

    e = perturbed
    e.profile = CostProfile(t_decode=1.0, t_verify=[1.0, 1.05, 1.1, 1.15, 1.2], t_draft=0.05)
    prompt = e.target_model.tokenize("write the code to read a csv file", True)
    cfg = GenConfig(temperature=0.9, top_k=20, top_p=1.0, min_p=0.0, spec="auto", drafter="model",
                    draft_max=4, max_tokens=2)
    assert_second_token_is_the_targets(e, prompt, cfg, seeds=2500, min_samples=300)


def test_stop_string_inside_accepted_draft(same):
    e = same
    prompt = e.prompt_tokens(PROMPTS[0])
    cfg = greedy(max_tokens=40)
    chunks = list(e.generate(prompt, cfg))
    full = "".join(c.text for c in chunks)
    # the longest run of text that came from accepted draft tokens, and a stop string in its middle
    runs, text = [], ""
    for c in chunks:
        if c.source == "model":
            text += c.text
        elif c.token is not None:
            runs.append(text)
            text = ""
    accepted = max(runs + [text], key=len)
    assert len(accepted) >= 6, accepted
    stop = accepted[len(accepted) // 2 - 1: len(accepted) // 2 + 2]
    cut = "".join(c.text for c in e.generate(prompt, cfg.with_(stop=[stop])))
    assert cut == full[:full.index(stop)]
    assert e.last_stats.stop_reason == "stop"


def test_max_tokens_and_plain_mode(perturbed):
    e = perturbed
    prompt = e.prompt_tokens(PROMPTS[1])
    tokens, _, st = run(e, prompt, GenConfig(temperature=0, spec="off", max_tokens=17))
    assert len(tokens) == st.tokens <= 17
    assert st.drafted == 0 and st.rounds_plain == st.target_passes == st.tokens
    assert st.tokens_by_source == {"target": st.tokens}


class PassLog:
    """The target's passes during a generation: (tokens, logits mode) of each, in order."""

    def __init__(self, ctx, monkeypatch):
        self.passes: list[tuple[list[int], str]] = []
        real = ctx.eval

        def logged(tokens, logits="last", **kw):
            self.passes.append((list(tokens), logits))
            return real(tokens, logits, **kw)

        monkeypatch.setattr(ctx, "eval", logged)


def test_the_prompts_own_pass_gives_the_first_token(perturbed, monkeypatch):
    """The prompt's last token goes in the prompt's pass, whose last row is the first token's
    distribution (as llama-server does): no pass of that token alone (a whole decode step, 70 ms for
    the 1.5B on a 2-core CPU), so a plain answer of n tokens takes n - 1 passes after the prompt's."""
    e = perturbed
    prompt = e.prompt_tokens(PROMPTS[2])
    e.target.reset()
    log = PassLog(e.target, monkeypatch)
    tokens, _, st = run(e, prompt, GenConfig(temperature=0, spec="off", max_tokens=9))
    assert len(tokens) == 9 and st.prompt_eval_tokens == len(prompt) and st.target_passes == 9
    assert log.passes[0] == (prompt, "last")
    assert log.passes[1:] == [([t], "all") for t in tokens[:-1]]
    # the same text as a reference that evaluates the prompt in one pass and each token alone
    e.target.reset()
    ref = [int(e.target.eval(prompt, logits="last")[0].argmax())]
    while len(ref) < 9:
        ref.append(int(e.target.eval([ref[-1]], logits="last")[0].argmax()))
    assert tokens == ref
    # a prompt the cache holds whole, put there outside a generation (no record of its passes): a sampled
    # request evaluates its last token again; a greedy one goes in the passes of a fresh evaluation, so its
    # answer repeats whatever the cache held (docs/EXACT.md)
    for cfg, evaluated in ((GenConfig(temperature=0.7, seed=1, spec="off", max_tokens=9), prompt[-1:]),
                           (GenConfig(temperature=0, spec="off", max_tokens=9), prompt)):
        monkeypatch.undo()
        e.target.reset()
        e.target.eval(prompt, logits="none")
        log = PassLog(e.target, monkeypatch)
        again, _, st = run(e, prompt, cfg)
        assert st.prompt_eval_tokens == len(evaluated) and log.passes[0] == (evaluated, "last")
    assert again == tokens


def test_a_first_round_draft_goes_in_a_pass_of_its_own_tokens(same, monkeypatch):
    """When the first round drafts, the pass holds the draft alone (the prompt's last token is in the
    cache already) and its rows follow the prompt pass's row: all accepted with an identical draft."""
    e = same
    prompt = e.prompt_tokens(PROMPTS[1])
    e.target.reset()
    log = PassLog(e.target, monkeypatch)
    tokens, _, st = run(e, prompt, greedy(max_tokens=12, draft_max=3))
    assert log.passes[0] == (prompt, "last")
    first_round = log.passes[1]
    assert first_round == (tokens[:3], "all") and st.accepted_by_position[0] >= 1
    assert st.target_passes == len(log.passes) - 1  # a round a pass; the first counts the prompt's


def test_context_full_stops_cleanly(tiny):
    e = load(tiny.target, tiny.same, n_ctx=64)
    # a prompt that leaves room for a few tokens only, so the context fills before any EOS can come
    prompt = (e.prompt_tokens("the code of the cache", raw=True) * 64)[:e.target.n_ctx - 6]
    tokens, _, st = run(e, prompt, greedy(max_tokens=2000))
    assert st.stop_reason == "context"
    assert 0 < len(tokens) and len(prompt) + len(tokens) <= e.target.n_ctx
    e.close()


def test_incompatible_pair_is_refused(tiny):
    with pytest.raises(IncompatiblePairError, match="token"):
        load(tiny.target, tiny.other_vocab)


@pytest.mark.parametrize("temperature", [0.7, 0.0])
def test_conversation_reuses_the_cache(perturbed, monkeypatch, temperature):
    """A conversation's next turn, sampled or greedy, evaluates only what follows the cached answer
    (docs/EXACT.md); sent again, a greedy one reuses the passes of its first time and gives the same answer."""
    e = perturbed
    e.target.reset()
    cfg = greedy(max_tokens=8, temperature=temperature, seed=1)
    msgs = [Message("user", "hello world")]
    p1 = e.prompt_tokens(msgs)
    tokens, _, _ = run(e, p1, cfg)
    # the next turn as the template writes it, the answer's tokens as they were (the tiny model's bytes do
    # not always make text that tokenizes back)
    answered = p1 + tokens
    p2 = answered + e.target_model.tokenize("<|im_end|>\n<|im_start|>user\nand the cache<|im_end|>\n"
                                            "<|im_start|>assistant\n", add_special=False, parse_special=True)
    reused = common_prefix(e.target.tokens, p2)
    assert reused >= len(answered) - 1  # the answer (its last token went in only if it was a draft)
    log = PassLog(e.target, monkeypatch)
    first, _, st = run(e, p2, cfg)
    n_prompt_passes = [mode for _, mode in log.passes].index("last") + 1
    prompt_passes = [t for t, _ in log.passes[:n_prompt_passes]]
    assert st.prompt_eval_tokens == len(p2) - reused and sum(prompt_passes, []) == p2[reused:]
    again, _, st = run(e, p2, cfg)
    if temperature:  # all the cache holds, as llama-server reuses it
        assert st.prompt_eval_tokens == 1
    else:  # its last pass again: the same rows, the same text
        assert again == first and st.prompt_eval_tokens == len(prompt_passes[-1])


def test_rpc_servers_need_an_rpc_build_and_a_host_that_answers(tiny):
    import llama_cpp

    from harness.serverproc import free_port
    from localspec.backend import Model
    from localspec.errors import ModelLoadError

    nobody = f"127.0.0.1:{free_port()}"
    if not llama_cpp.llama_supports_rpc():
        with pytest.raises(ModelLoadError, match="GGML_RPC=on"):
            Model(tiny.target, rpc_servers=nobody)
        return
    # llama.cpp aborts the process on a host it cannot reach: the check before it says so in one line
    with pytest.raises(ModelLoadError, match=f"could not reach the llama.cpp rpc-server at {nobody} "
                                             r"\(Connection refused\); is `scripts/rpc-host` running there\?"):
        Model(tiny.target, rpc_servers=nobody)


def test_the_draft_model_loads_only_when_a_round_drafts_with_it(tiny):
    from localspec.session import GenChoice, ModelChoice, Session

    choice = ModelChoice(target=str(tiny.target), draft=str(tiny.perturbed), threads=THREADS, ctx_size=512)
    s = Session.open(choice, GenChoice(spec="off", max_tokens=8, temperature=0))
    e = s.engine
    prompt = e.prompt_tokens(PROMPTS[0])
    for cfg in (s.gen, greedy(drafter="ngram", max_tokens=8)):
        list(e.generate(prompt, cfg))
        assert e.draft_ctx is None and e.draft_model is None  # plain and n-gram runs never load it
    assert not s.wants_draft()
    tokens, _, st = run(e, prompt, greedy(drafter="model", max_tokens=16))
    assert e.draft_ctx is not None and st.drafted_by_drafter.get("model", 0) > 0
    assert tokens == [c.token for c in load(tiny.target).generate(prompt, greedy(spec="off", max_tokens=16))
                      if c.token is not None]
    s.close()


def test_an_incompatible_draft_is_refused_before_anything_runs(tiny):
    from localspec.session import GenChoice, ModelChoice, Session

    with pytest.raises(IncompatiblePairError):
        Session.open(ModelChoice(target=str(tiny.target), draft=str(tiny.other_vocab), threads=THREADS), GenChoice())


def test_quiet_as_a_library_unless_debugging(tiny):
    import subprocess
    import sys

    code = (f"from localspec.engine import Engine\nfrom localspec.config import GenConfig\n"
            f"e = Engine({str(tiny.target)!r}, {str(tiny.same)!r})\n"
            f"print(len(e.complete(e.prompt_tokens('hello'), GenConfig(max_tokens=4, spec='off'))[0]) >= 0)\n")
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={k: v for k, v in __import__("os").environ.items() if k != "LOCALSPEC_DEBUG"})
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "True\n", "")
    loud = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "LOCALSPEC_DEBUG": "1"})
    assert loud.returncode == 0 and "llama_model_loader" in loud.stderr


def test_without_a_profile_auto_drafts_only_where_it_pays_on_any_machine(tiny):
    """A fresh install has measured nothing: the reference curve prices drafts (engine.py), so a predicted
    output or a long copy is drafted from the first answer on; chance matches and the draft model are not."""
    e = load(tiny.target, tiny.same)
    try:
        assert e.profile is None
        prompt = e.prompt_tokens(PROMPTS[1])
        tokens, _, _ = run(e, prompt, GenConfig(temperature=0, spec="off", max_tokens=40))
        said = b"".join(e.target_model.piece(t) for t in tokens).decode("utf-8", "replace")
        cfg = GenConfig(temperature=0.7, top_k=1, seed=1, spec="auto", max_tokens=40, prediction=said)
        _, _, st = run(e, prompt, cfg)
        assert st.spec_mode == "auto" and st.drafted_by_drafter.get("ngram", 0) > 0 and st.accepted > 0
        assert not st.drafted_by_drafter.get("model") and "T_verify/T_decode = 1.00, 1.80" in st.policy
    finally:
        e.close()
