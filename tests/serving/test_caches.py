"""The server's pieces without HTTP: FIM prompt layout, editor limits on a fake clock, request fields,
n-gram memory across requests."""

from __future__ import annotations

import json

import pytest
from conftest import THREADS
from tinygguf import FIM_TOKENS

from localspec.config import GenConfig, LoadConfig
from localspec.decoding.ngram import NgramDrafter
from localspec.fim import layout as fimmod
from localspec.server.apierrors import ApiError
from localspec.server.protocols.llama_api import pick_fields
from localspec.server.settings import gen_settings
from localspec.serving import limits
from localspec.serving.engine import ServingEngine


@pytest.fixture(scope="module")
def fim_engine(tiny):
    e = ServingEngine(tiny.fim_target, tiny.fim_draft, LoadConfig(n_ctx=4096, n_threads=THREADS, n_threads_batch=THREADS))
    yield e
    e.close()


def test_fim_prompt_layout(fim_engine):
    m = fim_engine.target_model
    fim = m.fim_tokens()
    assert set(fim) == set(FIM_TOKENS)
    body = {"input_prefix": "def read", "input_suffix": "return data", "prompt": "the",
            "input_extra": [{"filename": "a.py", "text": "import csv"}]}
    toks = fimmod.infill_tokens(m, body, body["input_extra"], 4096, 16)

    def t(s):
        return m.tokenize(s, add_special=False)
    expected = ([fim["rep"], *t("myproject\n"), fim["sep"], *t("a.py\n"), *t("import csv"), fim["sep"], *t("filename\n"),
                 m.bos, fim["pre"], *t("def read"), *t("the"), fim["suf"], *t("return data"), fim["mid"]])
    assert toks == expected
    assert fimmod.fim_stop_tokens(m) == {fim["pad"], fim["rep"], fim["sep"]}


def test_fim_budgets_keep_the_end_of_the_prefix_and_the_newest_extra(fim_engine):
    m = fim_engine.target_model
    long_prefix = "the cache " * 2000
    toks = fimmod.infill_tokens(m, {"input_prefix": long_prefix, "input_suffix": "", "prompt": ""}, [], 4096, 0)
    pre = toks.index(m.fim_tokens()["pre"])
    assert len(toks) - pre - 3 == 3 * fimmod.FIM_BATCH // 4  # 3/4 of a batch of prefix, its end
    extra = [{"text": "word " * 3000}]
    toks = fimmod.infill_tokens(m, {"input_prefix": "a", "input_suffix": "", "prompt": ""}, extra, 4096, 100)
    assert toks.index(m.fim_tokens()["pre"]) <= 4096 - fimmod.FIM_BATCH - 2 * 100 + 1


def test_a_model_without_fim_tokens_is_refused(tiny):
    with pytest.raises(fimmod.FimUnsupported, match="suffix"):
        fimmod.require_fim({"pre": 1, "mid": 2})


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_line_limits_on_a_fake_clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(limits.time, "perf_counter", clock)
    lim = limits.LineLimits(n_indent=4)
    assert lim.push("x = 1\n") == ("x = 1\n", False)  # the first line is never checked
    assert lim.push("    y") == ("    y", False)
    assert lim.push(" = 2\n  ") == (" = 2\n", False)  # indentation is held until the line shows itself
    assert lim.push("  z\n") == ("    z\n", False)  # four spaces: kept
    assert lim.push("\n") == ("\n", False)  # a blank line is fine
    assert lim.push("  bad") == ("", True)  # dedented: cut, stop
    timed = limits.LineLimits(t_max_predict_ms=100)
    assert timed.push("a") == ("a", False)  # the clock starts at the first token
    clock.t = 0.05
    assert timed.push("b\n") == ("b\n", False)
    clock.t = 0.2
    assert timed.push("c") == ("c", False)  # past the limit, but no new line yet
    assert timed.push("d\ne") == ("d\ne", True)  # stops at the next new line


def test_request_fields():
    base = GenConfig(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, max_tokens=99)
    cfg, ex = gen_settings({"samplers": ["top_k", "top_p", "infill"], "n_predict": 7, "speculative.n_max": 3,
                            "speculative": {"n_min": 2}, "drafter": "ngram", "stream": True}, base, oai=False)
    assert (cfg.top_k, cfg.top_p, cfg.min_p, cfg.temperature) == (40, 0.95, 0.0, 1.0)  # as llama-server's chain
    assert (cfg.max_tokens, cfg.draft_max, cfg.draft_min, cfg.drafter, ex.stream) == (7, 3, 2, "ngram", True)
    cfg, _ = gen_settings({"max_tokens": 5, "max_completion_tokens": 6, "stop": "x", "seed": -1}, base, oai=True)
    assert (cfg.max_tokens, cfg.stop, cfg.seed) == (6, ["x"], None)
    assert base.max_tokens == 99 and base.stop == []  # the server's defaults are never changed by a request
    for bad in ({"top_p": 2}, {"top_k": 1.5}, {"n": 2}, {"speculative": 3}, {"stream_options": []}):
        with pytest.raises(ApiError):
            gen_settings(bad, base, oai=True)
    assert pick_fields({"a": {"b": 1}, "c": 2}, ["a/b", "c", "", "x/y"]) == {"a/b": 1, "c": 2}


def test_ngram_memory_drafts_from_earlier_generations():
    d = NgramDrafter()
    d.remember([5, 6, 7, 8, 9, 10, 11])
    found, n = d.lookup([1, 2, 6, 7], 3)
    assert found == [8, 9, 10] and n == 2
    cur = [6, 7, 42, 1, 6, 7]  # the current text wins over the memory
    assert d.lookup(cur, 2)[0] == [42, 1]
    d.memory.MEMORY_TOKENS = 10
    d.remember(list(range(100, 109)))  # the oldest sequence leaves once the memory is full
    assert d.lookup([1, 6, 7], 2) == ([], 0) and d.lookup([1, 101, 102], 2)[0] == [103, 104]
    other = NgramDrafter(memory=d.memory)  # a parallel request's drafter reads the same memory
    assert other.lookup([1, 101, 102], 2)[0] == [103, 104]


def test_a_repeated_request_drafts_from_the_earlier_answer(fim_engine):
    e = fim_engine
    e.remember_generations = True
    try:
        # sampled (a greedy request drafts from its own text alone: tests/test_exact.py), but one-hot (top-k 1)
        cfg = GenConfig(temperature=0.7, top_k=1, seed=1, spec="on", drafter="ngram", draft_max=4, max_tokens=40)
        prompt = e.prompt_tokens("hello world")
        first = [c.token for c in e.generate(prompt, cfg) if c.token is not None]
        second = [c.token for c in e.generate(prompt, cfg) if c.token is not None]
        st = e.last_stats
        assert second == first and st.accepted > 0 and st.prompt_eval_tokens <= 1  # drafted from memory, cached
    finally:
        e.remember_generations = False


def test_a_long_prompt_outlives_the_process_on_disk(tiny, tmp_path):
    """A prompt evaluated once is restored from disk by a new engine (a restarted server), verified first:
    a corrupt entry is deleted and evaluated again, never loaded; another pair's entries are not seen."""
    from localspec.serving.caches.promptcache import PromptCache
    from localspec.serving.caches.promptdisk import SAVE_MIN, DiskPrompts, pair_key

    load = LoadConfig(n_ctx=4096, n_threads=THREADS, n_threads_batch=THREADS)
    prompt = [(i * 7) % 200 + 3 for i in range(SAVE_MIN + 300)]
    key = pair_key(str(tiny.fim_target))

    warnings = []

    def fresh_engine():
        e = ServingEngine(tiny.fim_target, None, load)
        e.prompt_cache = PromptCache(e.target, 64 << 20, disk=DiskPrompts(tmp_path, key, 256 << 20, warnings.append))
        return e

    def evaluated(e, tokens) -> int:
        st = e.prefill(tokens)
        return st.prompt_eval_tokens

    e = fresh_engine()
    assert evaluated(e, prompt) == len(prompt) - 1
    e.prompt_cache.persist(len(prompt))
    e.prompt_cache.disk.wait()
    e.close()
    files = sorted(p.suffix for p in tmp_path.rglob("*") if p.is_file())
    assert files == [".json", ".kv"]
    e = fresh_engine()  # "after a restart": a longer prompt with the same start evaluates only its new end
    longer = prompt + [5, 6, 7, 8]
    assert evaluated(e, longer) == 4 and e.last_stats.cache_restored
    e.close()
    kv = next(tmp_path.rglob("*.kv"))
    kv.write_bytes(b"\0" * kv.stat().st_size)  # same size, wrong bytes: the checksum catches it
    e = fresh_engine()
    assert evaluated(e, longer) == len(longer) - 1
    assert not list(tmp_path.rglob("*.kv"))  # the corrupt entry is gone, and said so in one line
    assert len(warnings) == 1 and warnings[0].startswith(f"dropping the saved prompt {kv} (truncated or damaged)")
    e.close()
    other = DiskPrompts(tmp_path, "another-model.gguf", 256 << 20)
    assert other.best(prompt) == (None, 0)


@pytest.mark.parametrize("meta", ["[]", "null", "7", '"text"', "{not json", '{"format": 1}'])
def test_a_saved_prompt_entry_that_is_not_one_is_dropped_with_a_warning(tmp_path, meta):
    from localspec.serving.caches.promptdisk import DiskPrompts

    warnings = []
    disk = DiskPrompts(tmp_path, "model.gguf", 256 << 20, warnings.append)
    disk.dir.mkdir(parents=True)
    (disk.dir / "abc.json").write_text(meta)
    (disk.dir / "abc.kv").write_bytes(b"\0" * 16)
    assert disk.best([1, 2, 3]) == (None, 0)
    assert not list(disk.dir.iterdir())
    assert len(warnings) == 1 and warnings[0].startswith(f"dropping the saved prompt {disk.dir / 'abc.json'} (")
    assert warnings[0].endswith("); its prompt is evaluated again")


def test_tool_calls_with_doubled_braces_are_parsed():
    """Qwen2.5-Coder 1.5B, given a system prompt, answers '{{"name": ..., "arguments": {...}}}' (measured);
    the call inside is taken, and ordinary text with braces stays text."""
    from localspec.server.tools import split_calls

    names = ["get_weather"]
    for text in ('{{"name": "get_weather", "arguments": {"city": "Paris"}}}',
                 '{{"name": "get_weather", "arguments": {"city": "Paris"}}}}'):
        content, calls = split_calls(text, names)
        assert content == "" and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    for text in ('{{"name": "other", "arguments": {}}}', '{{ not json }}', '{"name": "get_weather"} and more'):
        assert split_calls(text, names) == (text, [])


def test_log_requests_timing_line_is_whole():
    from localspec.serving.worker import timing_line
    from localspec.stats import Stats

    st = Stats(prompt_tokens=18734, prompt_eval_tokens=40, prompt_eval_s=6.4, tokens=25, generation_s=5.0,
               drafted=12, accepted=9, stop_reason="eos", cache_restored=True, threads=2,
               thread_changes=[[2, 1, "passes at 1.6x their expected cost"]])
    assert timing_line(st, 1, 0.004) == (
        "localspec serve: lane 1: waited 0.00 s · prompt 40 new tokens (18694 cached, restored) in 6.40 s "
        "(6.2 tok/s) · 25 tokens in 5.00 s (5.0 tok/s, 9/12 drafts accepted) · 2 threads (1 changes) · eos\n")
    assert "(0 cached) in 0.00 s (-)" in timing_line(Stats(stop_reason="length"), 0, 0.0)
    gave_way = Stats(prompt_tokens=1348, prompt_eval_tokens=64, prompt_eval_s=0.8, stop_reason="length")
    assert "prompt 64 new tokens (the rest deferred) in 0.80 s" in timing_line(gave_way, 2, 0.0, deferred=True)


def test_timings_count_as_llama_server_does():
    """The first token comes from the prompt's pass (its last token is evaluated there): llama-server
    counts that pass and token in the prompt, and its decode rate is the tokens after the first (end of
    text included) over the time after the prompt."""
    from localspec.server.request import timings
    from localspec.stats import Stats

    st = Stats(prompt_tokens=30, prompt_eval_tokens=21, prompt_eval_s=0.35, tokens=90, target_passes=90,
               generation_s=3.0, stop_reason="eos")
    t = timings(st)
    assert (t["cache_n"], t["prompt_n"], t["predicted_n"]) == (9, 21, 90)
    assert t["prompt_ms"] == pytest.approx(350) and t["predicted_ms"] == pytest.approx(3000)
    assert t["predicted_per_second"] == pytest.approx(30.0) and t["predicted_per_token_ms"] == pytest.approx(100 / 3)
    cut = timings(Stats(prompt_tokens=5, prompt_eval_tokens=5, tokens=10, target_passes=10, generation_s=0.9,
                        stop_reason="length"))
    assert cut["predicted_per_second"] == pytest.approx(10.0) and cut["cache_n"] == 0
    assert timings(Stats(prompt_tokens=5))["predicted_per_second"] == 0.0  # nothing generated yet


def test_idle_measurements_wait_while_other_programs_use_the_cpu(tmp_path):
    """The server measures pass costs when idle; with another program busy it waits (its figures would be
    noise, and it would take the cores from that program)."""
    import os

    from localspec.costs.threads import CpuWatch
    from localspec.serving.worker import ModelWorker

    stat = tmp_path / "stat"
    stat.write_text("cpu  1000 0 1000 50000 0 0 0 0 0 0\n")
    s = ModelWorker.__new__(ModelWorker)
    s.idle_watch = CpuWatch(str(stat))
    hz = os.sysconf("SC_CLK_TCK")

    def one_second_later(busy_ticks: int) -> bool:
        t, busy, own = s.idle_watch.last
        s.idle_watch.last = (t - 1.0, busy, own)  # the window began a second ago
        fields = [int(x) for x in stat.read_text().split()[1:]]
        fields[0] += busy_ticks
        fields[3] += 2 * hz - busy_ticks
        stat.write_text("cpu  " + " ".join(map(str, fields)) + "\n")
        return s._others_busy()

    assert one_second_later(int(1.5 * hz))  # another program kept 1.5 cores busy
    assert not one_second_later(0)  # quiet again
    s.idle_watch = None
    assert not s._others_busy()  # unknown: not busy


def test_a_servers_first_measurements_wait_for_idle_time_and_a_quiet_machine(tiny, monkeypatch):
    """A fresh server answers before anything is measured (auto drafts by the reference curve until then);
    idle, it measures its pass costs on its first lane, kept only if no other program used the cores
    meanwhile, and after giving way to one it waits before trying again."""
    from localspec.config import LoadConfig
    from localspec.costs import idle, tuning
    from localspec.serving import worker
    from localspec.serving.jobqueue import JobQueue
    from localspec.serving.lanes import LanePool

    monkeypatch.setattr(tuning, "noisy_sizes", lambda samples: [])  # the tiny model's passes take microseconds
    srv = worker.ModelWorker.__new__(worker.ModelWorker)
    srv.engine = ServingEngine(tiny.target, None, LoadConfig(n_threads=2, n_threads_batch=2))
    srv.lanes, srv.jobs, srv.idle_prompt = LanePool(srv.engine), JobQueue(lambda job: None), None
    try:
        busy = [True]
        monkeypatch.setattr(srv, "_others_busy", lambda: busy[0])
        assert srv._first_measurements() and srv.engine.profile is None  # a busy machine: nothing kept
        busy[0] = False
        assert srv._first_measurements() and srv.engine.profile is None  # backing off
        assert idle.state_of(srv.engine).state == "waiting" and srv._idle_after() > idle.QUIET_BEFORE_S
        idle.state_of(srv.engine).backoff.not_before = 0.0
        assert srv._first_measurements() and srv.engine.profile is not None
        assert srv.lanes.background == 0 and len(srv.lanes.free) == len(srv.engine.lanes)  # the lane handed back
        assert not srv._first_measurements()  # nothing left to measure for a tiny model (no kernel choice)
    finally:
        srv.engine.close()
