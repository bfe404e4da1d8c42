"""`localspec chat` driven by Textual's Pilot against the tiny GGUF models (real llama.cpp).

The tiny models answer with gibberish bytes, so the tests assert on structure: a reply streams
in, the status bar fills, settings change, rows land in SQLite. Every wait is a bounded poll of
a condition (`wait_until`), never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3

import pytest
from chatkit import SIZE, notices, send, status_text, wait_until
from conftest import THREADS

from localspec import paths
from localspec.chat.app import ChatApp
from localspec.chat.status import DRAFT_STYLE, TARGET_STYLE
from localspec.chat.widgets import (
    AssistantMessage,
    Notice,
    PromptInput,
    UserMessage,
    printable,
    provenance_content,
)
from localspec.commands.chat import parse_chat_args


def chat_app(tiny, *extra: str, draft: str | None = "same", target: str | None = None) -> ChatApp:
    argv = ["--target", str(target or tiny.target), "--threads", str(THREADS), "--ctx-size", "1024",
            "--temperature", "0", "--spec", "on"]
    if draft:
        argv += ["--draft", str(getattr(tiny, draft))]
    return ChatApp(parse_chat_args([*argv, *extra]))


async def ready(pilot, app: ChatApp) -> None:
    await wait_until(pilot, lambda: not app.loading, "the models to load")
    assert app.engine is not None, f"load failed: {app.load_error}"


async def command(pilot, app: ChatApp, line: str) -> str:
    """Type a slash command, press Enter, and return the notice it answers with."""
    before = list(app.query(Notice))[-1]
    app.query_one(PromptInput).load_text(line)
    await pilot.press("enter")
    await wait_until(pilot, lambda: list(app.query(Notice))[-1] is not before, f"the answer to {line}")
    return str(list(app.query(Notice))[-1].content)


def db_rows(sql: str, *args):
    con = sqlite3.connect(paths.history_db())
    con.row_factory = sqlite3.Row
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def run(coro):
    return asyncio.run(coro)


def test_prompt_streams_a_reply_and_fills_the_status_bar(tiny):
    async def go():
        app = chat_app(tiny)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            assert "/spec on|off|auto" in notices(app, "banner")[0]  # commands listed at start-up
            await pilot.press(*"hello world")
            await pilot.press("enter")
            await wait_until(pilot, lambda: not app.generating and app.last_reply, "a reply")
            view = list(app.query(AssistantMessage))[-1]
            assert [str(u.content) for u in app.query(UserMessage)] == ["hello world"]
            assert view.text == app.last_reply and view.runs and view.stream is None
            assert "".join(t for t, _ in view.runs) == view.text
            assert view.md.source == printable(app.last_reply)  # one full Markdown update at the end
            st = app.last_stats
            assert st.tokens > 0 and st.stop_reason in ("eos", "length", "context")
            bar = status_text(app)
            # this machine's first measurements, in a word while they are not done (costs/idle.py)
            assert re.search(r"spec on k=4 temp=0 │ (measuring │ |measure pending │ |measure later │ )?[0-9.]+ tok/s │ "
                             r"accept [0-9]+% │ mean acc len [0-9.]+ │ [0-9.]+ passes/tok", bar), bar
            assert "tok/s" in str(view.note.content)  # the footnote under the reply
            assert [m.role for m in app.conversation.turns] == ["user", "assistant"]
    run(go())


def test_input_box_enter_newline_empty_and_recall(tiny):
    async def go():
        app = chat_app(tiny)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            box = app.query_one(PromptInput)
            await pilot.press("enter")  # empty input is ignored
            await pilot.press("space", "space", "enter")
            assert not app.query(UserMessage) and not app.generating
            box.clear()
            await pilot.press("a", "ctrl+j", "b")  # ctrl+j: a newline, not a send
            assert box.text == "a\nb" and not app.query(UserMessage)
            await pilot.press("enter")
            await wait_until(pilot, lambda: not app.generating and app.last_reply, "a reply")
            assert [str(u.content) for u in app.query(UserMessage)] == ["a\nb"]
            assert box.text == ""
            await pilot.press("up")  # the previous prompt comes back
            assert box.text == "a\nb"
            await pilot.press("down", "down")  # past the newest: back to the (empty) draft
            assert box.text == ""
    run(go())


def test_escape_cancels_mid_reply_and_keeps_what_was_confirmed(tiny):
    async def go():
        # greedy "the the" with the identical draft never emits EOS: it runs until the context is full
        # (a 4,096-token context filled in under 3 s without flash attention, before Esc could land)
        app = chat_app(tiny, "--ctx-size", "32768", "--max-tokens", "100000")
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            app.query_one(PromptInput).load_text("the the")
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.current is not None and app.current.view.text,
                             "confirmed text to stream in")
            streaming_view = app.current.view
            assert app.generating and streaming_view.streaming  # text on screen before the reply ends
            await pilot.press("escape")
            await wait_until(pilot, lambda: not app.generating, "the cancel to land")
            st = app.last_stats
            assert st.stop_reason == "cancelled", st.stop_reason
            assert 0 < st.tokens < 32000
            assert app.last_reply and streaming_view.text == app.last_reply
            assert "cancelled" in str(streaming_view.note.content) and "cancelled" in status_text(app)
        row = db_rows("SELECT * FROM messages WHERE role = 'assistant'")[0]
        assert row["stop_reason"] == "cancelled" and row["complete"] == 1
        assert row["content"] == app.last_reply
    run(go())


def test_slash_commands_change_settings(tiny):
    async def go():
        app = chat_app(tiny)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)

            async def cmd(line: str) -> str:
                return await command(pilot, app, line)

            assert "k = 2" in await cmd("/k 2") and app.cfg.draft_max == 2 and "k=2" in status_text(app)
            assert "temperature = 0.5" in await cmd("/temp 0.5") and app.cfg.temperature == 0.5
            assert "system prompt set" in await cmd("/system Answer briefly.") and app.conversation.system == "Answer briefly."
            assert "Answer briefly." in await cmd("/system")
            assert "/k N" in await cmd("/help") and "/copy" in await cmd("/help")
            assert "no reply yet" in await cmd("/stats")
            assert "nothing to copy" in await cmd("/copy")
            # bad input: a message, no change
            assert "whole number" in await cmd("/k many") and app.cfg.draft_max == 2
            assert "on, off or auto" in await cmd("/spec sometimes") and app.cfg.spec == "on"
            assert "unknown command" in await cmd("/frobnicate")
            assert "plain" in await cmd("/spec off") and app.cfg.spec == "off"

            await cmd("/temp 0")
            view = await send(pilot, app, "hello world")
            st = app.last_stats
            assert st.spec_mode == "off" and st.drafted == 0 and set(st.tokens_by_source) <= {"target"}
            assert "plain decoding" in status_text(app)
            assert "last reply" in await cmd("/stats")
            await pilot.press("ctrl+y")  # the copy key: OSC 52 through the app's clipboard
            assert app.clipboard == view.text
            out = await cmd("/copy")
            copies = list(paths.copies_dir().glob("*.md"))
            assert len(copies) == 1 and str(copies[0]) in out
            assert copies[0].read_text(encoding="utf-8").rstrip("\n") == view.text.rstrip("\n")
            assert "#1" in await cmd("/history")
            assert "screen cleared" in await cmd("/clear")
            assert not app.query(AssistantMessage) and len(app.conversation.turns) == 2  # the model still remembers
            assert "new conversation" in await cmd("/new")
            assert app.conversation.turns == [] and app.conversation.id is None
            assert "continuing conversation #1" in await cmd("/history 1")  # reopen it
            assert len(app.conversation.turns) == 2 and app.conversation.id == 1 and len(app.query(AssistantMessage)) == 1
        conv = db_rows("SELECT * FROM conversations")[0]
        assert conv["system"] == "Answer briefly."
        assert json.loads(conv["settings"])["spec"] == "off"
    run(go())


def test_provenance_toggle_colours_draft_and_target_tokens(tiny):
    async def go():
        app = chat_app(tiny)  # identical draft: most tokens are accepted drafts, the rest the target's
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            view = await send(pilot, app, "write the code")
            sources = {s for _, s in view.runs}
            assert "target" in sources and sources & {"model", "ngram"}
            assert view.md.display and not view.prov.display
            await pilot.press("ctrl+t")
            assert app.provenance and view.prov.display and not view.md.display
            assert "■ draft" in status_text(app) and "■ target" in status_text(app)
            content = view.prov.content
            styles = {str(s.style) for s in content.spans}
            assert DRAFT_STYLE in styles and TARGET_STYLE in styles
            assert content.plain == provenance_content(view.runs).plain
            # a reply streamed while the toggle is on is coloured as it arrives
            view2 = await send(pilot, app, "hello world")
            assert view2.prov.display and view2.prov.content.plain
            await pilot.press("ctrl+t")
            assert not app.provenance and view.md.display and not view.prov.display
    run(go())


def test_rows_in_sqlite_after_exit_and_continue_resumes(tiny):
    async def first():
        app = chat_app(tiny, "--system", "Be terse.", "--max-tokens", "64")
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await send(pilot, app, "hello world")
            return app.last_reply

    reply = run(first())
    assert db_rows("SELECT version FROM schema_migrations")[0]["version"] == 1
    conv = db_rows("SELECT * FROM conversations")
    assert len(conv) == 1 and conv[0]["title"] == "hello world" and conv[0]["system"] == "Be terse."
    msgs = db_rows("SELECT * FROM messages ORDER BY id")
    assert [m["role"] for m in msgs] == ["user", "assistant"]
    assert msgs[0]["content"] == "hello world"
    a = msgs[1]
    assert a["content"] == reply and a["complete"] == 1 and a["stop_reason"]
    assert json.loads(a["stats"])["tokens"] > 0
    assert "".join(t for _, t in json.loads(a["provenance"])) == reply

    async def second():
        app = chat_app(tiny, "--continue", "--max-tokens", "64")
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            assert app.conversation.id == conv[0]["id"] and app.conversation.system == "Be terse."
            assert [m.role for m in app.conversation.turns] == ["user", "assistant"]
            assert len(app.query(UserMessage)) == 1 and len(app.query(AssistantMessage)) == 1
            assert any("continuing conversation" in n for n in notices(app, "ok"))
            await send(pilot, app, "write the code")
            assert len(app.conversation.turns) == 4

    run(second())
    assert len(db_rows("SELECT * FROM conversations")) == 1
    assert len(db_rows("SELECT * FROM messages")) == 4


def test_incompatible_pair_is_reported_in_the_ui(tiny):
    async def go():
        app = chat_app(tiny, draft="other_vocab")
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: not app.loading, "the load to fail")
            assert app.engine is None
            err = "\n".join(notices(app, "error"))
            assert "not compatible" in err and "start `localspec chat` again" in err
            await pilot.press(*"hi", "enter")  # still responsive; the prompt is not lost
            await wait_until(pilot, lambda: any("not sent" in n for n in notices(app, "error")), "a refusal")
            assert app.query_one(PromptInput).text == "hi"
            await pilot.press("ctrl+q")
        assert app.return_code in (0, None)
    run(go())


def test_missing_model_is_reported_in_the_ui(tiny, tmp_path):
    async def go():
        app = chat_app(tiny, target=str(tmp_path / "nowhere.gguf"), draft=None)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: not app.loading, "the load to fail")
            assert "not found" in "\n".join(notices(app, "error"))
            assert "no model" in status_text(app)
    run(go())


def test_a_template_that_refuses_the_conversation_gives_the_prompt_back(tiny):
    async def go():
        app = chat_app(tiny, "--chat-template", "{{ raise_exception('no conversation today') }}", draft=None)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            box = app.query_one(PromptInput)
            box.load_text("hello world")
            await pilot.press("enter")
            await wait_until(pilot, lambda: any("not answered" in n for n in notices(app, "error")),
                             "the template error")
            assert not app.generating and app.conversation.turns == [] and box.text == "hello world"
            assert not app.query(AssistantMessage)
        assert db_rows("SELECT COUNT(*) AS n FROM messages")[0]["n"] == 0
    run(go())


def test_tiny_terminal_still_works(tiny):
    async def go():
        app = chat_app(tiny)
        async with app.run_test(size=(30, 8)) as pilot:
            await ready(pilot, app)
            view = await send(pilot, app, "hello world")
            assert view.text and app.last_stats.tokens > 0
            await pilot.press("ctrl+t")
            await wait_until(pilot, lambda: app.provenance, "the provenance view")
            assert "■ draft" in status_text(app) and view.show_provenance
            await pilot.press("ctrl+t")
            await wait_until(pilot, lambda: not app.provenance, "the plain view")
            assert "■ draft" not in status_text(app) and not view.show_provenance
    run(go())


def test_spec_auto_measures_costs_and_estimates_the_speedup(tiny, monkeypatch):
    from localspec.chat import workers

    # figures are kept only from a quiet machine (test_units: a busy one's are dropped); this test runs anywhere
    monkeypatch.setattr(workers, "quiet_watch", lambda: lambda: False)

    async def go():
        app = chat_app(tiny, "--spec", "auto")
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            assert app.engine.profile is None  # ready without measuring: nobody waits for it
            first = await send(pilot, app, "write the code")
            stats = app.last_stats  # the first reply: drafts priced by the reference curve ...
            assert first.text and stats.spec_mode == "auto" and "T_verify/T_decode = 1.00, 1.80" in stats.policy
            assert app.engine.profile is not None  # ... and the pass costs are measured right after it
            assert list(paths.profiles_dir().glob("*.json"))
            await send(pilot, app, "write the code")
            assert app.last_stats.spec_mode == "auto"
            bar = status_text(app)
            # a profile measured on a busy machine can be implausible; the bar says so instead of guessing
            assert re.search(r"≈[0-9.]+× vs plain \(est\.\)|speedup n/a \(noisy cost profile", bar), bar
    run(go())


def test_estimated_speedup_from_rounds_and_pass_costs():
    from localspec.costs.costmodel import CostProfile
    from localspec.costs.predictions import estimated_speedup
    from localspec.stats import Stats

    prof = CostProfile(t_decode=1.0, t_verify=[1.0, 1.5, 2.0, 2.5, 3.0], t_draft=0.1)
    st = Stats()
    for _ in range(4):  # 4 rounds drafting 4 tokens with the draft model, 3 accepted: 4 tokens each
        st.add_round("model", 4, 3, 0.0, 0.0)
        for _ in range(4):
            st.add_token("model")
    st.add_round("target", 0, 0, 0.0, 0.0)  # one plain step
    st.add_token("target")
    # cost = 4 * (verify(5) + 4 * t_draft) + verify(1) = 4 * 3.4 + 1 = 14.6 decodes for 17 tokens
    assert estimated_speedup(st, prof) == pytest.approx(17 / 14.6)
    assert estimated_speedup(st, None) is None
    noisy = CostProfile(t_decode=0.25, t_verify=[0.25, 0.0002, 0.0002], t_draft=0.0001)
    assert estimated_speedup(st, noisy) is None


def test_a_damaged_history_file_does_not_stop_the_chat(tiny):
    paths.history_db().parent.mkdir(parents=True, exist_ok=True)
    paths.history_db().write_bytes(b"not a database " * 200)

    async def go():
        app = chat_app(tiny)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            assert any("without saved history" in n for n in notices(app, "error"))
            view = await send(pilot, app, "hello world")
            assert view.text and app.store is None
    run(go())


def test_a_message_typed_while_loading_is_shown_and_sent_when_ready(tiny, monkeypatch):
    import threading

    from localspec.chat import workers

    gate = threading.Event()
    real_open = workers._open

    def slow_open(*a, **kw):
        gate.wait(30)
        return real_open(*a, **kw)

    monkeypatch.setattr(workers, "_open", slow_open)

    async def go():
        app = chat_app(tiny)
        async with app.run_test(size=SIZE) as pilot:
            box = app.query_one(PromptInput)
            box.load_text("hello world")
            await pilot.press("enter")
            await wait_until(pilot, lambda: len(app.query(UserMessage)) == 1, "the message on screen")
            assert app.loading and box.text == "" and any("queued" in n for n in notices(app, "info"))
            gate.set()
            await ready(pilot, app)
            await wait_until(pilot, lambda: len(app.conversation.turns) == 2 and not app.generating, "the reply")
            assert [m.role for m in app.conversation.turns] == ["user", "assistant"] and app.conversation.turns[0].content == "hello world"
            assert len(app.query(UserMessage)) == 1 and list(app.query(AssistantMessage))[0].text
    run(go())


def test_two_hundred_turns_slide_through_a_small_context(tiny):
    import resource

    async def go():
        app = chat_app(tiny, "--ctx-size", "256", "-n", "12")
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            for i in range(5):
                await send(pilot, app, f"hello world {i}")
            rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            curve = []
            for i in range(5, 200):
                await send(pilot, app, f"the cache of the model {i}")
                if i % 50 == 49:
                    curve.append((i + 1, round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)))
            rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            print(f"peak RSS (MB) after turns: 5: {rss0 / 1024:.1f}, " + ", ".join(f"{t}: {m}" for t, m in curve))
            assert not notices(app, "error")
            assert app.conversation.sliding and sum("leave the model's context" in n for n in notices(app, "info")) <= 1  # said once
            assert len(app.conversation.turns) < 400  # the model sees the recent turns only
            assert len(app.query(UserMessage)) + len(app.query(AssistantMessage)) <= 200  # the screen keeps the newest
            assert (rss1 - rss0) / 1024 < 50, f"peak RSS grew {(rss1 - rss0) / 1024:.1f} MB over 195 turns"
            return app.conversation.id
    cid = run(go())
    assert db_rows("SELECT COUNT(*) AS n FROM messages WHERE conversation_id = ?", cid)[0]["n"] == 400


def test_a_conversation_the_page_started_opens_with_its_sources(tiny):
    """The server's page writes the history through its conversations API; `/history ID` continues it."""
    from starlette.testclient import TestClient

    from localspec.server.app import create_app
    from localspec.server.state import ServerState

    page = TestClient(create_app(ServerState()), base_url="http://127.0.0.1:8012")
    cid = page.post("/localspec/conversations", json={"system": "Be brief."}).json()["id"]
    page.post(f"/localspec/conversations/{cid}/messages", json={"role": "user", "content": "name a cache"})
    mid = page.post(f"/localspec/conversations/{cid}/messages",
                    json={"role": "assistant", "content": "", "complete": False}).json()["id"]
    page.patch(f"/localspec/conversations/{cid}/messages/{mid}", json={
        "content": "the L1 cache", "complete": True, "stop_reason": "eos",
        "provenance": [["target", "the "], ["model", "L1 cache"]], "stats": {"tokens": 3}})

    async def go():
        app = chat_app(tiny)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            box = app.query_one(PromptInput)
            box.load_text(f"/history {cid}")
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.conversation.id == cid, "the page's conversation")
            view = list(app.query(AssistantMessage))[-1]
            assert view.text == "the L1 cache" and ("L1 cache", "model") in view.runs
            assert app.conversation.system == "Be brief." and [t.role for t in app.conversation.turns] == ["user", "assistant"]
    run(go())


def test_model_switches_to_another_model_on_this_machine(tiny):
    """`/models` lists the data root's models; `/model NAME` loads that one and the conversation goes on."""
    import shutil

    models = paths.ensure(paths.models_dir())
    shutil.copy(tiny.target, models / "alpha.gguf")
    shutil.copy(tiny.bad, models / "beta.gguf")

    async def go():
        app = chat_app(tiny, draft=None, target=str(models / "alpha.gguf"))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)

            async def cmd(line: str) -> str:
                return await command(pilot, app, line)

            listed = await cmd("/models")
            assert "alpha  (n-gram drafts" in listed and "◀ this one" in listed.split("alpha")[1].split("\n")[0]
            assert "beta  (n-gram drafts" in listed
            assert "no model 'gamma'" in await cmd("/model gamma")
            first = (await send(pilot, app, "hello world")).text
            await cmd("/model beta")
            await ready(pilot, app)
            assert app.sel.target == str(models / "beta.gguf") and len(app.conversation.turns) == 2
            second = (await send(pilot, app, "hello world")).text
            assert second and second != first  # another model's answer, the conversation carried on
            assert "model: beta.gguf;" in await cmd("/model")
    run(go())
