"""The model's side of a process boundary (isolated.py): a `ModelWorker` in a child process, driven by
messages on a pipe. In: ("job", id, prompt, cfg, options, background, slot, priority), ("cancel", id),
("facts",), ("shutdown",), ("close", wait_s). Out: ("note", text) while loading, then ("ready", view) or
("failed", message); ("event", id, event) for each job's events (job.py); ("facts", facts, samples);
("closed", freed). If llama.cpp aborts (an RPC host gone), the pipe's end is the parent's news."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

from ..errors import LocalspecError
from .job import Job
from .worker import ModelWorker, open_served

TERMINAL = ("done", "error")


class Child:
    def __init__(self, conn):
        self.conn, self.lock = conn, threading.Lock()
        self.jobs: dict[int, Job] = {}

    def send(self, msg: tuple) -> None:
        with self.lock:
            try:
                self.conn.send(msg)
            except (OSError, EOFError, BrokenPipeError):  # the parent is gone: its exit ends this process too
                pass

    def emitter(self, job_id: int):
        def emit(event: tuple) -> None:
            if event[0] in TERMINAL:
                self.jobs.pop(job_id, None)
            self.send(("event", job_id, event))
        return emit

    def serve(self, worker: ModelWorker) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):  # the server went away: nobody is left to answer
                worker.close(1.0)
                return
            kind = msg[0]
            if kind == "job":
                self.submit(worker, *msg[1:])
            elif kind == "cancel":
                job = self.jobs.get(msg[1])
                if job is not None:
                    worker.jobs.withdraw(job)
            elif kind == "facts":
                self.send(("facts", worker.facts(), worker.metric_samples()))
            elif kind == "shutdown":
                worker.begin_shutdown()
            elif kind == "close":
                self.send(("closed", worker.close(msg[1])))
                return

    def submit(self, worker: ModelWorker, job_id, prompt, cfg, options, background, slot, priority) -> None:
        job = Job(lambda engine: (prompt, cfg), options, self.emitter(job_id), background=background, slot=slot,
                  priority=priority)
        self.jobs[job_id] = job
        try:
            worker.submit(job)
        except LocalspecError as e:
            job.emit(("error", e))


def main(conn, models, gen, editor, log_requests) -> None:
    """The child process's entry: load, report, serve until told to close or the pipe ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server decides
    # llama.cpp's abort would attach gdb for a backtrace and the kernel may write a core of the whole model:
    # seconds before the server learns of it, for nobody to read
    os.environ["GGML_NO_BACKTRACE"] = "1"
    with contextlib.suppress(ImportError, ValueError, OSError):  # no `resource` on Windows
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    child = Child(conn)
    try:
        session = open_served(models, gen, lambda text: child.send(("note", text)))
    except LocalspecError as e:
        child.send(("failed", str(e)))
        return
    worker = ModelWorker(session, editor, log_requests)
    engine = session.engine
    child.send(("ready", {"selection": session.selection, "gen": session.gen, "load": session.load,
                          "system": session.system, "notes": session.notes, "heads": engine.heads is not None,
                          "target": str(engine.target_model.path), "facts": worker.facts()}))
    child.serve(worker)
