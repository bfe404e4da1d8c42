"""`localspec chat` (the Textual app) and `localspec history list | show | export`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import ConfigError
from .common import add_gen_args, add_model_args, gen_choice, model_choice


def register(sub) -> None:
    from ..chat.slash import help_text

    p = sub.add_parser("chat", help="chat in the terminal, streaming only verified tokens, with live speculation stats",
                       description="A terminal chat that shows only tokens the target model has verified, which of "
                                   "them came from accepted drafts, and live acceptance and speed figures.",
                       epilog=help_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, positional_pair=True)
    add_gen_args(p)
    p.add_argument("--continue", dest="resume", action="store_true", help="continue the last saved conversation")
    p.add_argument("--local", action="store_true",
                   help="load the models here even when a `localspec serve` with this pair is running")
    p.set_defaults(func=cmd_chat)

    h = sub.add_parser("history", help="list, show and export saved chats")
    hs = h.add_subparsers(dest="history_command", metavar="ACTION", parser_class=type(h))
    h.set_defaults(func=cmd_history_list, json=False, limit=20)
    ls = hs.add_parser("list", help="saved conversations, newest first")
    ls.add_argument("--json", action="store_true", help="one JSON array on stdout")
    ls.add_argument("-n", "--limit", type=int, default=20, help="how many (0 = all; default 20)")
    ls.set_defaults(func=cmd_history_list)
    sh = hs.add_parser("show", help="print one conversation")
    sh.add_argument("id", help="conversation id (from `localspec history list`), or `last`")
    sh.set_defaults(func=cmd_history_show)
    ex = hs.add_parser("export", help="write one conversation as Markdown or JSON")
    ex.add_argument("id", help="conversation id, or `last`")
    ex.add_argument("--format", choices=["md", "json"], default="md", help="(default md)")
    ex.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    ex.set_defaults(func=cmd_history_export)


def chat_options(args):
    from ..chat.options import ChatOptions

    return ChatOptions(models=model_choice(args), gen=gen_choice(args), resume=args.resume, local=args.local)


def parse_chat_args(argv: list[str]):
    """The `chat` subcommand's flags as the app's ChatOptions (for tests and embedding)."""
    parser = argparse.ArgumentParser(prog="localspec")
    register(parser.add_subparsers(dest="command"))
    return chat_options(parser.parse_args(["chat", *argv]))


def cmd_chat(args) -> int:
    from ..chat.app import ChatApp

    app = ChatApp(chat_options(args))
    app.run()
    return int(app.return_code or 0)


# --- history --------------------------------------------------------------------------------------
def _store():
    from ..history import HistoryStore

    return HistoryStore()


def _conversation_id(store, ident: str) -> int:
    if ident == "last":
        cid = store.last_conversation_id()
        if cid is None:
            raise ConfigError("no saved conversations yet; `localspec chat` starts one")
        return cid
    try:
        return int(ident.lstrip("#"))
    except ValueError:
        raise ConfigError(f"{ident!r} is not a conversation id; `localspec history list` shows them")


def cmd_history_list(args) -> int:
    store = _store()
    try:
        convs = store.list_conversations(limit=args.limit or None)
    finally:
        store.close()
    out = sys.stdout
    if args.json:
        out.write(json.dumps([c.to_dict(with_messages=False) for c in convs], indent=2, ensure_ascii=False) + "\n")
        return 0
    if not convs:
        out.write("no saved conversations yet; `localspec chat` starts one\n")
        return 0
    out.write(f"{'ID':>4}  {'UPDATED':16}  {'MSGS':>4}  TITLE\n")
    for c in convs:
        out.write(f"{c.id:>4}  {_when(c.updated_at):16}  {c.n_messages:>4}  {c.title or '(untitled)'}\n")
    return 0


def cmd_history_show(args) -> int:
    from ..history import message_note

    store = _store()
    try:
        conv = store.get(_conversation_id(store, args.id))
    finally:
        store.close()
    out = sys.stdout
    out.write(f"conversation {conv.id}: {conv.title or '(untitled)'}\n")
    out.write(f"started {_when(conv.created_at)}" + (f", pair {conv.pair}" if conv.pair else "") + "\n")
    if conv.system:
        out.write(f"\n[system]\n{conv.system}\n")
    for m in conv.messages:
        who = {"user": "you", "assistant": "assistant"}.get(m.role, m.role)
        out.write(f"\n[{who}]\n{m.content.rstrip()}\n")
        note = message_note(m)
        if note:
            out.write(note + "\n")
    return 0


def cmd_history_export(args) -> int:
    from ..history import to_json, to_markdown

    store = _store()
    try:
        conv = store.get(_conversation_id(store, args.id))
    finally:
        store.close()
    text = to_json(conv) if args.format == "json" else to_markdown(conv)
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot write {args.output} ({e.strerror or e}); pick a writable path")
        sys.stderr.write(f"wrote conversation {conv.id} to {args.output}\n")
    else:
        sys.stdout.write(text)
    return 0


def _when(iso: str) -> str:
    from datetime import datetime

    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return iso
