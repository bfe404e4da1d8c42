"""The client conformance suite: real programs, installed as published, against a real `localspec serve`.

Each client is installed once into its own cached environment (LOCALSPEC_CLIENTS_CACHE, default
~/.cache/localspec/clients), then driven unmodified against the server through a recording proxy, so the
table shows what each client really sent. One row per client check: pass or fail, what it sent, what came
back. Run through scripts/clients (which sets up .venv first).

    scripts/clients                              # every client; llama.vim needs --llama-vim PATH
    scripts/clients --fast                       # the CI subset: the openai packages, llm, anthropic, ollama
    scripts/clients --llama-vim ~/src/llama.vim  # a checkout of llama.vim (it is on no package registry)
    scripts/clients --only aider,cn -- --target T.gguf --draft D.gguf
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
import agent_clients  # noqa: E402

from harness.serverproc import ServerProcess, drop_data_copies, free_port  # noqa: E402

CACHE = Path(os.environ.get("LOCALSPEC_CLIENTS_CACHE") or Path.home() / ".cache/localspec/clients")
PY_CLIENTS = {"openai": ["openai"], "llm": ["llm"], "litellm": ["litellm"],
              "langchain": ["langchain-openai", "pydantic"], "aider": ["aider-chat"]}
NPM_CLIENTS = {"openai-npm": "openai", "cn": "@continuedev/cli", **agent_clients.NPM}
PY_CLIENTS.update(agent_clients.PY)
FAST = ["openai", "openai-npm", "llm", *agent_clients.FAST]


# --- installing -----------------------------------------------------------------------------------
def python_env(name: str) -> Path:
    """The client's own virtual environment, made once (pip caches the wheels)."""
    env = CACHE / f"venv-{PY_CLIENTS[name][0]}"
    stamp = env / ".installed"
    if not stamp.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
        pip = [str(env / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, *PY_CLIENTS[name]], check=True)
        stamp.write_text(time.ctime())
    return env / "bin"


def npm_env(name: str) -> Path:
    d = CACHE / f"npm-{name}"
    if not (d / ".installed").exists():
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund", NPM_CLIENTS[name]], cwd=d, check=True)
        (d / ".installed").write_text(time.ctime())
    return d


def version(name: str) -> str:
    if name in PY_CLIENTS:
        pkg = PY_CLIENTS[name][0]
        out = subprocess.run([str(python_env(name) / "python"), "-m", "pip", "show", pkg], capture_output=True, text=True).stdout
        return f"{pkg} " + next((ln.split()[1] for ln in out.splitlines() if ln.startswith("Version:")), "?")
    if name in NPM_CLIENTS:
        pkg = NPM_CLIENTS[name]
        meta = npm_env(name) / "node_modules" / pkg / "package.json"
        return f"{pkg} {json.loads(meta.read_text())['version']}"
    return "?"


# --- the recording proxy ----------------------------------------------------------------------------
@dataclass
class Recorder:
    upstream: int
    seen: list[dict] = field(default_factory=list)

    def mark(self) -> int:
        return len(self.seen)

    def since(self, mark: int) -> list[dict]:
        return self.seen[mark:]


def summary(method: str, path: str, headers, body: bytes) -> dict:
    out = {"method": method, "path": path}
    try:
        obj = json.loads(body) if body else {}
    except ValueError:
        return {**out, "body": f"{len(body)} bytes, not JSON"}
    if isinstance(obj, dict):
        for k in ("model", "stream", "n_predict", "max_tokens", "max_output_tokens", "tool_choice", "temperature",
                  "format"):
            if k in obj:
                out[k] = obj[k]
        if obj.get("tools"):
            out["tools"] = len(obj["tools"])
        if obj.get("response_format"):
            out["response_format"] = obj["response_format"].get("type")
        if obj.get("input_extra") is not None:
            out["input_extra"] = len(obj["input_extra"])
    auth = headers.get("Authorization")
    if auth is not None:
        out["authorization"] = auth[:7] + ("…" if len(auth) > 7 else "")
    return out


def answer_summary(body: bytes) -> dict:
    """What a JSON answer says of its work (llama.cpp's timings), for the benches' request logs."""
    try:
        obj = json.loads(body)
    except ValueError:
        return {}
    if isinstance(obj, list) and obj:  # llama-server's answer to n_cmpl > 1: one object per completion
        obj = obj[0]
    if not isinstance(obj, dict):
        return {}
    t = obj.get("timings") or {}
    out = {}
    for k in ("prompt_n", "cache_n", "predicted_n", "prompt_ms", "predicted_ms", "draft_n", "draft_n_accepted"):
        v = t.get(k, obj.get("timings/" + k))  # llama.vim asks for flattened fields ("response_fields")
        if v is not None:
            out[k] = v
    if "content" in obj:
        out["content"] = obj["content"]
    return out


def pass_hangup(client: socket.socket, upstream: http.client.HTTPConnection, answered: threading.Event) -> None:
    """Until the server starts answering, watch the client: when it hangs up (an agent giving up on a
    request after minutes), close the connection to the server, which then cancels the request, as it
    would for the client itself. Without this a non-streamed request abandoned by its client ran on."""
    while not answered.wait(0.25):
        try:
            readable, _, _ = select.select([client], [], [], 0)
            if readable and client.recv(1, socket.MSG_PEEK) == b"":
                upstream.sock.shutdown(socket.SHUT_RDWR)
                return
            if readable:  # the client's next request, pipelined: it is still there
                return
        except (OSError, AttributeError):
            return


def start_proxy(rec: Recorder) -> int:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            seen = summary(self.command, self.path, self.headers, body)
            seen["t_start"] = time.monotonic()
            rec.seen.append(seen)
            conn = http.client.HTTPConnection("127.0.0.1", rec.upstream, timeout=3600)  # agents' prompts: minutes
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection", "content-length")}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            answered = threading.Event()
            threading.Thread(target=pass_hangup, args=(self.connection, conn, answered), daemon=True).start()
            try:
                resp = conn.getresponse()
            finally:
                answered.set()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            kept = []
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                if sum(map(len, kept)) < 1 << 16:
                    kept.append(chunk)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            conn.close()
            seen.update(status=resp.status, t_end=time.monotonic(), response=answer_summary(b"".join(kept)))

        def _safe_forward(self):
            try:
                self._forward()
            except (BrokenPipeError, ConnectionResetError):  # the client hung up (llama.vim cancels): fine
                self.close_connection = True

        do_GET = do_POST = do_OPTIONS = _safe_forward

        def log_message(self, *a):
            pass
    class QuietServer(ThreadingHTTPServer):
        def handle_error(self, request, client_address):  # a client that hung up between requests: fine
            if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
                super().handle_error(request, client_address)

    port = free_port()
    httpd = QuietServer(("127.0.0.1", port), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return port


# --- the clients ------------------------------------------------------------------------------------
@dataclass
class Row:
    client: str
    check: str
    ok: bool
    detail: str
    sent: list[dict] = field(default_factory=list)


def run(cmd, timeout=600, **kw) -> subprocess.CompletedProcess:
    if "input" not in kw:
        kw["stdin"] = subprocess.DEVNULL  # a client must never wait on this terminal
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, 124, e.stdout or "", f"timed out after {timeout} s")


def python_checks(name: str, url: str, script: str) -> list[tuple[str, bool, str]]:
    """Runs a client script that prints one JSON line per check: [check, ok, detail]."""
    r = run([str(python_env(name) / "python"), "-c", textwrap.dedent(script), url], timeout=900)
    rows = []
    for line in r.stdout.splitlines():
        if line.startswith("["):
            rows.append(tuple(json.loads(line)))
    if r.returncode != 0 or not rows:
        rows.append(("script", False, (r.stderr.strip().splitlines() or ["no output"])[-1][:160]))
    return rows


CHECK = '''
import json, sys, traceback
URL = sys.argv[1]
def check(name, fn):
    try:
        ok, detail = fn()
    except Exception as e:
        ok, detail = False, f"{type(e).__name__}: {e}"[:200]
    print(json.dumps([name, bool(ok), str(detail)[:200]]), flush=True)
'''

OPENAI_PY = CHECK + '''
from openai import OpenAI
c = OpenAI(base_url=URL + "/v1", api_key="none", max_retries=0)
def chat():
    r = c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Say hello in one word."}], max_tokens=8)
    return bool(r.choices[0].message.content), f"{r.model}: {r.choices[0].message.content!r}"
def stream():
    parts = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(model="gpt-4o-mini", stream=True, max_tokens=8,
             messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]) if ch.choices]
    return bool("".join(parts)), repr("".join(parts))
def completion():
    r = c.completions.create(model="text-davinci-003", prompt="def add(a, b):", max_tokens=12)
    return bool(r.choices[0].text), repr(r.choices[0].text)
def structured():
    r = c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Name a color."}],
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": {"type": "object",
        "properties": {"color": {"type": "string"}}, "required": ["color"]}}}, max_tokens=40)
    return "color" in json.loads(r.choices[0].message.content), r.choices[0].message.content
check("chat, another model's name", chat); check("stream, developer role", stream)
check("completions", completion); check("json_schema", structured)
'''

LITELLM = CHECK + '''
import litellm
def completion():
    r = litellm.completion(model="openai/gpt-4o", api_base=URL + "/v1", api_key="none", max_tokens=8,
                           messages=[{"role": "user", "content": "Say hello in one word."}])
    return bool(r.choices[0].message.content), repr(r.choices[0].message.content)
def stream():
    text = "".join((ch.choices[0].delta.content or "") for ch in litellm.completion(model="openai/gpt-4o",
                   api_base=URL + "/v1", api_key="none", max_tokens=8, stream=True, messages=[{"role": "user", "content": "Hi"}]))
    return bool(text), repr(text)
check("completion", completion); check("stream", stream)
'''

LANGCHAIN = CHECK + '''
from langchain_openai import ChatOpenAI
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel
llm = ChatOpenAI(base_url=URL + "/v1", api_key="none", temperature=0, max_retries=0)
class City(BaseModel):
    name: str
    country: str
@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return "sunny, 21 C"
def invoke():
    r = llm.invoke("Say hello in one word.")
    return bool(r.content), repr(r.content)
def stream():
    text = "".join(ch.content for ch in llm.stream("Count to three."))
    return bool(text), repr(text[:60])
gpt4o = ChatOpenAI(model="gpt-4o-mini", base_url=URL + "/v1", api_key="none", temperature=0, max_retries=0)
def structured(method):
    def fn():  # gpt-4o-mini: LangChain turns json_schema into function calling for models it thinks lack it
        r = gpt4o.with_structured_output(City, method=method).invoke("Which city is the capital of France?")
        return isinstance(r, City) and r.name.strip() != "", repr(r)
    return fn
def tools():
    bound = llm.bind_tools([get_weather])
    msgs = [HumanMessage("What is the weather in Paris right now?")]
    ai = bound.invoke(msgs)
    if not ai.tool_calls:
        return False, f"no tool call: {ai.content!r}"
    call = ai.tool_calls[0]
    msgs += [ai, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    final = bound.invoke(msgs)
    return True, f"{call['name']}({call['args']}) -> {(final.content or str(final.tool_calls))[:80]!r}"
check("invoke (no model: gpt-3.5-turbo)", invoke); check("stream", stream)
check("with_structured_output json_schema", structured("json_schema"))
check("with_structured_output function_calling", structured("function_calling"))
check("tool-calling round trip", tools)
'''

OPENAI_NPM = '''
const OpenAI = require("openai");
const c = new OpenAI({ baseURL: process.argv[1] + "/v1", apiKey: "none", maxRetries: 0 });
async function check(name, fn) {
  try { const [ok, d] = await fn(); console.log(JSON.stringify([name, !!ok, String(d).slice(0, 200)])); }
  catch (e) { console.log(JSON.stringify([name, false, String(e).slice(0, 200)])); }
}
(async () => {
  await check("chat", async () => {
    const r = await c.chat.completions.create({ model: "gpt-4o", messages: [{ role: "user", content: "Say hi." }], max_tokens: 8 });
    return [r.choices[0].message.content, `${r.model}: ${JSON.stringify(r.choices[0].message.content)}`];
  });
  await check("stream", async () => {
    let t = ""; const s = await c.chat.completions.create({ model: "", stream: true, max_tokens: 8, messages: [{ role: "user", content: "Hi" }] });
    for await (const ch of s) t += (ch.choices[0] && ch.choices[0].delta.content) || "";
    return [t, JSON.stringify(t)];
  });
})();
'''


def check_openai_npm(url: str) -> list[tuple[str, bool, str]]:
    d = npm_env("openai-npm")
    r = run(["node", "-e", OPENAI_NPM, url], cwd=d, timeout=300)
    rows = [tuple(json.loads(ln)) for ln in r.stdout.splitlines() if ln.startswith("[")]
    return rows or [("script", False, r.stderr.strip()[-160:])]


def check_llm(url: str) -> list[tuple[str, bool, str]]:
    bin_ = python_env("llm")
    home = Path(tempfile.mkdtemp(prefix="llm-home-"))
    (home / "extra-openai-models.yaml").write_text(
        f'- model_id: localspec\n  model_name: qwen2.5-coder-1.5b\n  api_base: "{url}/v1"\n')
    env = {**os.environ, "LLM_USER_PATH": str(home), "OPENAI_API_KEY": "none"}
    rows = []
    for label, args, stdin in (("prompt (streamed)", ["-m", "localspec", "Say hello in one word."], None),
                               ("--no-stream", ["-m", "localspec", "--no-stream", "Say hi."], None),
                               ("llm chat", ["chat", "-m", "localspec"], "Say hi in one word.\nquit\n")):
        r = run([str(bin_ / "llm"), *args], env=env, timeout=300, **({"input": stdin} if stdin else {}))
        out = r.stdout.strip()
        rows.append((label, r.returncode == 0 and bool(out), (out or r.stderr.strip())[-120:]))
    return rows


def check_aider(url: str) -> list[tuple[str, bool, str]]:
    bin_ = python_env("aider")
    rows = []
    # Without --model aider sends gpt-4o and prompts for gpt-4o's diff format, which a 1.5B model answers by
    # repeating the instructions; the whole-file format is what aider itself picks for unknown models.
    for label, model_args in (("--model openai/<id>", ["--model", "openai/qwen2.5-coder-1.5b"]),
                              ("no --model (sends gpt-4o), --edit-format whole", ["--edit-format", "whole"])):
        repo = Path(tempfile.mkdtemp(prefix="aider-repo-"))
        src = repo / "greet.py"
        src.write_text("def greet(name):\n    return 'Hello ' + name\n")
        run(["git", "init", "-q"], cwd=repo)
        run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "x", "--allow-empty"], cwd=repo)
        run(["git", "add", "."], cwd=repo)
        env = {**os.environ, "OPENAI_API_BASE": url + "/v1", "OPENAI_API_KEY": "none", "AIDER_ANALYTICS": "false"}
        r = run([str(bin_ / "aider"), *model_args, "--yes-always", "--no-auto-commits", "--no-check-update",
                 "--no-show-model-warnings", "--no-analytics", "--map-tokens", "0", "--no-stream", "--no-pretty",
                 "--message", "Add a docstring to the greet function.", "greet.py"], cwd=repo, env=env, timeout=900)
        after = src.read_text()
        edited = '"""' in after or "'''" in after
        rows.append((label, edited, "edited greet.py" if edited else (r.stdout.strip() or r.stderr.strip())[-160:]))
    return rows


def check_cn(url: str) -> list[tuple[str, bool, str]]:
    d = npm_env("cn")
    work = Path(tempfile.mkdtemp(prefix="cn-project-"))
    (work / "notes.txt").write_text("Project notes\nThe release codename is BLUE-HERON-42.\n")
    cfg = work / "config.yaml"
    cfg.write_text(f"name: localspec\nversion: 0.0.1\nschema: v1\nmodels:\n  - name: localspec\n    provider: llama.cpp\n"
                   f"    model: qwen2.5-coder-1.5b\n    apiBase: {url}/\n    roles: [chat]\n")
    home = Path(tempfile.mkdtemp(prefix="cn-home-"))
    env = {**os.environ, "HOME": str(home), "CONTINUE_GLOBAL_DIR": str(home / ".continue")}
    r = run([str(d / "node_modules/.bin/cn"), "-p", "--config", str(cfg), "--auto",
             "What is the release codename written in notes.txt? Read the file to find out."],
            cwd=work, env=env, timeout=900)
    out = r.stdout.strip()
    return [("headless question that needs its Read tool", "BLUE-HERON-42" in out, (out or r.stderr.strip())[-160:])]


def check_llama_vim(url: str, checkout: Path | None) -> list[tuple[str, bool, str]]:
    """Real vim with llama.vim inside tmux: a suggestion appears as virtual text; Tab inserts it."""
    if checkout is None:
        return [("suggestion appears, Tab inserts it", False,
                 "no llama.vim checkout given: pass --llama-vim PATH (it is on no package registry)")]
    if not shutil.which("vim") or not shutil.which("tmux"):
        return [("suggestion appears, Tab inserts it", False, "vim and tmux are needed (apt-get install vim tmux)")]
    work = Path(tempfile.mkdtemp(prefix="llama-vim-"))
    src = work / "fib.py"
    src.write_text('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n\n\nprint(fibonacci(10))\n')
    (work / "vimrc").write_text(
        f"set nocompatible\nset runtimepath^={checkout}\nfiletype plugin on\nsyntax off\n"
        f"let g:llama_config = {{'endpoint_fim': '{url}/infill', 'endpoint_inst': '{url}/v1/chat/completions', "
        f"'show_info': 0}}\n")
    sess = f"lv{os.getpid()}"
    tmux = ["tmux", "-L", sess]
    run([*tmux, "new-session", "-d", "-s", sess, "-x", "120", "-y", "30",
         f"vim -N -u {work / 'vimrc'} -i NONE {src}"])
    try:
        time.sleep(2)
        run([*tmux, "send-keys", "-t", sess, "3G", "i", "    "])  # the empty line under the docstring, at the indent
        t0, screen = time.monotonic(), ""
        while time.monotonic() - t0 < 120:
            time.sleep(0.5)
            screen = run([*tmux, "capture-pane", "-p", "-t", sess]).stdout
            line3 = screen.splitlines()[2] if len(screen.splitlines()) > 2 else ""
            if line3.strip():
                break
        waited = time.monotonic() - t0
        shown = screen.splitlines()[2].strip() if len(screen.splitlines()) > 2 else ""
        run([*tmux, "send-keys", "-t", sess, "Tab"])
        time.sleep(0.5)
        run([*tmux, "send-keys", "-t", sess, "Escape", ":wq", "Enter"])
        time.sleep(1.0)
    finally:
        run([*tmux, "kill-server"])
    inserted = src.read_text().splitlines()[2].strip() if len(src.read_text().splitlines()) > 2 else ""
    ok = bool(shown) and bool(inserted) and inserted.split()[0] == shown.split()[0]
    return [("suggestion appears, Tab inserts it", ok,
             f"shown after {waited:.1f} s: {shown[:50]!r}; inserted: {inserted[:50]!r}")]


CLIENTS = {
    "openai": lambda url, a: python_checks("openai", url, OPENAI_PY),
    "openai-npm": lambda url, a: check_openai_npm(url),
    "llm": lambda url, a: check_llm(url),
    "litellm": lambda url, a: python_checks("litellm", url, LITELLM),
    "langchain": lambda url, a: python_checks("langchain", url, LANGCHAIN),
    "aider": lambda url, a: check_aider(url),
    "cn": lambda url, a: check_cn(url),
    "llama.vim": lambda url, a: check_llama_vim(url, a.llama_vim),
}
CLIENTS.update(agent_clients.clients(sys.modules[__name__]))


NOT_SENT = ("method", "path", "t_start", "t_end", "status", "response")  # what the proxy adds about the answer


def sent_summary(sent: list[dict]) -> str:
    """The distinct requests a client made, each once: path and the fields that matter to the contract."""
    kinds = []
    for x in sent:
        if x["method"] != "POST":
            continue
        fields = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in x.items() if k not in NOT_SENT)
        item = f"{x['path']} {fields}".strip()
        if item not in kinds:
            kinds.append(item)
    return "<br>".join(kinds).replace("|", "/")


def main() -> int:
    p = argparse.ArgumentParser(description="Run real clients against localspec serve.")
    p.add_argument("--fast", action="store_true", help=f"only {', '.join(FAST)} (what CI runs)")
    p.add_argument("--only", help="comma-separated clients: " + ", ".join(CLIENTS))
    p.add_argument("--llama-vim", type=Path, help="a checkout of llama.vim (github.com/ggml-org/llama.vim)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument("serve_args", nargs="*", help="after --: flags for localspec serve (default: the default pair)")
    a = p.parse_args()
    names = FAST if a.fast else (a.only.split(",") if a.only else list(CLIENTS))
    unknown = [n for n in names if n not in CLIENTS]
    if unknown:
        p.error(f"unknown client {unknown[0]}; choose from {', '.join(CLIENTS)}")
    for n in names:  # install first: the server's time is for the clients
        if n in PY_CLIENTS:
            python_env(n)
        elif n in NPM_CLIENTS:
            npm_env(n)
    srv = ServerProcess([*a.serve_args, "--temperature", "0"], Path(tempfile.mkdtemp(prefix="clients-home-")))
    rec = Recorder(srv.port)
    url = f"http://127.0.0.1:{start_proxy(rec)}"
    rows: list[Row] = []
    try:
        for n in names:
            mark, t0 = rec.mark(), time.monotonic()
            results = CLIENTS[n](url, a)
            sent = rec.since(mark)
            for check, ok, detail in results:
                rows.append(Row(n, check, ok, detail, sent))
            print(f"  {n}: {sum(r[1] for r in results)}/{len(results)} in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    finally:
        code = srv.stop()
        drop_data_copies(srv.home)  # the pair assembled into its data root (gigabytes); the log stays
    versions = {n: version(n) for n in names if n in PY_CLIENTS or n in NPM_CLIENTS}
    if "llama.vim" in names and a.llama_vim:
        head = run(["git", "-C", str(a.llama_vim), "log", "-1", "--format=%h %cs"]).stdout.strip()
        versions["llama.vim"] = f"llama.vim {head or '(not a git checkout)'}"
    print("| client | version | check | result | detail | what the client sent (distinct requests) |\n"
          "|---|---|---|---|---|---|")
    shown = set()
    for r in rows:
        sent = "" if r.client in shown else sent_summary(r.sent)
        shown.add(r.client)
        detail = r.detail.replace("|", "/").replace("\n", " ")
        print(f"| {r.client} | {versions.get(r.client, '') if sent else ''} | {r.check} | {'pass' if r.ok else 'FAIL'} | "
              f"{detail} | {sent} |")
    failed = sum(not r.ok for r in rows)
    print(f"\n{len(rows) - failed} passed, {failed} failed (server exit {code})")
    if a.json:
        a.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1, default=str))
    return 1 if failed or code != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
