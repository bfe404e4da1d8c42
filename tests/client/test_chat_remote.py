"""`localspec chat` through a running `localspec serve` (a real server process on the tiny models),
driven by Textual's Pilot: the chat finds the server holding its pair, answers through it with the
same live figures and provenance as in-process, and the server's per-piece figures
(`timings_per_token`) and /apply-template are what the chat relies on."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import urllib.request

import pytest
from chatkit import SIZE, notices, send, status_text, wait_until
from conftest import THREADS

from harness.serverproc import ServerProcess
from localspec.chat.app import ChatApp
from localspec.chat_format import Message
from localspec.client import connect as client
from localspec.client.remote import RemoteEngine, RemoteSession
from localspec.commands.chat import parse_chat_args

CTX = "1024"


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    srv = ServerProcess(["--target", str(tiny.target), "--draft", str(tiny.perturbed), "--threads", str(THREADS),
                         "-c", CTX, "--temperature", "0", "-np", "2"], tmp_path_factory.mktemp("serve-home"))
    yield srv
    assert srv.stop() == 0, srv.output()
    assert "Traceback" not in srv.output()


def post(server, path: str, body: dict) -> dict:
    req = urllib.request.Request(server.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def sse(server, path: str, body: dict) -> list[dict]:
    req = urllib.request.Request(server.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return [json.loads(line[6:]) for line in r.read().decode().splitlines()
                if line.startswith("data: {")]


def chat_app(tiny, *extra: str) -> ChatApp:
    return ChatApp(parse_chat_args(["--target", str(tiny.target), "--draft", str(tiny.perturbed), "--threads",
                                    str(THREADS), "--ctx-size", CTX, "--temperature", "0", "--spec", "on", *extra]))


def test_timings_per_token_and_apply_template(server):
    messages = [{"role": "user", "content": "hello world"}]
    text = post(server, "/apply-template", {"messages": messages})["prompt"]
    assert "hello world" in text and text.endswith("assistant\n")
    ep = client.Endpoint("127.0.0.1", server.port)
    tokens = RemoteEngine(ep, client.probe(ep, 5.0)).prompt_tokens([Message("user", "hello world")])
    events = sse(server, "/v1/chat/completions", {"messages": messages, "stream": True, "max_tokens": 12,
                                                  "timings_per_token": True, "spec": "on"})
    pieces = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert pieces and all("timings" in e and e["localspec"]["source"] in ("target", "model", "ngram") for e in pieces)
    counts = [e["localspec"]["stats"]["tokens"] for e in pieces]
    assert counts == sorted(counts) and counts[-1] <= 12  # the figures so far, growing
    last = events[-1]
    assert last["localspec"]["stats"]["prompt_tokens"] == len(tokens)  # the chat's count of the prompt is exact
    plain = sse(server, "/v1/chat/completions", {"messages": messages, "stream": True, "max_tokens": 12})
    assert not any("timings" in e for e in plain[:-1])  # only when asked for, as in llama-server
    bad = urllib.request.Request(server.url + "/apply-template", b'{"messages": 3}', {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad, timeout=30)
    assert e.value.code == 400 and "messages" in json.loads(e.value.read())["error"]["message"]


def test_chat_answers_through_the_server_with_live_figures(server, tiny, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_SERVER", server.url)
    served = server.metric("localspec:requests_total")
    other = threading.Thread(target=sse, args=(server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "the the the"}], "stream": True, "max_tokens": 300}))

    async def go():
        app = chat_app(tiny)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: not app.loading, "the server to be found")
            assert app.session is not None, (app.load_error, notices(app))
            assert isinstance(app.session, RemoteSession) and any("answering through the localspec server" in n for n in notices(app))
            other.start()  # another client is active while the chat answers
            view = await send(pilot, app, "hello world")
            st = app.last_stats
            assert st.tokens > 0 and view.text == app.last_reply and st.drafted > 0
            assert {s for _, s in view.runs} <= {"target", "model", "ngram"} and len(view.runs) > 1
            assert re.search(r"spec on k=4 temp=0 │ [0-9.]+ tok/s │ accept [0-9]+% │ mean acc len [0-9.]+ │ "
                             r"[0-9.]+ passes/tok", status_text(app)), status_text(app)
            conv = app.conv  # the conversation overflows the screen and the reply is in view at its end
            await wait_until(pilot, lambda: conv.max_scroll_y > 0 and conv.scroll_y >= conv.max_scroll_y - 1,
                             "the reply scrolled into view")
            return app.last_reply

    reply = asyncio.run(go())
    other.join(timeout=120)
    assert server.metric("localspec:requests_total") >= served + 2  # the chat's reply and the other client's
    # the same answer `localspec run` gets through the server (greedy)
    from serverkit import run_cli
    r = run_cli(server, "run", "--target", str(tiny.target), "--draft", str(tiny.perturbed), "-c", CTX,
                "--threads", str(THREADS), "--temperature", "0", "--spec", "on", "--json", "hello world")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"] == reply


def test_chat_with_local_or_another_pair_loads_its_own(server, tiny, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_SERVER", server.url)

    async def go(app):
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: not app.loading, "the models to load")
            assert app.engine is not None and not isinstance(app.session, RemoteSession)
            await send(pilot, app, "hello")
            assert app.last_stats.tokens > 0

    served = server.metric("localspec:requests_total")
    asyncio.run(go(chat_app(tiny, "--local")))
    asyncio.run(go(ChatApp(parse_chat_args(["--target", str(tiny.target), "--threads", str(THREADS),
                                            "--ctx-size", "512", "--temperature", "0"]))))
    assert server.metric("localspec:requests_total") == served
