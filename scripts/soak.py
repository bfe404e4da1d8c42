"""A soak of `localspec serve` under real traffic, and crashes in the middle (docs/SERVE.md, "Under load and after
a crash"). One server on a fresh data root serves three models by name (the default pair, a tiny hybrid with
its perturbed draft, a tiny model with its own NextN head) with `--models-max 2`, so the router loads and
evicts under load; CLIENTS threads send every protocol it speaks (OpenAI chat and completions, streamed and
not; Anthropic Messages with an agent's long system prompt; Responses; Ollama; `/completion`; `/infill` as an
editor types; the chat page's conversations), some hanging up mid-stream, more at once than `--parallel`
lanes. With `--llama-server`, llama-server from the same sdist (`--spec-default`, the same lanes) gets the
same requests on the endpoints it shares, for the pair, in alternating order.

Phases: warm-up (a tenth of the run), a quiet sample, the measured run, a quiet sample; then CRASHES times:
traffic, SIGKILL at a random moment, a restart on the same data root and port, and checks (every
conversation write the server acknowledged is there whole, the saved prompts on disk whole, the profiles
load, the restart answers); then each greedy request sent again to a fresh quiet server. Prints the report
(markdown), writes it with a JSON of every figure and a plot of RSS and open files to OUT; exits 1 when a
goal fails: an error outside the documented ones, RSS grown more than --rss-growth after warm-up, open
files grown, the last tenth's p99 over --p99-growth times the first's, an acknowledged write lost, a
corrupt saved prompt, a restart that did not answer, a greedy answer unlike the quiet server's.

  scripts/soak                                   # the CI smoke: 2 minutes, 4 clients, 2 crashes
  scripts/soak --minutes 60 --clients 6 --crashes 6 --llama-server --replay 40 --ties 8   # the long run
"""

from __future__ import annotations

import argparse
import pickle
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import httpx

from harness import soakcrash, soakreport
from harness.serverproc import ServerProcess, drop_data_copies
from harness.soakclients import Request, send
from harness.soakmix import AGENT_SYSTEM, CHATS, HEAD, HYBRID, PAIR
from harness.soakrun import Clients, Endpoint, Sampler
from harness.tinyarch import build_tiny_arch

WIDE = dict(width=128, head_dim=32, ff=256)  # the NextN model: larger than the hybrid, as tests/server's


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=2.0, help="the load phase (warm-up included; default 2)")
    p.add_argument("--clients", type=int, default=4, help="clients at once (default 4)")
    p.add_argument("--parallel", type=int, default=2, help="the server's lanes: fewer than clients, so they overflow")
    p.add_argument("--crashes", type=int, default=2, help="SIGKILLs, each followed by a restart and checks")
    p.add_argument("--crash-after", type=float, nargs=2, default=(5.0, 25.0), metavar=("MIN_S", "MAX_S"),
                   help="each kill comes after a random time in this range of traffic (default 5 25)")
    p.add_argument("--llama-server", action="store_true", help="llama-server beside it on the shared endpoints")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--think", type=float, default=0.5, help="mean seconds a client waits between requests")
    p.add_argument("--rss-growth", type=float, default=0.05, help="the most RSS may grow after warm-up (0.05)")
    p.add_argument("--p99-growth", type=float, default=1.2, help="last tenth's p99 over the first's at most (1.2)")
    p.add_argument("--replay", type=int, default=16, help="distinct greedy requests sent again to a quiet server (16)")
    p.add_argument("--ties", type=int, default=4, help="partings of each server whose margin is measured (4)")
    p.add_argument("--out", type=Path, help="where the report, its JSON and plot go (default: a temporary folder)")
    p.add_argument("--report", type=Path, metavar="RAW",
                   help="no run: the report again from a run's soak-raw.pickle (the figures as this code makes them)")
    return p


def make_models(work: Path) -> Path:
    """The tiny models and a data root whose models.yaml names them beside the default pair; its profiles
    are the user's (the pair's pass costs measured once), copied so a crash can only damage the copies."""
    models, home = work / "models", work / "home"
    models.mkdir(parents=True)
    hybrid = build_tiny_arch(models / "hybrid.gguf", "qwen35", seed=0)
    draft = build_tiny_arch(models / "hybrid-draft.gguf", "qwen35", seed=0, perturb=0.3)
    head = build_tiny_arch(models / "head.gguf", "qwen35", seed=0, dims=WIDE, nextn=1)
    template = work / "home-template"
    template.mkdir()
    (template / "models.yaml").write_text(f"pairs:\n  {HYBRID}:\n    target: {hybrid}\n    draft: {draft}\n"
                                          f"  {HEAD}:\n    target: {head}\n")
    user = Path.home() / ".local/share/localspec/profiles"
    if user.is_dir():
        (template / "profiles").mkdir()
        for p in user.glob("*.json"):
            shutil.copy(p, template / "profiles" / p.name)
    shutil.copytree(template, home)
    return template


def server_args(args) -> list[str]:
    return ["--models-max", "2", "--parallel", str(args.parallel)]


def ask(url: str, model: str, prompt: str = CHATS[4][0], n: int = 16) -> tuple[float, str]:
    """Seconds to one whole greedy answer (the model loaded first if it is not), and its text."""
    t0 = time.monotonic()
    r = httpx.post(url + "/v1/chat/completions", json={"model": model, "max_tokens": n, "temperature": 0,
                                                       "messages": [{"role": "user", "content": prompt}]}, timeout=600)
    r.raise_for_status()
    return time.monotonic() - t0, r.json()["choices"][0]["message"]["content"]


def start(home: Path, args, port: int | None = None) -> tuple[ServerProcess, dict]:
    """The server, and how long it took to listen and to answer each model once."""
    t0 = time.monotonic()
    srv = ServerProcess(server_args(args), home, port=port)
    ready = {"health_s": round(time.monotonic() - t0, 2)}
    for model in (PAIR, HYBRID, HEAD):
        ready[f"{model}_s"] = round(ask(srv.url, model)[0], 2)
    ready["answered_s"] = round(time.monotonic() - t0, 2)
    return srv, ready


def quiet_sample(srv: ServerProcess, sampler: Sampler) -> dict:
    """RSS and open files with no request running, every model unloaded and then the hybrid and the pair
    loaded afresh and answering once: the two samples compare one state (a loaded model's KV pages, its
    saved prompts and its lazily loaded draft fill as it serves, bounded; a leak stays across a reload)."""
    def loaded() -> list[str]:
        return [m["id"] for m in httpx.get(srv.url + "/v1/models", timeout=60).json()["data"]
                if m["status"]["value"] == "loaded"]
    for name in loaded():
        httpx.post(srv.url + "/models/unload", json={"model": name}, timeout=600)
    end = time.monotonic() + 120
    while loaded() and time.monotonic() < end:  # a model whose hung-up streams are still ending unloads after them
        time.sleep(0.5)
    for model in (HYBRID, PAIR):
        ask(srv.url, model)
    time.sleep(3)
    s = sampler.take()
    saved = sum(v for k, v in s.metrics.items() if k.startswith("localspec:prompt_cache_bytes"))
    return {"rss_mb": round(s.rss_mb, 1), "anon_mb": round(s.anon_mb, 1), "saved_mb": round(saved / 2**20, 1),
            "files": s.files, "t": round(s.t, 1)}


def load_phase(clients: Clients, srv: ServerProcess, sampler: Sampler, minutes: float) -> dict:
    warm_s = max(20.0, minutes * 6)  # a tenth of the run
    marks = {"warm_start": time.monotonic()}
    clients.phase = "warm-up"
    clients.start()
    time.sleep(warm_s)
    clients.stop()
    marks["quiet_after_warmup"] = quiet_sample(srv, sampler)
    clients.phase = "load"
    marks["load_start"] = time.monotonic()
    clients.start()
    time.sleep(max(10.0, minutes * 60 - warm_s))
    clients.stop()
    marks["load_end"] = time.monotonic()
    marks["quiet_at_end"] = quiet_sample(srv, sampler)
    return marks


def crash_phase(clients: Clients, srv: ServerProcess, sampler: Sampler, args, rng: random.Random,
                started: dict) -> tuple[ServerProcess, list[dict]]:
    crashes = []
    clients.phase = "crash"
    for i in range(args.crashes):
        clients.start()
        time.sleep(rng.uniform(*args.crash_after))
        killed_at = time.monotonic()
        srv.kill()
        clients.stop()  # the requests in flight end with the connection
        left = {"saved_prompts": soakcrash.saved_prompts(srv.home), "profiles": soakcrash.profiles(srv.home),
                # the first crash also finds its saved prompts damaged (a bad disk): each dropped with one line
                "damaged": soakcrash.damage(srv.home) if i == 0 else 0}
        srv, ready = start(srv.home, args, port=srv.port)
        sampler.follow(srv.proc.pid)
        ready["up_at"] = time.monotonic()
        row = {"crash": i + 1, "after_s": round(killed_at - sampler.t0, 1), "killed_at": killed_at, **ready, **left,
               "conversations": clients.ledger.check(httpx.Client(), srv.url)}
        agent = send(httpx.Client(), srv.url, Request(
            "anthropic", PAIR, {"system": AGENT_SYSTEM, "messages": [{"role": "user", "content": CHATS[4][0]}],
                                "max": 16}, stream=False))
        row["agent_answer_s"] = round(agent.total_s, 2) if agent.answered else f"{agent.failure}: {agent.detail}"
        row["log"] = soakcrash.log_findings(srv.output())
        crashes.append(row)
        print(f"  crash {i + 1}: restarted, answered in {ready['answered_s']} s (first start {started['answered_s']} s)",
              file=sys.stderr)
    return srv, crashes


def greedy_requests(outcomes, server: str, seed: int, most: int) -> dict[str, Request]:
    """A seeded sample of at most `most` distinct greedy requests the server answered."""
    keys = {}
    for o in outcomes:
        if o.req.greedy and o.answered and o.extra["server"] == server and not o.req.exempt:
            keys.setdefault(o.req.key(), o.req)
    chosen = sorted(keys)
    random.Random(seed).shuffle(chosen)
    return {k: keys[k] for k in chosen[:most]}


def replay(url: str, requests: dict[str, Request]) -> dict[str, str]:
    """Each request sent alone, not streamed, one after another: its answer on a quiet server."""
    answers = {}
    with httpx.Client() as client:
        for key, req in requests.items():
            quiet = Request("openai-chat" if req.protocol == "page" else req.protocol, req.model, req.body, stream=False)
            out = send(client, url, quiet)
            answers[key] = out.text if out.answered else f"<{out.failure}: {out.detail}>"
    return answers


def quiet_answers(template: Path, work: Path, args, outcomes) -> dict[str, str]:
    """localspec's greedy requests answered by a fresh server on a fresh data root."""
    home = work / "quiet-home"
    shutil.copytree(template, home)
    srv = ServerProcess(server_args(args), home)
    try:
        return replay(srv.url, greedy_requests(outcomes, "localspec", args.seed, args.replay))
    finally:
        srv.stop()


def run(args, work: Path) -> dict:
    """The soak's phases; everything they measured, raw."""
    rng = random.Random(args.seed)
    template = make_models(work)
    srv, started = start(work / "home", args)
    print(f"soak: {srv.url}, started in {started}", file=sys.stderr)
    llama = _llama_server(work, args.parallel) if args.llama_server else None
    clients = Clients(Endpoint("localspec", srv.url),
                      Endpoint("llama-server", f"http://127.0.0.1:{llama.port}") if llama else None,
                      args.clients, args.seed, args.think)
    sampler = Sampler(srv.proc.pid, srv.url)
    sampler.start()
    doc = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "started": started,
           "work": str(work)}
    try:
        marks = load_phase(clients, srv, sampler, args.minutes)
        srv, doc["crashes"] = crash_phase(clients, srv, sampler, args, rng, started)
        marks["down"] = [(c.pop("killed_at"), c.pop("up_at")) for c in doc["crashes"]]
        sampler.stop()
        doc["exit_code"] = srv.stop()
        doc["clean_log"] = "Traceback" not in srv.output()
        doc["quiet"] = {"localspec": quiet_answers(template, work, args, clients.outcomes)}
        if llama is not None:  # llama-server, quiet now, answers its requests again
            doc["quiet"]["llama-server"] = replay(clients.llama.url,
                                                  greedy_requests(clients.outcomes, "llama-server", args.seed, args.replay))
    finally:
        sampler.stop()
        clients.stop()
        srv.stop(wait_s=10)
        if llama is not None:
            llama.stop()
    return {"outcomes": clients.outcomes, "samples": sampler.samples, "t0": sampler.t0, "marks": marks, "doc": doc}


def report(raw: dict, args, out: Path) -> int:
    """The figures, the near-tie check of each greedy parting, the goals; the report written to `out`."""
    import soak_ties

    doc, sampler = raw["doc"], SimpleNamespace(samples=raw["samples"], t0=raw.get("t0", raw["marks"]["warm_start"]))
    doc.update(soakreport.summarise(raw["outcomes"], sampler, raw["marks"], doc["quiet"]))
    doc["ties"] = soak_ties.check_partings(doc, most=args.ties)
    failed = soakreport.goals(doc, args)
    text = soakreport.markdown(doc, failed, soak_ties.table(doc["ties"]) if doc["ties"] else "")
    soakreport.save(doc, raw["outcomes"], sampler, out, text)
    print(text)
    print(f"report, figures and logs in {out}", file=sys.stderr)
    return 1 if failed else 0


def main() -> int:
    args = parser().parse_args()
    if args.report is not None:  # the figures again from a run's raw measurements (after changing the report)
        with open(args.report, "rb") as f:
            raw = pickle.load(f)
        out = args.out or args.report.parent
        out.mkdir(parents=True, exist_ok=True)
        return report(raw, args, out)
    work = Path(tempfile.mkdtemp(prefix="localspec-soak-"))
    out = args.out or work
    out.mkdir(parents=True, exist_ok=True)
    try:
        raw = run(args, work)
    except RuntimeError as e:  # a server that did not start, or did not come back after a kill
        print(f"soak: {e}; logs in {work}", file=sys.stderr)
        return 1
    with open(out / "soak-raw.pickle", "wb") as f:  # everything measured, before any figure is made of it
        pickle.dump(raw, f)
    code = report(raw, args, out)
    for home in ("home", "quiet-home"):
        drop_data_copies(work / home)  # the pair assembled into each data root: gigabytes; logs stay
    return code


def _llama_server(work: Path, parallel: int):
    from harness.llamacpp_tools import LlamaServer, build
    from localspec.models import bundle_paths_if_installed

    target, draft = bundle_paths_if_installed()
    return LlamaServer(build("llama-server"), str(target), ["--spec-default", "--parallel", str(parallel), "-c", "16384"],
                       work / "llama-server.log")


if __name__ == "__main__":
    sys.exit(main())
