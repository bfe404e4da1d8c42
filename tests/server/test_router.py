"""`localspec serve` with several models (`--models-dir`), as a real process on the tiny models: routing by
name in every protocol, loads on demand while another model streams, least-recently-used eviction under
`--models-max`, `keep_alive`, llama-server's /models/load and /models/unload, a broken file that fails only
its own requests, and /metrics labelled by model. The `ollama` and `openai` packages drive it as published."""

from __future__ import annotations

import json
import shutil
import threading
import time

import httpx
import openai
import pytest
from conftest import THREADS

from harness.serverproc import ServerProcess

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def models_dir(tiny, tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    shutil.copy(tiny.target, d / "alpha.gguf")
    shutil.copy(tiny.bad, d / "beta.gguf")  # another model, same vocabulary
    shutil.copy(tiny.other_vocab, d / "gamma.gguf")  # another vocabulary
    (d / "broken.gguf").write_bytes(tiny.target.read_bytes()[:3000])  # truncated inside its header
    return d


@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    srv = ServerProcess(["--models-dir", str(models_dir), "--models-max", "2", "--threads", str(THREADS),
                         "-c", "512", "--temperature", "0"], tmp_path_factory.mktemp("router-home"))
    yield srv
    assert srv.stop() == 0, srv.output()
    assert "Traceback" not in srv.output()


def post(server, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120, **kw)


def statuses(server) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in httpx.get(server.url + "/models").json()["data"]}


def wait_until(check, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def test_every_model_listed_and_each_answers_by_name(server):
    wait_until(lambda: statuses(server)["alpha"] != "loading")  # /health is 200 at once; the default loads
    assert statuses(server) == {"alpha": "loaded", "beta": "unloaded", "broken": "unloaded", "gamma": "unloaded"}
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    assert [m.id for m in client.models.list()] == ["alpha", "beta", "broken", "gamma"]
    for name in ("beta", "gamma.gguf", "alpha:latest"):
        r = client.chat.completions.create(model=name, **CHAT)
        assert r.model == name.split(":")[0].removesuffix(".gguf") and r.choices[0].message.content
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_unknown_names_and_paths_in_each_protocols_shape(server):
    r = post(server, "/v1/chat/completions", {**CHAT, "model": "nope"})
    assert r.status_code == 404
    assert r.json()["error"]["message"] == ("model 'nope' not found; this server has: alpha, beta, broken, gamma "
                                            "(`localspec serve NAME` serves one model under any name)")
    assert post(server, "/v1/chat/completions", {**CHAT, "model": "localspec"}).json()["model"] == "alpha"
    r = post(server, "/api/chat", {"model": "nope", "messages": CHAT["messages"]})
    assert (r.status_code, list(r.json())) == (404, ["error"])
    r = post(server, "/v1/messages", {"model": "nope", "max_tokens": 4, "messages": CHAT["messages"]})
    assert r.status_code == 404 and r.json()["type"] == "error" and r.json()["error"]["type"] == "not_found_error"
    r = post(server, "/v1/chat/completions", {**CHAT, "model": "../alpha"})
    assert r.status_code == 400 and "is a path" in r.json()["error"]["message"]


def test_a_broken_file_fails_its_own_requests_only(server):
    r = post(server, "/v1/chat/completions", {**CHAT, "model": "broken"})
    assert r.status_code == 500 and "broken.gguf is truncated" in r.json()["error"]["message"]
    assert statuses(server)["broken"] == "failed"
    assert post(server, "/v1/chat/completions", {**CHAT, "model": "alpha"}).status_code == 200


def test_a_stream_goes_on_while_another_model_loads(server):
    post(server, "/models/unload", {"model": "gamma"})
    wait_until(lambda: statuses(server)["gamma"] == "unloaded")
    body = {**CHAT, "model": "alpha", "max_tokens": 200, "stream": True}
    pieces, done = [], threading.Event()

    def stream() -> None:
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    pieces.append(delta.get("content") or "")
        done.set()

    t = threading.Thread(target=stream)
    t.start()
    wait_until(lambda: len(pieces) > 2)
    assert post(server, "/v1/chat/completions", {**CHAT, "model": "gamma"}).status_code == 200
    t.join(120)
    whole = post(server, "/v1/chat/completions", {**body, "stream": False}).json()
    assert done.is_set() and "".join(pieces) == whole["choices"][0]["message"]["content"]


def counters(server, name: str) -> dict[str, float]:
    rows = [x.split() for x in httpx.get(server.url + "/metrics").text.splitlines() if x.startswith(name + "{")]
    return {r[0].split('model="')[1].split('"')[0]: float(r[1]) for r in rows}


def test_least_recently_used_idle_model_is_unloaded_first(server):
    for name in ("alpha", "beta", "alpha"):
        assert post(server, "/v1/chat/completions", {**CHAT, "model": name}).status_code == 200
    assert [m["name"] for m in httpx.get(server.url + "/api/ps").json()["models"]] == ["alpha", "beta"]
    loads, unloads = counters(server, "localspec:model_loads_total"), counters(server, "localspec:model_unloads_total")
    assert post(server, "/v1/chat/completions", {**CHAT, "model": "gamma"}).status_code == 200
    loaded = {k for k, v in statuses(server).items() if v == "loaded"}
    assert loaded == {"alpha", "gamma"}  # beta was used least recently; --models-max 2 held
    # the router's own counters, kept across unloads (a soak counts evictions under load with them)
    assert counters(server, "localspec:model_loads_total") == {**loads, "gamma": loads["gamma"] + 1}
    assert counters(server, "localspec:model_unloads_total") == {**unloads, "beta": unloads["beta"] + 1}


def test_keep_alive_and_the_router_endpoints(server):
    import ollama

    client = ollama.Client(host=server.url)
    assert {m.model for m in client.list().models} == {"alpha", "beta", "broken", "gamma"}
    client.generate(model="beta", prompt="", keep_alive=0)  # Ollama's way to unload: after this request
    wait_until(lambda: statuses(server)["beta"] == "unloaded")
    reply = client.chat(model="beta", messages=CHAT["messages"], keep_alive="1s", options={"num_predict": 4})
    assert reply.message.content and reply.model == "beta"
    expiry = [m.expires_at for m in client.ps().models if m.model == "beta"]
    assert expiry and expiry[0].year < 2300
    wait_until(lambda: statuses(server)["beta"] == "unloaded")
    assert post(server, "/models/load", {"model": "beta"}).json() == {"success": True}
    assert statuses(server)["beta"] == "loaded"
    assert post(server, "/models/unload", {"model": "beta"}).json() == {"success": True}
    assert statuses(server)["beta"] == "unloaded"
    assert post(server, "/models/unload", {"model": "beta"}).status_code == 400
    shown = client.show("beta")  # from its header: showing a model does not load it
    assert shown.capabilities == ["completion"]  # its template has no tools section, its vocabulary no FIM tokens
    assert shown.modelinfo["llama.context_length"] == 2048
    assert statuses(server)["beta"] == "unloaded"
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("qwen2.5-coder-1.5b-nope")
    assert "unknown pair" in str(e.value)
    with pytest.raises(ollama.ResponseError) as e:  # a real pair, offline: the hub's answer, in one line
        client.pull("qwen2.5-coder-7b")
    assert "HF_HUB_OFFLINE=1" in str(e.value)
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("gamma")
    assert "was not fetched by `localspec pull`" in str(e.value) and statuses(server)["gamma"] != "failed"


def test_run_is_answered_by_the_servers_copy_of_the_model_it_names(server, models_dir):
    import os
    import subprocess
    import sys

    from harness.serverproc import ROOT

    def requests(model: str) -> float:
        line = [x for x in httpx.get(server.url + "/metrics").text.splitlines()
                if x.startswith(f'localspec:requests_total{{model="{model}"}}')]
        return float(line[0].split()[-1]) if line else 0.0

    before = requests("beta")
    env = {**os.environ, "LOCALSPEC_SERVER": server.url, "LOCALSPEC_HOME": str(server.home)}
    out = subprocess.run([sys.executable, "-m", "localspec", "run", "--target", str(models_dir / "beta.gguf"),
                          "-n", "6", "--temperature", "0", "hello"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() and requests("beta") == before + 1


def test_metrics_are_labelled_by_model(server):
    post(server, "/v1/chat/completions", {**CHAT, "model": "alpha"})
    text = httpx.get(server.url + "/metrics").text
    assert text.count("# TYPE localspec:requests_total counter") == 1
    assert 'localspec:requests_total{model="alpha"}' in text
    assert 'localspec:prompt_cache_bytes{model="alpha"}' in text  # saved prompts in memory, per model


def test_one_model_keeps_the_single_model_contract(tiny, tmp_path):
    srv = ServerProcess(["--target", str(tiny.target), "--threads", str(THREADS), "-c", "512"], tmp_path / "home")
    try:
        r = post(srv, "/v1/chat/completions", {**CHAT, "model": "gpt-4o"})
        assert r.status_code == 200 and r.json()["model"] == "target"
        assert post(srv, "/models/load", {"model": "x"}).status_code == 400
        assert "localspec:requests_total 1" in httpx.get(srv.url + "/metrics").text
    finally:
        assert srv.stop() == 0
