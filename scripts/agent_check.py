"""scripts/agent-check: Claude Code's first question cold on llama-server and on localspec serve, then warm
on a restarted localspec serve (the prompt restored from disk). Each server runs alone; every request goes
through the recording proxy of scripts/clients, so the table shows how many requests each question took
and how many prompt tokens each server evaluated."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
import agent_clients  # noqa: E402
import clients  # noqa: E402

from harness import llamacpp_tools  # noqa: E402
from harness.serverproc import ServerProcess  # noqa: E402


def prompt_tokens_total(port: int) -> int | None:
    """The server's own count of prompt tokens evaluated (llama.cpp's metric, which both servers export)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("llamacpp:prompt_tokens_total"):
            return int(float(line.split()[-1]))
    return None


def ask(label: str, upstream: int, tools: str | None, work: Path, home: Path) -> dict:
    rec = clients.Recorder(upstream)
    url = f"http://127.0.0.1:{clients.start_proxy(rec)}"
    r, took = agent_clients.run_claude(clients, url, tools=tools, work=work, home=home)
    out = (r.stdout.strip() or r.stderr.strip()).replace("\n", " ")
    msgs = [x for x in rec.seen if x["path"].startswith("/v1/messages")]
    t0 = min((x["t_start"] for x in msgs), default=0.0)
    for x in msgs:  # what the agent sent, and when each ended (None: still open when it exited)
        end = x.get("t_end")
        shown = {k: x[k] for k in ("model", "stream", "max_tokens", "tools", "status") if k in x}
        print(f"  request at {x['t_start'] - t0:7.1f} s, ended {'open' if end is None else f'{end - t0:7.1f} s'}: "
              f"{shown}", file=sys.stderr, flush=True)
    evaluated = prompt_tokens_total(upstream)
    row = {"run": label, "seconds": round(took), "answered": agent_clients.FILE_FACT[2] in out, "requests": len(msgs),
           "prompt_evaluated": evaluated, "answer": out[-100:]}
    print(row, file=sys.stderr, flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip-llama", action="store_true", help="localspec only")
    p.add_argument("--serve-args", default="", help="more flags for localspec serve, e.g. \"-fa off\"")
    p.add_argument("--tools", default=None, help="Claude Code's --tools (default: all of them, its real first prompt)")
    p.add_argument("--warm-only", nargs=3, type=Path, metavar=("DATA_ROOT", "PROJECT", "CLAUDE_HOME"),
                   help="only the warm run, on the data root, project directory and Claude Code HOME of an earlier run")
    a = p.parse_args()
    from localspec.models import bundle_paths_if_installed

    target, _ = bundle_paths_if_installed()
    rows = []
    # One project directory and one HOME for every run, as for a user: Claude Code's system prompt names
    # both (its memory directory is under HOME) before its tools, so a session elsewhere would share only
    # the first ~600 tokens of the prompt.
    work = a.warm_only[1] if a.warm_only else agent_clients.project()
    claude_home = a.warm_only[2] if a.warm_only else Path(tempfile.mkdtemp(prefix="claude-home-"))
    if not (a.skip_llama or a.warm_only):
        binary = llamacpp_tools.build("llama-server")
        log = Path(tempfile.mkdtemp(prefix="agent-check-")) / "llama-server.log"
        llama = llamacpp_tools.LlamaServer(binary, str(target), ["-c", "32768", "--jinja", "--temp", "0", "--metrics"], log)
        try:
            rows.append(ask("llama-server, first question", llama.port, a.tools, work, claude_home))
        finally:
            llama.stop()
    home = a.warm_only[0] if a.warm_only else Path(tempfile.mkdtemp(prefix="agent-check-home-"))
    models = Path.home() / ".local/share/localspec/models"
    if models.is_dir() and not (home / "models").exists():  # the bundle's files, not assembled again
        shutil.copytree(models, home / "models")
    labels = ["localspec serve, first question (cold)", "localspec serve restarted, new session (warm: disk)"]
    for label in labels[1:] if a.warm_only else labels:
        srv = ServerProcess(["--temperature", "0", "--log-requests", *a.serve_args.split()], home)
        try:
            rows.append(ask(label, srv.port, a.tools, work, claude_home))
        finally:
            srv.stop()
        timings = [ln for ln in srv.output().splitlines() if " lane " in ln]  # where each request's time went
        print(f"{label}:", *timings, sep="\n  ", file=sys.stderr, flush=True)
    print("| run | claude -p wall time | answered | /v1/messages requests | prompt tokens evaluated | answer |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['seconds']} s | {'yes' if r['answered'] else 'no'} | {r['requests']} | "
              f"{r['prompt_evaluated']} | {r['answer'].replace('|', '/')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
