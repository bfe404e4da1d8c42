"""The chat's slash commands: one table (name, aliases, usage, help, handler) that dispatch, /help,
the start-up banner and `localspec chat --help` all read. Handlers are plain functions of the app.
No Textual import here, so the CLI can list the commands cheaply."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Awaitable, Callable

from .. import paths
from ..errors import ConfigError

KEYS = [
    "Enter send · ctrl+j newline · ↑/↓ earlier prompts · Esc cancel the reply · ctrl+q quit",
    "ctrl+t provenance colours (green: accepted drafts, amber: the target's) · ctrl+y copy reply",
    "PgUp/PgDn scroll the conversation · ctrl+Home/ctrl+End its top and bottom",
]


def _next_reply(app) -> str:
    return " (from the next reply on)" if app.generating else ""


async def _k(app, rest: str) -> None:
    try:
        k = int(rest)
        if k < 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"/k needs a whole number 0 or more, like /k 4 (now {app.cfg.draft_max})")
    if k == 0 and app.cfg.spec == "on":
        raise ConfigError("/k 0 drafts nothing with /spec on; use /spec off for plain decoding")
    app.set_options(draft_max=k)
    await app.say(f"k = {k}: at most {k} tokens drafted per round{_next_reply(app)}", "ok")

async def _temp(app, rest: str) -> None:
    try:
        t = float(rest)
        if not t >= 0 or t == float("inf"):
            raise ValueError
    except ValueError:
        raise ConfigError(f"/temp needs a number 0 or more, like /temp 0.7 (now {app.cfg.temperature:g})")
    app.set_options(temperature=t)
    await app.say(f"temperature = {t:g}{' (greedy)' if t == 0 else ''}{_next_reply(app)}", "ok")

async def _system(app, rest: str) -> None:
    if not rest:
        await app.say(f"system prompt: {app.conversation.system}" if app.conversation.system else
                       "no system prompt; /system TEXT sets one", "info")
        return
    app.conversation.set_system(None if rest == "-" else rest)
    system = app.conversation.system
    await app.say("system prompt removed" if system is None else f"system prompt set: {system}", "ok")

async def _spec(app, rest: str) -> None:
    mode = rest.lower()
    if mode not in ("on", "off", "auto"):
        raise ConfigError(f"/spec takes on, off or auto (now {app.cfg.spec})")
    if mode == "on" and app.cfg.draft_max == 0:
        raise ConfigError("/spec on with k = 0 drafts nothing; set /k 4 first")
    app.set_options(spec=mode)
    what = {"on": "speculate every round", "off": "plain target-only decoding",
            "auto": "speculate when the measured costs say it pays"}[mode]
    await app.say(f"spec {mode}: {what}{_next_reply(app)}", "ok")

async def _clear(app, rest: str) -> None:
    if app.generating:
        raise ConfigError("a reply is being written; Esc cancels it, then /clear")
    for w in list(app.conv.children):
        if not w.has_class("banner") and w.id != "loading":
            await w.remove()
    await app.say("screen cleared; the model still remembers this conversation (/new forgets it)", "ok")


async def _new(app, rest: str) -> None:
    if app.generating:
        raise ConfigError("a reply is being written; Esc cancels it, then /new")
    app.conversation.start_new(app.options.gen.system)
    app.last_live = None
    for w in list(app.conv.children):
        if not w.has_class("banner") and w.id != "loading":
            await w.remove()
    await app.say("new conversation", "ok")

async def _history(app, rest: str) -> None:
    if app.store is None:
        raise ConfigError(app.store_error or "no history database")
    if rest:
        if app.generating:
            raise ConfigError("a reply is being written; Esc cancels it, then /history ID")
        try:
            cid = int(rest.lstrip("#"))
        except ValueError:
            raise ConfigError("/history ID takes a number from the /history list")
        await app.resume(cid)
        return
    convs = app.store.list_conversations(limit=15)
    if not convs:
        await app.say("no saved conversations yet", "info")
        return
    lines = ["saved conversations (newest first; /history ID opens one, "
             "`localspec history show ID` prints it):"]
    for c in convs:
        mark = " ◀ this one" if c.id == app.conversation.id else ""
        lines.append(f"  #{c.id}  {local_time(c.updated_at)}  {c.n_messages:>3} msgs  {c.title or '(untitled)'}{mark}")
    await app.say("\n".join(lines), "info")

async def _stats(app, rest: str) -> None:
    lines = []
    if app.last_stats is not None:
        lines.append("last reply:")
        lines += ["  " + ln for ln in app.last_stats.summary_lines()]
        if app.last_live is not None and app.last_live.speedup is not None:
            lines.append(f"  estimated speedup over plain decoding from measured pass costs: "
                         f"{app.last_live.speedup:.2f}×")
    else:
        lines.append("no reply yet")
    e = app.engine
    if e is not None and e.profile is not None:
        p = e.profile
        rel = ", ".join(f"{r:.2f}" for r in p.relative_verify()[:6])
        draft = f", draft decode {1000 * p.t_draft:.1f} ms" if p.t_draft else ""
        lines.append(f"measured pass costs: target decode {1000 * p.t_decode:.1f} ms{draft}; "
                     f"verify(n)/decode for n=1..6: {rel}")
    elif e is not None:
        lines.append("no measured pass costs yet (/spec auto measures them; so does `localspec tune`)")
    c = app.cfg
    if c is not None:
        lines.append(f"settings: spec {c.spec}, k {c.draft_max}, temperature {c.temperature:g}, top-k {c.top_k}, "
                     f"top-p {c.top_p:g}, min-p {c.min_p:g}, max tokens {c.max_tokens}, drafter {c.drafter}")
    await app.say("\n".join(lines), "info")

async def _copy(app, rest: str) -> None:
    if not app.last_reply:
        raise ConfigError("nothing to copy yet; /copy saves the last reply once there is one")
    app.copy_to_clipboard(app.last_reply)
    d = paths.ensure(paths.copies_dir())
    path = d / f"reply-{datetime.now().strftime('%Y%m%d-%H%M%S')}.md"
    n = 1
    while path.exists():
        n += 1
        path = d / f"reply-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{n}.md"
    path.write_text(app.last_reply if app.last_reply.endswith("\n") else app.last_reply + "\n",
                    encoding="utf-8")
    await app.say(f"copied the last reply to the clipboard (OSC 52) and saved it to {path}", "ok")

def _catalog():
    from ..models.catalog import find_models

    return find_models()


def _current(app, entry) -> bool:
    sel = app.sel
    if sel is None:
        return False
    return sel.name == entry.pair if entry.pair else str(entry.target) == sel.target


async def _models(app, rest: str) -> None:
    entries = _catalog()
    if not entries:
        await app.say("no models found on this machine; `localspec pull` fetches the default pair", "info")
        return
    lines = ["models on this machine (/model NAME switches; `localspec serve` serves them all):"]
    for e in entries:
        kind = "pair" if e.pair else f"draft {e.draft.name}" if e.draft else "n-gram drafts"
        mark = " ◀ this one" if _current(app, e) else ""
        lines.append(f"  {e.name}  ({kind}, {e.size / 1e9:.2f} GB){mark}")
    await app.say("\n".join(lines), "info")


async def _model(app, rest: str) -> None:
    if not rest:
        sel = app.sel
        await app.say(f"model: {sel.name if sel else 'none loaded'}; /models lists the others", "info")
        return
    if app.generating or app.loading:
        raise ConfigError("wait for the reply (Esc cancels it) or the load to finish, then /model")
    entry = next((e for e in _catalog() if e.find(rest)), None)
    if entry is None:
        raise ConfigError(f"no model {rest!r} on this machine; /models lists them")
    await app.switch_model(entry.choice_fields(), entry.name)


async def _help(app, rest: str) -> None:
    await app.say(help_text(), "info")


def local_time(iso: str) -> str:
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return iso


@dataclass(frozen=True)
class SlashCommand:
    name: str
    usage: str
    help: str
    handler: Callable[..., Awaitable[None]]
    aliases: tuple[str, ...] = ()


COMMANDS = [
    SlashCommand("/k", "/k N", "most tokens drafted per round (0 = no drafting)", _k),
    SlashCommand("/temp", "/temp T", "sampling temperature (0 = greedy)", _temp, ("/temperature",)),
    SlashCommand("/system", "/system TEXT", "set the system prompt (/system shows it, /system - removes it)", _system),
    SlashCommand("/spec", "/spec on|off|auto", "speculate always, never, or when the measured costs say it pays", _spec),
    SlashCommand("/clear", "/clear", "clear the screen (the model still remembers; /new forgets)", _clear),
    SlashCommand("/new", "/new", "start a new conversation", _new),
    SlashCommand("/history", "/history [ID]", "list saved conversations, or open one", _history),
    SlashCommand("/stats", "/stats", "figures of the last reply", _stats),
    SlashCommand("/model", "/model [NAME]", "switch to another model on this machine (through the server when one "
                 "has it)", _model),
    SlashCommand("/models", "/models", "the models on this machine", _models),
    SlashCommand("/copy", "/copy", "copy the last reply (OSC 52) and save it to a file", _copy),
    SlashCommand("/help", "/help", "this list", _help, ("/?",)),
]
BY_NAME = {n: c for c in COMMANDS for n in (c.name, *c.aliases)}


def help_text() -> str:
    width = max(len(c.usage) for c in COMMANDS)
    lines = ["Keys:", *("  " + k for k in KEYS), "Commands:"]
    lines += [f"  {c.usage.ljust(width)}  {c.help}" for c in COMMANDS]
    return "\n".join(lines)
