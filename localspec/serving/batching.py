"""Continuous batching: several generations in one target context, one llama_decode per step.

Each generation runs the same one-screen loop (`loop.speculative_decode`) in its own thread, on
its own sequence of a shared context (`SeqView`: a Context's face for one seq_id). Its passes are
not run by that thread: `SeqView.eval` hands them to the `Batcher`, whose thread waits until every
active sequence has handed in its next pass (or GATHER_S went by), runs them all as ONE llama_decode
(a plain token for one, a verify batch of drafts for another, a slice of a new arrival's prompt) and
gives each its own logits rows. Rollback stays per sequence (`llama_memory_seq_rm` on its seq_id), so
one sequence's rejected drafts never touch another's cache.

One thread decodes, for every context of the process: llama.cpp's OpenMP team belongs to the thread
that calls llama_decode, and while two such threads live, libgomp counts more threads than cores and
stops spinning at the barriers between a graph's nodes (a futex sleep at each instead): every pass of
both teams, the batch thread's too, then cost more for the rest of the process (docs/BENCHMARKS.md,
"Figures behind the code's rules"). So the draft model's passes, and anything else that decodes, go to
the batch thread too (`Batcher.call`).

Fairness: prompt evaluation goes in slices of at most PROMPT_SLICE tokens while others are decoding
(a long prompt stalls them for one slice, not for the whole prompt); sequences marked `priority`
(an editor's completion) go alone while they have work, the others' passes wait one step at most.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..backend import Context, sync_cache
from ..backend.rollback import Checkpoints
from ..errors import ContextFullError, PassInterrupted
from .caches.swap import SwapSpace

GATHER_S = 0.004  # a step waits this long for sequences still busy in Python (accepting, drafting)
PRIORITY_WAIT_S = 0.05  # while an editor's completion runs, the others' passes wait this long for its next one
NEWCOMER_S = 2.0  # a request this new gets the steps to itself: the others decode plainly (no long drafts) meanwhile
PROMPT_SLICE = 64  # prompt tokens per step while others decode: short enough not to stall them, barely dearer than 512
# a step of at least this many tokens (a long verify, a prompt slice) is given up inside llama_decode when an
# editor's completion arrives, and goes again after it
YIELD_MIN = 16
SWAP_POLL_S = 0.25  # how often a swapped-out sequence's client is asked whether it is still there


@dataclass
class Pass:
    """One sequence's pass, handed in and waited for."""
    seq: int
    tokens: list[int]
    logits: str
    priority: bool
    stop: Callable[[], bool] | None = None  # background work's (an idle measurement's): whether to give way
    since: float = field(default_factory=time.perf_counter)
    done: int = 0  # tokens evaluated so far (a prompt goes in slices)
    out: np.ndarray | None = None
    error: BaseException | None = None
    finished: bool = False
    decode_s: float = 0.0  # time of the steps it was part of

    @property
    def is_prompt(self) -> bool:
        """A prompt's pass ("none"; "last": the one whose last row gives the first token) goes in slices;
        a round's ("all": a decode or a verify) goes whole."""
        return self.logits != "all"


@dataclass
class _Call:
    """Work handed to the batch thread (Batcher.call), waited for."""
    fn: Callable[[], object]
    result: object = None
    error: BaseException | None = None
    finished: bool = False


class Batcher:
    """The one thread that calls llama_decode on a shared context while sequences are active."""

    def __init__(self, ctx: Context, make_room=None):
        """make_room(): free cells held by idle sequences when the cache is full; True if it freed any."""
        self.ctx, self.make_room = ctx, make_room
        self.swap = SwapSpace(ctx)  # sequences waiting, out of the cache, for cells (caches/swap.py)
        self.cancels: dict[int, Callable[[], bool]] = {}  # seq -> whether its client has gone
        self.leaves = self.leaves_seen = 0  # generations ended; a swapped sequence may fit since
        self.cv = threading.Condition()
        self.active: dict[int, bool] = {}  # seq -> priority, while a generation runs on it
        self.joined: dict[int, float] = {}  # seq -> when its generation began
        self.waiting: list[Pass] = []
        self.calls: list[_Call] = []  # other work that decodes (the draft model's passes), run between steps
        self.steps = 0
        self.last_step: dict[int, int] = {}  # seq -> tokens it had in the last step
        self.step_end = 0.0  # when the last step ended
        self.closed = False
        self.thread = threading.Thread(target=self._loop, name="localspec-batch", daemon=True)
        self.thread.start()

    def join(self, seq: int, priority: bool = False, cancel: Callable[[], bool] | None = None) -> None:
        with self.cv:
            self.active[seq] = priority
            self.joined[seq] = time.monotonic()
            if cancel is not None:
                self.cancels[seq] = cancel

    def leave(self, seq: int) -> None:
        with self.cv:
            self.active.pop(seq, None)
            self.cancels.pop(seq, None)
            self.swap.drop(seq)
            self.leaves += 1
            self.cv.notify_all()  # a step may have been waiting for this sequence's pass

    def others(self, seq: int) -> tuple[int, int, bool]:
        """(tokens, sequences) the other active sequences had in the last step: what a pass of this
        sequence's shares its step with (the policy prices drafts by it); and whether it should draft
        nothing now, yielding to a newer request (joined within NEWCOMER_S) or an editor's completion:
        a step with a long draft costs many decodes, and a short chat arriving beside a long copied
        answer would get one token per such step (docs/BENCHMARKS.md, "Figures behind the code's rules")."""
        last, now, mine = self.last_step, time.monotonic(), self.joined.get(seq, 0.0)
        rows = [n for s, n in last.items() if s != seq and s in self.active]
        active = dict(self.active)
        newer = any(s != seq and t > mine and now - t < NEWCOMER_S for s, t in list(self.joined.items()) if s in active)
        # an editor's completion runs: its next pass must not wait behind a long verify
        editor = any(pri for s, pri in active.items() if s != seq)
        return sum(rows), len(rows), newer or editor

    def submit(self, seq: int, tokens: list[int], logits: str, stop: Callable[[], bool] | None = None) -> Pass:
        return self._hand_in(self.waiting, Pass(seq, list(tokens), logits, self.active.get(seq, False), stop))

    def call(self, fn: Callable[[], object]):
        """fn() run on the batch thread, between steps, ahead of them (a draft model's pass: its
        generation waits for it); its result returned or its exception raised here."""
        if threading.current_thread() is self.thread:
            return fn()
        return self._hand_in(self.calls, _Call(fn)).result

    def _hand_in(self, queue: list, item):
        """Put a Pass or a _Call where the batch thread takes it, wait until it is finished, raise its error."""
        with self.cv:
            if self.closed:
                raise ContextFullError("the batch thread has stopped")
            queue.append(item)
            self.cv.notify_all()
            self.cv.wait_for(lambda: item.finished)
        if item.error is not None:
            raise item.error
        return item

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify_all()

    def _wait_left(self, first: float) -> float:
        """How much longer the next step waits (0: go now). It goes when every active sequence has
        handed in a pass, or GATHER_S after the first one came; while a priority sequence (an editor's
        completion) is active, it goes when that one's pass is in, waiting up to PRIORITY_WAIT_S for it."""
        now = time.perf_counter()
        if any(self.active.values()):  # counted from the priority pass's last step: the others' passes
            # have often waited through it, and would otherwise go first while its next one is prepared
            return 0.0 if any(p.priority for p in self.waiting) else max(first, self.step_end) + PRIORITY_WAIT_S - now
        seqs = {p.seq for p in self.waiting}
        return 0.0 if all(s in seqs for s in self.active) else first + GATHER_S - now

    def _loop(self) -> None:
        while True:
            if self.swap:
                self._tend_swapped()
            with self.cv:
                self.cv.wait_for(lambda: self._runnable() or self.calls or self.closed,
                                 timeout=SWAP_POLL_S if self.swap else None)
                if not (self._runnable() or self.calls or self.closed):
                    continue
                if self.closed:
                    for p in [*self.waiting, *self.calls]:
                        p.error, p.finished = ContextFullError("the server is shutting down"), True
                    self.cv.notify_all()
                    return
                if not self.calls:
                    first = min(p.since for p in self._runnable())
                    while not self.calls and (left := self._wait_left(first)) > 0:
                        self.cv.wait(left)
                calls, self.calls = self.calls, []
                step = [] if calls else self._compose()
            if calls:  # a generation waits on each (a sequence still drafting, not yet handed in)
                self._run_calls(calls)
                continue
            self._run(step)
            with self.cv:
                self.cv.notify_all()

    def _run_calls(self, calls: list["_Call"]) -> None:
        for c in calls:
            try:
                c.result = c.fn()
            except BaseException as e:  # the caller gets it; this thread goes on
                c.error = e
        with self.cv:
            for c in calls:
                c.finished = True
            self.cv.notify_all()

    def _compose(self) -> list[tuple[Pass, int]]:
        """The passes (and how many of each one's tokens) that go in the next step."""
        runnable = self._runnable()
        pool = [p for p in runnable if p.priority] or runnable
        decoding = [p for p in pool if not p.is_prompt]
        budget = self.ctx.n_batch
        step = []
        for p in decoding:  # verify and decode passes go whole: they are short, and their logits are needed now
            n = len(p.tokens) - p.done
            if step and n > budget:
                continue
            step.append((p, min(n, budget)))
            budget -= min(n, budget)
        for p in (p for p in pool if p.is_prompt):
            if budget <= 0:
                break
            n = min(len(p.tokens) - p.done, budget, PROMPT_SLICE if decoding else budget)
            step.append((p, n))
            budget -= n
        return step

    def _run(self, step: list[tuple[Pass, int]]) -> None:
        abort, yielding = self._abort_for(step)
        t0 = time.perf_counter()
        try:
            while True:
                parts = [(p.seq, p.tokens[p.done:p.done + n], p.logits if p.done + n == len(p.tokens) else "none")
                         for p, n in step]
                try:
                    outs = self.ctx.decode_parts(parts, abort)
                    break
                except ContextFullError:
                    if self.make_room and self.make_room():
                        continue  # an idle lane's cells freed: again
                    victim = self._victim(step)
                    if victim is None:
                        raise
                    self.swap.out(victim)  # its pass waits, out of the cache, until cells are free
                    step = [(p, n) for p, n in step if p.seq != victim]
                    if not step:
                        return
        except PassInterrupted as e:
            self._interrupted(step, e, yielding)
            return
        except BaseException as e:  # each pass's thread gets the error; this thread goes on
            with self.cv:
                for p, _ in step:
                    p.error, p.finished = e, True
                    self.waiting.remove(p)
            return
        dt = time.perf_counter() - t0
        with self.cv:
            self.steps += 1
            self.step_end = time.perf_counter()
            self.last_step = {p.seq: n for p, n in step}
            for (p, n), out in zip(step, outs):
                p.done += n
                p.decode_s += dt
                if p.done == len(p.tokens):
                    p.out, p.finished = out, True
                    self.waiting.remove(p)

    def _runnable(self) -> list[Pass]:
        return [p for p in self.waiting if p.seq not in self.swap] if self.swap else self.waiting

    def _victim(self, step: list[tuple[Pass, int]]) -> int | None:
        """Which sequence of a step that does not fit moves out of the cache: the youngest (an editor's
        completion last). A step of one sequence moves out while others hold cells or older ones wait
        swapped (they go first); with neither, that sequence alone outgrows the context: None."""
        seqs = {p.seq for p, _ in step}
        if len(seqs) < 2:
            (seq,) = seqs
            older_out = [s for s in list(self.swap.held) if self.joined.get(s, 0.0) < self.joined.get(seq, 0.0)]
            holding = [s for s in list(self.active) if s != seq and s not in self.swap and self.ctx.seq_tokens.get(s)]
            if not (older_out or holding):
                return None
        return max(seqs, key=lambda s: (not self.active.get(s, False), self.joined.get(s, 0.0)))

    def _tend_swapped(self) -> None:
        """Swapped sequences whose clients left end now; the others come back, oldest first, once a
        generation has ended or nothing else holds cells."""
        with self.cv:
            gone = [p for p in self.waiting if p.seq in self.swap and (c := self.cancels.get(p.seq)) and c()]
            for p in gone:
                self.swap.drop(p.seq)
                p.error, p.finished = ContextFullError("cancelled while waiting for room in the cache"), True
                self.waiting.remove(p)
            if gone:
                self.cv.notify_all()
            holding = any(self.ctx.seq_tokens.get(s) for s in self.active if s not in self.swap)
            if self.leaves == self.leaves_seen and holding:
                return
            self.leaves_seen = self.leaves
            order = sorted(self.swap.held, key=lambda s: self.joined.get(s, 0.0))
        self.swap.back(order, self.make_room)
        with self.cv:
            self.cv.notify_all()

    def _abort_for(self, step: list[tuple[Pass, int]]):
        """(what llama.cpp asks while the step runs whether to give it up, whether its passes then go
        again): background passes alone (an idle measurement's: work no request reuses) give way to any
        request and to their work's own stop (a 64-token pass is a long wait); a long step of
        others' passes gives way to an editor's completion that arrives (and goes again after it)."""
        if all(p.stop is not None for p, _ in step):
            return (lambda: self._request_waiting() or any(p.stop() for p, _ in step)), False
        seqs = {p.seq for p, _ in step}
        if not any(p.priority for p, _ in step) and sum(n for _, n in step) >= YIELD_MIN:
            return (lambda: any(pri for s, pri in list(self.active.items()) if s not in seqs)), True
        return None, False

    def _interrupted(self, step: list[tuple[Pass, int]], e: PassInterrupted, again: bool) -> None:
        with self.cv:
            now = self.step_end = time.perf_counter()
            for p, _ in step:
                if again:  # rolled back whole: it goes again once the editor's passes have had their turn
                    p.since = now
                else:
                    p.error, p.finished = e, True
                    self.waiting.remove(p)

    def _request_waiting(self) -> bool:
        """Asked by llama.cpp between a background pass's graph nodes (no lock: a list read is atomic):
        a request's pass, or work a request hands to this thread (its draft model's pass)."""
        return bool(self.calls) or any(p.stop is None for p in self.waiting)


class SeqView:
    """One sequence of a shared context, with a Context's face (tokens, eval, truncate, sync, snapshot,
    restore) for the loop, the drafter and the prompt cache. With a `batcher` its passes join the
    others' steps; without one (the draft model's context) they run at once, one caller at a time, on
    the `runner`'s thread when given one (the batch thread, the one thread that decodes)."""

    pad_verify = False

    def __init__(self, ctx: Context, seq: int, batcher: Batcher | None = None, runner: Batcher | None = None):
        self.ctx, self.seq, self.batcher, self.runner = ctx, seq, batcher, runner
        self.n_ctx, self.n_batch, self.n_vocab = ctx.n_ctx, ctx.n_batch, ctx.n_vocab
        self.decode_s = 0.0

    @property
    def tokens(self) -> list[int]:
        return self.ctx.seq_tokens[self.seq]

    @property
    def cuts(self):
        return self.ctx.seq_cuts[self.seq]

    @property
    def turn_starts(self) -> frozenset[int]:
        return self.ctx.turn_starts

    def eval(self, tokens: list[int], logits: str = "last", stop=None) -> np.ndarray | None:
        """stop: background work's question whether to give way, asked while the pass runs too (PassInterrupted)."""
        if not tokens:
            return None
        if self.batcher is None:
            t0 = time.perf_counter()
            if self.runner is None:
                out = self.ctx.eval(tokens, logits, seq=self.seq, stop=stop)
            else:
                out = self.runner.call(lambda: self.ctx.eval(tokens, logits, seq=self.seq, stop=stop))
            self.decode_s += time.perf_counter() - t0
            return out
        p = self.batcher.submit(self.seq, tokens, logits, stop)
        self.decode_s += p.decode_s
        return p.out

    def truncate(self, n: int) -> None:
        self.ctx.truncate(n, self.seq)

    def checkpoint(self, brief: bool = False, keep: int = Checkpoints.ROLLBACK_KEEP) -> None:
        self.ctx.checkpoint(self.seq, brief, keep)

    def reusable(self, n: int) -> int:
        return self.ctx.reusable(n, self.seq)

    # a recurrent model's checkpoints of this sequence, the context's rollback kind and miss costs (rollback.py)
    ckpts = property(lambda self: self.ctx.seq_ckpts[self.seq])
    rollback = property(lambda self: self.ctx.rollback)
    miss = property(lambda self: self.ctx.miss)

    def sync(self, tokens: list[int], should_stop=None, step: int = 128, background: bool = False) -> int:
        return sync_cache(self, tokens, should_stop, step, background)

    def copy_from(self, other: "SeqView", tokens: list[int]) -> int:
        return self.ctx.copy_prefix(other.seq, self.seq, tokens)

    def snapshot(self):
        return self.ctx.snapshot(self.seq)

    def restore(self, state, tokens: list[int], cuts=None, ckpts=None) -> bool:
        return self.ctx.restore(state, tokens, self.seq, cuts, ckpts)

    def reset(self) -> None:
        self.ctx.clear(self.seq)
