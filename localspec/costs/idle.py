"""The one owner of "answer now, measure when nobody waits": what this machine has not measured yet (auto's
pass costs, then the attention kernel), measured by `localspec run` after its answer, the chat app while
its user reads and a server while idle, never before an answer.

A measurement must be invisible: it starts only on a machine other programs left quiet (the caller's
`busy()` window), runs in passes that give way within one pass to a request or to another program
(`stop()`), keeps what it measured before it gave way (the pass-cost rounds done, the kernel's stages
done), and after giving way to another program waits longer each time (BACKOFF_S) before it tries again.
`measure_due` is the rule every front end calls; `state_of(engine)` is what /metrics, `localspec doctor` and
the chat app's status line show.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

from . import attention
from .costmodel import QUICK_SIZES
from .tuning import CostRounds, keep_profile, quick_profile

QUIET_BEFORE_S = 5.0  # a server measures only after it and the other programs left the cores quiet this long
BACKOFF_S = (15.0, 600.0)  # after giving way to another program: wait this long, doubling up to the second


@dataclass
class Backoff:
    """When background work that gave way to another program may try again: BACKOFF_S, doubling each time."""
    gave_way: int = 0  # times in a row
    not_before: float = 0.0  # time.monotonic()

    def ready(self) -> bool:
        return time.monotonic() >= self.not_before

    def wait_s(self) -> float:
        return max(0.0, self.not_before - time.monotonic())

    def another_program(self) -> None:
        self.gave_way += 1
        self.not_before = time.monotonic() + min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** (self.gave_way - 1))

    def done(self) -> None:
        self.gave_way, self.not_before = 0, 0.0


def stopper(request: Callable[[], bool], busy: Callable[[], bool], gave_way: list[str]) -> Callable[[], bool]:
    """stop() for background work: True once someone waits (`request()`) or another program used the cores
    (`busy()`), which it appends to `gave_way`."""
    def stop() -> bool:
        if not gave_way:
            if request():
                gave_way.append("a request")
            elif busy():
                gave_way.append("another program")
        return bool(gave_way)
    return stop


@dataclass
class Measurement:
    """Where this engine's first measurements stand: `state` is "pending" (due, waiting for an idle moment),
    "measuring", "waiting" (gave way to another program; not again before `not_before`) or "done"."""
    state: str = "pending"
    why: str = ""  # what the last attempt gave way to, or what is left
    backoff: Backoff = field(default_factory=Backoff)  # after giving way to another program
    rounds: CostRounds = field(default_factory=lambda: CostRounds(QUICK_SIZES))  # pass-cost rounds kept
    measured_s: float = 0.0  # wall seconds spent measuring, all attempts

    def to_dict(self) -> dict:
        return {"state": self.state, "why": self.why, "gave_way": self.backoff.gave_way,
                "retry_in_s": round(self.backoff.wait_s(), 1), "measured_s": round(self.measured_s, 1)}


def state_of(engine) -> Measurement:
    m = getattr(engine, "measurement", None)
    if m is None:
        m = engine.measurement = Measurement()
    if m.state != "measuring":
        m.state = "done" if not due(engine) else m.state
    return m


def due(engine) -> bool:
    """Something is left to measure on this machine for this engine."""
    return engine.profile is None or attention.engine_pending(engine)


def _nobody() -> bool:
    return False


def measure_due(engine, busy: Callable[[], bool], request: Callable[[], bool] = _nobody, what: str = "next") -> bool:
    """The rule of "answer now, measure when nobody waits", for `localspec run` after its answer, the chat app
    after a reply and a server's idle worker: nothing while this machine lacks nothing, nor when another
    program used the cores in the caller's window (`busy()`: it tries again later); else `what` is measured,
    giving way within a pass to someone waiting (`request()`) or another program. `what`: "costs" (pass costs
    alone, which price the next answers), "next" (the next thing due) or "all" (everything left).
    True when something was due."""
    if state_of(engine).state == "done" or what == "costs" and engine.profile is not None:
        return False
    if busy():
        return True
    if what == "all":
        measure_all_when_idle(engine, busy, request)
        return True
    return measure_when_idle(engine, busy, request)


def measure_when_idle(engine, busy: Callable[[], bool], request: Callable[[], bool]) -> bool:
    """Measure the next thing this machine lacks, giving way within a pass when `request()` (someone waits)
    or `busy()` (another program used the cores since the last look) says so. The caller checks `busy()`
    over a quiet window first. True when something was due (measured, given way, or backing off)."""
    m = state_of(engine)
    if m.state == "done":
        return False
    if not m.backoff.ready():
        return True
    m.state, t0 = "measuring", time.monotonic()
    gave_way: list[str] = []
    stop = stopper(request, busy, gave_way)
    try:
        if engine.profile is None:
            with _kept(engine.target):
                prof = quick_profile(engine, m.rounds, stop)
            if prof is not None and busy():  # measured beside another program: not this machine's figures
                gave_way.append("another program")
            elif prof is not None:
                keep_profile(prof)
                engine.profile = prof
        else:
            attention.measure_for(engine, stop, busy)
    finally:
        m.measured_s += time.monotonic() - t0
        _after(m, engine, gave_way[0] if gave_way else None)
    return True


@contextmanager
def _kept(ctx):
    """The first sequence's cache (a conversation's) put back after the measurement's passes replaced it."""
    held = (ctx.snapshot(), list(ctx.tokens), ctx.cuts.copy(), ctx.ckpts.copy()) if ctx.tokens else None
    try:
        yield
    finally:
        if held is not None:
            ctx.restore(held[0], held[1], cuts=held[2], ckpts=held[3])
        else:
            ctx.clear()


def measure_all_when_idle(engine, busy: Callable[[], bool], request: Callable[[], bool]) -> None:
    """Everything still due, one thing after the other (a few at most: a figure that cannot be stored, in an
    unwritable data root, stays due), until it is done, gives way, or backs off."""
    for _ in range(3):
        if not measure_when_idle(engine, busy, request) or state_of(engine).state != "pending" or request() or busy():
            return


def _after(m: Measurement, engine, gave_way_to: str | None) -> None:
    if not due(engine):
        m.state, m.why = "done", ""
        m.backoff.done()
    elif gave_way_to == "another program":
        m.backoff.another_program()
        m.state, m.why = "waiting", "another program used the cores"
    else:
        m.state = "pending"
        m.why = "gave way to a request" if gave_way_to else ("pass costs" if engine.profile is None
                                                             else "the attention kernel")


def word(engine) -> str | None:
    """The chat app's status word: None when nothing is left to measure."""
    m = state_of(engine)
    return {"measuring": "measuring", "waiting": "measure later", "pending": "measure pending"}.get(m.state)
