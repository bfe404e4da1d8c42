"""The chat page's client, as `localspec/server/page/static/app.js` drives the server: a conversation created,
each prompt written before its answer streams, the reply's row written after the first piece, saved every
second while it streams and once more, complete, at its end. Every write the server acknowledged (a 2xx) is
kept in a `Ledger`; after a crash, `Ledger.check` finds each acknowledged message in the restarted server's
conversation whole.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx

from .soakclients import TIMEOUT, Outcome, Request, send

BASE = "/localspec/conversations"
SAVE_EVERY_S = 1.0  # the page's SAVE_EVERY_MS


@dataclass
class Acked:
    role: str
    content: str  # what the last acknowledged write held
    complete: bool


@dataclass
class Ledger:
    conversations: dict[int, dict[int, Acked]] = field(default_factory=dict)  # cid -> mid -> last acknowledged
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, cid: int, mid: int | None, role: str = "", content: str = "", complete: bool = True) -> None:
        with self.lock:
            msgs = self.conversations.setdefault(cid, {})
            if mid is not None:
                msgs[mid] = Acked(role, content, complete)

    def check(self, client: httpx.Client, url: str) -> dict:
        """Each acknowledged conversation and message in the server's store: `lost` (gone), `truncated`
        (shorter than acknowledged, or a complete one changed), counted."""
        found = {"conversations": 0, "messages": 0, "lost": [], "truncated": []}
        with self.lock:
            snapshot = {cid: dict(m) for cid, m in self.conversations.items()}
        for cid, msgs in snapshot.items():
            r = client.get(f"{url}{BASE}/{cid}", timeout=30)
            if r.status_code != 200:
                found["lost"].append(f"conversation {cid}: {r.status_code}")
                continue
            found["conversations"] += 1
            stored = {m["id"]: m for m in r.json()["messages"]}
            for mid, a in msgs.items():
                m = stored.get(mid)
                if m is None or m["role"] != a.role:
                    found["lost"].append(f"conversation {cid} message {mid}")
                elif not m["content"].startswith(a.content) or (a.complete and m["content"] != a.content):
                    found["truncated"].append(f"conversation {cid} message {mid}: {len(m['content'])} of "
                                              f"{len(a.content)} characters")
                else:
                    found["messages"] += 1
        return found


def page_turn(client: httpx.Client, url: str, ledger: Ledger, conv: dict, model: str, prompt: str,
              max_tokens: int, on_piece=None) -> Outcome:
    """One prompt and its streamed reply in the conversation `conv` ({} for a new one: its id and messages
    are kept in it). Returns the reply's outcome (its failure, if a write failed, says which). on_piece(text):
    called after the page has handled each piece (a test's moment to pull the plug)."""
    try:
        if "id" not in conv:
            r = _ok(client.post(f"{url}{BASE}", json={"model": model}, timeout=30))
            conv.update(id=r["id"], messages=[])
            ledger.ack(conv["id"], None)
        r = _ok(client.post(f"{url}{BASE}/{conv['id']}/messages", json={"role": "user", "content": prompt}, timeout=30))
        ledger.ack(conv["id"], r["id"], "user", prompt)
        conv["messages"].append({"role": "user", "content": prompt})
    except (httpx.HTTPError, _Refused) as e:
        return _failed(Request("page", model, {}), f"write: {e}")
    req = Request("page", model, {"messages": list(conv["messages"]), "max": max_tokens},
                  exempt="a conversation's later turn" if len(conv["messages"]) > 1 else "")
    saver = _Saver(client, url, ledger, conv["id"])
    def piece(text: str) -> None:
        saver.piece(text)
        if on_piece is not None:
            on_piece(text)
    out = send(client, url, Request("openai-chat", model, req.body), on_piece=piece)
    out.req = req
    if out.failure in ("", "hung-up"):
        try:
            saver.finish(out.text)
        except (httpx.HTTPError, _Refused) as e:
            out.failure, out.detail = "page-write", str(e)[:160]
        conv["messages"].append({"role": "assistant", "content": out.text})
    return out


class _Saver:
    """The reply's row: added at the first piece, saved every second, completed at the end."""

    def __init__(self, client, url, ledger, cid):
        self.client, self.url, self.ledger, self.cid = client, url, ledger, cid
        self.mid: int | None = None
        self.text, self.saved_at = "", 0.0

    def piece(self, piece: str) -> None:
        self.text += piece
        if self.mid is None:
            r = _ok(self.client.post(f"{self.url}{BASE}/{self.cid}/messages",
                                     json={"role": "assistant", "content": "", "complete": False}, timeout=30))
            self.mid, self.saved_at = r["id"], time.monotonic()
            self.ledger.ack(self.cid, self.mid, "assistant", "", False)
        elif time.monotonic() - self.saved_at > SAVE_EVERY_S:
            self._save(False)

    def finish(self, text: str) -> None:
        self.text = text
        if self.mid is not None:
            self._save(True)

    def _save(self, complete: bool) -> None:
        content = self.text
        body = {"content": content, "complete": complete, **({"stop_reason": "eos"} if complete else {})}
        _ok(self.client.patch(f"{self.url}{BASE}/{self.cid}/messages/{self.mid}", json=body, timeout=TIMEOUT))
        self.saved_at = time.monotonic()
        self.ledger.ack(self.cid, self.mid, "assistant", content, complete)


class _Refused(Exception):
    pass


def _ok(r: httpx.Response) -> dict:
    if r.status_code // 100 != 2:
        raise _Refused(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text[:100]}")
    return r.json()


def _failed(req: Request, why: str) -> Outcome:
    out = Outcome(req, time.monotonic())
    out.failure, out.detail = ("connection" if "Error" in why else "page-write"), why[:160]
    return out
