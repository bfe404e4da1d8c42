"""Models behind a process boundary (`serve --isolate`, and every target split over RPC hosts), as real
processes on the tiny models: answers as in one process; a model's process killed mid-answer ends that
answer with one error in its protocol's shape while another model's client is answered, the server stays
up, says why, and loads the model again; and a target split over two real llama.cpp RPC servers (built
from the pinned sdist) gives the single machine's greedy text, survives `kill -9` of a host, and comes
back when the host does."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from conftest import THREADS

from harness import llamacpp_tools
from harness.netns import wait_port
from harness.serverproc import ServerProcess, free_port

PROMPT = [{"role": "user", "content": "hello"}]


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def stream_until_cut(server, body: dict, cut, path: str = "/v1/chat/completions") -> tuple[list[str], float]:
    """Stream `body`; call cut() after the first piece of text; the lines received and the seconds from the
    cut to the stream's end."""
    lines, t_cut = [], None
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                lines.append(line)
            if t_cut is None and '"content"' in line:
                cut()
                t_cut = time.monotonic()
    return lines, time.monotonic() - (t_cut or time.monotonic())


def wait_until(check, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def statuses(server) -> dict[str, dict]:
    return {m["id"]: m["status"] for m in httpx.get(server.url + "/models").json()["data"]}


@pytest.fixture(scope="module")
def isolated(tiny, tmp_path_factory):
    d = tmp_path_factory.mktemp("isolated-models")
    shutil.copy(tiny.target, d / "alpha.gguf")
    shutil.copy(tiny.other_vocab, d / "gamma.gguf")
    srv = ServerProcess(["--models-dir", str(d), "--isolate", "--threads", str(THREADS), "-c", "2048",
                         "--temperature", "0"], tmp_path_factory.mktemp("isolated-home"))
    yield srv
    assert srv.stop() == 0, srv.output()
    assert "Traceback" not in srv.output()


def test_an_isolated_model_answers_as_one_in_the_server_process(isolated, tiny, tmp_path):
    body = {"model": "alpha", "messages": PROMPT, "max_tokens": 24}
    props = httpx.get(isolated.url + "/props", params={"model": "alpha"}).json()
    assert props["localspec"]["isolated"] is True and props["localspec"]["pid"] != isolated.proc.pid
    one = ServerProcess(["--target", str(tiny.target), "--threads", str(THREADS), "-c", "2048", "--temperature", "0"],
                        tmp_path / "home")
    try:
        expected = post(one, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
        assert httpx.get(one.url + "/props").json()["localspec"]["isolated"] is False
    finally:
        assert one.stop() == 0
    assert post(isolated, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"] == expected
    assert post(isolated, "/tokenize", {"model": "alpha", "content": "hello"}).json()["tokens"]


def test_a_killed_model_process_ends_its_answer_and_no_other(isolated):
    pid = httpx.get(isolated.url + "/props", params={"model": "alpha"}).json()["localspec"]["pid"]
    other: dict = {}

    def second_client():
        other["r"] = post(isolated, "/v1/chat/completions", {"model": "gamma", "messages": PROMPT, "max_tokens": 200})

    helper = threading.Thread(target=second_client)
    body = {"model": "alpha", "messages": PROMPT, "max_tokens": 1500, "ignore_eos": True}
    lines, after = stream_until_cut(isolated, body, lambda: (helper.start(), os.kill(pid, signal.SIGKILL)))
    helper.join(120)
    assert after < 5
    error = json.loads(lines[-1].removeprefix("data: "))["error"]
    assert error["code"] == 503 and "the model is unavailable: its process ended (signal 9)" in error["message"]
    assert other["r"].status_code == 200 and other["r"].json()["choices"][0]["message"]["content"]
    wait_until(lambda: statuses(isolated)["alpha"]["value"] in ("lost", "loaded"))
    r = post(isolated, "/v1/chat/completions", {"model": "alpha", "messages": PROMPT, "max_tokens": 8})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]  # loaded again
    assert isolated.proc.poll() is None


def test_ollama_and_anthropic_streams_end_in_their_own_error_shape(isolated):
    for path, body in (("/api/chat", {"model": "alpha", "messages": PROMPT, "options": {"num_predict": 1500}}),
                       ("/v1/messages", {"model": "alpha", "messages": PROMPT, "max_tokens": 1500})):
        wait_until(lambda: statuses(isolated)["alpha"]["value"] == "loaded" or
                   post(isolated, "/v1/chat/completions", {"model": "alpha", "messages": PROMPT,
                                                            "max_tokens": 1}).status_code == 200)
        pid = httpx.get(isolated.url + "/props", params={"model": "alpha"}).json()["localspec"]["pid"]
        body = {**body, "ignore_eos": True} if path == "/v1/messages" else {**body, "options": {**body["options"]}}
        lines, _ = stream_until_cut(isolated, body, lambda: os.kill(pid, signal.SIGKILL), path)
        last = json.loads(lines[-1].removeprefix("data: "))
        if path == "/api/chat":
            assert "the model is unavailable" in last["error"]
        else:
            assert last["type"] == "error" and "the model is unavailable" in last["error"]["message"]


# --- a target split over two real RPC hosts -----------------------------------------------------------
@pytest.fixture(scope="module")
def rpc_server_binary():
    return llamacpp_tools.build("ggml-rpc-server")  # once per version, cached outside the repository


def start_host(binary, port: int, log) -> subprocess.Popen:
    proc = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port), "-t", "1"], stdout=log,
                            stderr=subprocess.STDOUT)
    wait_port("127.0.0.1", port)
    return proc


@pytest.fixture
def hosts(rpc_server_binary, tmp_path):
    ports = [free_port(), free_port()]
    log = open(tmp_path / "hosts.log", "ab")
    procs = {p: start_host(rpc_server_binary, p, log) for p in ports}
    yield ports, procs, lambda port: procs.__setitem__(port, start_host(rpc_server_binary, port, log))
    for proc in procs.values():
        proc.kill()
        proc.wait()


def run_cli(*argv: str, home) -> subprocess.CompletedProcess:
    """`localspec ARGV` in its own process: RPC devices, once registered, stay in a process for good."""
    return subprocess.run([sys.executable, "-m", "localspec", *argv], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LOCALSPEC_HOME": str(home), "HF_HUB_OFFLINE": "1"})


def test_a_split_target_answers_as_one_machine_and_outlives_a_lost_host(tiny, hosts, tmp_path):
    ports, procs, restart = hosts
    rpc = ",".join(f"127.0.0.1:{p}" for p in ports)
    flags = ["--target", str(tiny.target), "--threads", str(THREADS), "-c", "2048", "--temperature", "0"]
    here = run_cli("run", *flags, "-n", "24", "--spec", "off", "hello", home=tmp_path / "home")
    split = run_cli("run", *flags, "--rpc", rpc, "-n", "24", "--spec", "off", "hello", home=tmp_path / "home")
    assert split.returncode == 0 and split.stdout == here.stdout and here.stdout, split.stderr
    doctor = run_cli("doctor", "--load", "--target", str(tiny.target), "--draft", str(tiny.perturbed), "--rpc", rpc,
                     "-ngl", "2", home=tmp_path / "home")
    loaded = doctor.stdout[doctor.stdout.index("loaded target"):].splitlines()
    assert loaded[1] == f"  layers 0 here, 1 on 127.0.0.1:{ports[0]}, 2 on 127.0.0.1:{ports[1]} (the last is the output layer)"
    draft = doctor.stdout[doctor.stdout.index("loaded draft"):].splitlines()
    assert draft[1] == "  layers 0-2 here (the last is the output layer)"  # the draft stays on this machine
    srv = ServerProcess([*flags, "--rpc", rpc], tmp_path / "home")
    try:
        assert "note: split: layers " in srv.output() and f"on 127.0.0.1:{ports[1]}" in srv.output()
        body = {"messages": PROMPT, "max_tokens": 1500, "ignore_eos": True}
        lines, after = stream_until_cut(srv, body, lambda: procs.pop(ports[1]).kill())
        assert after < 5
        error = json.loads(lines[-1].removeprefix("data: "))["error"]
        assert error["code"] == 503 and f"its RPC host 127.0.0.1:{ports[1]} went away" in error["message"]
        wait_until(lambda: httpx.get(srv.url + "/health").status_code == 503)
        assert "went away" in httpx.get(srv.url + "/health").json()["error"]["message"]
        restart(ports[1])
        wait_until(lambda: httpx.get(srv.url + "/health").status_code == 200)
        r = post(srv, "/v1/chat/completions", {"messages": PROMPT, "max_tokens": 24, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    finally:
        assert srv.stop() == 0, srv.output()
    assert "Traceback" not in srv.output()
