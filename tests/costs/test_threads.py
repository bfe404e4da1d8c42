"""The thread governor on a fake clock: passes priced against their expected cost."""

from __future__ import annotations

from localspec.costs.threads import ThreadGovernor


class Machine:
    """A fake machine: seconds per pass by thread count, and a clock that advances with every pass."""

    def __init__(self, slowdown: dict[int, float], others: float | None = None):
        self.slowdown, self.t, self.applied = slowdown, 0.0, []
        self.others = others  # cores other processes keep busy (None: unknown, as off Linux)

    def clock(self) -> float:
        return self.t

    def run(self, gov: ThreadGovernor, passes: int) -> None:
        for _ in range(passes):
            cost = 0.03 * self.slowdown[gov.threads]
            self.t += cost
            gov.after_pass(1, cost)


def governor(m: Machine, threads: int = 2) -> ThreadGovernor:
    return ThreadGovernor(threads, lambda n: 0.03 * n, m.applied.append, clock=m.clock, others_busy=lambda: m.others)


def test_a_quiet_machine_keeps_every_thread():
    m = Machine({2: 1.0, 1: 1.5})
    g = governor(m)
    m.run(g, 500)
    assert g.threads == 2 and g.changes == [] and m.applied == []


def test_a_busy_machine_drops_to_one_thread_and_stays_while_probes_fail():
    m = Machine({2: 3.0, 1: 1.6}, others=0.35)  # a background process (leaving room for probes upwards)
    g = governor(m)
    m.run(g, ThreadGovernor.MIN_PASSES)
    assert g.threads == 1 and m.applied == [1]
    m.run(g, ThreadGovernor.MIN_PASSES)
    assert g.threads == 1 and len(g.changes) == 1  # the trial paid: kept
    m.run(g, 400)  # probes upwards every few seconds, each reverted, less and less often
    assert g.threads == 1
    probes = [c for c in g.changes if c[2] == 2]
    assert probes and all(b == 1 for _, a, b, _ in g.changes if a == 2)
    gaps = [b[0] - a[0] for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and g.probe_s > ThreadGovernor.PROBE_S  # backing off


def test_when_the_load_goes_away_the_threads_come_back():
    m = Machine({2: 3.0, 1: 1.6}, others=1.0)
    g = governor(m)
    m.run(g, 50)
    assert g.threads == 1
    m.slowdown, m.others = {2: 1.0, 1: 1.5}, 0.0  # the other process finished
    m.run(g, 400)
    assert g.threads == 2 and g.changes[-1][1:3] == (1, 2)


def test_slow_passes_on_a_quiet_machine_are_not_load():
    """Nobody else uses the CPU: passes slower than the profile are this machine's noise (or a deeper
    cache), and one thread fewer would only make them slower."""
    m = Machine({2: 1.8, 1: 1.75}, others=0.0)
    g = governor(m)
    m.run(g, 200)
    assert g.threads == 2 and g.changes == []


def test_where_the_others_cpu_cannot_be_read_slow_passes_still_start_a_trial():
    m = Machine({2: 3.0, 1: 1.6}, others=None)  # off Linux
    g = governor(m)
    m.run(g, ThreadGovernor.MIN_PASSES + ThreadGovernor.UNKNOWN_LOOKS)
    assert g.threads == 1


def test_a_trial_that_is_not_faster_is_undone():
    m = Machine({2: 1.8, 1: 1.75}, others=1.0)  # slow, but one thread fewer does not help
    g = governor(m)
    m.run(g, 2 * ThreadGovernor.MIN_PASSES)
    assert g.threads == 2 and [c[1:3] for c in g.changes] == [(2, 1), (1, 2)]
    assert "not faster" in g.changes[-1][3]


def test_passes_without_an_expected_cost_are_ignored():
    g = ThreadGovernor(2, lambda n: None, lambda n: None)
    for _ in range(100):
        g.after_pass(300, 9.0)  # a long prompt: no profile figure for it
    assert g.threads == 2 and g.score == {}


def unmeasured(m: Machine, threads: int = 2) -> ThreadGovernor:
    """A governor on a machine that has measured nothing: the reference curve and the fastest decode seen."""
    return ThreadGovernor(threads, lambda n: None, m.applied.append, clock=m.clock, others_busy=lambda: m.others,
                          relative=lambda n: float(n), cores=2)


def test_without_a_profile_a_machine_busy_from_the_start_drops_a_thread_within_a_second():
    m = Machine({2: 3.0, 1: 1.6}, others=1.6)  # two busy processes: every pass was slow from the first
    g = unmeasured(m)
    m.run(g, 2 * ThreadGovernor.MIN_PASSES)
    assert g.threads == 1 and g.changes[0][0] < 1.0 and g.changes[0][3] == "other programs hold the cores"
    assert len(g.changes) == 1  # the trial paid: kept
    m.slowdown, m.others = {2: 1.0, 1: 1.5}, 0.0  # the load left: back up
    m.run(g, 400)
    assert g.threads == 2


def test_a_run_that_starts_beside_busy_programs_starts_with_fewer_threads():
    m = Machine({2: 3.0, 1: 1.6}, others=1.6)
    g = unmeasured(m)
    g.before_run()
    assert g.threads == 1 and m.applied == [1]  # before its first pass
    m.run(g, ThreadGovernor.MIN_PASSES)
    assert g.threads == 1 and len(g.changes) == 1
    quiet = unmeasured(Machine({2: 1.0, 1: 1.5}, others=0.1))
    quiet.before_run()
    assert quiet.threads == 2 and quiet.changes == []


def test_sent_down_by_load_it_comes_back_up_though_no_pass_is_priced():
    """A server started beside a program that was busy loading: its first run went to one thread; the runs
    after it draft every round (no single-token pass, no profile: nothing prices a pass), and once the other
    program is quiet the count goes back up, judged by /proc as it went down."""
    m = Machine({2: 1.0, 1: 1.7}, others=1.6)
    g = unmeasured(m)
    g.before_run()
    assert g.threads == 1
    for _ in range(3 * ThreadGovernor.MIN_PASSES):  # verify passes of 3 tokens: unpriced
        m.t += 0.1
        g.after_pass(3, 0.1)
    assert g.threads == 1  # still busy: stays down
    m.others = 0.0
    for _ in range(100):
        m.t += 0.1
        g.after_pass(3, 0.1)
    assert g.threads == 2 and g.changes[-1][3] == "the other programs left the cores"


def test_a_program_that_ran_between_two_runs_and_stopped_sends_nothing_down(tmp_path):
    """The CPU the others used since the last run says busy (another server answered in between); nothing of
    theirs runs now, so the next run keeps its threads."""
    from localspec.costs.threads import CpuWatch

    m = Machine({2: 1.0, 1: 1.7}, others=1.6)
    g = ThreadGovernor(2, lambda n: None, m.applied.append, clock=m.clock, others_busy=lambda: m.others,
                       running_others=lambda: 0, relative=lambda n: float(n), cores=2)
    g.before_run()
    assert g.threads == 2 and g.changes == []
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 0 1 100 0 0 0 0 0 0\nprocs_running 3\nprocs_blocked 0\n")
    assert CpuWatch(str(stat)).running_others(looks=2, apart_s=0) == 2  # the caller is one of the three


def test_without_a_profile_load_that_appears_is_seen_in_the_passes_too():
    m = Machine({2: 1.0, 1: 1.5}, others=0.0)
    g = unmeasured(m)
    m.run(g, 100)
    assert g.threads == 2 and g.changes == []  # quiet: nothing to judge against but its own fastest pass
    m.slowdown, m.others = {2: 3.0, 1: 1.6}, 0.9
    start = m.t
    m.run(g, 2 * ThreadGovernor.MIN_PASSES)
    assert g.threads == 1 and g.changes[0][0] - start < 1.0


def test_a_trial_downwards_that_did_not_pay_holds_off_the_next():
    m = Machine({2: 1.0, 1: 1.5}, others=1.6)  # busy, but two threads are still faster here
    g = unmeasured(m)
    m.run(g, 200)
    assert g.threads == 2 and [c[1:3] for c in g.changes[:2]] == [(2, 1), (1, 2)]
    trials = [c[0] for c in g.changes if c[2] == 1]
    assert all(b - a >= ThreadGovernor.PROBE_S for a, b in zip(trials, trials[1:]))


def test_a_process_starts_at_the_count_a_recent_one_found_fastest(localspec_home, monkeypatch):
    import time

    from localspec.costs import threads


    assert threads.threads_hint(2) is None
    threads.save_threads_hint(1)
    assert threads.threads_hint(2) == 1 and threads.threads_hint(1) is None  # only fewer than the maximum
    monkeypatch.setattr(time, "time", lambda: 10 ** 10)  # long ago: not a hint any more
    assert threads.threads_hint(2) is None
    m = Machine({2: 1.0, 1: 1.5})  # the machine calmed down since
    g = governor(m)
    saved = []
    g.on_change = saved.append
    g.start_at(1, "hint")
    assert g.threads == 1 and m.applied == [1]
    m.run(g, 300)
    assert g.threads == 2 and saved[-1] == 2  # probed back up, and says so for the next process


def test_a_probe_that_is_plainly_worse_ends_after_one_pass():
    """Measured in a terminal: a 2-thread pass at 85-112x its expected cost, 2-3 s each; six of them
    before judging cost more than the whole reply."""
    m = Machine({2: 100.0, 1: 1.6})
    g = governor(m)
    g.start_at(1, "a hint")
    m.run(g, 200)
    probes = [c for c in g.changes if c[2] == 2]
    assert probes and g.threads == 1
    for probe in probes:  # every probe was undone by the very next pass
        undo = g.changes[g.changes.index(probe) + 1]
        assert undo[1:3] == (2, 1) and undo[0] - probe[0] <= 0.03 * 100.0 + 1e-9


def test_no_probe_while_other_processes_hold_the_spare_core(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    m = Machine({2: 3.0, 1: 1.6}, others=1.0)  # one busy background process
    g = governor(m)
    g.start_at(1, "a hint")
    m.run(g, 500)
    assert [c for c in g.changes if c[2] == 2] == []  # never tried: it could only lose
    m.others, m.slowdown = 0.1, {2: 1.0, 1: 1.5}  # the other process finished
    m.run(g, 300)
    assert g.threads == 2


def test_cpu_watch_reads_other_processes_busy_time(tmp_path):
    from localspec.costs.threads import CpuWatch

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 1000 0 0 0 0 0 0\n")
    w = CpuWatch(str(stat))
    w.last = (w.last[0] - 1.0, w.last[1], w.last[2])  # a second ago
    stat.write_text(f"cpu  {100 + int(1 / w.tick_s)} 0 100 1000 0 0 0 0 0 0\n")  # one core-second more busy
    busy = w.others_busy()
    assert busy is not None and 0.8 < busy <= 1.0
    assert CpuWatch(str(tmp_path / "missing")).others_busy() is None


def test_a_cpu_watch_asked_too_soon_keeps_its_window_open(tmp_path):
    """Asked every pass (each shorter than 0.2 s), the watch still answers once its window is long
    enough: a window restarted at every question never saw another program's work."""
    from localspec.costs.threads import CpuWatch

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 1000 0 0 0 0 0 0\n")
    w = CpuWatch(str(stat))
    stat.write_text(f"cpu  {100 + int(1 / w.tick_s)} 0 100 1000 0 0 0 0 0 0\n")  # another program works
    assert w.others_busy() is None  # too soon to say
    w.last = (w.last[0] - 1.0, w.last[1], w.last[2])  # the same window, a second long now
    busy = w.others_busy()
    assert busy is not None and 0.8 < busy <= 1.0


def test_idle_measurement_passes_are_not_read_as_load(tiny):
    """The server's idle measurements run passes no generation asked for (64-token passes a quick profile
    only guesses at): the governor does not see them; a generation's passes it does."""
    from localspec.config import LoadConfig
    from localspec.costs.costmodel import CostProfile
    from localspec.engine import Engine

    e = Engine(tiny.target, None, LoadConfig(n_ctx=512, n_threads=2, n_threads_batch=2))
    try:
        e.profile = CostProfile(t_decode=1e-6, t_verify=[1e-6] * 16)  # every pass looks far too slow
        with e.unobserved():
            e.target.eval([1, 2, 3], "last")
            e.target.eval([4], "last")
        assert e.governor.score == {} and e.target.observer is not None
        e.target.eval([5], "last")
        assert e.governor.score[2] > 1
    finally:
        e.close()
