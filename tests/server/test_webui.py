"""The chat page's server side without a browser: `/` for browsers and for other clients, the page's files
(gzip, ETag, CSP, nothing outside static/), the shipped libraries held to their manifest, and the
conversations API over the history `localspec history` reads. The page itself: tests/server/test_browser.py."""

from __future__ import annotations

import gzip
import hashlib
import re

import pytest
from starlette.testclient import TestClient

from localspec.cli import main
from localspec.history import HistoryStore
from localspec.server.app import create_app
from localspec.server.page import webui
from localspec.server.state import ServerState

STATIC = webui.STATIC
HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}


def client(**kw) -> TestClient:
    return TestClient(create_app(ServerState(**kw)), base_url="http://127.0.0.1:8012")


def test_browsers_get_the_page_other_clients_ollamas_answer():
    c = client()
    page = c.get("/", headers=HTML)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert '<script type="module" src="/webui/app.js">' in page.text
    plain = c.get("/")
    assert plain.text == "Ollama is running" and plain.headers["content-type"].startswith("text/plain")
    assert c.head("/").status_code == 200


def test_no_webui_turns_the_page_off():
    c = client(webui=False)
    assert c.get("/", headers=HTML).text == "Ollama is running"
    r = c.get("/webui/app.js")
    assert r.status_code == 404 and "--no-webui" in r.json()["error"]["message"]


def test_the_page_has_no_inline_script_or_style():
    for path in STATIC.glob("*.html"):
        html = path.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", html), path
        assert not re.search(r"\s(on\w+|style)=", html), path
        assert "http://" not in html and "https://" not in html, f"{path}: everything comes from this server"


def test_files_are_gzipped_cached_by_etag_and_kept_inside_static():
    c = client()
    r = c.get("/webui/app.js", headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"
    assert r.headers["content-type"].startswith("text/javascript")
    assert r.text == (STATIC / "app.js").read_text()
    again = c.get("/webui/app.js", headers={"If-None-Match": r.headers["etag"]})
    assert again.status_code == 304
    for bad in ("/webui/../http.py", "/webui/%2e%2e/http.py", "/webui/vendor/MANIFEST", "/webui/nope.js",
                "/webui/..%2f..%2fhttp.py"):
        got = c.get(bad)
        assert got.status_code == 404, bad
        assert "error" in got.json()


def test_shipped_libraries_match_their_manifest():
    """scripts/webui-vendor wrote them from the npm registry; a hand edit shows here."""
    lines = (STATIC / "vendor" / "MANIFEST").read_text().split("\n")
    entries = [line.split() for line in lines if line.strip()]
    assert {e[0].rsplit("@", 1)[0] for e in entries} == {"marked", "dompurify", "@highlightjs/cdn-assets"}
    for pkg, name, digest in entries:
        assert hashlib.sha256((STATIC / "vendor" / name).read_bytes()).hexdigest() == digest, name
    shipped = {p.name for p in (STATIC / "vendor").iterdir()} - {"MANIFEST"}
    assert shipped == {e[1] for e in entries}
    assert any(name.endswith("LICENSE.txt") and pkg.startswith(lib) for pkg, name, _ in entries
               for lib in ("marked", "dompurify", "@highlightjs"))


def test_the_page_and_its_libraries_fit_300_kb_compressed():
    page = [p for p in STATIC.rglob("*") if p.suffix in (".html", ".js", ".mjs", ".css")]
    total = sum(len(gzip.compress(p.read_bytes(), 9)) for p in page)
    assert total <= 300 * 1024, total


# --- conversations ----------------------------------------------------------------------------------
BASE = "/localspec/conversations"


def test_a_conversation_from_the_page_is_in_the_shared_history(localspec_home, capsys):
    c = client()
    conv = c.post(BASE, json={"system": "Be terse.", "settings": {"temperature": 0.2, "k": 8}}).json()
    cid = conv["id"]
    assert conv["messages"] == [] and conv["settings"] == {"temperature": 0.2, "k": 8}
    user = c.post(f"{BASE}/{cid}/messages", json={"role": "user", "content": "Explain a KV cache"}).json()
    reply = c.post(f"{BASE}/{cid}/messages", json={"role": "assistant", "content": "", "complete": False}).json()
    runs = [["target", "It keeps "], ["ngram", "keys and values"]]
    r = c.patch(f"{BASE}/{cid}/messages/{reply['id']}", json={
        "content": "It keeps keys and values", "provenance": runs, "complete": True, "stop_reason": "eos",
        "stats": {"tokens": 5, "drafted": 4, "accepted": 3}})
    assert r.status_code == 200, r.text
    got = c.get(f"{BASE}/{cid}").json()
    assert got["title"] == "Explain a KV cache" and got["system"] == "Be terse."
    assert [m["role"] for m in got["messages"]] == ["user", "assistant"]
    assert got["messages"][1]["provenance"] == runs and got["messages"][1]["stats"]["accepted"] == 3
    assert main(["history", "list"]) == 0
    assert "Explain a KV cache" in capsys.readouterr().out
    store = HistoryStore()  # what the chat app's /history opens
    assert store.get(cid).messages[1].content == "It keeps keys and values"
    store.close()
    assert user["id"] < reply["id"]


def test_list_search_rename_truncate_delete(localspec_home):
    c = client()
    a = c.post(BASE, json={}).json()["id"]
    c.post(f"{BASE}/{a}/messages", json={"role": "user", "content": "parse a csv file"})
    b = c.post(BASE, json={"title": "about 100%_sure"}).json()["id"]
    m1 = c.post(f"{BASE}/{b}/messages", json={"role": "user", "content": "hello"}).json()["id"]
    c.post(f"{BASE}/{b}/messages", json={"role": "assistant", "content": "hi"})
    assert [x["id"] for x in c.get(BASE).json()["data"]] == [b, a]
    assert [x["id"] for x in c.get(BASE, params={"search": "CSV"}).json()["data"]] == [a]
    assert [x["id"] for x in c.get(BASE, params={"search": "100%_"}).json()["data"]] == [b]
    assert [x["id"] for x in c.get(BASE, params={"search": "%"}).json()["data"]] == [b]  # literal, not a wildcard
    assert c.patch(f"{BASE}/{a}", json={"title": "CSV parsing"}).json()["title"] == "CSV parsing"
    assert c.delete(f"{BASE}/{b}/messages/{m1}").json()["deleted"] == 2
    assert c.get(f"{BASE}/{b}").json()["messages"] == []
    assert c.delete(f"{BASE}/{a}").json() == {"id": a, "deleted": True}
    assert c.get(f"{BASE}/{a}").status_code == 404


def test_export_as_markdown_and_json(localspec_home):
    c = client()
    cid = c.post(BASE, json={"system": "Be terse."}).json()["id"]
    c.post(f"{BASE}/{cid}/messages", json={"role": "user", "content": "Explain a KV cache"})
    c.post(f"{BASE}/{cid}/messages", json={"role": "assistant", "content": "It keeps keys and values."})
    md = c.get(f"{BASE}/{cid}/export")
    assert md.headers["content-type"].startswith("text/markdown")
    assert md.headers["content-disposition"] == f'attachment; filename="conversation-{cid}.md"'
    assert md.text.startswith("# Explain a KV cache") and "## Assistant\n\nIt keeps keys and values." in md.text
    js = c.get(f"{BASE}/{cid}/export", params={"format": "json"}).json()
    assert js["system"] == "Be terse." and [m["role"] for m in js["messages"]] == ["user", "assistant"]
    assert c.get(f"{BASE}/{cid}/export", params={"format": "pdf"}).status_code == 400
    assert c.get(f"{BASE}/999/export").status_code == 404


@pytest.mark.parametrize("method,path,body,status,says", [
    ("get", BASE + "/999", None, 404, "no conversation 999"),
    ("get", BASE + "/abc", None, 404, "ids are whole numbers"),
    ("post", BASE, {"settings": 3}, 400, '"settings" must be an object'),
    ("post", BASE, {"title": "x" * 201}, 400, "at most 200"),
    ("post", BASE + "/{cid}/messages", {"role": "system", "content": "x"}, 400, '"role" must be'),
    ("post", BASE + "/{cid}/messages", {"role": "user", "content": 5}, 400, '"content" must be a string'),
    ("patch", BASE + "/{cid}/messages/99999", {"content": "x"}, 404, "has no message 99999"),
    ("patch", BASE + "/{cid}/messages/{mid}", {"provenance": [["model"]]}, 400, "[source, text] pairs"),
    ("patch", BASE + "/{cid}/messages/{mid}", {"stop_reason": "bored"}, 400, '"stop_reason" must be one of'),
    ("delete", BASE + "/{cid}/messages/99999", None, 404, "has no message"),
])
def test_bad_conversation_requests_get_one_clear_error(localspec_home, method, path, body, status, says):
    c = client()
    cid = c.post(BASE, json={}).json()["id"]
    mid = c.post(f"{BASE}/{cid}/messages", json={"role": "user", "content": "hi"}).json()["id"]
    kw = {} if body is None else {"json": body}
    r = getattr(c, method)(path.format(cid=cid, mid=mid), **kw)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]["message"]


def test_a_bad_body_is_a_400_not_a_traceback(localspec_home):
    c = client()
    r = c.post(BASE, content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = c.post(BASE, content=b"{}", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415


def test_an_unusable_history_is_a_503_that_says_what_to_do(localspec_home):
    localspec_home.mkdir(parents=True, exist_ok=True)
    (localspec_home / "history.db").write_bytes(b"this is not a database" * 100)
    r = client().get(BASE)
    assert r.status_code == 503 and "move it aside" in r.json()["error"]["message"]


def test_a_history_that_cannot_be_written_is_a_503_that_says_so(localspec_home, monkeypatch):
    import sqlite3

    c = client()
    cid = c.post(BASE, json={}).json()["id"]

    def full(*a, **kw):
        raise sqlite3.OperationalError("database or disk is full")
    monkeypatch.setattr(HistoryStore, "add_message", full)
    r = c.post(f"{BASE}/{cid}/messages", json={"role": "user", "content": "hi"})
    assert r.status_code == 503 and "disk is full" in r.json()["error"]["message"]
    assert c.get(f"{BASE}/{cid}").status_code == 200  # the server goes on


def test_with_a_key_the_page_loads_and_its_calls_need_the_key(localspec_home):
    c = client(api_key="sekrit")
    assert c.get("/", headers=HTML).status_code == 200
    assert c.get("/webui/app.js").status_code == 200
    assert c.get(BASE).status_code == 401
    assert c.get(BASE, headers={"Authorization": "Bearer sekrit"}).status_code == 200
