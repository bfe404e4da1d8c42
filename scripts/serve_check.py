"""End-to-end check of `localspec serve` with real clients' requests, on the default pair (or PAIR args):
  1. one-shot `localspec run` of the haiku prompt through the warm server vs in-process (--local),
     side by side, medians over runs;
  2. an editor session: llama.vim's exact /infill requests (a ring-buffer update with n_predict 0,
     then FIM requests built like s:fim_ctx_local: 256 lines before the cursor, 64 after, the ring
     chunks as input_extra) while a method of Python's textwrap.py is written line by line, each
     line asked for at its indent and again after 3 typed characters; latency, prompt tokens
     evaluated vs reused (cache_n), drafting from the /metrics counters;
  3. a soak of REQUESTS mixed requests (chat, completion, infill, tokenize): the RSS every 100.

  scripts/serve-check                      # default pair, 500 editor requests, writes serve-check.json
  REQUESTS=100 RUNS=3 SESSION=6 scripts/serve-check --target T.gguf --draft D.gguf
"""

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import sysconfig
import time
import urllib.request

from harness.serverproc import wait_healthy

args = sys.argv[1:]
REQUESTS, RUNS, SESSION = (int(os.environ.get(k, d)) for k, d in (("REQUESTS", 500), ("RUNS", 5), ("SESSION", 12)))
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
url = f"http://127.0.0.1:{port}"
env = {**os.environ, "LOCALSPEC_SERVER": url}
srv = subprocess.Popen([sys.executable, "-m", "localspec", "serve", "--port", str(port), *args],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)

def http(path, body=None, timeout=300):
    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        data = r.read().decode()
        return json.loads(data) if r.headers.get("Content-Type", "").startswith("application/json") else data

def metric(name):
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", http("/metrics"), re.M)
    return float(m.group(1)) if m else 0.0

def rss_mb():
    with open(f"/proc/{srv.pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024

t0 = time.monotonic()
if not wait_healthy(url + "/health", srv, 600):
    sys.exit("the server did not start: " + (srv.stderr.read() if srv.poll() is not None else "not ready in 600 s"))
print(f"server ready in {time.monotonic() - t0:.1f} s", file=sys.stderr)
out = {"args": args}

# 1. one-shot run, warm server vs in-process, alternating
haiku = ["--max-tokens", "24", "--temperature", "0", "--json", "Write a haiku about caches"]
walls = {"server": [], "local": []}
model_s = []
for i in range(RUNS):
    for side in ("server", "local"):
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "localspec", "run", *args, *haiku] + (["--local"] if side == "local" else []),
                           capture_output=True, text=True, env=env)
        walls[side].append(time.perf_counter() - t)
        if r.returncode:
            sys.exit(r.stderr)
        if side == "local":
            st = json.loads(r.stdout)["stats"]
            model_s.append(st["prompt_eval_s"] + st["generation_s"])
out["oneshot"] = {k: statistics.median(v) for k, v in walls.items()} | {"local_model_s": statistics.median(model_s)}
print(f"one-shot haiku: warm server {out['oneshot']['server']:.2f} s, in-process {out['oneshot']['local']:.2f} s "
      f"(model work in-process {out['oneshot']['local_model_s']:.2f} s), medians of {RUNS}", file=sys.stderr)

# 2. an editor session with llama.vim's requests: the user writes a function line by line
src = open(os.path.join(sysconfig.get_paths()["stdlib"], "textwrap.py"), encoding="utf-8").read().splitlines()
FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms", "timings/prompt_per_second",
          "timings/predicted_n", "timings/predicted_ms", "timings/predicted_per_token_ms", "timings/predicted_per_second",
          "truncated", "tokens_cached"]
ring = [{"text": "\n".join(src[i:i + 16]), "filename": "textwrap.py"} for i in (300, 340)]  # llama.vim's ring chunks
http("/infill", {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": ring, "prompt": "", "n_predict": 0,
                 "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True, "t_max_prompt_ms": 1,
                 "t_max_predict_ms": 1, "response_fields": [""]})  # s:ring_update
drafted0, accepted0 = metric("llamacpp:spec_decode_num_draft_tokens_total"), metric("llamacpp:spec_decode_num_accepted_tokens_total")
rows = []
start = next(i for i, ln in enumerate(src) if ln.startswith("    def _split"))  # a method to write, from its top
for y in range(start + 1, start + 1 + SESSION):
    line = src[y]
    indent = len(line) - len(line.lstrip())
    for typed in (line[:indent], line[:indent + 3]):  # at the new line's indent, then after 3 typed characters
        body = {"id_slot": 0, "input_prefix": "\n".join(src[max(0, y - 256):y]) + "\n",
                "input_suffix": "\n" + "\n".join(src[y + 1:y + 65]) + "\n", "input_extra": ring, "prompt": typed,
                "n_predict": 128, "stop": [], "n_indent": indent, "top_k": 40, "top_p": 0.90,
                "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True,
                "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "response_fields": FIELDS}
        t = time.perf_counter()
        r = http("/infill", body)
        rows.append({"wall_s": time.perf_counter() - t, "prompt_n": r["timings/prompt_n"],
                     "prompt_ms": r["timings/prompt_ms"], "predicted_n": r["timings/predicted_n"],
                     "predicted_ms": r["timings/predicted_ms"],
                     "cache_n": r["tokens_cached"] - r["timings/prompt_n"] - r["timings/predicted_n"]})
drafted = metric("llamacpp:spec_decode_num_draft_tokens_total") - drafted0
accepted = metric("llamacpp:spec_decode_num_accepted_tokens_total") - accepted0
def med(k):
    return statistics.median(r[k] for r in rows)
out["editor"] = {"requests": len(rows), "wall_median_s": med("wall_s"), "prompt_n_median": med("prompt_n"),
                 "cache_n_median": med("cache_n"), "prompt_ms_median": med("prompt_ms"),
                 "predicted_n_median": med("predicted_n"), "predicted_ms_median": med("predicted_ms"),
                 "drafted": drafted, "accepted": accepted, "rows": rows}
e = out["editor"]
print(f"editor session ({len(rows)} llama.vim FIM requests): wall median {e['wall_median_s']:.2f} s; prompt tokens "
      f"evaluated {e['prompt_n_median']:.0f} in {e['prompt_ms_median']:.0f} ms, reused from the cache {e['cache_n_median']:.0f}; "
      f"predicted {e['predicted_n_median']:.0f} tokens in {e['predicted_ms_median']:.0f} ms; drafted {drafted:.0f}, "
      f"accepted {accepted:.0f}", file=sys.stderr)

# 3. a soak: REQUESTS mixed requests (chat, completion, infill, tokenize), RSS every 100
rss = [(0, rss_mb())]
kinds = [("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a sorting algorithm."}], "max_tokens": 12}),
         ("/completion", {"prompt": "def add(a, b):\n", "n_predict": 12}),
         ("/infill", {"input_prefix": "def mean(xs):\n", "input_suffix": "\n", "prompt": "    ", "n_predict": 12}),
         ("/tokenize", {"content": "hello world " * 20})]
for i in range(1, REQUESTS + 1):
    path, body = kinds[i % len(kinds)]
    http(path, {**body, "seed": i} if path != "/tokenize" else body)
    if i % 100 == 0:
        rss.append((i, rss_mb()))
        print(f"  {i} requests: RSS {rss[-1][1]:.0f} MB", file=sys.stderr)
out["soak_rss_mb"] = rss
print("RSS (MB) by requests served: " + ", ".join(f"{k}: {v:.0f}" for k, v in rss), file=sys.stderr)
srv.send_signal(2)
srv.wait(timeout=60)
out["exit_code"] = srv.returncode
with open(os.environ.get("OUT", "serve-check.json"), "w") as f:
    json.dump(out, f, indent=1)
print(json.dumps(out["oneshot"]))
