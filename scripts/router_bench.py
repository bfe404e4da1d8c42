"""Several models behind one `localspec serve`, measured against a single-model server and llama-server's
router, all up at once, requests alternating (docs/MODELS.md, "Several models"; docs/BENCHMARKS.md).

Models: the default pair, its 0.5B draft alone (n-gram drafting), and a Q4_0 copy of the 1.5B target
(made once with llama.cpp's quantizer, kept in ~/.cache/localspec/router-bench). A temporary data root
links the user's files and measured pass costs, so nothing of the user's changes.

  first byte   a loaded model's time to the first streamed text: router against `localspec serve PAIR`
  cold load    POST /models/load of the same file: localspec's router against llama-server's router
  stream       the pair's tok/s while another model loads, against the same stream with nothing loading
  budget       30 requests switching among the three models under --models-memory that holds two:
               the process's peak RSS against the budget, each answer against a single-model server's
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from harness.llamacpp_tools import CACHE, build  # noqa: E402
from harness.serverproc import process_tree, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
PAIR = "qwen2.5-coder-1.5b"
PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
           "Explain what a hash map is in two sentences.", "Write a haiku about compilers.",
           "Give three tips for writing readable shell scripts.", "What does HTTP status 404 mean?"]


def user_home() -> Path:
    return Path(os.environ.get("LOCALSPEC_HOME") or Path.home() / ".local/share/localspec")


def make_home(work: Path) -> tuple[Path, dict[str, Path]]:
    """A data root with the user's pair files (and their verified stamps), pass costs, and the Q4_0 copy."""
    src, home = user_home(), work / "home"
    (home / "models").mkdir(parents=True)
    files = {}
    for f in (src / "models").glob("qwen2.5-coder-*-instruct-q4_k_m.gguf*"):
        (home / "models" / f.name).symlink_to(f.resolve())
        files[f.name] = f.resolve()
    if (src / "profiles").is_dir():
        (home / "profiles").symlink_to((src / "profiles").resolve())
    target = src / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    if not target.exists():
        sys.exit("router-bench: the default pair is not in the data root; run `localspec pull` first")
    q40 = CACHE / "router-bench" / "qwen2.5-coder-1.5b-instruct-q4_0.gguf"
    if not q40.exists():
        q40.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-c", "import sys; from localspec.quantize import quantize_q4_0; "
                        "quantize_q4_0(sys.argv[1], sys.argv[2])", str(target), str(q40)], check=True, cwd=ROOT)
    (home / "models" / q40.name).symlink_to(q40)
    return home, {"draft": files["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"], "target": target, "q40": q40}


class Server:
    def __init__(self, name: str, cmd: list[str], port: int, env: dict, log: Path, ready: str = "/health"):
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        if not wait_healthy(self.url + ready, self.proc, 600):
            sys.exit(f"router-bench: {name} {'exited' if self.proc.poll() is not None else 'did not get ready'}; see {log}")

    def rss(self) -> int:
        """The server's resident memory with its child processes (llama-server's router runs one per model)."""
        total = 0
        for pid in process_tree(self.proc.pid):
            try:
                with open(f"/proc/{pid}/status") as f:
                    total += next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS:"))
            except (OSError, StopIteration):
                pass
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def chat(url: str, model: str, prompt: str, max_tokens: int, stream: bool = True) -> dict:
    """One greedy chat: the text, seconds to the first text, tokens and tok/s of the answer."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream}
    t0, first, text, timings = time.perf_counter(), None, [], {}
    if not stream:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=900).json()
        return {"text": r["choices"][0]["message"]["content"], "s": time.perf_counter() - t0}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            piece = ev["choices"][0]["delta"].get("content") if ev.get("choices") else None
            if piece:
                first = first if first is not None else time.perf_counter() - t0
                text.append(piece)
            timings = ev.get("timings", timings)
    return {"text": "".join(text), "first_s": first, "tokens": timings.get("predicted_n"),
            "tok_s": timings.get("predicted_per_second")}


def first_byte(single: Server, router: Server, runs: int) -> dict:
    httpx.post(router.url + "/models/load", json={"model": PAIR}, timeout=600)
    for s in (single, router):
        chat(s.url, PAIR, "Say hi.", 4)  # warm
    out = {"single": [], "router": []}
    for i in range(runs):
        prompt = f"{PROMPTS[i % len(PROMPTS)]} (run {i})"
        for key, s in (("single", single), ("router", router))[:: 1 if i % 2 == 0 else -1]:
            out[key].append(chat(s.url, PAIR, prompt, 8)["first_s"])
    return out


def load_seconds(url: str, model: str, poll: bool) -> float:
    """POST /models/load until the model is loaded (llama-server answers at once and loads in its child)."""
    t0 = time.perf_counter()
    r = httpx.post(url + "/models/load", json={"model": model}, timeout=600)
    assert r.status_code == 200, r.text
    while poll and _status(url, model) != "loaded":
        time.sleep(0.02)
    return time.perf_counter() - t0


def _status(url: str, model: str) -> str:
    for m in httpx.get(url + "/models", timeout=30).json()["data"]:
        if m["id"] == model:
            s = m.get("status", {})
            return s.get("value") if isinstance(s, dict) else str(s)
    return "missing"


def unload(url: str, model: str) -> None:
    httpx.post(url + "/models/unload", json={"model": model}, timeout=600)
    end = time.monotonic() + 120
    while _status(url, model) not in ("unloaded", "missing") and time.monotonic() < end:
        time.sleep(0.1)


def cold_load(router: Server, llama: Server, model: str, llama_model: str, runs: int) -> dict:
    out = {"localspec": [], "llama-server": []}
    for i in range(runs):
        order = [("localspec", router, model, False), ("llama-server", llama, llama_model, True)]
        for key, s, name, poll in order[:: 1 if i % 2 == 0 else -1]:
            unload(s.url, name)
            time.sleep(1)
            out[key].append(load_seconds(s.url, name, poll))
            unload(s.url, name)
    return out


def stream_while_loading(router: Server, other: str, runs: int) -> dict:
    out = {"quiet": [], "loading": []}
    prompt = "Write a Python class for a bank account with deposit, withdraw and a history of transactions."
    for i in range(runs):
        for key in (("quiet", "loading") if i % 2 == 0 else ("loading", "quiet")):
            unload(router.url, other)
            time.sleep(1)
            loader = threading.Timer(1.0, lambda: load_seconds(router.url, other, False))
            if key == "loading":
                loader.start()
            out[key].append(chat(router.url, PAIR, prompt, 300)["tok_s"])
            if key == "loading":
                loader.join()
    return out


def budget_run(router: Server, names: list[str], budget: int, n: int) -> dict:
    peak, stop = [0], threading.Event()

    most, tick = [0], [0]

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], router.rss())
            tick[0] += 1
            if tick[0] % 10 == 0:
                loaded = httpx.get(router.url + "/api/ps", timeout=30).json()["models"]
                most[0] = max(most[0], len(loaded))
            time.sleep(0.05)

    rng, answers = random.Random(7), []
    order = [names[i % len(names)] if i < len(names) else rng.choice(names) for i in range(n)]
    t = threading.Thread(target=sample)
    t.start()
    try:
        for i, model in enumerate(order):
            answers.append((model, PROMPTS[i % len(PROMPTS)], chat(router.url, model, PROMPTS[i % len(PROMPTS)], 48,
                                                                    stream=False)["text"]))
    finally:
        stop.set()
        t.join()
    return {"peak_rss": peak[0], "budget": budget, "answers": answers, "most_loaded": most[0]}


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def localspec(name: str, args: list[str], env: dict, work: Path) -> Server:
    port = free_port()
    return Server(name, [sys.executable, "-m", "localspec", "serve", "--port", str(port), *args], port, env,
                  work / f"{name}.log")


def single_args(entry) -> list[str]:
    if entry.pair:
        return [entry.pair]
    return ["--target", str(entry.target)] + (["--draft", str(entry.draft)] if entry.draft else [])


def median(xs: list) -> float:
    return statistics.median([x for x in xs if x is not None])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8, help="first-byte runs per server (cold loads and streams: half)")
    ap.add_argument("--requests", type=int, default=30, help="requests in the budget sequence")
    ap.add_argument("--json", metavar="FILE", help="write every figure here")
    args = ap.parse_args()
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"router-bench-{os.getpid()}"
    work.mkdir(parents=True)
    home, files = make_home(work)
    env = {**os.environ, "LOCALSPEC_HOME": str(home), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    os.environ["LOCALSPEC_HOME"] = str(home)
    from localspec.models.catalog import find_models
    entries = find_models()
    names = [e.name for e in entries]
    alone = next(e.name for e in entries if e.target == home / "models" / files["draft"].name)
    print("models:", ", ".join(f"{e.name} ({'pair' if e.pair else 'draft ' + e.draft.name if e.draft else 'n-gram'})"
                                for e in entries), flush=True)
    result = {"models": names}
    servers = []
    try:
        lsdir = work / "llama-models"
        lsdir.mkdir()
        (lsdir / files["draft"].name).symlink_to(files["draft"])
        port = free_port()
        llama = Server("llama-server", [str(build("llama-server")), "--models-dir", str(lsdir), "--port", str(port),
                                        "--no-models-autoload"], port, env, work / "llama-server.log")
        servers.append(llama)
        single = localspec("single", [PAIR], env, work)
        servers.append(single)
        router = localspec("router", [], env, work)
        servers.append(router)
        fb = first_byte(single, router, args.runs)
        result["first_byte_s"] = fb
        print(f"first byte: router {median(fb['router']) * 1000:.0f} ms, single {median(fb['single']) * 1000:.0f} ms",
              flush=True)
        single.stop()
        llama_id = next(m["id"] for m in httpx.get(llama.url + "/models").json()["data"])
        cl = cold_load(router, llama, alone, llama_id, max(2, args.runs // 2))
        result["cold_load_s"] = cl
        print(f"cold load of {files['draft'].name}: localspec {median(cl['localspec']):.2f} s, llama-server "
              f"{median(cl['llama-server']):.2f} s", flush=True)
        llama.stop()
        sw = stream_while_loading(router, alone, max(2, args.runs // 2))
        result["stream_tok_s"] = sw
        print(f"stream: {median(sw['loading']):.1f} tok/s while {alone} loads, {median(sw['quiet']):.1f} quiet",
              flush=True)
        router.stop()
        result["budget"] = budget_phase(env, work, entries, args.requests)
    finally:
        for s in servers:
            s.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


def budget_phase(env: dict, work: Path, entries, n: int) -> dict:
    """Sizes measured with room for all three, then a budget for the two largest, then the sequence."""
    fixed = ["-c", "8192", "--cache-ram", "256"]
    probe = localspec("probe", fixed + ["--models-max", "3"], env, work)
    try:
        for e in entries:
            httpx.post(probe.url + "/models/load", json={"model": e.name}, timeout=600)
        sizes = sorted((m["size"] for m in httpx.get(probe.url + "/api/ps").json()["models"]), reverse=True)
        rss_all = probe.rss()
    finally:
        probe.stop()
    budget = (200 << 20) + sizes[0] + sizes[1] + 2 * (256 << 20) + (128 << 20)
    router = localspec("budget", fixed + ["--models-memory", str(budget >> 20)], env, work)
    try:
        run = budget_run(router, [e.name for e in entries], budget, n)
    finally:
        router.stop()
    same = 0
    for e in entries:
        single = localspec("single-" + e.name, fixed + single_args(e), env, work)
        try:
            for model, prompt, text in run["answers"]:
                if model == e.name:
                    same += chat(single.url, model, prompt, 48, stream=False)["text"] == text
        finally:
            single.stop()
    out = {**run, "estimates": sizes, "rss_all_three": rss_all, "identical": same, "requests": n}
    out.pop("answers")
    print(f"budget {budget >> 20} MiB: peak RSS {run['peak_rss'] >> 20} MiB, most models loaded at once "
          f"{run['most_loaded']}, answers equal to a single-model server's {same}/{n} (all three loaded, no "
          f"budget: {rss_all >> 20} MiB)", flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
