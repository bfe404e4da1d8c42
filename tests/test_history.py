"""The chat history store: migrations, writes as messages arrive, survival of kill -9, export."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from localspec import paths
from localspec.history import (
    MIGRATIONS,
    HistoryError,
    HistoryStore,
    to_json,
    to_markdown,
)


def test_migrations_are_recorded_and_applied_once(tmp_path):
    db = tmp_path / "h.db"
    s = HistoryStore(db)
    assert s.schema_version() == max(v for v, _, _ in MIGRATIONS)
    assert s.migrate() == []  # nothing left to apply
    s.close()
    con = sqlite3.connect(db)
    rows = con.execute("SELECT version, name FROM schema_migrations").fetchall()
    assert [r[0] for r in rows] == [v for v, _, _ in MIGRATIONS]
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"conversations", "messages", "schema_migrations"} <= tables
    con.close()
    HistoryStore(db).close()  # reopening an up-to-date file changes nothing


def test_a_newer_schema_is_refused_with_a_next_step(tmp_path):
    db = tmp_path / "h.db"
    HistoryStore(db).close()
    con = sqlite3.connect(db)
    con.execute("INSERT INTO schema_migrations VALUES (99, 'future', '2099-01-01')")
    con.commit()
    con.close()
    with pytest.raises(HistoryError, match="newer localspec"):
        HistoryStore(db)


def test_not_a_database_is_reported(tmp_path):
    db = tmp_path / "h.db"
    db.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(HistoryError, match="not a usable chat history"):
        HistoryStore(db)


def test_default_location_is_the_data_dir(localspec_home):
    s = HistoryStore()
    assert s.path == paths.history_db() and s.path.parent == localspec_home
    s.close()


def test_messages_are_written_and_updated_in_place(tmp_path):
    s = HistoryStore(tmp_path / "h.db")
    cid = s.new_conversation(pair="tiny", target="/t.gguf", draft="/d.gguf", system="Be terse.",
                             settings={"k": 4})
    s.add_message(cid, "user", "Write a haiku\nabout caches")
    rid = s.add_message(cid, "assistant", "", complete=False)
    s.update_message(rid, "Cache lines", provenance=[["model", "Cache"], ["target", " lines"]])
    mid = s.get(cid).messages[1]
    assert (mid.content, mid.complete, mid.stats) == ("Cache lines", False, None)
    s.update_message(rid, "Cache lines warm", complete=True, stop_reason="eos", stats={"tokens": 3})
    conv = s.get(cid)
    assert conv.title == "Write a haiku about caches"  # from the first user message, on one line
    assert conv.system == "Be terse." and conv.settings == {"k": 4} and conv.n_messages == 2
    a = conv.messages[1]
    assert (a.content, a.complete, a.stop_reason, a.stats) == ("Cache lines warm", True, "eos", {"tokens": 3})
    assert a.provenance == [["model", "Cache"], ["target", " lines"]]  # kept from the earlier update
    s.update_conversation(cid, system=None, settings={"k": 2})
    conv = s.get(cid)
    assert conv.system is None and conv.settings == {"k": 2}
    assert s.recent_prompts() == ["Write a haiku\nabout caches"]
    assert s.last_conversation_id() == cid
    with pytest.raises(HistoryError, match="history list"):
        s.get(cid + 100)


def test_last_conversation_is_the_most_recently_updated_one_with_messages(tmp_path):
    s = HistoryStore(tmp_path / "h.db")
    a = s.new_conversation()
    s.add_message(a, "user", "first")
    b = s.new_conversation()
    s.add_message(b, "user", "second")
    s.new_conversation()  # empty: never the one to continue
    assert s.last_conversation_id() == b
    assert [c.id for c in s.list_conversations()] == [b + 1, b, a]  # newest first
    s.add_message(a, "user", "back to the first")
    assert s.last_conversation_id() == a


def test_kill_9_loses_at_most_the_reply_in_flight(tmp_path):
    """A process writing the way the chat app does, killed with SIGKILL mid-reply."""
    db = tmp_path / "h.db"
    code = textwrap.dedent(f"""
        import os, signal
        from localspec.history import HistoryStore
        s = HistoryStore({str(db)!r})
        cid = s.new_conversation()
        s.add_message(cid, "user", "hello")
        r = s.add_message(cid, "assistant", "", complete=False)
        s.update_message(r, "the first confirmed words", provenance=[["target", "the first confirmed words"]])
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    conv = HistoryStore(db).get(1)
    assert [(m.role, m.content, m.complete) for m in conv.messages] == [
        ("user", "hello", True), ("assistant", "the first confirmed words", False)]


def test_export_markdown_and_json(tmp_path):
    s = HistoryStore(tmp_path / "h.db")
    cid = s.new_conversation(pair="tiny", system="Be terse.")
    s.add_message(cid, "user", "hello")
    rid = s.add_message(cid, "assistant", "", complete=False)
    s.update_message(rid, "```python\nprint(1)\n```", complete=True, stop_reason="cancelled")
    conv = s.get(cid)
    md = to_markdown(conv)
    assert md.startswith("# hello\n") and "## You\n\nhello" in md and "```python\nprint(1)\n```" in md
    assert "**System:**" in md and "(cancelled)" in md
    d = json.loads(to_json(conv))
    assert d["id"] == cid and d["system"] == "Be terse."
    assert [m["role"] for m in d["messages"]] == ["user", "assistant"]
    assert d["messages"][1]["stop_reason"] == "cancelled"
