"""Prompt sets for the bench: the shipped workloads and the user's own JSONL files.

Every line of a workload file is one JSON object:

    {"id": "edit-03", "workload": "edit", "prompt": "...", "system": "...", "max_tokens": 200}

`id` and `prompt` are required; `workload` is required in the shipped files and defaults to
"custom" in a user's file; `system` and `max_tokens` are optional. A user file is checked line
by line and the first problem is reported with its line number, before any model is loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import ConfigError

# The shipped workloads, in report order, with what each one stands for.
BUILTIN = {
    "chat": "everyday questions and short messages",
    "code": "code generation from a description",
    "edit": "code editing: rewrite or extend a function given in the prompt",
    "support": "customer-support replies filling in a fixed template",
    "docqa": "summarization and question answering over a supplied document, with quotes",
    "extract": "structured JSON extraction from free text",
    "fim": "code completion in the middle of Python's standard-library functions (FIM, the real lines as reference)",
}

# what runs without --workloads (and with "all"): `fim` needs a model with FIM tokens, so it is named
CHAT_WORKLOADS = [w for w in BUILTIN if w != "fim"]

FIELDS = {"id": str, "workload": str, "prompt": str, "system": str, "max_tokens": int}


@dataclass(frozen=True)
class Prompt:
    id: str
    workload: str
    prompt: str
    system: str | None = None
    max_tokens: int | None = None
    fim: tuple[str, str] | None = None  # (prefix, suffix): a fill-in-the-middle prompt instead of a chat
    reference: str | None = None  # the real middle, for fim prompts


def parse_line(line: str, where: str, default_workload: str | None = None) -> Prompt:
    """One JSONL line -> Prompt; raises ConfigError naming `where` (file and line)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not valid JSON ({e.msg} at column {e.colno})")
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object like "
                          '{"id": "p1", "prompt": "..."}, got ' + type(obj).__name__)
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}; allowed: {', '.join(FIELDS)}")
    if "workload" not in obj and default_workload:
        obj["workload"] = default_workload
    for name in ("id", "workload", "prompt"):
        if name not in obj:
            raise ConfigError(f"{where}: missing required field {name!r}")
    for name, typ in FIELDS.items():
        if name not in obj or (obj[name] is None and name in ("system", "max_tokens")):
            continue
        v = obj[name]
        if typ is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise ConfigError(f"{where}: {name!r} must be a whole number, got {v!r}")
        if typ is str and not isinstance(v, str):
            raise ConfigError(f"{where}: {name!r} must be a string, got {type(v).__name__}")
    for name in ("id", "workload", "prompt"):
        if not obj[name].strip():
            raise ConfigError(f"{where}: {name!r} is empty")
    if "," in obj["workload"] or obj["workload"] != obj["workload"].strip():
        raise ConfigError(f"{where}: workload name {obj['workload']!r} may not contain commas or surrounding spaces")
    mt = obj.get("max_tokens")
    if mt is not None and mt < 1:
        raise ConfigError(f"{where}: 'max_tokens' must be 1 or more, got {mt}")
    return Prompt(obj["id"], obj["workload"], obj["prompt"], obj.get("system"), mt)


def parse_jsonl(text: str, name: str, default_workload: str | None = None) -> list[Prompt]:
    prompts, seen = [], {}
    for no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        p = parse_line(line, f"{name} line {no}", default_workload)
        if p.id in seen:
            raise ConfigError(f"{name} line {no}: duplicate id {p.id!r} (first on line {seen[p.id]})")
        seen[p.id] = no
        prompts.append(p)
    if not prompts:
        raise ConfigError(f"{name}: no prompts in the file (one JSON object per line)")
    return prompts


def load_builtin(name: str) -> list[Prompt]:
    if name == "fim":
        from .fimcode import fim_prompts

        return [Prompt(p["id"], "fim", f"complete the middle of {p['where']}", max_tokens=64,
                       fim=(p["prefix"], p["suffix"]), reference=p["reference"]) for p in fim_prompts()]
    text = resources.files("localspec").joinpath("workloads", f"{name}.jsonl").read_text(encoding="utf-8")
    prompts = parse_jsonl(text, f"workloads/{name}.jsonl")
    bad = [p.id for p in prompts if p.workload != name]
    if bad:  # a packaging mistake, not a user error
        raise ConfigError(f"workloads/{name}.jsonl: prompts {bad} belong to another workload")
    return prompts


def load_file(path: str | Path) -> list[Prompt]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--prompts: file not found: {path}")
    except UnicodeDecodeError as e:
        raise ConfigError(f"--prompts: {path} is not UTF-8 text ({e.reason} at byte {e.start})")
    except OSError as e:
        raise ConfigError(f"--prompts: cannot read {path}: {e.strerror}")
    return parse_jsonl(text, str(path), default_workload="custom")


def select(workloads: str | None, user_files: list[str], per_workload: int) -> dict[str, list[Prompt]]:
    """{workload: prompts} in run order.

    Without --workloads: every shipped workload, or only the user's when --prompts is given.
    --workloads names shipped workloads and/or workloads of the user's files ("all" = every one).
    `per_workload` keeps the first N prompts of each (0 = all)."""
    user: dict[str, list[Prompt]] = {}
    ids = {}
    for f in user_files:
        for p in load_file(f):
            if (p.workload, p.id) in ids:
                raise ConfigError(f"--prompts: id {p.id!r} of workload {p.workload!r} appears in both "
                                  f"{ids[(p.workload, p.id)]} and {f}")
            ids[(p.workload, p.id)] = f
            user.setdefault(p.workload, []).append(p)
    if workloads:
        names = [w.strip() for w in workloads.split(",") if w.strip()]
        if "all" in names:
            names = [*CHAT_WORKLOADS, *[w for w in user if w not in BUILTIN], *[n for n in names if n != "all"]]
    else:
        names = list(user) if user else list(CHAT_WORKLOADS)
    if not names:
        raise ConfigError("--workloads is empty; name one or more of " + ", ".join(BUILTIN))
    out: dict[str, list[Prompt]] = {}
    for name in dict.fromkeys(names):
        prompts = list(user.get(name, []))  # the user's own first: --prompts-per-workload keeps them
        if name in BUILTIN:
            prompts += load_builtin(name)
        if not prompts:
            known = ", ".join([*BUILTIN, *[w for w in user if w not in BUILTIN]])
            raise ConfigError(f"unknown workload {name!r}; choose from {known}")
        out[name] = prompts[:per_workload] if per_workload > 0 else prompts
    return out
