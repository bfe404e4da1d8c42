"""Continuous batching: several generations in one context, one llama_decode per step (batching.py)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from conftest import THREADS
from lanekit import assert_plain_or_near_tie, run_together

from localspec.backend import Context, Model, sync_cache
from localspec.chat_format import Message
from localspec.config import GenConfig, LoadConfig
from localspec.costs.costmodel import CostProfile, best_k, best_k_shared
from localspec.engine import Engine
from localspec.errors import PassInterrupted
from localspec.serving.batching import PROMPT_SLICE, Batcher, Pass
from localspec.serving.caches.promptcache import PromptCache
from localspec.serving.caches.promptfills import PromptFills
from localspec.serving.caches.swap import SwapSpace
from localspec.serving.engine import ServingEngine


def load(n_parallel: int, n_ctx: int = 2048, flash_attn: str = "on") -> LoadConfig:
    """The tiny model's exactness tests run llama.cpp's flash-attention kernel: their near-tie bound is
    the batched-vs-single noise of one sequence, which without it (the CPU default) understates a step
    shared with other sequences (a parting at a 0.0010 margin against a 0.0008 bound). The default is
    checked on the real pair below, where near-ties are counted."""
    return LoadConfig(n_ctx=n_ctx, n_threads=THREADS, n_threads_batch=THREADS, n_parallel=n_parallel,
                      flash_attn=flash_attn)


@pytest.fixture(scope="module")
def shared(tiny):
    e = ServingEngine(tiny.target, None, load(3))
    yield e
    e.close()


@pytest.fixture(scope="module")
def alone(tiny):
    e = Engine(tiny.target, None, load(1))
    yield e
    e.close()


def tokens(e: Engine, text: str) -> list[int]:
    return e.target_model.tokenize(text, add_special=True)


def test_a_shared_step_gives_each_sequence_its_own_logits_and_rollback_is_per_sequence(tiny):
    model = Model(tiny.target)
    ctx = Context(model, 1024, 512, THREADS, THREADS, n_seq=2)
    solo = Context(model, 1024, 512, THREADS, THREADS)
    try:
        a, b = [1, 5, 9, 13, 17, 21], [2, 4, 6, 8]
        out = ctx.decode_parts([(0, a, "last"), (1, b, "all")])
        assert ctx.seq_tokens == {0: a, 1: b}
        assert out[0].shape == (1, ctx.n_vocab) and out[1].shape == (len(b), ctx.n_vocab)
        ref_a = solo.eval(a, "last")
        solo.reset()
        ref_b = solo.eval(b, "all")
        assert np.allclose(out[0], ref_a, atol=1e-2) and np.allclose(out[1], ref_b, atol=1e-2)
        # a draft on sequence 0 rejected and rolled back: sequence 1's next token sees none of it
        ctx.decode_parts([(0, [30, 31, 32], "all"), (1, [10], "last")])
        ctx.truncate(len(a), 0)
        assert ctx.seq_tokens[0] == a
        nxt = ctx.decode_parts([(1, [12], "last")])[0]
        ref = solo.eval([10, 12], "last")
        assert np.allclose(nxt, ref, atol=1e-2) and int(nxt.argmax()) == int(ref.argmax())
    finally:
        ctx.close()
        solo.close()
        model.close()


def test_batched_generations_equal_their_single_runs_and_never_mix(shared, alone):
    cfg = GenConfig(temperature=0, max_tokens=40, spec="on", drafter="ngram", draft_max=4)
    prompts = [tokens(shared, t) for t in ("hello world the cache", "def parse the csv file", "import the data now")]
    steps = shared.batcher.steps
    got = run_together(shared, prompts, cfg)
    for (toks, st), p, lane in zip(got, prompts, shared.lanes):
        assert lane.target.tokens[:len(p) - 1] == p[:-1]  # each sequence holds its own text only
        assert lane.target.tokens[len(p):] == toks[:len(lane.target.tokens) - len(p)]
    # a token of another sequence's text would part from plain decoding at a clear margin
    assert_plain_or_near_tie(alone, prompts, [toks for toks, _ in got])
    rounds = sum(st.target_passes for _, st in got)
    assert shared.batcher.steps - steps < rounds  # passes were shared: fewer steps than passes
    assert not shared.batcher.active


def test_cancelling_one_generation_mid_batch_frees_its_sequence_and_leaves_the_others_exact(shared, alone):
    cfg = GenConfig(temperature=0, max_tokens=60, spec="off")
    prompts = [tokens(shared, t) for t in ("one two three", "four five six", "seven eight nine")]
    got = run_together(shared, prompts, cfg, cancel_after={1: 5})
    assert got[1][1].stop_reason == "cancelled" and len(got[1][0]) == 5
    assert_plain_or_near_tie(alone, [prompts[0], prompts[2]], [got[0][0], got[2][0]])
    assert not shared.batcher.active


def test_sampling_keeps_each_request_its_own_random_stream(shared, alone):
    # T > 0: each request samples from its own rows with its own seeded generator, drafts verified by
    # speculative sampling in shared steps; what it draws is what it draws alone with the same seed
    prompts = [tokens(shared, t) for t in ("the cache holds", "parse the file", "import data")]
    cfgs = [GenConfig(temperature=0.8, top_p=1.0, top_k=0, seed=11 + i, max_tokens=30, spec="on", drafter="ngram",
                      draft_max=4) for i in range(3)]
    want = [[c.token for c in alone.generate(p, c) if c.token is not None] for p, c in zip(prompts, cfgs)]
    out: list = [None] * 3

    def run(i: int) -> None:
        out[i] = [c.token for c in shared.generate(prompts[i], cfgs[i], lane=shared.lanes[i]) if c.token is not None]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert out == want


def test_a_prompt_held_by_another_lane_is_shared_not_evaluated_again(shared):
    shared.prompt_cache = PromptCache(shared.lanes[0].target, 64 << 20, lanes=[x.target for x in shared.lanes])
    try:
        system = tokens(shared, "you are a helpful assistant " * 20)
        cfg = GenConfig(temperature=0, max_tokens=4, spec="off", repeatable=False)  # the cache's reuse, whole
        list(shared.generate(system + [7, 8], cfg, lane=shared.lanes[0]))
        list(shared.generate(system + [9, 10], cfg, lane=shared.lanes[1]))
        st = shared.lanes[1].last_stats
        assert st.prompt_eval_tokens <= 2  # only what follows the shared system prompt
    finally:
        shared.prompt_cache = None


def test_requests_arriving_together_with_one_system_prompt_evaluate_it_once(shared):
    shared.prompt_cache = PromptCache(shared.lanes[0].target, 64 << 20, lanes=[x.target for x in shared.lanes])
    try:
        old = [tokens(shared, f"an earlier conversation number {i} " * 12) for i in range(3)]
        for lane, conversation in zip(shared.lanes, old):
            lane.target.reset()
            lane.target.sync(conversation)  # the last burst's conversations, still in their lanes
        system = tokens(shared, "you are a careful coding assistant working on this module " * 8)
        assert len(system) > 300
        prompts = [system + [20 + i, 30 + i] for i in range(3)]
        got = run_together(shared, prompts, GenConfig(temperature=0, max_tokens=4, spec="off", repeatable=False))
        evaluated = sorted(st.prompt_eval_tokens for _, st in got)
        assert evaluated[-1] >= len(system) and sum(evaluated[:-1]) <= 6  # the others evaluated their last tokens
        # the waiting lanes parked their old conversations (saved, cells freed) instead of keeping them
        # beside the fill; the filling lane's went the usual way (saved when its prompt replaced it)
        assert all(any(e.tokens == c for e in shared.prompt_cache.entries) for c in old)
    finally:
        shared.prompt_cache = None


def test_a_waiting_request_waits_for_the_new_prefix_not_the_filling_lanes_old_length():
    """The filling lane may still hold an older, longer conversation (the first burst's) when a request
    sharing its new prompt arrives: the request waits until the new prefix is there."""
    from types import SimpleNamespace

    fills = PromptFills()
    system = list(range(1000, 1400))
    filler = SimpleNamespace(tokens=[7] * 600)  # the last burst's conversation, longer than the new prefix
    registered, filled, through = threading.Event(), threading.Event(), threading.Event()

    parked: list[int] = []

    def fill():
        with fills.evaluating(0, filler, system + [1, 2], on_wait=lambda: parked.append(0)):
            registered.set()
            filled.wait(5)
            filler.tokens = system + [1]  # its fill: truncated to what it shares, then the new prompt
            through.wait(5)

    def wait():
        registered.wait(5)
        with fills.evaluating(1, SimpleNamespace(tokens=[]), system + [3, 4], on_wait=lambda: parked.append(1)):
            through.set()

    threads = [threading.Thread(target=fill), threading.Thread(target=wait)]
    for t in threads:
        t.start()
    assert not through.wait(0.3)  # the old 600 tokens are not the 400 it waits for
    filled.set()
    assert through.wait(5)
    for t in threads:
        t.join(5)
    assert parked == [1]  # only the waiter parks its lane's old conversation, once, before waiting


def test_waiters_let_the_filler_take_its_first_token_alone(monkeypatch):
    """The requests sharing a burst's prompt start their own tails only after the one that evaluated it
    has taken its first token's pass (one token, not that plus three tails), or after a bounded wait."""
    from types import SimpleNamespace

    fills = PromptFills()
    system = list(range(1000, 1400))
    want = system + [1, 2]
    filler = SimpleNamespace(tokens=[])
    registered, through, release = threading.Event(), threading.Event(), threading.Event()

    def fill():
        with fills.evaluating(0, filler, want):
            registered.set()
            while 1 not in fills.filling:  # the other request is waiting for this fill
                time.sleep(0.01)
            filler.tokens = list(want)  # the whole fill is in: the shared prefix is there...
        release.wait(5)
        filler.tokens = want + [9]  # ...then its first token's pass

    def wait():
        registered.wait(5)
        with fills.evaluating(1, SimpleNamespace(tokens=[]), system + [3, 4]):
            through.set()

    threads = [threading.Thread(target=fill), threading.Thread(target=wait)]
    for t in threads:
        t.start()
    assert not through.wait(0.3)
    release.set()
    assert through.wait(1.0)
    for t in threads:
        t.join(5)
    monkeypatch.setattr(PromptFills, "FIRST_TOKEN_WAIT_S", 0.2)  # a filler cancelled before its first token
    t0 = time.monotonic()
    fills._first_token(SimpleNamespace(tokens=list(want)), len(want), None)
    assert time.monotonic() - t0 < 1.0


def test_a_request_sharing_a_warm_ups_prompt_goes_once_the_prefix_is_there():
    """An editor's warm-up (a prefill) is never followed by a token's pass: a completion that waited for
    its fill goes as soon as the shared prefix is in, not after the bounded wait for a first token (it
    had made llama.vim's completions after a warm-up 2.2-2.6 s slower, measured with --log-requests)."""
    from types import SimpleNamespace

    fills = PromptFills()
    system = list(range(1000, 1400))
    warm = SimpleNamespace(tokens=[])
    registered, release, through = threading.Event(), threading.Event(), threading.Event()

    def warm_up():
        with fills.evaluating(0, warm, system + [1, 2], generates=False):
            registered.set()
            release.wait(5)
            warm.tokens = system + [1, 2]
        release.wait(5)

    def complete():
        registered.wait(5)
        with fills.evaluating(1, SimpleNamespace(tokens=[]), system + [3, 4]):
            through.set()

    threads = [threading.Thread(target=warm_up), threading.Thread(target=complete)]
    for t in threads:
        t.start()
    assert not through.wait(0.2)  # waits for the shared prefix...
    t0 = time.monotonic()
    release.set()
    assert through.wait(5) and time.monotonic() - t0 < PromptFills.FIRST_TOKEN_WAIT_S / 2  # ...and no longer
    for t in threads:
        t.join(5)


def test_a_fill_that_ends_while_the_waiter_parks_its_lane_lets_it_through():
    """The filling lane may finish while the waiting one is still parking its old conversation (found
    from a fresh clone: a KeyError in the waiter's thread)."""
    from types import SimpleNamespace

    fills = PromptFills()
    system = list(range(1000, 1400))
    registered, release, done = threading.Event(), threading.Event(), threading.Event()

    def fill():
        with fills.evaluating(0, SimpleNamespace(tokens=system), system + [1, 2]):
            registered.set()
            release.wait(5)
        done.set()

    def park_slowly():
        release.set()
        assert done.wait(5)  # the fill is over before the waiter looks at it

    filler = threading.Thread(target=fill)
    filler.start()
    registered.wait(5)
    with fills.evaluating(1, SimpleNamespace(tokens=[]), system + [3, 4], on_wait=park_slowly):
        pass
    filler.join(5)
    assert fills.filling == {}


def test_a_request_gets_the_lane_holding_its_prefix_and_idle_lanes_are_parked(shared):
    from localspec.serving.lanes import LanePool

    shared.prompt_cache = PromptCache(shared.lanes[0].target, 64 << 20, lanes=[x.target for x in shared.lanes])
    try:
        a, b = tokens(shared, "alpha beta gamma " * 12), tokens(shared, "delta epsilon zeta " * 12)
        for lane, toks in zip(shared.lanes, (a, b, [])):
            lane.target.sync(toks)
        pool = LanePool(shared)
        got = pool.checkout(b + [5, 6])
        assert got is shared.lanes[1] and got.target.tokens == b  # its cells are where they were
        assert shared.lanes[0].target.tokens == [] and any(e.tokens == a for e in shared.prompt_cache.entries)
        other = pool.checkout(a + [7])  # the parked one comes back from the prompt cache into a free lane
        assert shared.prompt_cache.prefix_len(a + [7]) == len(a)
        pool.checkin(got)
        pool.checkin(other)
    finally:
        shared.prompt_cache = None


def test_a_quick_profile_gets_its_whole_curve_in_the_first_idle_moment_even_after_a_short_request(shared):
    """After a "hi" (too shallow to measure over), the idle measurement fills the lane to QUICK_FILL
    tokens, prices passes to 64 there, and leaves the lane holding the conversation it held."""
    from localspec.costs import idle
    from localspec.costs.costmodel import CURVE_SIZES
    from localspec.serving import worker

    srv = worker.ModelWorker.__new__(worker.ModelWorker)
    srv.engine, srv.idle_watch = shared, None
    srv.jobs = worker.JobQueue(lambda job: None)
    srv.depth_backoff = idle.Backoff()
    before = shared.profile
    shared.profile = CostProfile(t_decode=1.0, t_verify=[1.0 + i for i in range(16)], extra={"quick": True})
    lane = shared.lanes[0]
    try:
        hi = tokens(shared, "say hi")
        lane.target.sync(hi)
        # a measurement whose repeats disagree is dropped (noise: the tiny model's passes take under a
        # millisecond, and on a busy shared machine five in a row disagreed once)
        for _ in range(20):
            srv._measure_depth(lane)
            assert lane.target.tokens == hi
            if not shared.profile.extra["quick"]:
                break
        prof = shared.profile
        assert not prof.extra["quick"] and len(prof.t_verify) == CURVE_SIZES[-1] and prof.depth == worker.QUICK_FILL
        assert lane.target.tokens == hi
        assert lane.target.eval([5], "last") is not None  # the cells past the conversation are free again
    finally:
        shared.profile = before
        lane.target.sync([])


def test_the_wait_queue_is_bounded(monkeypatch):
    from localspec.errors import Unavailable
    from localspec.serving import worker
    from localspec.serving.jobqueue import JobQueue
    from localspec.serving.metrics import Metrics

    monkeypatch.setattr(worker, "MAX_WAITING", 2)
    srv = worker.ModelWorker.__new__(worker.ModelWorker)  # no lanes: every job stays waiting
    srv.jobs = JobQueue(lambda job: None)
    srv.metrics = Metrics(srv.jobs)
    job = lambda: worker.Job(lambda engine: ([], None), None, lambda event: None)  # noqa: E731
    srv.submit(job())
    srv.submit(job())
    with pytest.raises(Unavailable, match="waiting"):
        srv.submit(job())


class FakeCtx:
    n_batch = 512


def test_a_long_prompt_goes_in_slices_while_others_decode_and_priority_goes_alone():
    b = Batcher.__new__(Batcher)
    b.ctx, b.active, b.step_end = FakeCtx(), {0: False, 1: False, 2: True}, 0.0
    b.swap = SwapSpace(b.ctx)
    prompt, decode = Pass(0, list(range(1000)), "none", False), Pass(1, [5, 6, 7], "all", False)
    b.waiting = [prompt, decode]
    step = b._compose()
    assert [(p.seq, n) for p, n in step] == [(1, 3), (0, PROMPT_SLICE)]
    b.waiting = [prompt]
    assert b._compose() == [(prompt, 512)]  # alone: whole batches
    editor = Pass(2, [1, 2], "all", True)
    b.waiting = [prompt, decode, editor]
    assert b._compose() == [(editor, 2)]  # an editor's completion goes alone
    assert b._wait_left(time.perf_counter()) == 0.0
    b.waiting = [prompt, decode]  # its next pass is on its way: the others wait for it, a while
    assert 0 < b._wait_left(time.perf_counter()) <= 0.05
    b.step_end = time.perf_counter()  # ...counted from its last step, however long theirs have waited
    assert 0 < b._wait_left(time.perf_counter() - 10) <= 0.05


def test_a_running_request_yields_to_a_newer_one_for_its_first_steps():
    b = Batcher.__new__(Batcher)
    now = time.monotonic()
    b.active, b.joined, b.last_step = {0: False, 1: False}, {0: now - 30, 1: now - 0.1}, {0: 17, 1: 1}
    assert b.others(0) == (1, 1, True)  # the long answer: a newcomer is here, draft nothing
    assert b.others(1) == (17, 1, False)  # the newcomer prices its drafts by the long one's rows
    b.joined[1] = now - 10
    assert b.others(0) == (1, 1, False)


def test_drafts_are_priced_by_what_they_add_to_a_shared_step():
    prof = CostProfile(t_decode=1.0, t_verify=[1.0 + 0.5 * n for n in range(64)])
    assert best_k_shared(0.9, 16, prof, "ngram", 0, 0) == best_k(0.9, 16, prof, "ngram")
    alone_k = best_k(0.9, 16, prof, "ngram")[0]
    busy_k = best_k_shared(0.9, 16, prof, "ngram", rows=3, others=3)[0]
    assert alone_k > 0 and busy_k < alone_k  # others busy: drafting shrinks
    # beside a long prompt slice, a few more tokens cost little: drafting grows
    flat = CostProfile(t_decode=1.0, t_verify=[1.0 + 0.3 * n for n in range(64)])
    assert best_k_shared(0.6, 16, flat, "ngram", rows=64, others=1)[0] >= best_k(0.6, 16, flat, "ngram")[0]


@pytest.mark.realpair
def test_batched_greedy_equals_single_runs_but_at_measured_near_ties_on_the_real_pair(real_pair):
    target, _ = real_pair
    e = ServingEngine(target, None, load(4, n_ctx=4096, flash_attn="auto"))  # what a user runs: off on a CPU
    try:
        prompts = [e.prompt_tokens([Message("user", t)]) for t in (
            "Write a Python function that reverses a string.", "What is a mutex? One sentence.",
            "List three prime numbers.", "Write a bash loop that prints 1 to 3.")]
        # speculative: n-gram drafts verified inside the shared steps, rolled back per sequence
        cfg = GenConfig(temperature=0, max_tokens=48, spec="on", drafter="ngram", draft_max=4)
        got = run_together(e, prompts, cfg)
        assert sum(st.drafted for _, st in got) > 0
        assert_plain_or_near_tie(e, prompts, [toks for toks, _ in got])
    finally:
        e.close()


def test_every_pass_of_a_shared_context_runs_on_the_batch_thread(tiny):
    """llama.cpp's OpenMP team belongs to the thread that calls llama_decode, and with two such threads
    alive libgomp stops spinning at the barriers between a graph's nodes: decoding a lone request in its
    own thread (two hand-offs a token fewer) cost 20% a token on 2 cores (35 -> 42 ms). So every pass,
    alone or shared, runs on the batch thread."""
    model = Model(tiny.target)
    ctx = Context(model, 1024, 512, THREADS, THREADS, n_seq=2)
    batcher = Batcher(ctx)
    ran_in: list[str] = []
    ctx.observer = lambda n, dt: ran_in.append(threading.current_thread().name)
    try:
        batcher.join(0)
        batcher.submit(0, [1, 5, 9, 13, 17, 21], "none")
        alone = batcher.submit(0, [30], "last").out
        ctx.truncate(6, 0)
        batcher.join(1)
        other = threading.Thread(target=lambda: batcher.submit(1, [1, 5, 9, 31], "last"))
        other.start()
        together = batcher.submit(0, [30], "last").out
        other.join()
        assert set(ran_in) == {"localspec-batch"}
        assert np.allclose(alone, together, atol=1e-2) and int(alone.argmax()) == int(together.argmax())
    finally:
        batcher.close()
        ctx.close()
        model.close()


def test_the_draft_models_passes_and_the_cost_measurement_run_on_the_batch_thread(tiny):
    """While two threads that call llama_decode live, libgomp (more of its threads than cores) stops
    spinning at the barriers between a graph's nodes: every pass of both cost ~25% more for the rest of
    the process (a server's plain decoding 29.7 -> 23.6 tok/s after one request drafted with the model on
    its generation thread). So on a server's engine the draft model decodes on the batch thread too, and
    so does measuring the pass costs; a call's error reaches its caller and the thread goes on."""
    e = ServingEngine(tiny.target, tiny.perturbed, load(2))
    ran_in: list[str] = []
    record = lambda n, dt: ran_in.append(threading.current_thread().name)  # noqa: E731
    e.target.observer = record
    try:
        e.load_draft().observer = record
        cfg = GenConfig(temperature=0, max_tokens=12, spec="on", drafter="model", draft_max=3)
        got = []
        worker = threading.Thread(target=lambda: got.extend(e.generate(tokens(e, "count: 1 2 3"), cfg, lane=e.lanes[1])),
                                  name="localspec-generate-1")
        worker.start()
        worker.join()
        assert e.lanes[1].last_stats.drafted_by_drafter.get("model", 0) > 0 and got
        assert e.on_decode_thread(lambda: e.target.eval(tokens(e, "hi"), logits="last", seq=0)) is not None
        assert set(ran_in) == {"localspec-batch"}
        with pytest.raises(ZeroDivisionError):
            e.on_decode_thread(lambda: 1 / 0)
        assert e.on_decode_thread(lambda: e.on_decode_thread(lambda: 7)) == 7  # asked from the batch thread itself: run there
    finally:
        e.close()


def test_a_request_lets_idle_work_hand_back_its_deep_lane_before_choosing(shared, monkeypatch):
    """Idle work holds the last request's lane, filled deep; a request arriving meanwhile waits for it
    to give way (bounded), then takes that lane when it holds its conversation, or has it parked before
    evaluating anything: its cells would otherwise sit beside the request's, attended over every pass."""
    from localspec.serving.lanes import LanePool

    shared.prompt_cache = PromptCache(shared.lanes[0].target, 64 << 20, lanes=[x.target for x in shared.lanes])
    try:
        deep, other = tokens(shared, "alpha beta gamma " * 40), tokens(shared, "delta epsilon zeta " * 4)
        for lane in shared.lanes:
            lane.target.reset()
        for follow_up, expect_same_lane in ((other, False), (deep + [5, 6], True)):
            shared.lanes[0].target.sync(deep)
            shared.lanes[1].target.sync(other[:len(other) // 2])  # where the unrelated follow-up belongs
            pool = LanePool(shared)
            idle = pool.checkout(lane=shared.lanes[0], background=True)
            gave_way = threading.Event()

            def idle_work():
                time.sleep(0.2)  # the measurement's pass in flight, then it gives way
                gave_way.set()
                pool.checkin(idle, background=True)

            worker = threading.Thread(target=idle_work)
            worker.start()
            got = pool.checkout(follow_up)
            assert gave_way.is_set()  # the request chose only once the idle lane was back
            worker.join(5)
            if expect_same_lane:
                assert got is shared.lanes[0] and got.target.tokens == deep  # its own conversation, live
            else:
                assert got is not shared.lanes[0] and shared.lanes[0].target.tokens == []  # parked
                assert any(e.tokens == deep for e in shared.prompt_cache.entries)
            pool.checkin(got)
        # idle work that never gives way holds a request up for BACKGROUND_WAIT_S at most
        monkeypatch.setattr(LanePool, "BACKGROUND_WAIT_S", 0.1)
        pool = LanePool(shared)
        stuck = pool.checkout(lane=shared.lanes[0], background=True)
        t0 = time.perf_counter()
        got = pool.checkout(other)
        assert got is not stuck and time.perf_counter() - t0 < 2
    finally:
        shared.prompt_cache = None


def test_a_repeated_prompt_is_restored_even_when_it_saves_only_a_few_tokens(shared):
    """A snapshot holding the whole prompt is restored when it saves a few tokens (a copy of 2.6 us a
    token of the snapshot against ~20 ms a token of a short pass); a huge snapshot needs a larger gain."""
    from localspec.serving.caches.promptcache import restore_pays

    assert restore_pays(1, 150) and restore_pays(14, 4000) and not restore_pays(3, 19000)
    shared.prompt_cache = PromptCache(shared.lanes[0].target, 64 << 20, lanes=[x.target for x in shared.lanes])
    try:
        for lane in shared.lanes:
            lane.target.reset()
        system = tokens(shared, "you are a helpful assistant " * 4)
        question = system + shared.target_model.tokenize(" what is a thread and a process", add_special=False)
        cfg = GenConfig(temperature=0, max_tokens=8, spec="off", repeatable=False)
        list(shared.generate(question, cfg, lane=shared.lanes[0]))
        shared.prompt_cache.save(shared.lanes[0].target)  # parked, as the lane pool does
        shared.lanes[0].target.reset()
        shared.lanes[1].target.sync(system)  # another lane holds the shared system part only
        list(shared.generate(question, cfg, lane=shared.lanes[0]))
        st = shared.lanes[0].last_stats
        # only the prompt's last token goes again: its row gives the first token (no row is stored)
        assert st.cache_restored and st.prompt_eval_tokens == 1
    finally:
        shared.prompt_cache = None


def test_a_background_pass_is_given_up_inside_llama_decode_and_rolled_back(tiny):
    """A warm-up's or a measurement's pass stops between the graph's nodes when asked (llama.cpp's abort
    callback), its cells removed: the sequence holds what it held, and goes on exactly as before."""
    model = Model(tiny.target)
    ctx = Context(model, 1024, 512, THREADS, THREADS, n_seq=2)
    try:
        ctx.decode_parts([(0, [1, 5, 9, 13], "none")])
        with pytest.raises(PassInterrupted):
            ctx.decode_parts([(0, list(range(20, 84)), "none")], abort=lambda: True)
        assert ctx.seq_tokens[0] == [1, 5, 9, 13]
        after = ctx.decode_parts([(0, [17], "last")])[0]
        ctx.truncate(4, 0)
        again = ctx.decode_parts([(0, [17], "last")], abort=lambda: False)[0]  # not asked to stop: runs whole
        assert np.array_equal(after, again)
    finally:
        ctx.close()
        model.close()


def test_a_step_of_background_passes_gives_way_to_a_request_waiting_beside_it(tiny):
    """The batch thread runs a background slice alone; a request's pass arriving meanwhile ends it (the
    background fill stops with what it had), and only such a step is ever given up."""
    model = Model(tiny.target)
    ctx = Context(model, 1024, 512, THREADS, THREADS, n_seq=2)
    b = Batcher(ctx)
    try:
        never = lambda: False  # noqa: E731  (the warm-up's own work is never told to stop here)
        warm, request = Pass(0, list(range(20, 84)), "none", False, stop=never), Pass(1, [3, 4], "last", False)
        b.waiting += [warm, request]
        b._run([(warm, len(warm.tokens))])
        assert isinstance(warm.error, PassInterrupted) and ctx.seq_tokens[0] == []
        b.waiting = [request]
        b._run([(request, 2)])
        assert request.finished and request.error is None and ctx.seq_tokens[1] == [3, 4]
        mixed = [Pass(0, list(range(20, 84)), "none", False, stop=never), Pass(1, [5], "last", False)]
        b.waiting = list(mixed)
        b._run([(p, len(p.tokens)) for p in mixed])  # a request's pass in the step: nothing is given up
        assert all(p.finished and p.error is None for p in mixed)
    finally:
        b.close()
        ctx.close()
        model.close()


def test_a_step_of_background_passes_gives_way_to_work_a_request_hands_to_the_batch_thread(tiny):
    """A request's draft-model pass (or its first cost measurement) goes to the batch thread as a call;
    an idle measurement's step in flight gives way to it as to a request's pass, instead of making it
    wait the step out (0.3-1.0 s a completion with llama.vim, measured, 64-token passes ~1,200 deep)."""
    from localspec.serving.batching import _Call

    model = Model(tiny.target)
    ctx = Context(model, 1024, 512, THREADS, THREADS, n_seq=2)
    b = Batcher(ctx)
    try:
        measure = Pass(0, list(range(20, 84)), "none", False, stop=lambda: False)
        b.waiting.append(measure)
        b.calls.append(_Call(lambda: None))
        b._run([(measure, len(measure.tokens))])
        assert isinstance(measure.error, PassInterrupted) and ctx.seq_tokens[0] == []
        b.calls.clear()
        again = Pass(0, list(range(20, 84)), "none", False, stop=lambda: False)
        b.waiting.append(again)
        b._run([(again, len(again.tokens))])  # nothing waiting: it runs whole
        assert again.finished and again.error is None and len(ctx.seq_tokens[0]) == 64
    finally:
        b.close()
        ctx.close()
        model.close()


def test_a_long_step_gives_way_to_an_editors_completion_and_goes_again_after_it(tiny):
    """A 64-token verify or prompt slice costs up to a second here: when an editor's completion joins while
    it runs, it is given up inside llama_decode, rolled back, and goes again (nothing lost but time)."""
    model = Model(tiny.target)
    ctx = Context(model, 1024, 512, THREADS, THREADS, n_seq=3)
    b = Batcher(ctx)
    try:
        b.active = {0: False, 2: True}  # the editor's completion has joined, its first pass not in yet
        slice_ = Pass(0, list(range(20, 84)), "none", False)
        b.waiting = [slice_]
        b._run([(slice_, 64)])
        assert not slice_.finished and slice_.error is None and slice_ in b.waiting and ctx.seq_tokens[0] == []
        decode = Pass(0, [7], "last", False)  # a single token is not worth giving up
        b.waiting = [decode]
        b._run([(decode, 1)])
        assert decode.finished and decode.error is None
        b.active = {0: False}  # the editor is done: the long step runs whole
        b.waiting = [slice_]
        b._run([(slice_, 64)])
        assert slice_.finished and ctx.seq_tokens[0] == [7, *range(20, 84)]
    finally:
        b.close()
        ctx.close()
        model.close()


def test_a_background_fill_interrupted_mid_pass_keeps_the_slices_before_it():
    from localspec.backend.passes import Cuts

    class Cache:  # its third slice is interrupted by a request
        rollback = "partial"

        def __init__(self):
            self.tokens: list[int] = []
            self.asked: list[bool] = []
            self.cuts = Cuts()

        def reusable(self, n):
            return n

        def checkpoint(self):
            pass

        def truncate(self, n):
            del self.tokens[n:]

        def eval(self, toks, logits="last", stop=None):
            self.asked.append(stop is not None)
            if len(self.tokens) == 128 and stop is not None:
                raise PassInterrupted("a request came")
            self.tokens += toks

    cache = Cache()
    assert sync_cache(cache, list(range(1000)), should_stop=lambda: False, step=64, background=True) == 128
    assert cache.tokens == list(range(128)) and all(cache.asked)
    request = Cache()  # a request's own fill: its passes are never given up, its cancel is asked between them
    assert sync_cache(request, list(range(1000)), should_stop=lambda: False, step=64) == 1000
    assert not any(request.asked)


def prompt_of(e: Engine, n: int, seed: str) -> list[int]:
    """A prompt of exactly n tokens of the tiny model's."""
    text, toks = seed, tokens(e, seed)
    while len(toks) < n:
        text += f" {seed} {len(toks)}"
        toks = tokens(e, text)
    return toks[:n]


def test_prompts_that_fit_alone_but_not_together_both_answer_whole(tiny):
    """Two requests, each fitting the context alone, together not: the cache fills while both evaluate,
    and instead of both failing ("no KV-cache slot") the younger one's cells move to host memory until
    the older has answered, then come back (caches/swap.py). Neither is refused, neither cut short."""
    e = ServingEngine(tiny.target, None, load(2, n_ctx=256))
    try:
        prompts = [prompt_of(e, 180, "alpha beta"), prompt_of(e, 180, "gamma delta")]
        cfg = GenConfig(temperature=0, max_tokens=40, spec="off")
        got = run_together(e, prompts, cfg)
        assert [(len(toks), st.stop_reason) for toks, st in got] == [(40, "length"), (40, "length")]
        assert e.batcher.swap.moves >= 1 and not e.batcher.swap.held
        e.target.reset()
        assert_plain_or_near_tie(e, prompts, [toks for toks, _ in got])
    finally:
        e.close()


def test_idle_lanes_cells_all_give_way_to_a_prompt_that_fits_alone(tiny):
    """Short conversations left in idle lanes are freed, every one of them, before a long prompt that fits
    the context alone is refused (only one was, and the prompt failed)."""
    e = ServingEngine(tiny.target, None, load(3, n_ctx=256))
    try:
        cfg = GenConfig(temperature=0, max_tokens=8, spec="off")
        for i in range(3):
            list(e.generate(prompt_of(e, 30, f"short {i}"), cfg, lane=e.lanes[i]))
        assert all(len(x.target.tokens) > 30 for x in e.lanes)
        got = list(e.generate(prompt_of(e, 240, "long one"), cfg, lane=e.lanes[0]))
        assert e.lanes[0].last_stats.stop_reason in ("length", "eos") and got
    finally:
        e.close()


def test_a_request_that_hangs_up_while_swapped_out_ends_and_the_other_answers(tiny):
    """A sequence waiting out of the cache for cells whose client goes away is let go (its pass ends with an
    error, or its rounds with "cancelled"), its snapshot dropped; the one that holds the cells answers whole."""
    from localspec.errors import ContextFullError

    e = ServingEngine(tiny.target, None, load(2, n_ctx=256))
    try:
        prompts = [prompt_of(e, 180, "alpha beta"), prompt_of(e, 180, "gamma delta")]
        cfg = GenConfig(temperature=0, max_tokens=40, spec="off")
        out: list = [None, None]

        def run(i: int) -> None:
            gone = lambda: i in e.batcher.swap  # noqa: E731  (the client hangs up once it waits swapped out)
            try:
                toks = [c.token for c in e.generate(prompts[i], cfg, cancel=gone, lane=e.lanes[i]) if c.token is not None]
                out[i] = (len(toks), e.lanes[i].last_stats.stop_reason)
            except ContextFullError as err:
                out[i] = (0, str(err))
        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
        assert e.batcher.swap.moves >= 1 and not e.batcher.swap.held
        assert sorted(out, key=lambda r: r[0])[1] == (40, "length")  # the other answered whole
        let_go = sorted(out, key=lambda r: r[0])[0]
        assert let_go[1] == "cancelled" or "cancelled while waiting" in let_go[1]
    finally:
        e.close()
