"""A TCP relay that holds every chunk for a set time each way: network delay where the kernel has no
`netem` queueing discipline (these machines' do not). Threads, not asyncio: a sleep of 0.5 ms must be
0.5 ms (an event loop's timers round to the millisecond). Each direction keeps its order; a side that
closes closes the other. Figures measured through it say so (docs/MODELS.md).

  python scripts/harness/relay.py --listen 127.0.0.1:51052 --to 10.78.1.2:50052 --delay-ms 2.5
"""

from __future__ import annotations

import argparse
import queue
import socket
import sys
import threading
import time


def forward(src: socket.socket, dst: socket.socket, delay_s: float) -> None:
    held: queue.Queue = queue.Queue()

    def read() -> None:
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                data = b""
            held.put((time.perf_counter() + delay_s, data))
            if not data:
                return

    threading.Thread(target=read, daemon=True).start()
    while True:
        due, data = held.get()
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        if not data:
            break
        try:
            dst.sendall(data)
        except OSError:
            break
    for s in (dst, src):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(listen: tuple[str, int], to: tuple[str, int], delay_s: float) -> None:
    server = socket.create_server(listen, reuse_port=False)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection(to, timeout=5)
            upstream.settimeout(None)
        except OSError:
            client.close()
            continue
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=forward, args=(a, b, delay_s), daemon=True).start()


def endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", required=True, type=endpoint)
    p.add_argument("--to", required=True, type=endpoint)
    p.add_argument("--delay-ms", type=float, default=0.0, help="held this long each way")
    a = p.parse_args()
    try:
        serve(a.listen, a.to, a.delay_ms / 1e3)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
