"""Conversation history in SQLite (stdlib `sqlite3`), in the data dir (`paths.history_db()`): the chat
app, `localspec history` and the server's page (`server/page/conversations_api.py`) share it.

Every message is written when it is sent or confirmed: the user's message when Enter is pressed,
the assistant's row when its reply starts, then updated with the confirmed text every ~0.5 s and
once more at the end (`complete = 1`, with the reply's stats). A crash or `kill -9` therefore
loses at most the last half second of the reply in flight. WAL journaling keeps readers
(`localspec history list` in another terminal) from blocking the chat, and each write commits.

Schema changes are numbered migrations; the ones applied are recorded in `schema_migrations`.
One connection, shared by the UI thread and the generation worker behind a lock.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from . import paths
from .errors import LocalspecError

MIGRATIONS: list[tuple[int, str, str]] = [
    (1, "conversations and messages", """
        CREATE TABLE conversations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL DEFAULT '',
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            pair TEXT,                      -- pair name (or the target path when given directly)
            target TEXT,                    -- target GGUF path
            draft TEXT,                     -- draft GGUF path (NULL: none)
            system TEXT,                    -- current system prompt (NULL: none)
            settings TEXT NOT NULL DEFAULT '{}'  -- JSON: k, temperature, spec, ...
        );
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            content TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            complete INTEGER NOT NULL DEFAULT 1,  -- 0 while a reply is streaming (or was cut off)
            stop_reason TEXT,                     -- eos | length | stop | cancelled | context | error
            error TEXT,                           -- why a reply failed mid-way
            stats TEXT,                           -- JSON: Stats.to_dict() of the reply
            provenance TEXT                       -- JSON: [[source, text], ...] runs of the reply
        );
        CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
        CREATE INDEX conversations_by_update ON conversations(updated_at);
    """),
]


class HistoryError(LocalspecError):
    pass


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class StoredMessage:
    id: int
    role: str
    content: str
    created_at: str
    complete: bool = True
    stop_reason: str | None = None
    error: str | None = None
    stats: dict | None = None
    provenance: list[list[str]] | None = None  # [[source, text], ...]

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("id", "role", "content", "created_at", "complete",
                                               "stop_reason", "error", "stats", "provenance")}


@dataclass
class Conversation:
    id: int
    title: str
    created_at: str
    updated_at: str
    pair: str | None = None
    target: str | None = None
    draft: str | None = None
    system: str | None = None
    settings: dict = field(default_factory=dict)
    n_messages: int = 0
    messages: list[StoredMessage] = field(default_factory=list)

    def to_dict(self, with_messages: bool = True) -> dict:
        d = {k: getattr(self, k) for k in ("id", "title", "created_at", "updated_at", "pair", "target",
                                            "draft", "system", "settings", "n_messages")}
        if with_messages:
            d["messages"] = [m.to_dict() for m in self.messages]
        return d


def title_from(text: str, width: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


class HistoryStore:
    """The conversation log. Thread-safe: every call takes the lock and commits."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else paths.history_db()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=10)
        except (OSError, sqlite3.Error) as e:
            raise HistoryError(f"cannot open chat history {self.path} ({e}); check LOCALSPEC_HOME "
                               "points to a writable folder") from e
        self._conn.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: each commit survives kill -9
            self._conn.execute("PRAGMA foreign_keys=ON")
            self.migrate()
        except sqlite3.DatabaseError as e:
            self._conn.close()
            raise HistoryError(f"{self.path} is not a usable chat history ({e}); move it aside and "
                               "localspec starts a new one") from e

    # --- schema ---------------------------------------------------------------------------------
    def migrate(self) -> list[int]:
        """Apply the migrations not yet recorded; return their versions."""
        with self._lock:
            self._conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations ("
                               "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
            self._conn.commit()
            done = {r[0] for r in self._conn.execute("SELECT version FROM schema_migrations")}
            known = {v for v, _, _ in MIGRATIONS}
            if done - known:
                raise HistoryError(f"{self.path} was written by a newer localspec (schema "
                                   f"{max(done)}); upgrade localspec to read it")
            applied = []
            for version, name, sql in MIGRATIONS:
                if version in done:
                    continue
                try:
                    self._conn.execute("BEGIN")
                    for stmt in _statements(sql):
                        self._conn.execute(stmt)
                    self._conn.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (version, name, now()))
                    self._conn.execute("COMMIT")
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                applied.append(version)
            return applied

    def schema_version(self) -> int:
        with self._lock:
            row = self._conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
            return row[0] or 0

    # --- writing --------------------------------------------------------------------------------
    def new_conversation(self, pair: str | None = None, target: str | None = None, draft: str | None = None,
                         system: str | None = None, settings: dict | None = None, title: str = "") -> int:
        t = now()
        with self._lock, self._conn:
            cur = self._conn.execute(
                "INSERT INTO conversations (title, created_at, updated_at, pair, target, draft, system, settings)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (title, t, t, pair, target, draft, system, json.dumps(settings or {})))
            return int(cur.lastrowid)

    def update_conversation(self, cid: int, *, system=..., settings: dict | None = None,
                            title: str | None = None) -> None:
        """Change what is given; `system=None` removes the system prompt, leaving it out keeps it."""
        sets, args = ["updated_at = ?"], [now()]
        if system is not ...:
            sets.append("system = ?")
            args.append(system)
        if settings is not None:
            sets.append("settings = ?")
            args.append(json.dumps(settings))
        if title is not None:
            sets.append("title = ?")
            args.append(title)
        with self._lock, self._conn:
            self._conn.execute(f"UPDATE conversations SET {', '.join(sets)} WHERE id = ?", (*args, cid))

    def add_message(self, cid: int, role: str, content: str, complete: bool = True) -> int:
        t = now()
        with self._lock, self._conn:
            cur = self._conn.execute(
                "INSERT INTO messages (conversation_id, role, content, created_at, updated_at, complete)"
                " VALUES (?, ?, ?, ?, ?, ?)", (cid, role, content, t, t, int(complete)))
            self._conn.execute("UPDATE conversations SET updated_at = ?,"
                               " title = CASE WHEN title = '' AND ? = 'user' THEN ? ELSE title END WHERE id = ?",
                               (t, role, title_from(content), cid))
            return int(cur.lastrowid)

    def update_message(self, mid: int, content: str, *, complete: bool = False, stop_reason: str | None = None,
                       error: str | None = None, stats: dict | None = None,
                       provenance: list | None = None) -> None:
        t = now()
        with self._lock, self._conn:
            self._conn.execute(
                "UPDATE messages SET content = ?, updated_at = ?, complete = ?, stop_reason = ?, error = ?,"
                " stats = COALESCE(?, stats), provenance = COALESCE(?, provenance) WHERE id = ?",
                (content, t, int(complete), stop_reason, error,
                 json.dumps(stats) if stats is not None else None,
                 json.dumps(provenance, ensure_ascii=False) if provenance is not None else None, mid))
            self._conn.execute("UPDATE conversations SET updated_at = ? WHERE id ="
                               " (SELECT conversation_id FROM messages WHERE id = ?)", (t, mid))

    def delete_message(self, mid: int) -> None:
        with self._lock, self._conn:
            self._conn.execute("DELETE FROM messages WHERE id = ?", (mid,))

    def has_message(self, cid: int, mid: int) -> bool:
        with self._lock:
            return self._conn.execute("SELECT 1 FROM messages WHERE id = ? AND conversation_id = ?",
                                      (mid, cid)).fetchone() is not None

    def delete_messages_from(self, cid: int, mid: int) -> int:
        """Drop message `mid` of conversation `cid` and every later one (an edit resent, a reply
        regenerated); how many went."""
        with self._lock, self._conn:
            cur = self._conn.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?", (cid, mid))
            self._conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now(), cid))
            return cur.rowcount

    def delete_conversation(self, cid: int) -> None:
        with self._lock, self._conn:
            self._conn.execute("DELETE FROM conversations WHERE id = ?", (cid,))

    # --- reading --------------------------------------------------------------------------------
    def list_conversations(self, limit: int | None = None, search: str = "") -> list[Conversation]:
        """Newest first; `search`: only those whose title or a message contains it (any case)."""
        sql, args = ("SELECT c.*, (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id) AS n"
                     " FROM conversations c"), []
        if search:
            like = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            sql += (" WHERE c.title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m"
                    " WHERE m.conversation_id = c.id AND m.content LIKE ? ESCAPE '\\')")
            args = [like, like]
        sql += " ORDER BY c.updated_at DESC, c.id DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        with self._lock:
            return [_conversation(r) for r in self._conn.execute(sql, args)]

    def last_conversation_id(self) -> int | None:
        with self._lock:
            # the conversation of the newest message (row ids only grow; clocks can tie or step back)
            row = self._conn.execute("SELECT conversation_id FROM messages ORDER BY id DESC LIMIT 1").fetchone()
        return int(row[0]) if row else None

    def get(self, cid: int) -> Conversation:
        with self._lock:
            row = self._conn.execute(
                "SELECT c.*, (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id) AS n"
                " FROM conversations c WHERE c.id = ?", (cid,)).fetchone()
            if row is None:
                raise HistoryError(f"no conversation {cid}; `localspec history list` shows the ids")
            conv = _conversation(row)
            conv.messages = [_message(r) for r in self._conn.execute(
                "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (cid,))]
        return conv

    def recent_prompts(self, limit: int = 200) -> list[str]:
        """The user's last prompts, oldest first (for up/down recall in the input box)."""
        with self._lock:
            rows = self._conn.execute("SELECT content FROM messages WHERE role = 'user' ORDER BY id DESC LIMIT ?",
                                      (limit,)).fetchall()
        return [r[0] for r in reversed(rows)]

    def close(self) -> None:
        with self._lock:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass


def _statements(sql: str) -> list[str]:
    out = []
    for part in sql.split(";"):
        lines = [ln.split("--", 1)[0].rstrip() for ln in part.splitlines()]
        stmt = "\n".join(ln for ln in lines if ln.strip())
        if stmt.strip():
            out.append(stmt)
    return out


def _conversation(r: sqlite3.Row) -> Conversation:
    try:
        settings = json.loads(r["settings"] or "{}")
    except ValueError:
        settings = {}
    return Conversation(id=r["id"], title=r["title"], created_at=r["created_at"], updated_at=r["updated_at"],
                        pair=r["pair"], target=r["target"], draft=r["draft"], system=r["system"],
                        settings=settings, n_messages=r["n"])


def _message(r: sqlite3.Row) -> StoredMessage:
    def js(v):
        try:
            return json.loads(v) if v else None
        except ValueError:
            return None

    return StoredMessage(id=r["id"], role=r["role"], content=r["content"], created_at=r["created_at"],
                         complete=bool(r["complete"]), stop_reason=r["stop_reason"], error=r["error"],
                         stats=js(r["stats"]), provenance=js(r["provenance"]))


# --- export -------------------------------------------------------------------------------------
def to_markdown(conv: Conversation) -> str:
    lines = [f"# {conv.title or f'Conversation {conv.id}'}", ""]
    meta = [f"conversation {conv.id}", f"started {conv.created_at}"]
    if conv.pair:
        meta.append(f"pair {conv.pair}")
    lines += ["_" + " · ".join(meta) + "_", ""]
    if conv.system:
        lines += ["**System:**", "", conv.system, ""]
    for m in conv.messages:
        who = {"user": "You", "assistant": "Assistant", "system": "System"}.get(m.role, m.role)
        lines += [f"## {who}", "", m.content.rstrip(), ""]
        note = message_note(m)
        if note:
            lines += [f"_{note}_", ""]
    return "\n".join(lines).rstrip() + "\n"


def message_note(m: StoredMessage) -> str:
    """A short remark for a reply that did not end normally (empty when it did)."""
    if m.role != "assistant":
        return ""
    if m.error:
        return f"(reply failed: {m.error})"
    if not m.complete:
        return "(reply cut off: localspec stopped while it was being written)"
    return {"cancelled": "(cancelled)", "length": "(stopped at the token limit)",
            "context": "(stopped: the context is full)"}.get(m.stop_reason or "", "")


def to_json(conv: Conversation) -> str:
    return json.dumps(conv.to_dict(), indent=2, ensure_ascii=False) + "\n"
