"""OpenAI tool calls, as llama-server does them for templates with a tools section (Qwen2.5, Hermes):
the request's `tools` are rendered by the GGUF's own chat template; the answer's
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks come back as `tool_calls`.
`tool_choice` "required" or a named function constrains decoding to well-formed calls (a grammar built
from the functions' parameter schemas), so the call always parses.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..decoding.constraints import schema_grammar
from ..errors import ConfigError
from .apierrors import ApiError

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ToolRequest:
    tools: list[dict]  # as the client sent them (OpenAI's {"type": "function", "function": {...}})
    choice: str  # "auto" | "required" | "none" | the one function's name
    parallel: bool = True

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]


def tool_request(body: dict) -> ToolRequest | None:
    """The request's tools and tool_choice, validated; None when it has no tools or tool_choice "none"."""
    tools = body.get("tools")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise ApiError(400, '"tools" must be a list of {"type": "function", "function": {...}} objects')
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ApiError(400, f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}')
        if not isinstance(fn.get("parameters", {}), dict):
            raise ApiError(400, f"tools[{i}].function.parameters must be a JSON schema object")
    req = ToolRequest(tools, _choice(body.get("tool_choice"), [t["function"]["name"] for t in tools]))
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ApiError(400, '"parallel_tool_calls" must be true or false')
    req.parallel = parallel
    return None if req.choice == "none" else req


def _choice(v, names: list[str]) -> str:
    if v is None:
        return "auto"
    if v in ("auto", "required", "none"):
        return v
    name = v.get("function", {}).get("name") if isinstance(v, dict) and isinstance(v.get("function"), dict) else None
    if not isinstance(name, str):
        raise ApiError(400, '"tool_choice" must be "auto", "required", "none" or {"type": "function", '
                            '"function": {"name": ...}}')
    if name not in names:
        raise ApiError(400, f'"tool_choice" names {name!r}, which is not among the tools ({", ".join(names)})')
    return name


def renders_tools(template: str | None) -> bool:
    """Whether a chat template gives the model its tools (Ollama's "tools" capability)."""
    return bool(template) and re.search(r"\btools\b", template) is not None


def require_tools_template(template: str | None) -> None:
    """A template that never mentions tools would drop them silently: refuse instead."""
    if not renders_tools(template):
        raise ApiError(400, "this model's chat template has no tools section, so it cannot be given tools; "
                            "use a model whose template renders them (e.g. Qwen2.5, Llama 3.1+, Hermes)")


def call_grammar(req: ToolRequest) -> str | None:
    """GBNF that admits only well-formed calls, for tool_choice "required" or a named function."""
    if req.choice == "auto":
        return None
    fns = [t["function"] for t in req.tools if req.choice == "required" or t["function"]["name"] == req.choice]
    schema = {"anyOf": [{"type": "object", "properties": {
        "name": {"const": f["name"]}, "arguments": f.get("parameters") or {"type": "object"}},
        "required": ["name", "arguments"], "additionalProperties": False} for f in fns]}
    try:
        body = schema_grammar(schema)
    except ConfigError as e:
        raise ApiError(400, f"a tool's parameters: {e}")
    body = re.sub(r"^root ::=", "tool-call-json ::=", body, flags=re.M)
    one = r'"<tool_call>\n" tool-call-json "\n</tool_call>"'
    root = f"root ::= {one} (\"\\n\" {one})*" if req.parallel else f"root ::= {one}"
    return f"{root}\n{body}"


def call_arguments(args):
    """A call's arguments as the object they encode, for the protocols and templates that want the object
    (OpenAI's carry them as a JSON string): text that is not JSON stays text, missing arguments are {}."""
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args if args is not None else {}


def new_call(name: str, arguments) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def parse_call(block: str, names: list[str]) -> list[dict] | None:
    """A call's JSON ({"name", "arguments"}, or a list of them) as OpenAI tool calls, or None when it is
    not one: not JSON, or a name that is not among the tools (so ordinary JSON in an answer stays text)."""
    obj = _call_json(block)
    if obj is None:
        return None
    objs = obj if isinstance(obj, list) and obj else [obj]
    calls = []
    for o in objs:
        if not isinstance(o, dict) or o.get("name") not in names:
            return None
        args = o.get("arguments", o.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                pass
        calls.append(new_call(o["name"], args))
    return calls


def _call_json(block: str):
    """The JSON of a call, or None. Small models given a system prompt sometimes double the outer braces
    ('{{"name": ..., "arguments": {...}}}', seen from Qwen2.5-Coder 1.5B): the object inside is taken when
    only closing braces follow it."""
    try:
        return json.loads(block)
    except ValueError:
        pass
    text = block.strip()
    if not text.startswith("{{"):
        return None
    try:
        obj, end = json.JSONDecoder().raw_decode(text[1:])
    except ValueError:
        return None
    return obj if set(text[1 + end:].strip()) <= {"}"} else None


# Besides <tool_call> blocks, small models often answer with the call alone, bare or in a ```json fence;
# llama-server's Hermes/Qwen parser takes those too.
_WHOLE_CALL = re.compile(r"^\s*(?:```(?:json)?\s*\n)?(?P<json>[\[{].*?[\]}])\s*(?:\n?```)?\s*$", re.S)


def split_calls(text: str, names: list[str]) -> tuple[str, list[dict]]:
    """A whole answer: (content, tool_calls)."""
    if OPEN not in text:
        m = _WHOLE_CALL.match(text)
        calls = parse_call(m.group("json"), names) if m else None
        return ("", calls) if calls else (text, [])
    out, calls, rest = [], [], text
    while OPEN in rest:
        i = rest.index(OPEN)
        j = rest.find(CLOSE, i)
        end = j + len(CLOSE) if j >= 0 else len(rest)
        found = parse_call(rest[i + len(OPEN):j if j >= 0 else len(rest)].strip(), names)
        out.append(rest[:i] if found else rest[:end])
        calls += found or []
        rest = rest[end:]
    content = "".join(out) + rest
    return (content.strip() if calls else content), calls


class CallStream:
    """Splits streamed text into content and tool calls. An answer that starts like a bare or fenced call
    is held to the end and judged whole; otherwise content flows until a `<tool_call>` may be starting,
    which is held until its block closes (a call) or proves not to be one (content again)."""

    def __init__(self, names: list[str]):
        self.names, self.calls = names, []
        self.buf, self.whole = "", None  # whole: None until the answer's first visible character decides

    def feed(self, text: str) -> tuple[str, list[dict]]:
        self.buf += text
        if self.whole is None and self.buf.strip():
            self.whole = self.buf.lstrip()[0] in "{[`"
        if self.whole is not False:
            return "", []
        cut = self.buf.rfind(OPEN)
        if cut >= 0 and CLOSE in self.buf[cut:]:
            cut = len(self.buf)
        ready, keep = (self.buf, "") if cut < 0 else (self.buf[:cut], self.buf[cut:])
        if cut < 0:  # the end may be the start of a tag
            n = _partial_prefix(ready, OPEN)
            ready, keep = ready[:len(ready) - n], ready[len(ready) - n:]
        self.buf = keep
        content, new = split_calls(ready, self.names)
        self.calls += new
        return content, new

    def finish(self) -> tuple[str, list[dict]]:
        content, new = split_calls(self.buf, self.names) if self.buf else ("", [])
        self.buf = ""
        self.calls += new
        return content, new


def _partial_prefix(text: str, tag: str) -> int:
    """How many characters at the end of `text` could be the start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
