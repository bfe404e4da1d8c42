"""`localspec serve` as a real process on a free loopback port, for the server tests."""

from __future__ import annotations

import atexit
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
_LIVE: set = set()  # servers started and not yet stopped: killed when the test process exits, whatever happened


@atexit.register
def _kill_leftovers() -> None:
    for srv in list(_LIVE):
        srv.stop(wait_s=5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout: float, poll_s: float = 0.2) -> bool:
    """Until `url` (a server's /health) answers 200: True; False once `proc` exits or `timeout` seconds pass.
    The one readiness loop of every script and test that starts a server (localspec's or llama-server's)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(poll_s)
    return False


class ServerProcess:
    def __init__(self, args: list[str], home: Path, env: dict | None = None, wait: bool = True,
                 cwd: Path | None = None, port: int | None = None):
        """cwd: the checkout whose `localspec` runs (default: this one); port: a given one (a restart's)."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.home = home
        self.env = {**os.environ, "LOCALSPEC_HOME": str(home), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                    **(env or {})}
        self.log = home / f"serve-{self.port}.log"
        for n in range(2, 1000):  # a restart on the same port keeps the log of the one before
            if not self.log.exists():
                break
            self.log = home / f"serve-{self.port}-{n}.log"
        home.mkdir(parents=True, exist_ok=True)
        self.log_file = open(self.log, "w")
        # LOCALSPEC_TEST_SERVE_ARGS: flags for every server a test starts (`--isolate`: the suite behind the boundary)
        extra = shlex.split(os.environ.get("LOCALSPEC_TEST_SERVE_ARGS", ""))
        self.proc = subprocess.Popen([sys.executable, "-m", "localspec", "serve", "--port", str(self.port), *args, *extra],
                                     cwd=cwd or ROOT, env=self.env, stdout=self.log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        _LIVE.add(self)
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until /health answers 200; a server that exits or never gets there is stopped, then reported."""
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop(wait_s=10)
            raise

    def _wait_ready(self, timeout: float) -> None:
        if not wait_healthy(self.url + "/health", self.proc, timeout, poll_s=0.1):
            what = f"exited ({self.proc.returncode})" if self.proc.poll() is not None else "did not become ready"
            raise RuntimeError(f"the server {what}: {self.output()}")

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

    def kill(self) -> None:
        """SIGKILL, as a crash, the OOM killer or a lost battery ends it: no handler runs."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log_file.close()
        _LIVE.discard(self)

    def stop(self, wait_s: float = 60) -> int:
        """Ctrl-C, as a user stops it (killed after wait_s); returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()
        _LIVE.discard(self)
        return self.proc.returncode


def process_tree(pid: int) -> list[int]:
    """pid and its descendants, from /proc's children lists (a server's model processes, llama-server's
    router's children): what a script counts as the server's memory and CPU."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return out


def _decode(raw: bytes, ctype: str):
    text = raw.decode("utf-8")
    return json.loads(text) if "json" in ctype else text


def drop_data_copies(root: Path) -> None:
    """Remove what the servers of a scripted run wrote into their fresh data roots under `root` (the pair
    assembled into each, saved prompts): gigabytes per run; the logs stay for reading."""
    import shutil

    for d in [*root.rglob("models"), *root.rglob("prompt-cache")]:
        if d.is_dir() and not (d / "__init__.py").exists():  # never a checkout's localspec/models package
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":  # from a shell script: PYTHONPATH=scripts python -m harness.serverproc URL [SECONDS]
    sys.exit(0 if wait_healthy(sys.argv[1], None, float(sys.argv[2]) if len(sys.argv) > 2 else 120) else 1)
