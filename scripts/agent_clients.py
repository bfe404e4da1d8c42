"""The clients of the other protocols, for scripts/clients: Anthropic's SDK and Claude Code (Messages),
the OpenAI Agents SDK and Codex CLI (Responses), the `ollama` library and `llm-ollama` (Ollama's API).
Each is installed as published and driven unmodified; `clients(h)` gives scripts/clients their checks
(h: that module, for its installers, runner and check harness)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

PY = {"anthropic": ["anthropic"], "ollama": ["ollama"], "openai-agents": ["openai-agents"],
      "llm-ollama": ["llm-ollama", "llm"]}
NPM = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex", "opencode": "opencode-ai",
       "qwen": "@qwen-code/qwen-code"}
FAST = ["anthropic", "ollama"]
FILE_FACT = ("config.py", "MAGIC = 4817\nNAME = 'localspec'\n", "4817")  # a file an agent must read to answer

ANTHROPIC = '''
import anthropic
c = anthropic.Anthropic(base_url=URL, api_key="none", max_retries=0)
WEATHER = [{"name": "get_weather", "description": "Current weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
def create():
    m = c.messages.create(model="claude-sonnet-5", max_tokens=16, messages=[{"role": "user", "content": "Say hello in one word."}])
    return m.content[0].text.strip() != "", f"{m.stop_reason}: {m.content[0].text!r}"
def stream():
    with c.messages.stream(model="claude-haiku-5", max_tokens=16, system="Be brief.",
                           messages=[{"role": "user", "content": "Say hi."}]) as s:
        text = "".join(s.text_stream)
    return bool(text), repr(text)
def tools():
    q = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    m = c.messages.create(model="x", max_tokens=200, tools=WEATHER, tool_choice={"type": "any"}, messages=q)
    use = next(b for b in m.content if b.type == "tool_use")
    q += [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}]}]
    # tool_choice none: the answer is text (with tools offered, the 1.5B model calls the tool again)
    final = c.messages.create(model="x", max_tokens=60, tools=WEATHER, tool_choice={"type": "none"}, messages=q)
    text = "".join(b.text for b in final.content if b.type == "text")
    return m.stop_reason == "tool_use" and bool(text), f"{use.name}({use.input}) -> {text[:80]!r}"
def count():
    n = c.messages.count_tokens(model="x", messages=[{"role": "user", "content": "Say hi."}]).input_tokens
    return n > 0, f"{n} tokens"
check("messages.create", create); check("messages.stream, system", stream)
check("tool_use round trip", tools); check("count_tokens", count)
'''

OLLAMA = '''
import ollama
c = ollama.Client(host=URL)
def chat():
    r = c.chat(model="qwen2.5-coder:1.5b", messages=[{"role": "user", "content": "Say hello in one word."}],
               options={"num_predict": 16})
    return bool(r.message.content) and r.eval_count > 0, f"{r.message.content!r}, eval_count {r.eval_count}"
def stream():
    text = "".join(p.message.content for p in c.chat(model="x", stream=True, options={"num_predict": 16},
                                                      messages=[{"role": "user", "content": "Say hi."}]))
    return bool(text), repr(text)
def fim():
    r = c.generate(model="x", prompt="def add(a, b):\\n    ", suffix="\\n\\nprint(add(1, 2))\\n", options={"num_predict": 24})
    return "return" in r.response, repr(r.response)
def tools():
    r = c.chat(model="x", messages=[{"role": "user", "content": "What is the weather in Paris right now?"}],
               tools=[{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
    calls = r.message.tool_calls or []
    return bool(calls) and calls[0].function.name == "get_weather", repr(calls[:1] or r.message.content)
def schema():
    r = c.chat(model="x", messages=[{"role": "user", "content": "Name a color."}], options={"num_predict": 40},
               format={"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]})
    return "color" in json.loads(r.message.content), r.message.content
def models():
    names = [m.model for m in c.list().models]
    shown = c.show(names[0])
    caps = shown.capabilities  # "tools" where the template renders them
    return bool(names) and "completion" in caps and ("tools" in caps) == ("tools" in shown.template), f"{names}: {caps}"
check("chat", chat); check("chat streamed", stream); check("generate with suffix (FIM)", fim)
check("tool call", tools); check("format: a JSON schema", schema); check("list, show", models)
'''

AGENTS = '''
from openai import AsyncOpenAI
from agents import Agent, Runner, OpenAIResponsesModel, function_tool, set_tracing_disabled
set_tracing_disabled(True)
called = []
@function_tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    called.append(city)
    return "sunny, 21 C"
def run():
    called.clear()
    model = OpenAIResponsesModel(model="localspec", openai_client=AsyncOpenAI(base_url=URL + "/v1", api_key="none"))
    agent = Agent(name="weather", instructions="Use get_weather to answer questions about the weather.",
                  model=model, tools=[get_weather])
    try:
        r = Runner.run_sync(agent, "What is the weather in Paris right now?", max_turns=4)
        final = str(r.final_output)
    except Exception as e:  # MaxTurnsExceeded: the model called the tool on every turn
        final = f"{type(e).__name__}"
    return called, final
called_, final_ = run()
check("function tool called, its output sent back (Responses)", lambda: (bool(called_), f"get_weather({called_})"))
check("a final answer after the tool's output", lambda: ("sunny" in final_ or "21" in final_, final_[:120]))
'''


def check_llm_ollama(h, url: str) -> list[tuple[str, bool, str]]:
    """`llm` with the llm-ollama plugin: the server's models are listed as llm models, then prompted."""
    bin_ = h.python_env("llm-ollama")
    env = {**os.environ, "LLM_USER_PATH": tempfile.mkdtemp(prefix="llm-home-"), "OLLAMA_HOST": url}
    listed = h.run([str(bin_ / "llm"), "models"], env=env, timeout=120)
    found = [ln.split()[1] for ln in listed.stdout.splitlines() if ln.startswith("Ollama:")]
    name = found[0] if found else "?"
    r = h.run([str(bin_ / "llm"), "-m", name, "-o", "num_predict", "16", "Say hello in one word."], env=env, timeout=300)
    return [("llm models (the server's /api/tags)", bool(found), name if found else listed.stderr[-120:]),
            (f"llm -m {name}", r.returncode == 0 and bool(r.stdout.strip()), (r.stdout.strip() or r.stderr.strip())[-120:])]


def project() -> Path:
    work = Path(tempfile.mkdtemp(prefix="agent-project-"))
    name, text, _ = FILE_FACT
    (work / name).write_text(text)
    return work


QUESTION = f"What is the value of MAGIC in {FILE_FACT[0]}? Read the file to find out."
SHELL_QUESTION = f"Run `cat {FILE_FACT[0]}` and tell me the value of MAGIC."  # Codex reads files through its shell


def claude_env(url: str, home: Path) -> dict:
    return {**os.environ, "HOME": str(home), "ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": "none",
            "ANTHROPIC_MODEL": "localspec", "ANTHROPIC_DEFAULT_HAIKU_MODEL": "localspec", "API_TIMEOUT_MS": "1800000",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1"}


def run_claude(h, url: str, tools: str | None = "Read", work: Path | None = None, home: Path | None = None):
    """`claude -p QUESTION` in a new session (in `work`, with `home` as HOME: its system prompt names both);
    tools=None: all of Claude Code's tools (its whole ~19k-token first prompt). Returns the finished
    process and its wall time."""
    import time

    claude = h.npm_env("claude") / "node_modules/.bin/claude"
    work, home = work or project(), home or Path(tempfile.mkdtemp(prefix="claude-home-"))
    args = [str(claude), "-p", QUESTION, "--allowedTools", "Read", "--max-turns", "4"]
    if tools:  # a 1.5B model loses its way among two dozen tools; the Read tool alone is what the check needs
        args += ["--tools", tools]
    t0 = time.monotonic()
    r = h.run(args, cwd=work, env=claude_env(url, home), timeout=2400)
    return r, time.monotonic() - t0


def check_claude(h, url: str) -> list[tuple[str, bool, str]]:
    """Claude Code headless: a question only its Read tool can answer."""
    r, took = run_claude(h, url)
    out = r.stdout.strip()
    return [("claude -p --tools Read: a question that needs its Read tool", FILE_FACT[2] in out,
             f"{took:.0f} s: " + (out or r.stderr.strip())[-150:])]


def check_codex(h, url: str) -> list[tuple[str, bool, str]]:
    """Codex CLI headless, a provider whose base_url is the server, wire_api "responses"."""
    codex = h.npm_env("codex") / "node_modules/.bin/codex"
    work, home = project(), Path(tempfile.mkdtemp(prefix="codex-home-"))
    (home / "config.toml").write_text(
        'model = "localspec"\nmodel_provider = "localspec"\n\n[model_providers.localspec]\nname = "localspec"\n'
        f'base_url = "{url}/v1"\nwire_api = "responses"\n')
    env = {**os.environ, "CODEX_HOME": str(home)}
    r = h.run([str(codex), "exec", "--skip-git-repo-check", "--sandbox", "read-only", SHELL_QUESTION], cwd=work, env=env,
              timeout=1800)
    out = (r.stdout + r.stderr).strip()
    answer = r.stdout.strip()
    return [("codex exec: its shell tool runs through Responses function calls (the file's text comes back)",
             "MAGIC = 4817" in out, out[-160:]),
            ("codex exec: the answer names the value", r.returncode == 0 and FILE_FACT[2] in answer,
             (answer or r.stderr.strip())[-160:])]


def check_opencode(h, url: str) -> list[tuple[str, bool, str]]:
    """opencode headless (`opencode run`), a provider through the AI SDK's OpenAI-compatible package."""
    import json

    opencode = h.npm_env("opencode") / "node_modules/.bin/opencode"
    work, home = project(), Path(tempfile.mkdtemp(prefix="opencode-home-"))
    (work / "opencode.json").write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json", "model": "localspec/qwen2.5-coder-1.5b",
        "provider": {"localspec": {"npm": "@ai-sdk/openai-compatible", "name": "localspec",
                                   "options": {"baseURL": f"{url}/v1"},
                                   "models": {"qwen2.5-coder-1.5b": {"name": "qwen2.5-coder-1.5b"}}}}}))
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_DATA_HOME": str(home / ".local/share"), "OPENCODE_DISABLE_AUTOUPDATE": "1",
           "OPENCODE_CONFIG": str(work / "opencode.json")}
    r = h.run([str(opencode), "run", "--model", "localspec/qwen2.5-coder-1.5b", QUESTION], cwd=work, env=env,
              timeout=1800)
    out = r.stdout.strip()
    return [("opencode run: a question that needs its read tool", FILE_FACT[2] in out, (out or r.stderr.strip())[-160:])]


def check_qwen(h, url: str) -> list[tuple[str, bool, str]]:
    """Qwen Code headless (`qwen -p`), its OpenAI-compatible provider."""
    import json

    qwen = h.npm_env("qwen") / "node_modules/.bin/qwen"
    work, home = project(), Path(tempfile.mkdtemp(prefix="qwen-home-"))
    (home / ".qwen").mkdir()
    (home / ".qwen/settings.json").write_text(json.dumps({"security": {"auth": {"selectedType": "openai"}},
                                                          "privacy": {"usageStatisticsEnabled": False}}))
    env = {**os.environ, "HOME": str(home), "OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": "none",
           "OPENAI_MODEL": "qwen2.5-coder-1.5b"}
    r = h.run([str(qwen), "-p", QUESTION, "--yolo"], cwd=work, env=env, timeout=1800)
    out = r.stdout.strip()
    return [("qwen -p: a question that needs its read tool", FILE_FACT[2] in out, (out or r.stderr.strip())[-160:])]


def clients(h) -> dict:
    return {
        "anthropic": lambda url, a: h.python_checks("anthropic", url, h.CHECK + ANTHROPIC),
        "ollama": lambda url, a: h.python_checks("ollama", url, h.CHECK + OLLAMA),
        "openai-agents": lambda url, a: h.python_checks("openai-agents", url, h.CHECK + AGENTS),
        "llm-ollama": lambda url, a: check_llm_ollama(h, url),
        "claude": lambda url, a: check_claude(h, url),
        "codex": lambda url, a: check_codex(h, url),
        "opencode": lambda url, a: check_opencode(h, url),
        "qwen": lambda url, a: check_qwen(h, url),
    }
