"""scripts/rpc-host: build and start llama.cpp's RPC server here, printing the pair's `rpc_servers` line."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # localspec's pure modules, without a venv

from harness import llamacpp_tools  # noqa: E402
from localspec.backends import choose, probe  # noqa: E402


def addresses(host: str) -> list[str]:
    """The addresses other machines reach this one by (for 0.0.0.0), else the one given."""
    if host not in ("0.0.0.0", "::"):
        return [host]
    try:
        found = {i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    except OSError:
        found = set()
    return sorted(a for a in found if not a.startswith("127.")) or ["THIS-MACHINE'S-ADDRESS"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=50052, help="port (default 50052, llama.cpp's)")
    p.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1, help="CPU threads for the host's layers")
    p.add_argument("--cache", action="store_true", help="keep received weights in a local file cache (faster reloads)")
    p.add_argument("--backend", choices=sorted(llamacpp_tools.BACKEND_FLAGS),
                   help="build for this backend (default: what the project's set-up would choose here)")
    a = p.parse_args()
    if not 0 < a.port < 65536:
        p.error(f"--port {a.port} is not a port (1-65535)")
    backend = a.backend or choose(probe(), os.environ.get("CMAKE_ARGS", ""), os.environ.get("LOCALSPEC_BACKEND", "")).backend
    try:
        binary = llamacpp_tools.build("ggml-rpc-server", backend)
    except Exception as e:  # a missing compiler or cmake: one line, not the build's traceback
        print(f"rpc-host: could not build llama.cpp's RPC server ({e}); install cmake and a C++ compiler", file=sys.stderr)
        return 1
    hosts = ",".join(f"{addr}:{a.port}" for addr in addresses(a.host))
    print(f"rpc-host: llama.cpp's RPC server ({backend}) on {a.host}:{a.port}; on the main machine: "
          f"`localspec serve --rpc {hosts}` or, in models.yaml, rpc_servers: [{hosts}]", file=sys.stderr, flush=True)
    args = [str(binary), "-H", a.host, "-p", str(a.port), "-t", str(a.threads), *(["-c"] if a.cache else [])]
    os.execv(args[0], args)


if __name__ == "__main__":
    sys.exit(main())
