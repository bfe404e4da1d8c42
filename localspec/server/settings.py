"""Request fields, each validated on its own, and a request's generation settings: the server's defaults
(`localspec serve` flags, the pair's settings) overridden by the fields each protocol shares (sampling,
stop strings, speculation, predicted output, `logit_bias`, grammars and JSON schemas)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from ..config import DRAFTERS, GenConfig
from ..errors import LocalspecError
from ..serving.job import BiasItem, JobOptions
from .apierrors import ApiError

SPEC_MODES = ("on", "off", "auto")
LOCALSPEC_FIELDS = ("spec", "drafter", "speculative", "exact")  # localspec's own request fields, on every protocol


# --- one field at a time: a known field of the wrong type is a 400 that names it; unknown fields are
# ignored (never a 422) --------------------------------------------------------------------------------
MISSING = object()  # no such field in the body


def _get(body: dict, key: str, kind, what: str, default=None):
    v = body.get(key, MISSING)
    if v is MISSING or v is None:
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



_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def keep_alive_seconds(v) -> float | None:
    """Ollama's `keep_alive`: seconds as a number, or a Go duration ("5m", "1h30m", "-1", "0");
    negative: stay loaded; 0: unload once the request ends; None: the server's default."""
    if v is None:
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        text = v.strip()
        if re.fullmatch(r"-?\d+(\.\d+)?", text):
            return float(text)
        parts = _DURATION.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _UNIT_S[u] for n, u in parts)
    raise ApiError(400, '"keep_alive" must be seconds or a duration such as "5m", "1h", "-1" (stay) or 0 (unload)')


@dataclass
class Extras:
    """How a request's answer is framed (streamed, usage, the fields to send), beside the generation-time
    options its job carries (`job`)."""
    stream: bool = False
    include_usage: bool = False
    response_fields: list[str] = field(default_factory=list)
    job: JobOptions = field(default_factory=JobOptions)


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
    options = JobOptions(n_indent=integer(body, "n_indent", 0, 0), t_max_predict_ms=integer(body, "t_max_predict_ms", 0, 0),
                         logit_bias=logit_bias(body), ignore_eos=boolean(body, "ignore_eos"),
                         timings_per_token=boolean(body, "timings_per_token"))
    extras = Extras(stream=boolean(body, "stream"), job=options)
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


def requested_grammar(body: dict) -> str | None:
    """The grammar a request asks for: llama-server's `grammar` (GBNF) or `json_schema`, or OpenAI's
    `response_format` (json_object, json_schema). At most one of them."""
    from ..decoding.constraints import json_grammar, schema_grammar

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
