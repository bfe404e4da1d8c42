"""`localspec serve` as a real process on a free loopback port, for the server tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, args: list[str], home: Path, env: dict | None = None, wait: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.home = home
        self.env = {**os.environ, "LOCALSPEC_HOME": str(home), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                    **(env or {})}
        self.log = home / f"serve-{self.port}.log"
        home.mkdir(parents=True, exist_ok=True)
        self.log_file = open(self.log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "localspec", "serve", "--port", str(self.port), *args],
                                     cwd=ROOT, env=self.env, stdout=self.log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}): {self.output()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the server did not become ready: {self.output()}")

    def get(self, path: str, headers: dict | None = None) -> tuple[int, dict | str]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, _decode(r.read(), r.headers.get("Content-Type", ""))
        except urllib.error.HTTPError as e:
            return e.code, _decode(e.read(), e.headers.get("Content-Type", ""))

    def metric(self, name: str) -> float:
        _, text = self.get("/metrics")
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise KeyError(name)

    def output(self) -> str:
        if not self.log_file.closed:
            self.log_file.flush()
        return self.log.read_text()

    def stop(self) -> int:
        """Ctrl-C, as a user stops it; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()
        return self.proc.returncode


def _decode(raw: bytes, ctype: str):
    text = raw.decode("utf-8")
    return json.loads(text) if "json" in ctype else text
