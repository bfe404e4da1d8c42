"""A split model's host killed mid-answer, again and again, while another model of the same server answers
a second client: does the first request end with one error in its protocol's shape within 5 s, does the
second answer complete, does the server stay up, and does the split model answer again once its host is
back (loaded again by the server when the host answers, nobody asking)?

One `localspec serve` with two pairs (a data root of its own): `split`, the default pair's target with
`-ngl` layers over two helper hosts (network namespaces, harness/netns.py) and its draft here, and
`helper`, the pair's draft model served alone, in the server's process. Each round streams a long answer
from `split` (OpenAI chat), starts a `helper` request, and `kill -9`s host 1's RPC server at the first
piece of text; then restarts it and waits for `split` to answer again.

  scripts/split-check                 # 10 rounds
  scripts/split-check --rounds 3 --delay-ms 2.5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from harness import llamacpp_tools
from harness.netns import Hosts
from harness.serverproc import ServerProcess
from localspec import models

PORT = 50052
LONG = {"model": "split", "stream": True, "max_tokens": 600, "temperature": 0,
        "messages": [{"role": "user", "content": "Write a long, detailed tutorial on Python's asyncio, with examples."}]}
SHORT = {"model": "helper", "max_tokens": 100, "temperature": 0,
         "messages": [{"role": "user", "content": "Explain what a hash table is in a short paragraph."}]}


def pairs_file(home: Path, rpc: str, ngl: int) -> None:
    pair = models.resolve_pair()
    home.mkdir(parents=True, exist_ok=True)
    (home / "models.yaml").write_text(
        "pairs:\n"
        f"  split:\n    target: {{path: {pair.target_path}}}\n    draft: {{path: {pair.draft_path}}}\n"
        f"    rpc_servers: [{rpc}]\n    n_gpu_layers_target: {ngl}\n"
        f"  helper:\n    target: {{path: {pair.draft_path}}}\n")


def status(srv: ServerProcess, name: str) -> str:
    data = httpx.get(srv.url + "/models", timeout=10).json()["data"]
    return next(m["status"]["value"] for m in data if m["id"] == name)


def wait_for(check, timeout: float) -> float:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError
        time.sleep(0.2)
    return time.monotonic() - t0


def one_round(srv: ServerProcess, hosts: Hosts) -> dict:
    helper: dict = {}

    def second_client():
        r = httpx.post(srv.url + "/v1/chat/completions", json=SHORT, timeout=300)
        helper.update(status=r.status_code, text=(r.json().get("choices") or [{}])[0].get("message", {}).get("content"))

    client = threading.Thread(target=second_client)
    last, t_kill = "", None
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=LONG, timeout=300) as r:
        for line in r.iter_lines():
            if line:
                last = line
            if t_kill is None and '"content"' in line:
                client.start()
                hosts.kill(1, PORT)
                t_kill = time.monotonic()
    ended_s = time.monotonic() - t_kill if t_kill else None
    client.join(300)
    error = json.loads(last.removeprefix("data: ")).get("error", {}) if last.startswith("data: {") else {}
    hosts.start_server(1, PORT)
    back_s = wait_for(lambda: status(srv, "split") == "loaded", 120)
    again = httpx.post(srv.url + "/v1/chat/completions", json={**LONG, "stream": False, "max_tokens": 16}, timeout=300)
    return {"error_s": ended_s, "error": error, "helper": helper, "server_up": srv.proc.poll() is None,
            "reloaded_s": back_s, "answers_again": again.status_code == 200}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--delay-ms", type=float, default=0.0, help="relay delay each way (0: direct)")
    p.add_argument("-ngl", type=int, default=19, help="the target's layers on the hosts")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="localspec-split-check-"))
    print(f"logs in {work}", file=sys.stderr)
    hosts = Hosts(2, llamacpp_tools.build("ggml-rpc-server"), [PORT], 2, a.delay_ms, work).start()
    srv = None
    rounds = []
    try:
        pairs_file(work / "home", hosts.rpc(PORT), a.ngl)
        srv = ServerProcess(["--models-max", "2", "--threads", "2"], work / "home", wait=False)
        srv.wait_ready(timeout=600)
        httpx.post(srv.url + "/models/load", json={"model": "split"}, timeout=600)
        wait_for(lambda: status(srv, "split") == "loaded", 600)
        for i in range(a.rounds):
            rounds.append(one_round(srv, hosts))
            r = rounds[-1]
            print(f"round {i + 1}: error after {r['error_s']:.2f} s ({r['error'].get('code')}: "
                  f"{r['error'].get('message')}); helper {r['helper'].get('status')}; server up {r['server_up']}; "
                  f"split loaded again after {r['reloaded_s']:.1f} s, answers: {r['answers_again']}", file=sys.stderr)
    finally:
        if srv is not None:
            code = srv.stop()
            print(f"server stopped with exit code {code}", file=sys.stderr)
        hosts.stop()
    ok = [r for r in rounds if r["error_s"] is not None and r["error_s"] < 5 and r["error"].get("code") == 503]
    helped = [r for r in rounds if r["helper"].get("status") == 200 and r["helper"].get("text")]
    print(f"| rounds | error in shape within 5 s | slowest error | second client answered | server up | "
          f"answers again | slowest reload |\n|---|---|---|---|---|---|---|\n"
          f"| {len(rounds)} | {len(ok)}/{len(rounds)} | {max((r['error_s'] or 0) for r in rounds):.2f} s | "
          f"{len(helped)}/{len(rounds)} | {sum(r['server_up'] for r in rounds)}/{len(rounds)} | "
          f"{sum(r['answers_again'] for r in rounds)}/{len(rounds)} | {max(r['reloaded_s'] for r in rounds):.1f} s |")
    return 0 if len(ok) == len(helped) == len(rounds) == a.rounds else 1


if __name__ == "__main__":
    sys.exit(main())
