"""scripts/soak's moving parts: the clients (threads, each a `Mix`, sending to localspec and, for the requests
llama-server speaks, to llama-server too, in alternating order) and the sampler (the server's RSS, open files
by kind and /metrics every few seconds)."""

from __future__ import annotations

import os
import random
import re
import threading
import time
from dataclasses import dataclass, field

import httpx

from .serverproc import process_tree
from .soakclients import Outcome, Request, send
from .soakmix import PAIR, SHARED, Mix
from .soakpage import Ledger, page_turn


@dataclass
class Endpoint:
    """A server the clients send to; `url` changes when it is restarted (the same port)."""
    name: str
    url: str
    up: bool = True


@dataclass
class Clients:
    localspec: Endpoint
    llama: Endpoint | None
    n: int
    seed: int
    think_s: float = 0.5
    ledger: Ledger = field(default_factory=Ledger)
    outcomes: list[Outcome] = field(default_factory=list)
    phase: str = "load"

    def __post_init__(self):
        self.mixes = [Mix(i, self.seed) for i in range(self.n)]
        self.convs: list[dict] = [{} for _ in range(self.n)]
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self._stop.clear()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True, name=f"soak-client-{i}")
                         for i in range(self.n)]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Each client ends after its request in flight."""
        self._stop.set()
        for t in self._threads:
            t.join()

    def _run(self, i: int) -> None:
        rng = random.Random(self.seed * 7919 + i)
        with httpx.Client() as client:
            while not self._stop.is_set():
                kind, what = self.mixes[i].next()
                if kind == "page":
                    if len(self.convs[i].get("messages", [])) >= 6 or rng.random() < 0.3:
                        self.convs[i] = {}  # a new conversation now and then
                    model, prompt, n = what
                    self._record(page_turn(client, self.localspec.url, self.ledger, self.convs[i], model, prompt, n),
                                 "localspec", kind)
                else:
                    self._send_both(client, what, kind, rng)
                self._stop.wait(rng.uniform(0, 2 * self.think_s))

    def _send_both(self, client: httpx.Client, req: Request, kind: str, rng: random.Random) -> None:
        targets = [self.localspec]
        if self.llama is not None and req.model == PAIR and req.protocol in SHARED:
            targets.append(self.llama)
            rng.shuffle(targets)  # alternating: neither always goes first
        for t in targets:
            self._record(send(client, t.url, req), t.name, kind)

    def _record(self, out: Outcome, server: str, kind: str) -> None:
        out.extra.update(server=server, kind=kind, phase=self.phase)
        with self.lock:
            self.outcomes.append(out)


@dataclass
class Sample:
    t: float
    rss_mb: float
    files: dict[str, int]  # open file descriptors by kind: file, socket, pipe, other
    metrics: dict[str, float]
    anon_mb: float = 0.0  # of rss_mb, memory no file backs (the heap, KV caches, saved prompts; not mapped weights)


class Sampler:
    """Every `every_s`: the server's RSS (with any model processes of its own), its open files by kind, and
    /metrics. `pid` and `url` follow a restart (`follow`)."""

    def __init__(self, pid: int, url: str, every_s: float = 5.0):
        self.pid, self.url, self.every_s = pid, url, every_s
        self.samples: list[Sample] = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="soak-sampler")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def follow(self, pid: int) -> None:
        self.pid = pid

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            s = self.take()
            if s is not None:
                self.samples.append(s)

    def take(self) -> Sample | None:
        try:
            pids = process_tree(self.pid)
            rss = sum(_status_kb(p, "VmRSS") for p in pids) / 1024
            anon = sum(_status_kb(p, "RssAnon") for p in pids) / 1024
            files = open_files(self.pid)
            text = httpx.get(self.url + "/metrics", timeout=10).text
        except (OSError, httpx.HTTPError):
            return None  # the server is down (a crash) or busy past the timeout: no sample
        return Sample(time.monotonic() - self.t0, rss, files, parse_metrics(text), anon)


def open_files(pid: int) -> dict[str, int]:
    kinds = {"file": 0, "socket": 0, "pipe": 0, "other": 0}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        kind = "socket" if target.startswith("socket:") else "pipe" if target.startswith("pipe:") else \
            "file" if target.startswith("/") else "other"
        kinds[kind] += 1
    return kinds


def parse_metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_:]+(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def counter_total(samples: list[Sample], prefix: str) -> dict[str, float]:
    """Per series starting with `prefix`: its increase over the samples, counting a fall (the model
    unloaded, its counters gone; the server restarted) as a reset from zero."""
    totals: dict[str, float] = {}
    last: dict[str, float] = {}
    for s in samples:
        for k, v in s.metrics.items():
            if not k.startswith(prefix):
                continue
            prev = last.get(k, 0.0)
            totals[k] = totals.get(k, 0.0) + (v - prev if v >= prev else v)
            last[k] = v
        for k in [k for k in last if k not in s.metrics]:  # unloaded: its next value starts from zero
            last[k] = 0.0
    return totals


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith(field + ":"))
