"""Helper hosts on this machine: each a network namespace (its own address, joined to this one by a veth
pair) running llama.cpp's RPC servers, optionally behind a delaying relay (relay.py). Root only; every
namespace, link and process made here is removed by `stop()`, also when a run fails.

Host i has address 10.78.i.2 (this side 10.78.i.1); an RPC server listens there on each port asked for, and
with a delay a relay on 127.0.0.1 forwards to it (`endpoint` says which address a client should use)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

RELAY = Path(__file__).resolve().parent / "relay.py"


def ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_port(host: str, port: int, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing answers on {host}:{port}")


class Hosts:
    def __init__(self, n: int, binary: Path, ports: list[int], threads: int, delay_ms: float, log_dir: Path,
                 prefix: str = "lsnet"):
        if os.geteuid() != 0:
            raise SystemExit("helper hosts need network namespaces: run as root (or on a machine where you are)")
        self.n, self.binary, self.ports, self.threads, self.delay_ms = n, binary, ports, threads, delay_ms
        self.log_dir, self.prefix = log_dir, prefix
        self.procs: dict[tuple[int, int], subprocess.Popen] = {}
        self.relays: list[subprocess.Popen] = []

    def address(self, i: int) -> str:
        return f"10.78.{i + 1}.2"

    def endpoint(self, i: int, port: int) -> str:
        """Where a client reaches host i's server on `port`: the relay when there is a delay."""
        return f"127.0.0.1:{self.relay_port(i, port)}" if self.delay_ms else f"{self.address(i)}:{port}"

    @staticmethod
    def relay_port(i: int, port: int) -> int:
        return port + 1000 + 100 * i

    def rpc(self, port: int) -> str:
        """`--rpc` for the servers on `port` of every host."""
        return ",".join(self.endpoint(i, port) for i in range(self.n))

    def start(self) -> "Hosts":
        try:
            for i in range(self.n):
                ns, here, there = f"{self.prefix}{i}", f"{self.prefix}{i}a", f"{self.prefix}{i}b"
                ip("netns", "del", ns, check=False)
                ip("link", "del", here, check=False)
                ip("netns", "add", ns)
                ip("link", "add", here, "type", "veth", "peer", "name", there)
                ip("link", "set", there, "netns", ns)
                ip("addr", "add", f"10.78.{i + 1}.1/24", "dev", here)
                ip("link", "set", here, "up")
                ip("netns", "exec", ns, "ip", "addr", "add", f"{self.address(i)}/24", "dev", there)
                ip("netns", "exec", ns, "ip", "link", "set", there, "up")
                ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
                for port in self.ports:
                    self.start_server(i, port)
                    if self.delay_ms:
                        self.relays.append(subprocess.Popen(
                            [sys.executable, str(RELAY), "--listen", f"127.0.0.1:{self.relay_port(i, port)}",
                             "--to", f"{self.address(i)}:{port}", "--delay-ms", str(self.delay_ms)]))
                        wait_port("127.0.0.1", self.relay_port(i, port))
        except BaseException:
            self.stop()
            raise
        return self

    def start_server(self, i: int, port: int) -> None:
        log = open(self.log_dir / f"rpc-host{i}-{port}.log", "ab")
        self.procs[(i, port)] = subprocess.Popen(
            ["ip", "netns", "exec", f"{self.prefix}{i}", str(self.binary), "-H", self.address(i), "-p", str(port),
             "-t", str(self.threads)], stdout=log, stderr=subprocess.STDOUT)
        wait_port(self.address(i), port)

    def kill(self, i: int, port: int) -> None:
        """kill -9 of host i's server on `port` (a host that vanishes)."""
        proc = self.procs.pop((i, port))
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        for proc in [*self.procs.values(), *self.relays]:
            proc.kill()
            proc.wait()
        self.procs.clear()
        self.relays.clear()
        for i in range(self.n):
            ip("netns", "del", f"{self.prefix}{i}", check=False)
            ip("link", "del", f"{self.prefix}{i}a", check=False)
