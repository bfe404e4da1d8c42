"""Recurrent and hybrid targets (Mamba, LFM2, Qwen3.5) on tiny models llama.cpp builds at their own shapes:
speculation as exact as on a transformer, rejected drafts rolled back without evaluating the context again,
prompts reused across turns and requests, lanes never sharing a recurrent state (docs/RECURRENT.md)."""

from __future__ import annotations

import threading

import pytest
from conftest import THREADS

from harness.tinyarch import build_tiny_arch
from localspec.backend import rollback
from localspec.backend.passes import Cuts
from localspec.config import GenConfig, LoadConfig
from localspec.decoding.drafters import learn_reach
from localspec.engine import Engine
from localspec.models.archs import rollback_of
from localspec.serving.engine import ServingEngine

ARCHS = {"mamba": rollback.CHECKPOINT, "lfm2": rollback.SNAPSHOT, "qwen35": rollback.SNAPSHOT}
TEXT = "the cache model token draft target fast slow " * 3


@pytest.fixture(scope="session")
def arch_files(tmp_path_factory):
    """arch -> (target, perfect draft, perturbed draft)."""
    d = tmp_path_factory.mktemp("archs")
    out = {}
    for arch in ARCHS:
        out[arch] = (build_tiny_arch(d / f"{arch}.gguf", arch), build_tiny_arch(d / f"{arch}-same.gguf", arch),
                     build_tiny_arch(d / f"{arch}-perturbed.gguf", arch, perturb=0.15))
    return out


def load(n_ctx=4096, parallel=1):
    return LoadConfig(n_ctx=n_ctx, n_threads=THREADS, n_threads_batch=THREADS, n_parallel=parallel)


def greedy(**kw) -> GenConfig:
    return GenConfig(**{**dict(temperature=0.0, spec="on", drafter="model", draft_max=4, max_tokens=40), **kw})


def run(e, prompt, cfg, lane=None):
    chunks = list(e.generate(prompt, cfg, lane=lane))
    return [c.token for c in chunks if c.token is not None], (lane or e.lane).last_stats


@pytest.fixture(scope="module", params=list(ARCHS))
def engine(request, arch_files):
    target, _, perturbed = arch_files[request.param]
    e = Engine(target, perturbed, load())
    e.arch = request.param
    yield e
    e.close()


def prompt_of(e, n_words: int) -> list[int]:
    return e.target_model.tokenize(" ".join((TEXT.split() * 400)[:n_words]), add_special=True)


def test_each_architecture_gets_its_rollback(engine, tiny):
    assert engine.target.rollback == ARCHS[engine.arch]
    assert rollback_of(engine.arch) == ARCHS[engine.arch]
    t = Engine(tiny.target, None, load(512))
    try:
        assert t.target.rollback == rollback.PARTIAL and rollback_of("llama") == rollback.PARTIAL
    finally:
        t.close()


@pytest.mark.parametrize("drafter", ["model-perturbed", "model-same", "ngram", "prediction"])
def test_greedy_speculation_gives_plain_decodings_text(engine, arch_files, drafter):
    """Every drafter, every rejected tail rolled back cheaply: the text of --spec off, no fallback."""
    e = engine
    if drafter == "model-same":
        e = Engine(arch_files[engine.arch][0], arch_files[engine.arch][1], load())
    try:
        prompt = prompt_of(e, 60)
        plain, _ = run(e, prompt, greedy(spec="off"))
        kw = {"drafter": "model"} if drafter.startswith("model") else {"drafter": "ngram", "ngram_draft_max": 8}
        if drafter == "prediction":
            kw["prediction"] = b"".join(e.target_model.piece(t) for t in plain[:20] + prompt[5:30]).decode("utf-8", "replace")
        before = e.target.miss.fallbacks
        spec, st = run(e, prompt, greedy(**kw))
        assert spec == plain
        assert st.drafted > 0 and e.target.miss.fallbacks == before
        if e.draft_ctx is not None:
            assert e.draft_ctx.miss.fallbacks == 0
    finally:
        if e is not engine:
            e.close()


def test_a_rejected_tail_costs_the_same_deep_in_the_context(engine, monkeypatch):
    """A verify pass rolled back at 100 and at 2,000 tokens evaluates the same few tokens again (none with
    snapshots), never the context."""
    ctx = engine.target
    replayed = []
    real = ctx.eval

    def logged(tokens, logits="last", **kw):
        replayed.append(len(tokens))
        return real(tokens, logits, **kw)

    for depth in (100, 2000):
        ctx.reset()
        ctx.sync(prompt_of(engine, depth)[:depth])
        ctx.eval([5, 6, 7, 8, 9], logits="all")
        monkeypatch.setattr(ctx, "eval", logged)
        replayed.clear()
        ctx.truncate(depth + 2)
        monkeypatch.setattr(ctx, "eval", real)
        assert len(ctx.tokens) == depth + 2 and sum(replayed) <= 2, (depth, replayed)
    assert ctx.miss.fallbacks == 0


@pytest.mark.parametrize("per_step", [False, True])
def test_a_recurrent_draft_model_goes_back_to_its_last_accepted_draft(engine, monkeypatch, per_step):
    """Where a save is cheap against a step, the draft model saves its state after each drafted token: the round
    after a rejection evaluates the target's token alone (two with every draft accepted), never the accepted
    drafts again; otherwise it goes back to the round's start and evaluates them with it. Texts equal plain."""
    monkeypatch.setattr(rollback.MissCost, "step_save_pays", lambda self, reach: per_step)
    prompt = prompt_of(engine, 60)
    plain, _ = run(engine, prompt, greedy(spec="off"))
    run(engine, prompt_of(engine, 30), greedy(max_tokens=2))  # the draft context loaded
    passes = []
    monkeypatch.setattr(engine.draft_ctx, "observer", lambda n, dt: passes.append(n))
    spec, st = run(engine, prompt, greedy())
    assert spec == plain and st.drafted > st.accepted > 0 and engine.draft_ctx.miss.fallbacks == 0
    later = passes[1:]  # after the first round's catch-up with the prompt
    assert (max(later) <= 2) == per_step, later


def test_rollback_gives_the_rows_of_a_fresh_evaluation(engine):
    """After a rollback, the next row is the one decoding the kept text gives."""
    ctx, prompt = engine.target, prompt_of(engine, 80)
    ctx.reset()
    ctx.sync(prompt)
    ctx.eval([9, 9, 9, 9], logits="all")
    ctx.truncate(len(prompt) + 1)
    after = ctx.eval([7], logits="last")[0]
    ctx.reset()
    ctx.sync(prompt + [9])
    fresh = ctx.eval([7], logits="last")[0]
    assert abs(after - fresh).max() < 1e-3 and after.argmax() == fresh.argmax()


def test_prompts_reuse_what_a_recurrent_cache_holds(engine):
    """The same greedy prompt again repeats its last pass and its text; a conversation's next turn
    evaluates only what is new; a prompt sharing a long prefix evaluates from its last checkpoint."""
    e, cfg = engine, greedy(max_tokens=12, spec="off")
    e.target.reset()
    p1 = prompt_of(e, 600)
    first, st = run(e, p1, cfg)
    assert st.prompt_eval_tokens == len(p1)
    again, st = run(e, p1, cfg)
    assert again == first and st.prompt_eval_tokens <= 256 + 8  # its last pass (passes.py)
    p2 = p1 + first + e.target_model.tokenize(" and the cache", add_special=False)
    _, st = run(e, p2, cfg)
    assert st.prompt_eval_tokens <= len(p2) - len(p1)
    p3 = p1[:500] + e.target_model.tokenize(" slow fast", add_special=False)
    _, st = run(e, p3, cfg)
    assert st.prompt_eval_tokens <= 300  # from the last pass end at or before the shared 500 tokens
    assert e.target.miss.fallbacks == 0


@pytest.mark.parametrize("arch", ["qwen35", "mamba"])
def test_parallel_lanes_sharing_a_prefix_never_share_a_state(arch_files, arch, monkeypatch):
    """Overlapping requests that start alike on two lanes (the second takes the first's prefix) answer as
    each does alone: llama.cpp's seq_cp would hand the second lane the first's whole recurrent state."""
    target, _, perturbed = arch_files[arch]
    e = ServingEngine(target, perturbed, LoadConfig(n_ctx=4096, n_threads=THREADS, n_threads_batch=THREADS,
                                                    n_parallel=2, cache_ram_mib=64))
    shared, real = [], e.target.copy_prefix
    monkeypatch.setattr(e.target, "copy_prefix", lambda *a: shared.append(real(*a)) or shared[-1])
    try:
        base = e.target_model.tokenize(TEXT * 12, add_special=True)
        prompts = [base + e.target_model.tokenize(f" {w} {w} {w}", add_special=False) for w in ("fast", "slow")]
        cfg = greedy(max_tokens=16, temperature=0.8, seed=3, spec="on")
        alone = []
        for p in prompts:
            e.lanes[0].target.reset()
            alone.append(run(e, p, cfg, lane=e.lanes[0])[0])
        for _ in range(3):
            for lane in e.lanes:
                lane.target.reset()
            run(e, base + [5], cfg.with_(max_tokens=1), lane=e.lanes[0])  # lane 0 holds the shared prefix
            out: list = [None, None]

            def go(i):
                out[i] = run(e, prompts[i], cfg, lane=e.lanes[i])[0]

            threads = [threading.Thread(target=go, args=(i,)) for i in (1, 0)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            assert out == alone
        assert shared and max(shared) > 0  # the second lane did take the first's prefix
    finally:
        e.close()


def test_check_says_which_rollback_a_file_gets(arch_files, tiny, cli):
    qwen, mamba = arch_files["qwen35"][0], arch_files["mamba"][0]
    code, out, err = cli("check", str(qwen), str(mamba))
    assert (code, err) == (0, "")
    assert out.splitlines()[-2:] == [
        "target rollback: per-token state snapshots for short drafts, checkpoints for longer ones (docs/RECURRENT.md)",
        "draft rollback: its state saved after each drafted token where a save costs little beside a step (a CPU), "
        "else at each round's start and the accepted drafts evaluated again (docs/RECURRENT.md)"]
    assert "rollback" not in cli("check", str(tiny.target))[1]


def test_checkpoints_are_bounded_and_copied_up_to_a_point():
    ck = rollback.Checkpoints()
    for p in range(1, 100):
        ck.add(p * 10, bytes(4))
    assert len(ck.items) == rollback.KEEP and ck.best(995)[0] == 990 and ck.best(5) is None
    assert [p for p, _ in ck.copy(700).items][-1] == 700
    ck.add(500, bytes(4))  # a new state at 500 replaces every later one
    assert ck.items[-1][0] == 500 and ck.best(999)[0] == 500
    assert rollback.reach(650, 900, ck.positions(), rollback.CHECKPOINT) == 500
    assert rollback.reach(650, 900, ck.positions(), rollback.PARTIAL) == 650
    assert rollback.reach(900, 900, [], "checkpoint") == 900
    assert Cuts().copy(0).at == []


def test_a_draft_rounds_checkpoints_and_when_they_pay(monkeypatch):
    """A draft round's rollback states, `keep` of them: over the byte budget the prompt's go first, then those
    between the round's start and its latest. A save before a drafted token where it costs less than the
    replays it spares (the share of rounds that get that far), and little beside a step."""
    ck = rollback.Checkpoints()
    ck.add(5, bytes(8))
    for p in range(10, 15):
        ck.add(p, bytes(8), rollback=True, keep=4)
    assert ck.positions() == [5, 11, 12, 13, 14]
    monkeypatch.setattr(rollback, "BUDGET", 10)
    ck.add(15, bytes(8), rollback=True, keep=5)
    assert ck.positions() == [11, 15]
    reach: dict[int, float] = {}
    learn_reach(reach, 1, 3)  # a round that evaluated 3 drafts and kept 1
    learn_reach(reach, 0, 2)
    assert reach == pytest.approx({1: 0.8, 2: 0.64, 3: 0.8})
    learn_reach(reach, 2, 2)  # every evaluated draft kept: the state is the current one, no save served it
    assert reach[1] == pytest.approx(0.64)
    cost = rollback.MissCost(save_s=5e-5, step_s=1e-3)  # a save costs a twentieth of a step
    assert cost.step_save_pays(1.0) and cost.step_save_pays(0.2)
    assert not cost.step_save_pays(0.05)  # it would spare a token's replay in one round of twenty
    assert not rollback.MissCost(save_s=1e-3, step_s=1e-3).step_save_pays(1.0)  # dear (a GPU's host copy)
    assert not rollback.MissCost(step_s=1e-3).step_save_pays(1.0)  # not measured yet


def test_a_hybrids_saved_prompt_survives_a_restart(arch_files, tmp_path):
    """The disk cache keeps a hybrid's checkpoints with its state: after a restart, a prompt sharing the saved
    one's first part reuses it up to a checkpoint and evaluates only the rest."""
    target = arch_files["qwen35"][0]
    cfg = greedy(max_tokens=4, spec="off")

    def server():
        return ServingEngine(target, None, LoadConfig(n_ctx=4096, n_threads=THREADS, n_threads_batch=THREADS,
                                                      n_parallel=1, cache_ram_mib=64, cache_disk_mib=64))

    e = server()
    try:
        first = prompt_of(e, 400)
        _, st = run(e, first, cfg)
        assert st.prompt_eval_tokens == len(first) >= 1024
        e.prompt_cache.persist(st.prompt_eval_tokens, e.lanes[0].target)
        e.prompt_cache.disk.wait()
    finally:
        e.close()
    e = server()
    try:
        later = first[:1100] + e.target_model.tokenize(" slow fast list", add_special=False)
        _, st = run(e, later, cfg)
        assert st.cache_restored and st.prompt_eval_tokens <= len(later) - 1024
        assert e.target.miss.fallbacks == 0
    finally:
        e.close()


def test_sampling_on_a_hybrid_is_the_targets_distribution(arch_files):
    """Speculative sampling with rollbacks by snapshot and checkpoint keeps the target's distribution: the
    second token's frequencies against the target's probabilities (as test_engine's statistical test)."""
    from enginekit import assert_second_token_is_the_targets

    target, _, perturbed = arch_files["qwen35"]
    e = Engine(target, perturbed, load(512))
    try:
        prompt = e.target_model.tokenize("the cache model token", True)
        cfg = GenConfig(temperature=0.9, top_k=20, top_p=1.0, min_p=0.0, spec="on", drafter="model",
                        draft_max=4, max_tokens=2)
        assert_second_token_is_the_targets(e, prompt, cfg, seeds=1500, min_samples=200)
    finally:
        e.close()


def test_a_pass_given_up_on_a_hybrid_leaves_a_state_to_build_on(arch_files):
    """A background pass that gives way inside llama_decode may leave part of itself in a recurrent state:
    the sequence goes back to its checkpoint, and what follows is computed as on a fresh cache."""
    from localspec.errors import PassInterrupted

    e = Engine(arch_files["qwen35"][0], None, load(1024))
    try:
        ctx, p = e.target, prompt_of(e, 120)[:300]
        ctx.sync(p[:200])
        with pytest.raises(PassInterrupted):
            ctx.eval(p[200:], logits="none", stop=lambda: True)
        assert ctx.tokens == p[:200] and ctx.miss.fallbacks == 0
        after = ctx.eval(p[200:], logits="last")[0]
        ctx.reset()
        ctx.sync(p[:200])
        fresh = ctx.eval(p[200:], logits="last")[0]
        assert abs(after - fresh).max() < 1e-3
    finally:
        e.close()
