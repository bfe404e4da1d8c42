"""A model served from its own process (`IsolatedWorker`), seen by the server as a `ModelWorker` is.

llama.cpp's RPC client aborts the whole process when a host it splits a model over goes away, which in
one process would take every model and every client of the server with it. A split target (and any model
`serve --isolate` names) therefore runs in a child process (child.py) behind a pipe: the server keeps the
vocabulary (no weights) to make prompts, sends each job's prompt and settings, and gets its events back.
When the child dies, every request it held ends with one `Unavailable` error (a 503 before the first byte,
the protocol's error event after it), `lost` says why, and the router loads the model again when its hosts
answer or the next request names it (router.py)."""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import threading
from types import SimpleNamespace

from ..backend import Model
from ..backend.model import require_answering
from ..errors import LocalspecError, ModelLoadError, Unavailable
from ..fim.windows import EditorSettings, EditorWindows
from ..prompts import Prompts
from . import child
from .job import Job, emit_failure
from .worker import CUT_SHORT, MAX_WAITING

FACTS_WAIT_S = 2.0  # /props and /metrics wait this long for a busy child's figures, then show the last ones
POLL_S = 0.05  # how often a hung-up client's job is looked for (a cancel then reaches the child)


def rpc_servers_of(models) -> str | None:
    """The RPC hosts a load would split its target over (the flag's, else the pair's), without loading."""
    from ..session import select_models

    if models.rpc:
        return models.rpc
    sel = select_models(models)
    return sel.spec.rpc_servers if sel.spec is not None else None


class ModelView(Prompts):
    """The engine as the server's handlers see it: prompts from the vocabulary alone, the context's size."""

    def __init__(self, info: dict):
        self.load = info["load"]
        self.target_model = Model(info["target"], vocab_only=True)
        self.target = SimpleNamespace(n_ctx=info["facts"]["n_ctx"])
        self.heads = True if info["heads"] else None

    def close(self) -> None:
        self.target_model.close()


class SessionView:
    def __init__(self, info: dict, engine: ModelView):
        self.selection, self.gen, self.load = info["selection"], info["gen"], info["load"]
        self.system, self.notes, self.engine = info["system"], info["notes"], engine

    def close(self) -> None:
        self.engine.close()


class RemoteJobs:
    """What the router and the bridge ask of a worker's queue: the jobs in the child, withdrawing one."""

    def __init__(self, cancel):
        self.running: set[Job] = set()
        self._cancel = cancel

    def qsize(self) -> int:
        return 0  # every job is counted as running from the moment it is handed to the child

    def withdraw(self, job: Job) -> None:
        job.cancel.set()
        self._cancel(job)


class IsolatedWorker:
    isolated = True

    def __init__(self, models, gen, notify, editor: EditorSettings | None = None, log_requests: bool = False):
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads or llama.cpp state inherited
        self.conn, theirs = ctx.Pipe()
        self.process = ctx.Process(target=child.main, args=(theirs, models, gen, editor, log_requests),
                                   name="localspec-model", daemon=True)
        self.process.start()
        theirs.close()
        info = self._await_ready(notify)
        self.engine = ModelView(info)
        self.session = SessionView(info, self.engine)
        self.hosts = info["load"].rpc_servers
        self._facts = (info["facts"], [])
        editor = editor or EditorSettings()
        self.fim = EditorWindows(self.engine.target_model, editor.budget) if editor.layout == "editor" else None
        self.jobs = RemoteJobs(self._send_cancel)
        self.closing, self.lost = False, None
        self._send_lock, self._facts_lock = threading.Lock(), threading.Lock()
        self._replies: queue.Queue = queue.Queue()
        self._outbox: queue.Queue = queue.Queue()
        self._ids, self._inflight, self._cancelled = itertools.count(), {}, set()
        self._threads = [threading.Thread(target=fn, name=f"localspec-{name}", daemon=True)
                         for fn, name in ((self._read, "model-events"), (self._hand_over, "model-jobs"))]
        for t in self._threads:
            t.start()

    neighbours_busy = staticmethod(lambda: False)  # set by the router; the child measures by its own machine view

    @property
    def model(self):
        return self.engine.target_model

    @property
    def alive(self) -> bool:
        return not self.closing and self.lost is None  # a death is `lost` (with why) as soon as the pipe ends

    def _await_ready(self, notify) -> dict:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                self.process.join(5)
                raise ModelLoadError(f"the model's process ended while loading ({exit_reason(self.process)})") from None
            if msg[0] == "note":
                notify(msg[1])
            elif msg[0] == "failed":
                self.process.join(5)
                raise ModelLoadError(msg[1])
            elif msg[0] == "ready":
                return msg[1]

    # --- jobs -----------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        if self.lost is not None:
            raise Unavailable(self.lost)
        if self.closing:
            raise Unavailable("the server is shutting down")
        if len(self.jobs.running) + self._outbox.qsize() >= MAX_WAITING:
            raise Unavailable(f"{MAX_WAITING} requests are already waiting; try again when they are done")
        self._outbox.put(job)

    def _hand_over(self) -> None:
        """Prompts made here (the vocabulary is here), jobs sent; hung-up clients' jobs cancelled there."""
        while True:
            try:
                job = self._outbox.get(timeout=POLL_S)
            except queue.Empty:
                job = False
            if job is None:
                return
            for j in [j for j in list(self.jobs.running) if j.cancel.is_set()]:
                self._send_cancel(j)
            if job and not job.cancel.is_set():
                self._send_job(job)

    def _send_job(self, job: Job) -> None:
        try:
            prompt, cfg = job.prepare(self.engine)
        except Exception as e:
            emit_failure(job, e, "making the prompt")
            return
        job_id = next(self._ids)
        job.remote_id = job_id
        self._inflight[job_id] = job
        self.jobs.running.add(job)
        if not self._send(("job", job_id, prompt, cfg, job.options, job.background, job.slot, job.priority)):
            self._end(job_id, ("error", Unavailable(self.lost or "the model's process is gone")))

    def _send_cancel(self, job: Job) -> None:
        job_id = getattr(job, "remote_id", None)
        if job_id is not None and job_id not in self._cancelled and job_id in self._inflight:
            self._cancelled.add(job_id)
            self._send(("cancel", job_id))

    def _send(self, msg: tuple) -> bool:
        with self._send_lock:
            try:
                self.conn.send(msg)
                return True
            except (OSError, EOFError, BrokenPipeError):
                return False

    def _end(self, job_id: int, event: tuple) -> None:
        job = self._inflight.pop(job_id, None)
        self._cancelled.discard(job_id)
        if job is not None:
            self.jobs.running.discard(job)
            job.emit(event)

    # --- events back ----------------------------------------------------------------------------
    def _read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                self._on_exit()
                return
            if msg[0] == "event":
                job_id, event = msg[1], msg[2]
                if event[0] in child.TERMINAL:
                    if event[0] == "done" and self.fim is not None:
                        self.fim.observe(event[1].prompt_eval_tokens, event[1].prompt_eval_s)
                    self._end(job_id, event)
                elif (job := self._inflight.get(job_id)) is not None:
                    job.emit(event)
            elif msg[0] in ("facts", "closed"):
                self._replies.put(msg)

    def _on_exit(self) -> None:
        """The child is gone: each request it held ends with one error; the server goes on."""
        if not self.closing:
            self.lost = "the model is unavailable: its process ended; it loads again on the next request"
        self.process.join(2)
        if not self.closing:
            self.lost = lost_reason(self.process, self.hosts)  # the exit's cause and which host, a moment later
        why = Unavailable(self.lost or CUT_SHORT)
        for job_id in list(self._inflight):
            self._end(job_id, ("error", why))
        self._replies.put(("closed", True))

    # --- figures --------------------------------------------------------------------------------
    def _ask_facts(self) -> tuple[dict, list]:
        with self._facts_lock:
            if self.lost is None and self._send(("facts",)):
                try:
                    reply = self._replies.get(timeout=FACTS_WAIT_S)
                    if reply[0] == "facts":
                        self._facts = (reply[1], reply[2])
                except queue.Empty:
                    pass
            return self._facts

    def facts(self) -> dict:
        return self._ask_facts()[0]

    def metric_samples(self) -> list[tuple]:
        return self._ask_facts()[1]

    def hosts_answer(self) -> bool:
        """Every RPC host takes a connection again (the router then loads the model anew)."""
        return all(_answers(h) for h in endpoints(self.hosts))

    # --- the end --------------------------------------------------------------------------------
    def begin_shutdown(self) -> None:
        self.closing = True
        self._send(("shutdown",))

    def close(self, wait_s: float = 1.0) -> bool:
        if not self.closing:
            self.begin_shutdown()
        freed = True
        if self.process.is_alive() and self._send(("close", wait_s)):
            try:
                freed = bool(self._replies.get(timeout=wait_s + 5)[1])
            except queue.Empty:
                freed = False
        self.process.join(wait_s + 1)
        if self.process.is_alive():  # stuck inside llama.cpp: a process can be ended where a thread cannot
            self.process.kill()
            self.process.join(5)
        self._outbox.put(None)
        self.session.close()
        self.conn.close()
        return freed or not self.process.is_alive()


def exit_reason(process) -> str:
    code = process.exitcode
    if code is None:
        return "still running"
    return f"signal {-code}" if code < 0 else f"exit status {code}"


def lost_reason(process, hosts: str | None) -> str:
    """Why the model's process ended, in a line a client can act on."""
    if hosts:
        gone = [h for h in endpoints(hosts) if not _answers(h)]
        if gone:
            return (f"the model is unavailable: its RPC host {', '.join(gone)} went away "
                    f"({exit_reason(process)}); it loads again when the host answers")
        return (f"the model is unavailable: its process ended ({exit_reason(process)}) while split over {hosts}; "
                "it loads again on the next request")
    return f"the model is unavailable: its process ended ({exit_reason(process)}); it loads again on the next request"


def endpoints(hosts: str | None) -> list[str]:
    return [h.strip() for h in (hosts or "").split(",") if h.strip()]


def _answers(endpoint: str) -> bool:
    try:
        require_answering(endpoint, timeout_s=1.0)
        return True
    except LocalspecError:
        return False
