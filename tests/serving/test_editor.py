"""Editors: FIM windows that let typing append to the cached prompt, several cached prompts, warm-ups in
the background, superseded completions; and a replay of llama.vim's request pattern against the real
server, every suggestion compared with greedy decoding of the prompt the server built."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from conftest import THREADS

from harness.serverproc import ServerProcess
from localspec.backend import common_prefix
from localspec.config import GenConfig, LoadConfig
from localspec.fim.layout import fim_stop_tokens
from localspec.fim.windows import EditorWindows, FimBudget
from localspec.serving.caches.promptcache import PromptCache
from localspec.serving.engine import ServingEngine
from localspec.serving.jobqueue import JobQueue

FILE = ["def read the file", "    for line in data", "        write the code", "    return value",
        "def parse the csv file", "    return list", "def hello world", "    the cache is fast"] * 6
BUDGET = FimBudget(prefix=64, suffix=16, middle=48, extra=96)


def around(y: int, typed: str = "") -> dict:
    """What llama.vim sends with the cursor on line y (0-based) after typing `typed` there."""
    return {"input_prefix": "\n".join(FILE[max(0, y - 256):y]) + "\n", "prompt": typed,
            "input_suffix": "\n" + "\n".join(FILE[y + 1:y + 65]) + "\n"}


@pytest.fixture(scope="module")
def fim_engine(tiny):
    e = ServingEngine(tiny.fim_target, None, LoadConfig(n_ctx=2048, n_threads=THREADS, n_threads_batch=THREADS))
    yield e
    e.close()


def local(w, body):
    return w.local(body["input_prefix"], body["prompt"], body["input_suffix"])


def test_typing_and_new_lines_only_append_to_the_prompt(fim_engine):
    w = EditorWindows(fim_engine.target_model, BUDGET)
    first, _ = local(w, around(20, "    "))
    typed, heal = local(w, around(20, "    the cache"))
    assert common_prefix(first, typed) >= len(first) - 1  # at most the healed last token differs
    assert heal and "    the cache".endswith(heal)  # the last typed token is left to the model to re-create
    next_line = {**around(21), "input_prefix": around(21)["input_prefix"].replace(FILE[20], "    the cache is")}
    newline, _ = local(w, {**next_line, "input_suffix": around(20)["input_suffix"][len("\n" + FILE[21]):]})
    fim = fim_engine.target_model.fim_tokens()
    assert newline[:newline.index(fim["mid"]) + 1] == first[:first.index(fim["mid"]) + 1]  # same anchor and suffix


def test_a_jump_moves_the_window_in_one_step_and_keeps_it_while_it_fits(fim_engine):
    m = fim_engine.target_model
    w = EditorWindows(m, BUDGET)
    a, _ = local(w, around(30))
    b, _ = local(w, around(31))  # one line further: the anchor holds (the line moves after FIM_MID)
    assert common_prefix(a, b) >= a.index(m.fim_tokens()["suf"])
    w2 = EditorWindows(m, BUDGET)
    local(w2, around(10))
    far, _ = local(w2, around(40))
    pre, suf = far.index(m.fim_tokens()["pre"]), far.index(m.fim_tokens()["suf"])
    assert 0 < suf - pre - 1 <= BUDGET.prefix
    mid = far.index(m.fim_tokens()["mid"])
    assert mid - suf - 1 <= BUDGET.suffix
    assert b"".join(m.piece(t) for t in far[suf + 1:mid]).endswith(b"\n")  # cut at a line end


def test_the_suffix_follows_the_prompt_speed_and_holds_while_the_anchor_does(fim_engine):
    from localspec.fim.windows import SUFFIX_MAX, SUFFIX_MIN
    m = fim_engine.target_model
    long_file = [f"    x = {i}" for i in range(400)]

    def at(y):
        return {"input_prefix": "\n".join(long_file[:y]) + "\n", "prompt": "",
                "input_suffix": "\n" + "\n".join(long_file[y + 1:y + 65]) + "\n"}

    def suffix_len(toks):
        f = m.fim_tokens()
        return toks.index(f["mid"]) - toks.index(f["suf"]) - 1

    w = EditorWindows(m, FimBudget(prefix=64))
    assert SUFFIX_MAX - 24 < suffix_len(local(w, at(100))[0]) <= SUFFIX_MAX  # not measured yet: the most
    w.observe(200, 2.5)  # a slow machine: 80 prompt tokens a second
    typing, _ = local(w, at(101))  # the same anchor: its suffix stays as it was cut
    assert SUFFIX_MAX - 24 < suffix_len(typing) <= SUFFIX_MAX
    jump, _ = local(w, at(300))  # another area: the suffix is evaluated anyway, cut to the slow budget
    assert SUFFIX_MIN - 24 < suffix_len(jump) <= SUFFIX_MIN
    w.observe(2000, 1.0)  # the machine got faster (a long evaluation at 2,000 tokens a second)
    assert suffix_len(local(w, at(301))[0]) == suffix_len(jump)
    assert SUFFIX_MAX - 24 < suffix_len(local(w, at(50))[0]) <= SUFFIX_MAX


def test_a_half_evaluated_new_extra_context_does_not_cost_the_local_context(fim_engine):
    """An editor's warm-up for new extra context, interrupted by the completion after it, leaves the new set
    partly cached: more of it cached than of the set in use, but all of the local context still to evaluate
    (measured with llama.vim: 370 tokens, 5 s, to type a word). The set that leaves least to do wins."""
    w = EditorWindows(fim_engine.target_model, FimBudget(**{**BUDGET.__dict__, "extra": 1024}))
    old = [{"filename": "a.py", "text": "import the data\n"}]
    new = old + [{"filename": "b.py", "text": "def parse the csv file\n" * 30}]
    in_use, _ = w.completion_prompt(around(20), old, lambda toks: 0)  # evaluated by the first completion
    partly_new = w.head(new)[:-2]  # the interrupted warm-up's part (more tokens than the old set and its local)
    assert len(partly_new) > len(in_use)

    def cached(toks):
        return max(common_prefix(toks, in_use), common_prefix(toks, partly_new))

    prompt, _ = w.completion_prompt(around(20, "    the"), new, cached)
    assert prompt[:len(w.head(new))] != w.head(new) and cached(prompt) >= len(in_use) - 1  # the old set
    whole_new = w.head(new) + w.last_local  # the warm-up finished (new set and local context): it is used
    prompt, _ = w.completion_prompt(around(20, "    the"), new, lambda toks: max(cached(toks), common_prefix(toks, whole_new)))
    assert prompt[:len(w.head(new))] == w.head(new)


def test_the_cached_extra_context_serves_until_the_new_one_is_warm(fim_engine):
    e = fim_engine
    e.prompt_cache = PromptCache(e.target)
    try:
        w = EditorWindows(e.target_model, BUDGET)
        old = [{"filename": "a.py", "text": "import the data\n"}]
        new = old + [{"filename": "b.py", "text": "def parse the csv file\n"}]
        cfg = GenConfig(temperature=0.0, max_tokens=4, spec="off")
        p1, _ = w.completion_prompt(around(20), old, e.prompt_cache.prefix_len)
        e.complete(p1, cfg)
        p2, _ = w.completion_prompt(around(20, "    the"), new, e.prompt_cache.prefix_len)
        assert p2[:len(w.head(old))] == w.head(old)  # the new chunk is not evaluated yet: the old set serves
        e.prefill(w.warmup_prompt(new))  # the editor's warm-up, run in the background by the server
        p3, _ = w.completion_prompt(around(20, "    the"), new, e.prompt_cache.prefix_len)
        assert p3[:len(w.head(new))] == w.head(new)
        assert e.prompt_cache.prefix_len(p3) >= len(p3) - 2
    finally:
        e.prompt_cache = None


def test_saved_prompts_come_back_exactly(fim_engine):
    e = fim_engine
    e.prompt_cache = cache = PromptCache(e.target)
    try:
        m = e.target_model
        a = m.tokenize("def read the file\n    for line in data\n" * 12, add_special=False)
        b = m.tokenize("the cache is fast and the model is slow\n" * 12, add_special=False)
        cfg = GenConfig(temperature=0.0, max_tokens=12, spec="off", repeatable=False)  # an editor's: the cache whole
        first, _ = e.complete(a, cfg)
        e.complete(b, cfg)
        again, st = e.complete(a, cfg)
        assert st.cache_restored and st.prompt_eval_tokens <= 1 and again == first
        cache.budget_bytes = 1  # nothing fits: saving is skipped, generation goes on
        assert cache.save() == 0
    finally:
        e.prompt_cache = None


class FakeJob:
    def __init__(self, slot, background=False):
        self.slot, self.background, self.cancel = slot, background, threading.Event()


def test_newer_completions_supersede_older_ones_from_the_same_slot():
    gone = []
    q = JobQueue(gone.append)
    running, warm, old, other, new = FakeJob("s"), FakeJob(None, True), FakeJob("s"), FakeJob("t"), FakeJob("s")
    q.running = {running}
    for j in (warm, old, other):
        q.put(j)
    assert q.foreground_waiting()
    q.put(new)
    assert gone == [old] and running.cancel.is_set() and not other.cancel.is_set()
    assert [q.get(0), q.get(0), q.get(0)] == [other, new, warm]  # answers first, the warm-up after
    with pytest.raises(TimeoutError):
        q.get(0)


# --- a replay of llama.vim's pattern against the real server -------------------------------------------
def vim_request(body: dict, n_predict: int = 16, extra=None) -> dict:
    return {"id_slot": 0, **body, "input_extra": extra or [], "n_predict": n_predict, "n_indent": 0,
            "top_k": 40, "top_p": 0.9, "samplers": ["top_k", "top_p", "infill"], "stream": False,
            "cache_prompt": True, "t_max_prompt_ms": 500, "response_fields": ["content", "timings/prompt_n"]}


def warmup(extra) -> dict:
    return {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": extra, "prompt": "", "n_predict": 0,
            "temperature": 0.0, "samplers": [], "cache_prompt": True, "response_fields": [""]}


def replay(model, home, engine, exact: bool) -> None:
    """llama.vim's pattern (completions while typing, new lines, a jump, warm-ups with new extra context,
    then three completions at once from one slot) against a real server on `model`; `engine` (the same
    model, in this process) mirrors the server's windows and cache to rebuild each prompt and decode it
    greedily as the server does (n-gram drafts): with `exact`, every suggestion must be that text."""
    # one attention kernel on both sides: each process measures its own under -fa auto, and where the two
    # decode within noise of each other they may choose differently, and kernels part at near-ties
    srv = ServerProcess(["--target", str(model), "--threads", str(THREADS), "-c", "2048", "--temperature", "0", "-np", "1",
                         "-fa", "off",
                         "--spec", "on", "--drafter", "ngram", "--fim-prefix", str(BUDGET.prefix),
                         "--fim-suffix", str(BUDGET.suffix), "--fim-extra", str(BUDGET.extra)], home)
    extra1 = [{"filename": "a.py", "text": "import the data\n"}]
    extra2 = extra1 + [{"filename": "b.py", "text": "def parse the csv file\n"}]
    steps = [("fim", around(20), extra1), ("warm", None, extra1), ("fim", around(20, "    the"), extra1),
             ("fim", around(20, "    the cache"), extra1), ("warm", None, extra2), ("fim", around(21), extra2),
             ("fim", around(40), extra2), ("fim", around(21, "    for"), extra2)]
    ref = EditorWindows(engine.target_model, FimBudget(**{**BUDGET.__dict__, "middle": 256}))
    engine.prompt_cache = PromptCache(engine.target)
    # the same decoding as the server's (n-gram drafts, k = 4, earlier answers remembered): each verify pass
    # then has the same shape in both, so the texts are equal token for token; plain greedy may part from
    # both at measured near-ties (`localspec verify`), which is not what this replay checks
    cfg = GenConfig(temperature=0.0, max_tokens=16, spec="on", drafter="ngram", draft_max=4)
    engine.remember_generations = True
    cfg.stop_tokens = fim_stop_tokens(engine.target_model)
    try:
        with httpx.Client(base_url=srv.url, timeout=300) as c:
            for kind, body, extra in steps:
                if kind == "warm":
                    assert c.post("/infill", json=warmup(extra)).status_code == 200
                    engine.prefill(ref.warmup_prompt(extra))
                    continue
                got = c.post("/infill", json=vim_request(body, extra=extra))
                assert got.status_code == 200, got.text
                prompt, cfg.heal = ref.completion_prompt(body, extra, engine.prompt_cache.prefix_len)
                want, _ = engine.complete(prompt, cfg)
                assert isinstance(got.json()["content"], str)
                if exact:
                    assert got.json()["content"] == want, (body["prompt"], prompt)
                if body["prompt"].endswith("cache"):  # typing on: only the new characters are evaluated
                    assert got.json()["timings/prompt_n"] <= len(engine.target_model.tokenize(" cache", add_special=False)) + 2
            replies = superseding(c, srv, extra2)
        # each older one ends early: cut short while running, or (if still waiting) answered "" at once
        for older in ("running", "waiting"):
            assert replies[older]["timings/predicted_n"] < 1500, older
        assert replies["newest"]["timings/predicted_n"] == 16  # the newest is answered in full
    finally:
        engine.prompt_cache = None
        assert srv.stop() == 0, srv.output()
    assert "Traceback" not in srv.output()


def superseding(c, srv, extra) -> dict:
    """Three completions from one slot, each newer one sent while the one before is in the server:
    a newer completion supersedes a waiting one and ends a running one at its next round."""
    replies = {}

    def send(name, body, n):
        fields = ["content", "timings/prompt_n", "timings/predicted_n"]
        replies[name] = c.post("/infill", json={**vim_request(body, n, extra), "ignore_eos": True,
                                                "response_fields": fields}).json()
    running = threading.Thread(target=send, args=("running", around(30, "    the"), 1500))
    running.start()
    until(lambda: srv.metric("llamacpp:requests_processing") >= 1 or "running" in replies)
    waiting = threading.Thread(target=send, args=("waiting", around(31), 1500))
    waiting.start()
    running.join(120)  # it ends when the second arrives (the second is then in the server)
    send("newest", around(32), 16)
    waiting.join(120)
    return replies


def until(condition, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "the server never got there"
        time.sleep(0.005)


def test_a_replayed_editing_session_is_answered(tiny, tmp_path, fim_engine):
    replay(fim_engine.target_model.path, tmp_path / "home", fim_engine, exact=False)  # a random tiny model ties


@pytest.mark.realpair
def test_a_replayed_editing_session_is_answered_exactly_on_the_real_pair(real_pair, tmp_path):
    target, _ = real_pair
    engine = ServingEngine(target, None, LoadConfig(n_ctx=2048, n_threads=THREADS, n_threads_batch=THREADS, flash_attn="off"))
    try:
        replay(target, tmp_path / "home", engine, exact=True)
    finally:
        engine.close()
