"""Request bodies in, settings out: llama-server's and OpenAI's fields, validated one by one.

Fields a client sends that we do not know are ignored (never a 422); a known field of the wrong type
is a 400 in the OpenAI error shape that names the field. Every generation setting starts from the
server's defaults (`localspec serve` flags, the pair's settings) and is overridden per request.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import traceback
from dataclasses import dataclass, field, replace
from typing import Any

from ..chat_format import ROLE_ALIASES, ROLES, canonical_role
from ..config import GenConfig
from ..engine import Message
from ..errors import ContextFullError, LocalspecError

SPEC_MODES = ("on", "off", "auto")
DRAFTERS = ("model", "ngram", "hybrid")
LOCALSPEC_FIELDS = ("spec", "drafter", "speculative", "exact")  # localspec's own request fields, on every protocol


class ApiError(Exception):
    """An error answered in the OpenAI shape {"error": {"code", "message", "type"}} (llama-server's types)."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
             404: "not_found_error", 500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}

    def __init__(self, status: int, message: str, type_: str | None = None, **extra: Any):
        super().__init__(message)
        self.status, self.message = status, message
        self.type = type_ or self.TYPES.get(status, "server_error")
        self.extra = extra

    def body(self) -> dict:
        return {"error": {"code": self.status, "message": self.message, "type": self.type, **self.extra}}


def check_prompt_fits(engine, prompt: list[int]) -> None:
    """The prompt is not empty and leaves room in the context: else the 400 llama-server answers."""
    try:
        engine.check_prompt(prompt)
    except ContextFullError:
        raise ApiError(400, f"request ({len(prompt)} tokens) exceeds the available context size "
                            f"({engine.target.n_ctx} tokens), try increasing it",
                       "exceed_context_size_error", n_prompt_tokens=len(prompt), n_ctx=engine.target.n_ctx) from None
    except LocalspecError as e:
        raise ApiError(400, str(e)) from None


def log_unexpected(where: str, e: BaseException) -> None:
    """One line on the server's stderr for a failure nobody anticipated (the traceback only with
    LOCALSPEC_DEBUG=1): the client gets an error JSON, the log stays readable."""
    if os.environ.get("LOCALSPEC_DEBUG"):
        traceback.print_exception(e)
    sys.stderr.write(f"localspec serve: unexpected error in {where}: {type(e).__name__}: {e} "
                     "(LOCALSPEC_DEBUG=1 shows the traceback)\n")
    sys.stderr.flush()


_NOTED: set[str] = set()


def log_note(message: str) -> None:
    """A line on the server's stderr about a request the server served differently than asked, once
    per distinct message (an agent sends the same tools on every turn)."""
    if message not in _NOTED:
        _NOTED.add(message)
        sys.stderr.write(f"localspec serve: {message}\n")
        sys.stderr.flush()


# JSON's escapes for UTF-16 surrogates: only a body that has one can hold a lone surrogate
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw.decode("utf-8")) if raw.strip() else None
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8; send JSON text")
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply")
    except ValueError as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})")
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw):
        where = _lone_surrogate(body, "")
        if where is not None:
            raise ApiError(400, f'{where or "the body"} has a lone UTF-16 surrogate (half of an emoji?); '
                                "send whole characters")
    return body


def _lone_surrogate(v: Any, path: str, depth: int = 0) -> str | None:
    """The path of the first string (value or key) that is not valid Unicode text, or None."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if depth > 64:
        return None
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in items:
        name = k.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(k, str) else k
        sub = f"{path}[{k}]" if isinstance(k, int) else f"{path}.{name}" if path else name
        if isinstance(k, str) and _lone_surrogate(k, sub) is not None:
            return sub
        found = _lone_surrogate(x, sub, depth + 1)
        if found is not None:
            return found
    return None


def requested_model(body: dict) -> str | None:
    """`model`: any string is served by the loaded pair, as llama-server does with one model (clients
    send "", "gpt-4o", their own alias); replies name the served model. Only a non-string is wrong."""
    v = body.get("model")
    if v is not None and not isinstance(v, str):
        raise ApiError(400, '"model" must be a string (any name: this server serves its one model)')
    return v


# --- one field at a time ------------------------------------------------------------------------
_MISSING = object()


def _get(body: dict, key: str, kind, what: str, default=None):
    v = body.get(key, _MISSING)
    if v is _MISSING or v is None:
        return default
    ok = isinstance(v, kind) and not (isinstance(v, bool) and kind is not bool)
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v, ok = float(v), True
    if not ok or (isinstance(v, float) and not math.isfinite(v)):
        raise ApiError(400, f'"{key}" must be {what}')
    return v


def number(body: dict, key: str, lo: float | None = None, hi: float | None = None, default=None) -> float | None:
    v = _get(body, key, float, "a number", default)
    if v is not None and ((lo is not None and v < lo) or (hi is not None and v > hi)):
        rng = f"between {lo:g} and {hi:g}" if lo is not None and hi is not None else f"at least {lo:g}"
        raise ApiError(400, f'"{key}" must be {rng}')
    return v


def integer(body: dict, key: str, lo: int | None = None, default=None) -> int | None:
    v = _get(body, key, int, "a whole number", default)
    if v is not None and lo is not None and v < lo:
        raise ApiError(400, f'"{key}" must be {lo} or more')
    return v


def string(body: dict, key: str, default=None) -> str | None:
    return _get(body, key, str, "a string", default)


def boolean(body: dict, key: str, default: bool = False) -> bool:
    return _get(body, key, bool, "true or false", default)


def stop_strings(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return list(v)
    raise ApiError(400, '"stop" must be a string or a list of strings')


# --- generation settings --------------------------------------------------------------------------
@dataclass
class Extras:
    """Per-request knobs that are not generation settings of the engine."""
    stream: bool = False
    include_usage: bool = False
    n_indent: int = 0  # /infill: stop at a new line indented less than this
    t_max_predict_ms: int = 0  # stop at the first new line after this many ms of generation
    response_fields: list[str] = field(default_factory=list)
    logit_bias: list = field(default_factory=list)  # [(token id or text, bias)], resolved by the worker
    ignore_eos: bool = False  # llama-server's: every end-of-generation token banned (a bias of -inf)
    timings_per_token: bool = False  # llama-server's: each streamed piece carries the figures so far


def gen_settings(body: dict, defaults: GenConfig, oai: bool) -> tuple[GenConfig, Extras]:
    """A GenConfig for this request (defaults overridden by its fields) and the other knobs."""
    if oai:
        max_tokens = integer(body, "max_completion_tokens", 0) or integer(body, "max_tokens", 0)
        if integer(body, "n", 1, 1) not in (None, 1):
            raise ApiError(400, '"n" must be 1: one choice per request')
    else:
        max_tokens = integer(body, "n_predict", -1)
        max_tokens = None if max_tokens is not None and max_tokens < 0 else max_tokens
    cfg = replace(defaults, stop=stop_strings(body) or list(defaults.stop))
    if max_tokens is not None:
        cfg.max_tokens = max_tokens
    for key, attr, lo, hi in (("temperature", "temperature", 0.0, None), ("top_p", "top_p", 0.0, 1.0),
                              ("min_p", "min_p", 0.0, 1.0)):
        v = number(body, key, lo, hi)
        if v is not None:
            setattr(cfg, attr, v)
    top_k = integer(body, "top_k", 0)
    if top_k is not None:
        cfg.top_k = top_k
    seed = integer(body, "seed")
    if seed is not None:
        cfg.seed = None if seed < 0 else seed  # llama-server: -1 = random
    _samplers(body, cfg)
    _speculative(body, cfg)
    cfg.prediction = prediction(body)
    cfg.exact = boolean(body, "exact", defaults.exact)  # localspec's: byte-identical to plain decoding
    cfg.grammar = requested_grammar(body)
    extras = Extras(stream=boolean(body, "stream"), n_indent=integer(body, "n_indent", 0, 0),
                    t_max_predict_ms=integer(body, "t_max_predict_ms", 0, 0), logit_bias=logit_bias(body),
                    ignore_eos=boolean(body, "ignore_eos"), timings_per_token=boolean(body, "timings_per_token"))
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise ApiError(400, '"stream_options" must be an object')
        extras.include_usage = boolean(so, "include_usage")
    rf = body.get("response_fields")
    if rf is not None:
        if not isinstance(rf, list) or not all(isinstance(x, str) for x in rf):
            raise ApiError(400, '"response_fields" must be a list of strings')
        extras.response_fields = rf
    return cfg, extras


def prediction(body: dict) -> str:
    """OpenAI's predicted outputs, `{"type": "content", "content": "..." or [{"type": "text", "text": ...}]}`
    (a plain string is taken too, as on /completion): text the answer is expected to repeat, drafted
    from and aligned with the answer as it grows. It changes the speed, never the answer."""
    v = body.get("prediction")
    if v is None or isinstance(v, str):
        return v or ""
    bad = ApiError(400, '"prediction" must be {"type": "content", "content": "..."} (or a string)')
    if not isinstance(v, dict) or v.get("type", "content") != "content":
        raise bad
    content = v.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise bad


BiasItem = tuple  # (token id or text, added logit; -inf bans)


def logit_bias(body: dict) -> list[BiasItem]:
    """`logit_bias` as OpenAI sends it ({"15043": -100}) or as llama-server also takes it
    ([[15043, -1.5], ["Hello", false]]: a text stands for each of its tokens, false bans).
    Token texts are turned into ids once the model is at hand (`resolve_logit_bias`)."""
    v = body.get("logit_bias")
    if v is None:
        return []
    if isinstance(v, dict):
        pairs = list(v.items())
    elif isinstance(v, list) and all(isinstance(x, list) and len(x) == 2 for x in v):
        pairs = [tuple(x) for x in v]
    else:
        raise ApiError(400, '"logit_bias" must be an object {"token id": bias} or a list of [token, bias] pairs')
    out = []
    for tok, bias in pairs:
        if isinstance(tok, str) and tok.strip().lstrip("-").isdigit():
            tok = int(tok)
        if isinstance(tok, bool) or not isinstance(tok, (int, str)):
            raise ApiError(400, '"logit_bias": a token must be an id or a text')
        if bias is False:
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise ApiError(400, f'"logit_bias": the bias for {tok!r} must be a number (or false to ban it)')
        out.append((tok, float(bias)))
    return out


def resolve_logit_bias(items: list[BiasItem], model, ignore_eos: bool = False) -> dict[int, float]:
    """Token ids -> bias for this model; ids outside the vocabulary are a 400. ignore_eos bans every
    end-of-generation token, as llama-server does."""
    out: dict[int, float] = dict.fromkeys(model.eog_tokens(), -math.inf) if ignore_eos else {}
    for tok, bias in items:
        ids = [tok] if isinstance(tok, int) else model.tokenize(tok, add_special=False, parse_special=False)
        for t in ids:
            if not 0 <= t < model.n_vocab:
                raise ApiError(400, f'"logit_bias" has a token id outside the vocabulary (0..{model.n_vocab - 1})')
            out[t] = out.get(t, 0.0) + bias
    return out


def requested_grammar(body: dict) -> str | None:
    """The grammar a request asks for: llama-server's `grammar` (GBNF) or `json_schema`, or OpenAI's
    `response_format` (json_object, json_schema). At most one of them."""
    from ..constraints import json_grammar, schema_grammar

    asked = []
    gbnf = string(body, "grammar")
    if gbnf:
        asked.append(("grammar", lambda: gbnf))
    schema = body.get("json_schema")
    if schema is not None:
        if not isinstance(schema, dict):
            raise ApiError(400, '"json_schema" must be a JSON schema object')
        asked.append(("json_schema", lambda: schema_grammar(schema)))
    rf = body.get("response_format")
    if rf is not None:
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind == "json_schema" or (kind == "json_object" and isinstance(rf.get("schema"), dict)):
            inner = rf.get("json_schema") if kind == "json_schema" else rf
            inner = inner.get("schema") if isinstance(inner, dict) else None
            if not isinstance(inner, dict):
                raise ApiError(400, '"response_format": json_schema needs {"json_schema": {"schema": {...}}}')
            asked.append(("response_format", lambda: schema_grammar(inner)))
        elif kind == "json_object":
            asked.append(("response_format", json_grammar))
        elif kind != "text":
            raise ApiError(400, '"response_format" must be {"type": "text" | "json_object" | "json_schema", ...}')
    if len(asked) > 1:
        raise ApiError(400, f"give one of {', '.join(k for k, _ in asked)}, not several")
    if not asked:
        return None
    try:
        return asked[0][1]()
    except LocalspecError as e:
        raise ApiError(400, f'"{asked[0][0]}": {e}')


def _samplers(body: dict, cfg: GenConfig) -> None:
    """llama-server's `samplers`: the chain to apply. A sampler left out of the list is off, as there
    (no "temperature" = temperature 1); "infill", "dry", "penalties" and other llama.cpp samplers are
    not implemented here and are skipped."""
    chain = body.get("samplers")
    if chain is None:
        return
    if not isinstance(chain, list) or not all(isinstance(x, str) for x in chain):
        raise ApiError(400, '"samplers" must be a list of sampler names')
    names = {x.lower() for x in chain}
    if "top_k" not in names:
        cfg.top_k = 0
    if "top_p" not in names:
        cfg.top_p = 1.0
    if "min_p" not in names:
        cfg.min_p = 0.0
    if "temperature" not in names and cfg.temperature > 0:
        cfg.temperature = 1.0


def _speculative(body: dict, cfg: GenConfig) -> None:
    """llama-server's speculative.{n_max, n_min, p_min} (nested or as "speculative.n_max" keys) and
    localspec's own `spec`, `drafter` and `speculative.ngram_n_max`."""
    spec = body.get("speculative")
    if spec is not None and not isinstance(spec, dict):
        raise ApiError(400, '"speculative" must be an object like {"n_max": 4}')
    spec = dict(spec or {})
    for k in ("n_max", "n_min", "p_min"):
        if f"speculative.{k}" in body:
            spec[k] = body[f"speculative.{k}"]
    n_max = integer(spec, "n_max", 0)
    if n_max is not None:
        cfg.draft_max = cfg.ngram_draft_max = n_max
    ngram_n_max = integer(spec, "ngram_n_max", 0)  # localspec's: n-gram drafts may be longer than the model's
    if ngram_n_max is not None:
        cfg.ngram_draft_max = ngram_n_max
    n_min = integer(spec, "n_min", 0)
    if n_min is not None:
        cfg.draft_min = n_min
    p_min = number(spec, "p_min", 0.0, 1.0)
    if p_min is not None:
        cfg.p_min = p_min
    mode = string(body, "spec")
    if mode is not None:
        if mode not in SPEC_MODES:
            raise ApiError(400, f'"spec" must be one of {", ".join(SPEC_MODES)}')
        cfg.spec = mode
    drafter = string(body, "drafter")
    if drafter is not None:
        if drafter not in DRAFTERS:
            raise ApiError(400, f'"drafter" must be one of {", ".join(DRAFTERS)}')
        cfg.drafter = drafter
    if cfg.spec == "on" and cfg.draft_max == 0:
        cfg.spec = "off"  # nothing to draft: plain decoding, as llama-server does with n_max 0


# --- prompts ----------------------------------------------------------------------------------------
def chat_messages(body: dict) -> list[Message]:
    """OpenAI `messages` -> Messages; text parts of a content array are joined; an assistant's
    tool_calls and a tool result's ids go to the template as it expects them (tools.template_messages)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, '"messages" must be a non-empty list of {"role", "content"} objects')
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f'messages[{i}] must be an object with a string "role"')
        role = canonical_role(m["role"])
        if role is None:
            known = ", ".join([*ROLES, *ROLE_ALIASES])
            raise ApiError(400, f'messages[{i}].role "{m["role"]}" is not a role this server knows ({known})')
        extra = {k: m[k] for k in ("tool_calls", "tool_call_id", "name") if m.get(k) is not None}
        if "tool_calls" in extra:
            extra["tool_calls"] = _template_calls(extra["tool_calls"], i)
        out.append(Message(role, _content_text(m.get("content"), i), extra or None))
    return out


def _template_calls(calls, i: int) -> list[dict]:
    """OpenAI's assistant tool_calls carry arguments as a JSON string; chat templates (like HF's and
    llama.cpp's renderers) expect the object."""
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise ApiError(400, f"messages[{i}].tool_calls must be a list of tool call objects")
    out = []
    for c in calls:
        fn = dict(c.get("function") or {}) if isinstance(c.get("function"), dict) else {}
        if isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"])
            except ValueError:
                pass  # not JSON: the template shows the text as it came
        out.append({**c, "function": fn})
    return out


def _content_text(content: Any, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise ApiError(400, f"messages[{i}].content: only text parts are supported by this server")
        return "".join(parts)
    raise ApiError(400, f'messages[{i}].content must be a string or a list of text parts')


def completion_prompt(body: dict) -> str | list[int]:
    """`prompt` as text, or as token ids (llama-server accepts both); one prompt per request."""
    p = body.get("prompt", _MISSING)
    if p is _MISSING or p is None:
        raise ApiError(400, '"prompt" is required')
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        return p
    if isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return list(p)
    raise ApiError(400, '"prompt" must be a string or a list of token ids (one prompt per request)')


def completion_tokens(body: dict):
    """engine -> the prompt's tokens for `prompt` (text, tokenized with the BOS, or token ids)."""
    prompt = completion_prompt(body)
    parse_special = boolean(body, "parse_special", True)  # localspec's: False reads "<|x|>" as plain text

    def tokens(engine) -> list[int]:
        m = engine.target_model
        if isinstance(prompt, str):
            return m.tokenize(prompt, add_special=True, parse_special=parse_special)
        if any(t < 0 or t >= m.n_vocab for t in prompt):
            raise ApiError(400, f'"prompt" has a token id outside the vocabulary (0..{m.n_vocab - 1})')
        return prompt
    return tokens


def pick_fields(obj: dict, paths: list[str]) -> dict:
    """llama-server's `response_fields`: {"timings/prompt_n": ..., "content": ...}, flat, paths that
    exist only."""
    out = {}
    for path in paths:
        cur: Any = obj
        for part in path.split("/"):
            if not isinstance(cur, dict) or part not in cur:
                cur = _MISSING
                break
            cur = cur[part]
        if cur is not _MISSING:
            out[path] = cur
    return out
