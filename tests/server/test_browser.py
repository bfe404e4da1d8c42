"""The chat page at `/` in real Chromium (Playwright), against a real `localspec serve` on the tiny models:
a draft identical to the target, so accepted drafts (and their colour) are certain. Every test ends with
no console error. Run by scripts/browser-check (CI), skipped here when Chromium or Playwright is missing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import THREADS

from harness.browserproc import Watched, chromium, expect, require_browser
from harness.serverproc import ROOT, ServerProcess

pytestmark = pytest.mark.browser
WAIT_MS = 60_000
HOSTILE = ('<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
           '[click](javascript:window.pwned=3) <b style="color:red" onclick="window.pwned=4">bold</b>')


@pytest.fixture(scope="module")
def browser():
    require_browser()
    with chromium() as b:
        yield b


def serve(tiny, home, *extra):
    return ServerProcess(["--target", str(tiny.target), "--draft", str(tiny.same), "--threads", str(THREADS),
                          "-c", "32768", "-n", "200", "--temperature", "0", "--spec", "on", *extra], home)


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    srv = serve(tiny, tmp_path_factory.mktemp("page-home"))
    yield srv
    assert srv.stop() == 0, srv.output()
    assert "Traceback" not in srv.output()


@pytest.fixture
def page(browser, server):
    context = browser.new_context()
    watched = Watched(context)
    watched.page.goto(server.url + "/")
    watched.page.wait_for_selector("#model:not(:empty)", timeout=WAIT_MS)
    yield watched
    context.close()
    assert watched.errors == []


def ask(page, text: str):
    """Send `text` as a person would (Enter) and wait for the reply to end; the reply's element."""
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    return finished(page)


def finished(page):
    """Waits until the newest reply has ended; tags it, so the next wait waits for a newer one."""
    page.wait_for_selector("article.assistant[data-done]:not([data-seen])", timeout=WAIT_MS)
    n = page.locator("article.assistant[data-seen]").count() + 1
    page.locator("article.assistant[data-done]:not([data-seen])").last.evaluate(f"el => {{ el.dataset.seen = '{n}'; }}")
    return page.locator(f"article.assistant[data-seen='{n}']")


def tinted(page, source: str) -> int:
    """Runs of the newest reply's text the page marked as coming from `source` (CSS highlight ranges)."""
    return page.evaluate("""(name) => {
        const h = CSS.highlights.get(name), body = [...document.querySelectorAll("article.assistant .body")].pop();
        return h && body ? [...h].filter((r) => body.contains(r.startContainer)).length : 0;
    }""", f"src-{source}")


def api(server, method: str, path: str, body=None):
    req = urllib.request.Request(server.url + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def test_a_prompt_streams_with_its_sources_coloured_and_its_figures(page):
    p = page.page
    reply = ask(p, "print hello world")
    assert tinted(p, "model") > 0  # accepted drafts of the draft model
    figures = reply.locator(".figures").inner_text()
    assert "tokens" in figures and "tok/s" in figures and "accepted" in figures, figures
    assert re.search(r"from \d+ draft model", figures), figures
    assert reply.locator("svg.chart polyline.speed").get_attribute("points")
    p.keyboard.press("Alt+t")  # the toggle: plain text, no colours
    assert tinted(p, "model") == 0
    p.keyboard.press("Alt+t")
    assert tinted(p, "model") > 0


def test_reload_keeps_the_conversation_and_the_history_lists_it(page, browser, server):
    p = page.page
    ask(p, "parse the csv file")
    url = p.url
    assert "#c=" in url
    p.reload()
    p.wait_for_selector("article.assistant[data-id]", timeout=WAIT_MS)
    assert p.locator("article.user .body").first.inner_text() == "parse the csv file"
    assert tinted(p, "model") > 0  # the sources were stored too
    other = browser.new_context()  # another browser: nothing kept in it, all on the server
    second = Watched(other)
    second.page.goto(server.url + "/")
    second.page.wait_for_selector("#conversations a:has-text('parse the csv file')", timeout=WAIT_MS)
    other.close()
    assert second.errors == []
    out = subprocess.run([sys.executable, "-m", "localspec", "history", "list"], cwd=ROOT, env=server.env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "parse the csv file" in out.stdout, out.stdout + out.stderr


def test_stop_cancels_the_answer_and_the_server_answers_the_next(page, server):
    p = page.page
    p.click("#settings-toggle")
    p.fill("#set-max_tokens", "20000")
    p.fill("#prompt", "hello")  # the tiny model's answer to it runs to the limit
    p.press("#prompt", "Enter")
    p.wait_for_selector("article.assistant[data-tokens]", timeout=WAIT_MS)
    p.click("#stop")
    reply = finished(p)
    assert "stopped" in reply.locator(".figures").inner_text()
    cid = p.url.split("#c=")[1]
    stored = api(server, "GET", f"/localspec/conversations/{cid}")["messages"][-1]
    assert stored["stop_reason"] == "cancelled" and len(stored["content"]) < 20000 * 3
    p.fill("#set-max_tokens", "16")
    p.locator("#set-max_tokens").dispatch_event("change")
    assert "tokens" in ask(p, "a model token").locator(".figures").inner_text()


def test_edit_resend_and_regenerate(page, server):
    p = page.page
    ask(p, "first question")
    p.locator("article.user .actions button:has-text('Edit')").last.click()
    assert p.input_value("#prompt") == "first question"
    expect(p.locator("article.msg")).to_have_count(0)
    ask(p, "second question")
    p.locator("article.assistant .actions button:has-text('Regenerate')").last.click()
    finished(p)
    cid = p.url.split("#c=")[1]
    stored = api(server, "GET", f"/localspec/conversations/{cid}")["messages"]
    assert [(m["role"], m["content"] if m["role"] == "user" else "") for m in stored] == [
        ("user", "second question"), ("assistant", "")]
    assert stored[1]["complete"] and stored[1]["content"]


def test_search_rename_and_delete_conversations(page, server):
    p = page.page
    ask(p, "the cache line")
    cid = p.url.split("#c=")[1]
    p.click("#new-chat")
    ask(p, "for line in file")
    p.fill("#search", "cache line")
    expect(p.locator("#conversations a")).to_have_count(1)
    p.click("#conversations a")
    p.wait_for_url(f"**#c={cid}")
    expect(p.locator("#title")).to_have_text("the cache line")
    p.click("#rename")
    p.keyboard.type("Caches, renamed")
    p.keyboard.press("Enter")
    expect(p.locator("#conversations a")).to_have_text(["Caches, renamed"])  # found by its messages
    p.fill("#search", "renamed")
    expect(p.locator("#conversations a")).to_have_text(["Caches, renamed"])  # and by its new title
    assert api(server, "GET", f"/localspec/conversations/{cid}")["title"] == "Caches, renamed"
    with p.expect_download() as saved:
        p.click("#export")
    assert saved.value.suggested_filename == f"conversation-{cid}.md"
    assert "the cache line" in Path(saved.value.path()).read_text()
    p.click("#delete")
    p.click("#delete")  # the second click confirms
    expect(p.locator("#conversations a")).to_have_count(0)
    assert "#c=" not in p.url and p.locator("article.msg").count() == 0
    with pytest.raises(urllib.error.HTTPError):
        api(server, "GET", f"/localspec/conversations/{cid}")


def test_keyboard_only(page):
    p = page.page
    p.focus("#prompt")
    p.keyboard.type("line one")
    p.keyboard.press("Shift+Enter")
    p.keyboard.type("line two")
    assert p.input_value("#prompt") == "line one\nline two"
    p.keyboard.press("Enter")
    finished(p)
    assert p.locator("article.user .body").inner_text() == "line one\nline two"
    p.keyboard.press("Control+k")
    assert p.evaluate("document.activeElement.id") == "search"


def test_hostile_content_stays_inert(page, server):
    conv = api(server, "POST", "/localspec/conversations", {"title": HOSTILE})
    cid = conv["id"]
    api(server, "POST", f"/localspec/conversations/{cid}/messages", {"role": "user", "content": HOSTILE})
    reply = api(server, "POST", f"/localspec/conversations/{cid}/messages", {"role": "assistant", "content": ""})
    api(server, "PATCH", f"/localspec/conversations/{cid}/messages/{reply['id']}", {
        "content": "Here:\n\n" + HOSTILE, "complete": True, "stop_reason": "eos",
        "provenance": [["target", "Here:\n\n"], ["model", HOSTILE]]})
    p = page.page
    p.goto(f"{server.url}/#c={cid}")
    p.wait_for_selector("article.assistant[data-id]", timeout=WAIT_MS)
    p.wait_for_selector("#conversations a:has-text('window.pwned')", timeout=WAIT_MS)
    assert p.evaluate("window.pwned") is None
    assert p.locator("#messages script, #messages img, #messages b, #messages [onerror], #messages [onclick], "
                     "#messages [style], #messages a[href^='javascript']").count() == 0
    assert p.locator("article.user .body").inner_text() == HOSTILE  # the user's text, shown as text
    shown = p.locator("article.assistant .body").inner_text()
    assert "<script>window.pwned = 1</script>" in shown and 'onerror="window.pwned = 2"' in shown, shown
    assert p.inner_text("#title") == HOSTILE


def test_files_attach_as_text_and_a_binary_is_refused(page, tmp_path):
    p = page.page
    (tmp_path / "notes.py").write_text("def parse(): pass\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02binary\xff")
    p.set_input_files("#attach", str(tmp_path / "blob.bin"))
    p.wait_for_selector("#banner:has-text('not a text file')")
    p.set_input_files("#attach", str(tmp_path / "notes.py"))
    p.wait_for_selector("#attachments button:has-text('notes.py')")
    ask(p, "explain this")
    assert "def parse(): pass" in p.locator("article.user .body").inner_text()


def test_edit_mode_sends_the_file_as_the_predicted_output(page, server, tmp_path):
    """The tiny model's answers are mostly byte tokens, whose text does not tokenize back the same: the
    prediction reaches the server and its figures show; its tokens accepted are the real pair's to show
    (scripts/webui-bench)."""
    body = {"messages": [{"role": "user", "content": "def parse csv"}], "max_tokens": 48}
    expected = api(server, "POST", "/v1/chat/completions", body)["choices"][0]["message"]["content"]
    (tmp_path / "edited.py").write_text(expected)
    p = page.page
    p.click("#settings-toggle")
    p.fill("#set-max_tokens", "48")
    p.click("#edit-mode summary")
    p.set_input_files("#prediction-file", str(tmp_path / "edited.py"))
    expect(p.locator("#prediction")).to_have_value(expected)
    reply = ask(p, "def parse csv")
    assert re.search(r"\d+ of the prediction's \d+ tokens accepted", reply.locator(".figures").inner_text())
    assert tinted(p, "ngram") > 0  # n-gram drafts from the text seen, accepted


def test_the_key_prompt(browser, tiny, tmp_path):
    srv = serve(tiny, tmp_path / "home", "--api-key", "sekrit")
    try:
        context = browser.new_context()
        w = Watched(context)
        w.page.goto(srv.url + "/")
        w.page.wait_for_selector("#key-dialog[open]")
        w.page.fill("#key-input", "wrong")
        w.page.click("#key-ok")
        w.page.wait_for_selector("#key-message:has-text('not accepted')")
        w.page.fill("#key-input", "sekrit")
        w.page.press("#key-input", "Enter")
        w.page.wait_for_selector("#model:not(:empty)", timeout=WAIT_MS)
        ask(w.page, "hello")
        context.close()
        # a refused key is a 401 answer, which Chromium reports in the console; nothing else may be there
        assert [e for e in w.errors if "401" not in e] == []
    finally:
        assert srv.stop() == 0


def test_the_picker_chooses_among_the_servers_models(browser, tiny, tmp_path):
    """A server with several models: the page lists them, and the one picked answers (loaded on demand)."""
    import shutil

    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(tiny.target, models / "alpha.gguf")
    shutil.copy(tiny.bad, models / "beta.gguf")
    srv = ServerProcess(["--models-dir", str(models), "--threads", str(THREADS), "-c", "1024", "-n", "24",
                         "--temperature", "0"], tmp_path / "home")
    context = browser.new_context()
    try:
        watched = Watched(context)
        page = watched.page
        page.goto(srv.url + "/")
        page.wait_for_selector("#model-pick:not([hidden])", timeout=WAIT_MS)
        assert page.locator("#model-pick option").all_inner_texts() == ["alpha", "beta (unloaded)"]
        page.select_option("#model-pick", "beta")
        expect(page.locator("#model")).to_have_text(re.compile(r"^beta"))
        reply = ask(page, "hello world")
        expect(reply.locator(".body")).not_to_be_empty()
        loaded = {m["id"]: m["status"]["value"] for m in api(srv, "GET", "/v1/models")["data"]}
        assert loaded["beta"] == "loaded"
        cid = page.evaluate("location.hash").split("=")[1]
        assert api(srv, "GET", f"/localspec/conversations/{cid}")["pair"] == "beta"
        page.click("#new-chat")  # a new chat with alpha, then back: the picker follows the conversation
        page.select_option("#model-pick", "alpha")
        expect(page.locator("#model")).to_have_text(re.compile(r"^alpha"))
        page.goto(srv.url + f"/#c={cid}")
        expect(page.locator("#model-pick")).to_have_value("beta")
        expect(page.locator("#model")).to_have_text(re.compile(r"^beta"))
        assert watched.errors == []
    finally:
        context.close()
        assert srv.stop() == 0, srv.output()
