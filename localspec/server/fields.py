"""Request bodies in, values out: JSON parsed strictly, and each field validated on its own.

Fields a client sends that we do not know are ignored (never a 422); a known field of the wrong type is a 400
that names the field. The protocols' modules read their fields through these."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .apierrors import ApiError

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
    """`model`: with one model served any string names it, as llama-server does with one model (clients
    send "", "gpt-4o", their own alias); replies name the served model. Only a non-string is wrong."""
    v = body.get("model")
    if v is not None and not isinstance(v, str):
        raise ApiError(400, '"model" must be a string: a name GET /v1/models lists')
    return v


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
