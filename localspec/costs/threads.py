"""Decode threads that follow the machine: fewer when another process holds the cores.

llama.cpp's worker threads meet at a barrier several hundred times per token and spin while they
wait (OpenMP). When the cores are oversubscribed, a barrier waits for a thread the OS has taken off
its core, and a 2-thread decode on a 2-core laptop with one busy background process runs at a
third of its quiet speed, slower than one thread. No fixed count serves both a quiet and a busy
machine, so `ThreadGovernor` measures: every target pass is priced against what the measured cost
profile says it should cost (`slowdown` = seconds / expected), per thread count, as a running
average. When passes come much slower than expected it tries one thread fewer and keeps whichever
count is faster now; while running below the maximum it tries one more every PROBE_S seconds, since
the machine may have calmed down, but only when the other processes left a core free since the last
look (`CpuWatch`, from /proc/stat: a probe into a busy machine costs far more than it can gain), and a
probe that is plainly worse ends after one pass. Thread counts never change the arithmetic's result in a way the
acceptance rule relies on: every confirmed token is still the target's own (see the note in
docs/BENCHMARKS.md for the measured effect on greedy outputs).
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Callable

from .. import paths

OTHERS_BUSY = 0.3  # of a core: another program is working, so a measurement now would be noise (and steal from it)


class CpuWatch:
    """How many cores other processes kept busy since the last look (Linux's /proc/stat minus this
    process's own CPU time); None where that cannot be read."""

    def __init__(self, stat_path: str = "/proc/stat"):
        self.stat_path = stat_path
        self.tick_s = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
        self.last = self._sample()

    def _sample(self) -> tuple[float, float, float] | None:
        try:
            with open(self.stat_path) as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # all but idle and iowait
        own = resource.getrusage(resource.RUSAGE_SELF)
        return time.monotonic(), busy * self.tick_s, own.ru_utime + own.ru_stime

    def others_busy(self) -> float | None:
        """Cores other processes kept busy since the last answer; None until a window of 0.2 s has passed
        (a shorter one is kept open, not restarted: a caller asking every pass still gets answers)."""
        now, before = self._sample(), self.last
        if now is None or before is None:
            self.last = now
            return None
        if now[0] - before[0] < 0.2:
            return None
        self.last = now
        return max(0.0, ((now[1] - before[1]) - (now[2] - before[2])) / (now[0] - before[0]))

    def running_others(self, looks: int = 5, apart_s: float = 0.002) -> int | None:
        """Threads of other processes running or ready to run now (/proc/stat's procs_running less the caller's,
        the fewest of a few looks: a command that comes and goes is not load); None where it cannot be read.
        A program that was busy a while ago and stopped is not here."""
        seen = []
        for i in range(looks):
            try:
                with open(self.stat_path) as f:
                    line = next((x for x in f if x.startswith("procs_running")), None)
                seen.append(int(line.split()[1]) - 1)
            except (OSError, ValueError, IndexError, AttributeError):
                return None
            if i + 1 < looks:
                time.sleep(apart_s)
        return max(0, min(seen))


def quiet_watch():
    """busy(): whether other programs used the cores (OTHERS_BUSY of a core) since the last time it was asked."""
    watch = CpuWatch()
    return lambda: (watch.others_busy() or 0.0) >= OTHERS_BUSY


class ThreadGovernor:
    TRIGGER = 1.4  # explore fewer threads when passes take this many times their expected cost
    MIN_PASSES = 6  # passes at a count before judging it
    GAIN = 0.9  # a count must be at least 10% faster to be kept
    PROBE_S = 3.0  # while below the maximum, try one thread more this often (doubling after each miss, to 30 s)
    RATE = 0.3  # weight of the newest pass in a count's running average
    FIRST_PROBE_S = 1.0  # after starting below the maximum on a hint, the first probe upwards comes this soon
    BAD_TRIAL = 2.0  # a trial whose pass costs this many times the old count's average ends at once
    FREE_CORE = 0.6  # probe upwards only if other processes left at least this much of a core free

    OVERSUBSCRIBED = 0.5  # other programs leave fewer free cores than this many below the thread count: try fewer

    def __init__(self, max_threads: int, expected: Callable[[int], float | None], apply: Callable[[int], None],
                 clock: Callable[[], float] = time.perf_counter,
                 others_busy: Callable[[], float | None] | None = None,
                 running_others: Callable[[], int | None] | None = None,
                 relative: Callable[[int], float | None] | None = None, cores: int | None = None):
        """expected(n): what an n-token pass costs on a quiet machine (the measured profile), None where it
        has no figure; then `relative(n)` (a reference curve, T(n)/T(1)) times the fastest single-token pass
        seen prices it, so a machine measured never is still watched."""
        self.max_threads, self.expected, self.apply, self.clock = max_threads, expected, apply, clock
        watch = CpuWatch() if others_busy is None else None
        self.others_busy = others_busy if others_busy is not None else watch.others_busy
        self.running_others = running_others or (watch.running_others if watch is not None else lambda: None)
        self.relative, self.fastest = relative, float("inf")  # the fastest single-token pass seen
        self.cores = cores or os.cpu_count() or max_threads
        self.down_hold_s, self.down_after = self.PROBE_S, 0.0  # after a trial downwards that did not pay
        self.last_s = 0.0  # the latest pass's slowdown
        self.threads = max_threads
        self.score: dict[int, float] = {}  # thread count -> running slowdown
        self.passes = 0  # passes at the current count since it was chosen
        self.trial_from: int | None = None  # the count a trial started from (None: settled)
        self.since = clock()  # when the current count was chosen
        self.probe_s = self.PROBE_S
        self.changes: list[tuple[float, int, int, str]] = []  # (time, from, to, why)
        self.on_change: Callable[[int], None] | None = None  # e.g. remember the count for the next process
        self.scale = 1.0  # what passes cost on a quiet machine at this run's depth, relative to the profile
        self.unknown_looks = 0  # questions about the others' CPU answered "cannot say", in a row
        self.calibrating: list[float] | None = None

    QUIET = 0.3  # other processes used less than this share of a core: the machine is quiet

    def before_run(self) -> None:
        """Before a run's first pass (its prompt's): other programs that already hold the cores are seen at
        once, from /proc, and the run starts with fewer threads (a trial, judged by its passes as any)."""
        busy = self.others_busy()  # since the last look (the last run's end), and a fresh window
        if self.threads > 1 and self.trial_from is None and self._too_many(busy, self.threads) \
                and self.running_others() != 0:  # and still at it (not one that ran in between and stopped)
            self._try(self.threads - 1, "other programs hold the cores")

    def begin_run(self) -> None:
        """A new generation: the profile was measured at a shallow depth, and a prompt thousands of tokens
        deep makes every pass dearer, which read as load and cost a trial at
        one thread. The first passes of a run at the full count on a quiet machine set what this depth costs."""
        self.scale = 1.0
        self.calibrating = [] if self.threads == self.max_threads and self.trial_from is None else None
        self.others_busy()  # a fresh window for the quiet check

    def _calibrate(self, s: float) -> bool:
        """Collect the run's first slowdowns; True while still collecting (they judge nothing yet)."""
        self.calibrating.append(s)
        if len(self.calibrating) < self.MIN_PASSES:
            return True
        busy = self.others_busy()
        if busy is not None and busy < self.QUIET:
            self.scale = max(1.0, sorted(self.calibrating)[len(self.calibrating) // 2])
        self.calibrating = None
        return False

    def start_at(self, n: int, why: str) -> None:
        """Begin at another count than the maximum (what a process a moment ago found fastest); the
        governor probes upwards from there as usual."""
        if 1 <= n < self.threads:
            self._set(n, why)
            self.since -= self.probe_s - self.FIRST_PROBE_S  # and looks up again soon: the load may be gone

    def _expected_s(self, n_tokens: int, seconds: float) -> float | None:
        exp = self.expected(n_tokens)
        if exp or self.relative is None:
            return exp
        if n_tokens == 1 and 0 < seconds < self.fastest:  # a new baseline: the scores priced by the old one follow
            if self.fastest != float("inf"):
                self.score = {k: v * self.fastest / seconds for k, v in self.score.items()}
            self.fastest = seconds
        if self.fastest == float("inf"):
            return None
        r = self.relative(n_tokens)
        return r * self.fastest if r else None

    def after_pass(self, n_tokens: int, seconds: float) -> None:
        exp = self._expected_s(n_tokens, seconds)
        if not exp or seconds <= 0:
            self._unpriced()
            return
        s = seconds / exp
        if self.calibrating is not None and self._calibrate(s):
            return
        s /= self.scale
        n = self.threads
        self.score[n] = s if n not in self.score or self.passes == 0 else self.score[n] + self.RATE * (s - self.score[n])
        self.last_s = s
        self.passes += 1
        if self.trial_from is not None and s > self.BAD_TRIAL * self.score.get(self.trial_from, float("inf")):
            self._judge_trial()  # plainly worse: one such pass is enough (one can cost seconds)
            return
        if self.passes < self.MIN_PASSES:
            return
        if self.trial_from is not None:
            self._judge_trial()
        elif self.score[n] > self.TRIGGER and n > 1 and self._contended():
            self._try(n - 1, f"passes at {self.score[n]:.1f}x their expected cost")
        elif n > 1 and self._oversubscribed(n):
            self._try(n - 1, "other programs hold the cores")
        elif n < self.max_threads and self.clock() - self.since >= self.probe_s:
            if self._core_free(n):
                self._try(n + 1, "probing: the machine may have calmed down")
            else:
                self.since = self.clock()  # still busy: look again after another interval

    def _unpriced(self) -> None:
        """A pass nothing prices (no profile, and no single-token pass seen: a run that drafts every round).
        Such passes judge no trial, so a count that the others' load alone sent down (`before_run`) comes back
        up once that load is gone, as it went down: by /proc, not by passes."""
        if self.threads >= self.max_threads or self.clock() - self.since < self.probe_s:
            return
        busy = self.others_busy()
        if busy is not None and busy < self.QUIET:
            self.trial_from = None
            self._set(self.threads + 1, "the other programs left the cores")

    UNKNOWN_LOOKS = 10  # the others' CPU could not be read this many times running: judge by pass costs alone

    def _contended(self) -> bool:
        """Whether other processes use the CPU: only then can fewer threads be faster. On a quiet machine
        slow passes are its own noise (a trial at one thread there cost a short chat more than it saved);
        where the others' use cannot be read (off Linux), slow passes are all there is to go by."""
        busy = self.others_busy()
        if busy is None:  # a window too short to say, or no /proc/stat
            self.unknown_looks += 1
            return self.unknown_looks >= self.UNKNOWN_LOOKS
        self.unknown_looks = 0
        return busy >= self.QUIET

    def _core_free(self, n: int) -> bool:
        """Whether the other processes left room for one more thread since the last look (unknown: yes)."""
        busy = self.others_busy()
        return busy is None or self.cores - n - busy >= self.FREE_CORE

    def _oversubscribed(self, n: int) -> bool:
        """Whether other programs hold so much of the CPU that n threads cannot all run: each of llama.cpp's
        barriers then waits for a thread the scheduler took away (seen at once, profile or none)."""
        return self._too_many(self.others_busy(), n)

    def _too_many(self, busy: float | None, n: int) -> bool:
        return self.clock() >= self.down_after and busy is not None and self.cores - busy < n - self.OVERSUBSCRIBED

    def _try(self, n: int, why: str) -> None:
        if n < self.threads and self.threads in self.score:  # load that just came shows in the latest pass first
            self.score[self.threads] = max(self.score[self.threads], self.last_s)
        self.trial_from = self.threads
        self._set(n, why)

    def _judge_trial(self) -> None:
        new, old = self.threads, self.trial_from
        self.trial_from = None
        if self.score[new] < self.GAIN * self.score.get(old, float("inf")):
            self.since = self.clock()  # keep it (and from here, maybe explore further)
            self.probe_s = self.PROBE_S
            return
        if new > old:  # a probe upwards that did not pay: wait longer before the next one
            self.probe_s = min(30.0, 2 * self.probe_s)
        else:  # nor one downwards: the load alone does not send it down again for a while
            self.down_after, self.down_hold_s = self.clock() + self.down_hold_s, min(30.0, 2 * self.down_hold_s)
        self._set(old, f"{new} threads were not faster ({self.score[new]:.1f}x vs {self.score[old]:.1f}x)")

    def _set(self, n: int, why: str) -> None:
        self.changes.append((self.clock(), self.threads, n, why))
        self.threads, self.passes, self.since = n, 0, self.clock()
        self.apply(n)
        if self.on_change is not None:
            self.on_change(n)


HINT_MAX_AGE_S = 60.0  # a machine busy a minute ago is likely still busy


def _hint_file() -> Path:
    return paths.home() / "threads.json"


def threads_hint(max_threads: int) -> int | None:
    """The thread count the last process settled on, if it was recent and fewer than the maximum: a
    `run` under load then starts (and evaluates its prompt) at the count that was fastest, instead of
    learning it again from slow passes."""
    try:
        h = json.loads(_hint_file().read_text())
        n, at = int(h["threads"]), float(h["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return n if 1 <= n < max_threads and 0 <= time.time() - at <= HINT_MAX_AGE_S else None


def save_threads_hint(n: int) -> None:
    try:
        paths.write_atomic(_hint_file(), json.dumps({"threads": n, "at": time.time()}))
    except OSError:
        pass
