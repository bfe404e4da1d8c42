"""One loaded model (its pair) behind a queue, a worker thread per lane: `ModelWorker`.

Requests become `Job`s. One worker thread per lane of the engine (`--parallel`: each lane a sequence
of the shared context, their passes batched into one llama_decode per step, `batching.py`) takes them
in arrival order, requests before warm-ups (`jobqueue`), and runs each to the end (none is lost, none
gets another's text; only a newer completion from the same editor slot ends one early): it builds the
prompt, generates through its lane, and reports back through the job's `emit` callback —
("start", prompt_len) once the prompt is accepted, ("text", str) for confirmed text, then
("done", Stats) or ("error", LocalspecError) (job.py). A job whose client hung up is cancelled within one
decoding round (`Job.cancel`); a job cancelled while waiting is skipped.

Requests share the engine's caches, so a prompt that starts like an earlier one (in its lane, in
another lane, or saved) evaluates only the new tokens (`cache_n`). An editor's completion (`priority`)
runs ahead of the others' decoding. Idle work (finishing a warm-up, pricing passes at a new depth)
runs on the first lane when no job runs at all.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
import threading
import time

from ..costs import attention, idle
from ..costs.costmodel import CURVE_SIZES, depth_bucket
from ..costs.threads import OTHERS_BUSY, CpuWatch
from ..costs.tuning import keep_depth_curve, measure_at_depth
from ..errors import Unavailable
from ..fim.windows import EditorSettings, EditorWindows
from ..session import Session
from ..stats import Stats
from .job import Job, emit_failure, resolve_logit_bias
from .jobqueue import JobQueue
from .lanes import LanePool
from .limits import LineLimits
from .log import log_unexpected
from .metrics import Metrics

MAX_WAITING = 64  # queued requests beyond this are refused (Unavailable) instead of held in memory without bound
IDLE_WARMUP_S = 0.5  # quiet time before an interrupted warm-up goes on
QUICK_FILL = 512  # the depth a quick profile's whole curve is measured at when the last request ran shallower
CUT_SHORT = "the server is shutting down; the answer was cut short"


UNLIMITED_TOKENS = 1 << 30  # like llama-server's n_predict -1: until EOS, a stop, or the context is full


def open_served(models, gen, notify) -> Session:
    """A server's session: the pair loaded as a server runs it, a stored profile only (the first answer never
    waits for a measurement; the worker measures when idle). Raises LocalspecError."""
    from .engine import ServingEngine

    session = Session.open(models, gen, notify, engine_class=ServingEngine)
    if session.gen.max_tokens < 0:
        session.gen.max_tokens = UNLIMITED_TOKENS
    session.ensure_profile(notify, spec="auto", measure=False)
    return session


class ModelWorker:
    def __init__(self, session: Session, editor: EditorSettings | None = None, log_requests: bool = False):
        self.session = session
        self.log_requests = log_requests  # a timing line per answer on stderr, as llama-server prints
        self.engine = session.engine
        editor = editor or EditorSettings()
        self.fim = EditorWindows(self.engine.target_model, editor.budget) if editor.layout == "editor" else None
        self.jobs = JobQueue(self._superseded)
        self.metrics = Metrics(self.jobs)
        self.idle_prompt: list[int] | None = None  # a warm-up cut short by a request: finished when idle
        self.lanes = LanePool(self.engine)
        self.measure_pending = self.engine.profile is None or attention.engine_pending(self.engine)
        self.depth_backoff = idle.Backoff()  # pricing passes at a depth gave way to another program: not at once
        self.threads = [threading.Thread(target=self._run, args=(i == 0,), name=f"localspec-generate-{i}",
                                         daemon=True) for i in range(len(self.engine.lanes))]
        for t in self.threads:
            t.start()

    @property
    def model(self):
        return self.engine.target_model

    def submit(self, job: Job) -> None:
        if self.closing:
            raise Unavailable("the server is shutting down")
        if self.jobs.qsize() >= MAX_WAITING:
            raise Unavailable(f"{MAX_WAITING} requests are already waiting; try again when they are done")
        self.jobs.put(job)

    def begin_shutdown(self) -> None:
        """The first Ctrl-C or SIGTERM: refuse new jobs, end the waiting ones and the running one with an
        error event at once (a prompt evaluation in progress is not waited for), so every client can tell
        a shutdown from a finished answer and the HTTP server has nothing left to wait out."""
        self.closing = True
        shutting = ("error", Unavailable(CUT_SHORT))
        running = list(self.jobs.running)
        for job in self.jobs.drain():
            job.cancel.set()
            job.emit(shutting)
        for job in running:
            job.cancel.set()
            job.emit(shutting)
        for _ in self.threads:
            self.jobs.put(None)

    def close(self, wait_s: float = 1.0) -> bool:
        """Shut down and free the models; False when the generation thread is still inside llama.cpp after
        `wait_s` (a long prompt evaluation): its models are then left to the process's exit."""
        if not self.closing:
            self.begin_shutdown()
        deadline = time.monotonic() + wait_s
        for t in self.threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self.threads):
            return False
        self.session.close()
        return True

    @property
    def alive(self) -> bool:
        """The generation threads are there to take jobs (a server's health check fails otherwise)."""
        return all(t.is_alive() for t in self.threads) and not self.closing

    closing = False  # set once shutdown begins: new jobs are refused, running ones end
    lost: str | None = None  # why the model cannot answer any more (a process boundary's: isolated.py)

    def facts(self) -> dict:
        """The figures /props shows that change as the model serves (data; the same from isolated.py)."""
        e = self.engine
        return {"n_ctx": e.target.n_ctx, "total_slots": len(e.lanes), "flash_attn_in_use": e.flash_attn,
                "pid": os.getpid(),  # the model's process (another than the server's when isolated)
                "profile": dataclasses.asdict(e.profile) if e.profile is not None else None,
                "measurement": idle.state_of(e).to_dict(),
                "rollback": {"kind": e.target.rollback, "snapshots": e.target.n_rs, "miss_s": e.target.miss.seconds,
                             "fallbacks": e.target.miss.fallbacks}}

    def metric_samples(self) -> list[tuple]:
        """/metrics' rows for this model (metrics.py)."""
        batcher = getattr(self.engine, "batcher", None)
        swapped = batcher.swap.moves if batcher is not None else 0
        cache = getattr(self.engine, "prompt_cache", None)
        return self.metrics.samples(swapped, idle.state_of(self.engine).to_dict(),
                                    cache.size() if cache is not None else 0)

    def _superseded(self, job: Job) -> None:
        """A newer completion from the same editor slot replaced this waiting one: an empty answer."""
        job.cancel.set()
        job.emit(("start", 0))
        job.emit(("done", Stats(stop_reason="superseded", spec_mode="off")))

    def _run(self, idle_worker: bool) -> None:
        """One worker (one per lane): jobs in order; the first worker also does the idle work."""
        while True:
            try:
                if idle_worker:
                    self.idle_watch = CpuWatch()
                job = self.jobs.get(timeout=self._idle_after() if idle_worker else None)
            except TimeoutError:
                if not self.jobs.running:  # idle work waits for a quiet machine
                    self._idle_work()
                continue
            if job is None:
                return
            if job.cancel.is_set():
                continue
            self.jobs.running.add(job)
            try:
                self._serve(job)
                self.measure_pending = True
            except Exception as e:  # never let one job's failure end a generation thread
                log_unexpected("the generation thread", e)
            finally:
                self.jobs.running.discard(job)

    measure_pending = False  # a job ran since the last idle-time measurement
    idle_watch: CpuWatch | None = None  # the other processes' CPU since this worker began waiting

    def _idle_after(self) -> float | None:
        """How long the queue stays empty before idle work starts: editors send the next request within
        ~0.1 s of an answer, and a step of background work already begun delays it. A first measurement waits
        for a machine quiet that long (the window `_others_busy` reads), and out its backing off."""
        if self.idle_prompt:
            return IDLE_WARMUP_S
        m = idle.state_of(self.engine)
        if m.state != "done":
            return max(idle.QUIET_BEFORE_S, m.backoff.wait_s())
        return max(idle.QUIET_BEFORE_S, self.depth_backoff.wait_s()) if self.measure_pending else None

    def _idle_work(self) -> None:
        if not self.idle_prompt and self._others_busy():
            return  # measure_pending stays: the next quiet moment measures (no lane taken, none parked)
        if not self.idle_prompt and self._first_measurements():
            return  # measure_pending stays: the depth's curve comes at the next quiet moment
        lane = self.lanes.checkout(lane=self.lanes.last, background=True)
        try:
            if self.idle_prompt:
                self._finish_warmup(lane)
            else:
                self.measure_pending = False
                self._measure_depth(lane)
        finally:
            self.lanes.checkin(lane, background=True)

    def _first_measurements(self) -> bool:
        """This machine's first pass costs, then its attention kernel (costs/idle.py), on the first lane, held
        so no request shares its sequence: a request takes it back within a pass. True when one was due."""
        if idle.state_of(self.engine).state == "done":
            return False
        lane = self.lanes.checkout(lane=self.engine.lanes[0], background=True)
        try:
            return idle.measure_due(self.engine, self._others_busy, request=lambda: not self._quiet())
        finally:
            self.lanes.checkin(lane, background=True)

    def _foreground(self) -> bool:
        """A request waits or runs: background work (a warm-up) gives way to it, on any lane, since their
        passes would share every step (llama.vim's completions waited out its warm-ups)."""
        return self.jobs.foreground_waiting() or any(not j.background for j in list(self.jobs.running))

    def _quiet(self) -> bool:
        return self.jobs.empty() and not self.jobs.running

    def _others_busy(self) -> bool:
        """Whether other programs used the CPU since the last look: idle measurements wait for a machine
        that is idle, not only a server (one ran beside another server's answer and slowed it several
        times over, its own figures then thrown away as noise)."""
        if self.neighbours_busy():  # another model of this server answers: its CPU counts as this process's
            return True
        busy = self.idle_watch.others_busy() if self.idle_watch is not None else None
        return busy is not None and busy >= OTHERS_BUSY

    @staticmethod
    def neighbours_busy() -> bool:
        """Replaced by the router with several models (router.Router.busy_besides)."""
        return False

    def _finish_warmup(self, lane) -> None:
        """Idle: go on evaluating the warm-up a request interrupted, giving way again to any job."""
        prompt, self.idle_prompt = self.idle_prompt, None
        try:
            stats = self.engine.prefill(prompt, should_stop=lambda: not self._quiet(), lane=lane)
        except Exception as e:
            log_unexpected("a background warm-up", e)
            return
        if stats.stop_reason == "cancelled":
            self.idle_prompt = prompt

    def _measure_depth(self, lane) -> None:
        """While idle, price passes at the depth the last request ran at, once per depth bucket, so
        auto's choices hold for long prompts (FIM with extra context runs thousands of tokens deep);
        a quick start-up profile (passes to 16 tokens) is replaced by the whole curve, to 64, measured
        at the depth requests run at, or over filler to QUICK_FILL tokens deep after a short request
        (a "hi" before the first long one must not leave that one priced by the quick profile). Uses
        the cache as the request left it, as it was afterwards; gives up as soon as another request arrives."""
        prof = self.engine.profile
        held = len(lane.target.tokens)
        quick = prof is not None and bool(prof.extra.get("quick"))
        bucket = depth_bucket(held)
        if prof is None or not quick and (bucket is None or any(depth_bucket(int(d)) == bucket for d in prof.by_depth)):
            return
        if not self.depth_backoff.ready():
            self.measure_pending = True  # later
            return
        gave_way: list[str] = []
        stop = idle.stopper(lambda: not self._quiet(), self._others_busy, gave_way)
        try:
            with self.engine.unobserved():
                if quick and held < QUICK_FILL:
                    toks = lane.target.tokens or [0]  # any token: only the depth matters
                    lane.target.sync((toks * (QUICK_FILL // len(toks) + 1))[:QUICK_FILL], stop, 64,  # starts with toks
                                     background=True)
                tv = measure_at_depth(lane.target, CURVE_SIZES[-1], repeats=2, should_stop=stop)
            depth = len(lane.target.tokens)
        finally:
            lane.target.truncate(held)
        if tv:
            keep_depth_curve(prof, tv, depth, quick)
            self.depth_backoff.done()
        elif gave_way == ["another program"]:  # it would start again at the next quiet moment, and give way again
            self.depth_backoff.another_program()
            self.measure_pending = True

    def _serve(self, job: Job) -> None:
        held: list = []  # the lane the job got, handed back whatever happens
        try:
            self._answer(job, held)
        finally:
            for lane in held:
                self.lanes.checkin(lane)

    def _answer(self, job: Job, held: list) -> None:
        engine = self.engine
        try:
            prompt, cfg = job.prepare(engine)
            if job.options.logit_bias or job.options.ignore_eos:
                cfg.logit_bias = resolve_logit_bias(job.options.logit_bias, engine.target_model, job.options.ignore_eos)
            if cfg.grammar:
                engine.grammar(cfg.grammar).close()  # a grammar that does not parse is refused before any answer
            engine.check_prompt(prompt)
            job.emit(("start", len(prompt)))
            t_start = time.perf_counter()
            lane = self.lanes.checkout(prompt)
            held.append(lane)
            stats = self._generate(job, prompt, cfg, lane)
        except Exception as e:
            emit_failure(job, e, "generating")
            return
        self.metrics.add(stats)
        if self.fim is not None:  # the FIM windows size themselves by the measured prompt speed
            self.fim.observe(stats.prompt_eval_tokens, stats.prompt_eval_s)
        if self.closing and stats.stop_reason == "cancelled":  # cut short by shutdown: not a finished answer
            job.emit(("error", Unavailable(CUT_SHORT)))
            return
        job.emit(("done", stats))
        if self.log_requests:
            deferred = self.idle_prompt is prompt  # a warm-up a request interrupted (_generate kept it)
            sys.stderr.write(timing_line(stats, lane.seq, t_start - job.queued_at, deferred))
            sys.stderr.flush()
        if engine.prompt_cache is not None:  # after the answer (its client need not wait); a prompt whose
            engine.prompt_cache.persist(stats.prompt_eval_tokens, lane.target)  # client gave up: for its retry

    def _generate(self, job: Job, prompt: list[int], cfg, lane):
        engine, ex = self.engine, job.options
        if cfg.max_tokens == 0:
            if not job.background:
                return engine.prefill(prompt, lane=lane)
            self.idle_prompt = None  # a newer warm-up replaces an unfinished one
            stats = engine.prefill(prompt, should_stop=self._foreground, lane=lane)
            if stats.stop_reason == "cancelled":  # a request came: it goes first, the rest waits for idle time
                self.idle_prompt, stats.stop_reason = prompt, "length"
            return stats
        limits = LineLimits(ex.n_indent, ex.t_max_predict_ms) if (ex.n_indent or ex.t_max_predict_ms) else None
        gen = engine.generate(prompt, cfg, cancel=job.cancel.is_set, lane=lane, priority=job.priority)
        t_call = time.perf_counter()
        try:
            for chunk in gen:
                text, stop = (chunk.text, False) if limits is None else limits.push(chunk.text)
                if text and ex.timings_per_token:
                    job.emit(("live", (chunk.source, live_figures(lane.last_stats, t_call))))
                if text:
                    job.emit(("text", text))
                if stop:
                    lane.last_stats.stop_reason = "limit"
                    break
        finally:
            gen.close()
        return lane.last_stats


def live_figures(stats: Stats, t_call: float) -> Stats:
    """A copy of a running answer's figures (its generator, paused in this thread now, goes on changing
    them), with the time spent generating so far, as `localspec chat` counts it in-process."""
    now = copy.deepcopy(stats)
    now.generation_s = max(0.0, time.perf_counter() - t_call - stats.prompt_eval_s)
    return now


def timing_line(st: Stats, lane: int, waited_s: float, deferred: bool = False) -> str:
    """`serve --log-requests`: one answer's figures, as llama-server's timing lines give them. `deferred`:
    a warm-up that gave way to a request, the rest of its prompt left for idle time (not cached)."""
    def rate(n, s):
        return f"{n / s:.1f} tok/s" if s > 0 else "-"
    cached = "the rest deferred" if deferred else f"{st.prompt_tokens - st.prompt_eval_tokens} cached"
    drafts = f", {st.accepted}/{st.drafted} drafts accepted" if st.drafted else ""
    changes = f" ({len(st.thread_changes)} changes)" if st.thread_changes else ""
    threads = f" · {st.threads} threads{changes}" if st.threads else ""
    return (f"localspec serve: lane {lane}: waited {waited_s:.2f} s · prompt {st.prompt_eval_tokens} new tokens "
            f"({cached}{', restored' if st.cache_restored else ''}) in {st.prompt_eval_s:.2f} s "
            f"({rate(st.prompt_eval_tokens, st.prompt_eval_s)}) · {st.tokens} tokens in {st.generation_s:.2f} s "
            f"({rate(st.tokens, st.generation_s)}{drafts}){threads} · {st.stop_reason}\n")
