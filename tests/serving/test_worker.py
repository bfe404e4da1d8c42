"""The worker: its timing lines and its idle measurements."""

from __future__ import annotations

from localspec.config import LoadConfig
from localspec.serving.engine import ServingEngine


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
    from localspec.costs import idle, tuning
    from localspec.serving import worker
    from localspec.serving.jobqueue import JobQueue
    from localspec.serving.lanes import LanePool

    monkeypatch.setattr(tuning, "noisy_sizes", lambda samples: [])  # the tiny model's passes take microseconds
    srv = worker.ModelWorker.__new__(worker.ModelWorker)
    srv.engine = ServingEngine(tiny.target, None, LoadConfig(n_threads=2, n_threads_batch=2))
    srv.lanes, srv.jobs, srv.idle_prompt = LanePool(srv.engine), JobQueue(lambda job: None), None
    try:
        looks = []  # each look at the other programs: busy from the look numbered busy_from on
        busy_from = [0]
        monkeypatch.setattr(srv, "_others_busy", lambda: looks.append(1) or len(looks) > busy_from[0])
        assert srv._first_measurements() and srv.engine.profile is None  # a busy machine: nothing started
        assert idle.state_of(srv.engine).state == "pending" and idle.state_of(srv.engine).measured_s == 0
        looks.clear()
        busy_from[0] = 1  # quiet when it starts, another program during it: nothing kept
        assert srv._first_measurements() and srv.engine.profile is None
        looks.clear()
        busy_from[0] = 10 ** 6
        assert srv._first_measurements() and srv.engine.profile is None  # backing off
        assert idle.state_of(srv.engine).state == "waiting" and srv._idle_after() > idle.QUIET_BEFORE_S
        idle.state_of(srv.engine).backoff.not_before = 0.0
        assert srv._first_measurements() and srv.engine.profile is not None
        assert srv.lanes.background == 0 and len(srv.lanes.free) == len(srv.engine.lanes)  # the lane handed back
        assert not srv._first_measurements()  # nothing left to measure for a tiny model (no kernel choice)
    finally:
        srv.engine.close()
