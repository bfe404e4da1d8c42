"""`localspec history list | show | export` on a history written the way the chat app writes it."""

from __future__ import annotations

import json

import pytest

from localspec.cli import main
from localspec.history import HistoryStore


@pytest.fixture
def two_chats(localspec_home):
    s = HistoryStore()
    a = s.new_conversation(pair="tiny", target="/m/t.gguf", draft="/m/d.gguf", system="Be terse.")
    s.add_message(a, "user", "Write a haiku about caches")
    r = s.add_message(a, "assistant", "", complete=False)
    s.update_message(r, "Lines stay warm in L1", complete=True, stop_reason="eos", stats={"tokens": 6})
    b = s.new_conversation(pair="tiny")
    s.add_message(b, "user", "Explain a KV cache")
    r = s.add_message(b, "assistant", "", complete=False)
    s.update_message(r, "It keeps keys and", complete=False)  # the app was killed mid-reply
    s.close()
    return a, b


def test_list_newest_first(two_chats, capsys):
    a, b = two_chats
    assert main(["history", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["ID", "UPDATED", "MSGS", "TITLE"]
    assert "Explain a KV cache" in out[1] and "Write a haiku about caches" in out[2]
    assert main(["history"]) == 0  # `history` alone lists too
    assert "Explain a KV cache" in capsys.readouterr().out


def test_list_json(two_chats, capsys):
    a, b = two_chats
    assert main(["history", "list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [c["id"] for c in data] == [b, a]
    assert data[1]["n_messages"] == 2 and data[1]["system"] == "Be terse." and "messages" not in data[1]


def test_list_empty(localspec_home, capsys):
    assert main(["history", "list"]) == 0
    assert "no saved conversations" in capsys.readouterr().out
    assert main(["history", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_show(two_chats, capsys):
    a, b = two_chats
    assert main(["history", "show", str(a)]) == 0
    out = capsys.readouterr().out
    assert "[system]\nBe terse." in out and "[you]\nWrite a haiku about caches" in out
    assert "[assistant]\nLines stay warm in L1" in out
    assert main(["history", "show", "last"]) == 0
    out = capsys.readouterr().out
    assert "It keeps keys and" in out and "cut off" in out


def test_export_md_and_json(two_chats, capsys, tmp_path):
    a, _ = two_chats
    assert main(["history", "export", str(a), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("# Write a haiku about caches") and "## Assistant\n\nLines stay warm in L1" in md
    assert main(["history", "export", str(a), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["id"] == a and [m["content"] for m in d["messages"]] == ["Write a haiku about caches",
                                                                      "Lines stay warm in L1"]
    assert d["messages"][1]["stats"] == {"tokens": 6}
    dest = tmp_path / "chat.md"
    assert main(["history", "export", str(a), "-o", str(dest)]) == 0
    assert dest.read_text(encoding="utf-8") == md
    assert str(dest) in capsys.readouterr().err


@pytest.mark.parametrize("argv, needle", [
    (["history", "show", "42"], "no conversation 42"),
    (["history", "show", "abc"], "not a conversation id"),
    (["history", "export", "42", "--format", "md"], "no conversation 42"),
])
def test_bad_ids_are_one_line_errors(two_chats, capsys, argv, needle):
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert needle in err and err.startswith("error: ") and "Traceback" not in err


def test_bad_format_and_unwritable_output(two_chats, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["history", "export", "1", "--format", "pdf"])
    assert e.value.code == 2
    capsys.readouterr()
    assert main(["history", "export", "1", "-o", str(tmp_path / "no" / "such" / "dir" / "x.md")]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err


def test_show_last_without_history(localspec_home, capsys):
    assert main(["history", "show", "last"]) != 0
    assert "no saved conversations" in capsys.readouterr().err
