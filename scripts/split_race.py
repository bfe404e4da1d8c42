"""The pair's target split over two helper hosts, raced: `localspec serve --rpc` against llama-server --rpc
on the same hosts, at several network delays.

Each helper host is a network namespace of this machine with its own address (harness/netns.py), running
llama.cpp's RPC server (built from the sdist localspec runs on) once per racing server, since an RPC server
serves one client at a time. The kernel here has no `netem`, so a delay is a relay (harness/relay.py) that
holds every chunk that long each way; at delay 0 the servers connect to the hosts directly. Every server
keeps the first layers here and sends `-ngl N` layers to the hosts (split evenly by llama.cpp); llama-server's
draft model (`-md`) stays here (`-ngld 0`), as localspec's does. localspec's threads are fixed (`--threads`,
all cores, as llama-server's): the hosts' work shares this machine's cores, which its thread governor would
otherwise read as other programs' load and answer by using fewer threads, as it would not on real hosts. Then race.py's race at each delay: the same
greedy requests to each server in turn, order alternating, quiet before each.

  scripts/split-race                                         # delays 0, 0.5 and 2.5 ms, edit and chat
  scripts/split-race --delays 2.5 --workloads edit --quick --servers localspec,localspec-plain
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import race

from harness import llamacpp_tools
from harness.netns import Hosts

FIRST_PORT = 50052


def server_flags(names: list[str], hosts: Hosts, ngl: int, threads: int) -> dict[str, list[str]]:
    """Each server's own RPC servers (one port each on every host) and its split."""
    out = {}
    for j, name in enumerate(names):
        flags = ["--rpc", hosts.rpc(FIRST_PORT + j), "-ngl", str(ngl)]
        if name == "llama-draft":
            flags += ["-ngld", "0"]
        if name.startswith("localspec"):  # the hosts compute on this machine's cores, which localspec's thread
            flags += ["--threads", str(threads)]  # governor would read as other programs' load: fixed, as llama-server's
        out[name] = flags
    return out


def main() -> int:
    p = race.parser(__doc__, servers="localspec,localspec-plain,llama,llama-spec,llama-draft")
    p.set_defaults(workloads="edit,chat", quick=True)
    p.add_argument("--delays", default="0,0.5,2.5", help="relay delays each way, ms (0: direct)")
    p.add_argument("--hosts", type=int, default=2, help="helper hosts (default 2)")
    p.add_argument("-ngl", type=int, default=19, help="layers on the hosts (default 19 of the 1.5B's 29: 10 stay here)")
    p.add_argument("--host-threads", type=int, default=2, help="each RPC server's threads")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="localspec's threads here, fixed")
    a = p.parse_args()
    names = race.server_names(p, a)
    rpc_server = llamacpp_tools.build("ggml-rpc-server")
    llamacpp_tools.build("llama-server")  # before any host starts: a first build takes minutes
    json_base = a.json
    for delay in (float(d) for d in a.delays.split(",")):
        work = Path(tempfile.mkdtemp(prefix=f"localspec-split-{delay}-"))
        print(f"delay {delay} ms each way (relay): logs in {work}", file=sys.stderr)
        hosts = Hosts(a.hosts, rpc_server, [FIRST_PORT + j for j in range(len(names))], a.host_threads, delay, work)
        hosts.start()
        try:
            servers = race.start_servers(names, work, a.llama_server, "cpu", server_flags(names, hosts, a.ngl, a.threads))
            a.json = json_base.with_suffix(f".delay{delay}.json") if json_base else None
            results, turns = race.run(servers, work, a)
        finally:
            hosts.stop()
        print(f"\n### delay {delay} ms each way (simulated by a relay), {a.hosts} hosts, -ngl {a.ngl}\n")
        race.report(results, turns, names, a.json)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
