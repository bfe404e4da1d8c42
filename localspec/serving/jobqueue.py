"""The waiting jobs, in the order an editor needs them served.

- Requests that answer someone (anything that generates) go before background work (warm-ups:
  n_predict 0), in arrival order among themselves.
- A newer completion from the same editor slot supersedes the waiting ones from that slot and
  the running one (`Job.slot`; llama-server's `id_slot`): they end with an empty answer, the
  running one at its next round, so an editor never waits behind text it no longer needs.
- Background work yields to any request that arrives or runs on another lane (`foreground_waiting`; the
  worker also checks the running jobs).
"""

from __future__ import annotations

import threading
from collections import deque


class JobQueue:
    def __init__(self, on_superseded):
        """on_superseded(job): called (outside the lock) for each waiting job a newer one replaced."""
        self._fg: deque = deque()
        self._bg: deque = deque()
        self._cv = threading.Condition()
        self._on_superseded = on_superseded
        self.running: set = set()  # the jobs being served (the workers add and remove theirs)

    def qsize(self) -> int:
        with self._cv:
            return len(self._fg) + len(self._bg)

    def empty(self) -> bool:
        return self.qsize() == 0

    def foreground_waiting(self) -> bool:
        return bool(self._fg)  # a racy read is fine: it is polled between evaluation steps

    def put(self, job) -> None:
        superseded = []
        with self._cv:
            if job is None:
                self._fg.append(None)
            elif job.background:
                self._bg.append(job)
            else:
                if job.slot is not None:
                    superseded = [j for j in self._fg if j is not None and j.slot == job.slot]
                    for j in superseded:
                        self._fg.remove(j)
                    for running in list(self.running):
                        if running.slot == job.slot and not running.background:
                            running.cancel.set()  # it ends at its next round with what it has
                self._fg.append(job)
            self._cv.notify()
        for j in superseded:
            self._on_superseded(j)

    def get(self, timeout: float | None = None):
        """The next job (None = stop); raises TimeoutError when nothing came within `timeout`."""
        with self._cv:
            if not self._cv.wait_for(lambda: self._fg or self._bg, timeout):
                raise TimeoutError
            return self._fg.popleft() if self._fg else self._bg.popleft()

    def withdraw(self, job) -> None:
        """Its client hung up, or its response ended: the job ends, and if it still waits it leaves the queue
        now, so its place no longer counts against the server's limit on waiting requests."""
        job.cancel.set()
        with self._cv:
            for q in (self._fg, self._bg):
                for i, j in enumerate(q):
                    if j is job:
                        del q[i]
                        return

    def drain(self) -> list:
        with self._cv:
            jobs = [j for j in (*self._fg, *self._bg) if j is not None]
            self._fg.clear()
            self._bg.clear()
            return jobs
