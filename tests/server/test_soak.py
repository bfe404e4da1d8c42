"""scripts/soak's parts on the tiny models: the page's conversation written as the page writes it survives a
SIGKILL in the middle of a reply (every acknowledged write there, whole, after a restart on the same data
root), every protocol's client reads an answer, and the figures the soak reports are counted right (counters
that reset when a model unloads, requests the kill cut short). The soak itself runs in CI as `scripts/soak`."""

from __future__ import annotations

import threading

import httpx
import pytest
from conftest import THREADS

from harness.serverproc import ServerProcess
from harness.soakclients import PROTOCOLS, Outcome, Request, send
from harness.soakpage import Ledger, page_turn
from harness.soakreport import _failures, pct
from harness.soakrun import Sample, counter_total


def test_an_acknowledged_conversation_survives_a_kill_mid_reply(tiny, tmp_path):
    args = ["--target", str(tiny.target), "--threads", str(THREADS), "-c", "512", "--temperature", "0"]
    srv = ServerProcess(args, tmp_path / "home")
    ledger, conv = Ledger(), {}
    with httpx.Client() as client:
        done = page_turn(client, srv.url, ledger, conv, "", "hello there", 24)
        assert done.answered and done.text, done.detail
        killed = threading.Event()

        def kill_at_first_piece(_piece):  # the reply's row exists and the stream is running: the power goes
            if not killed.is_set():
                killed.set()
                srv.kill()
        cut = page_turn(client, srv.url, ledger, conv, "", "and again", 200, on_piece=kill_at_first_piece)
        assert killed.is_set() and cut.failure in ("connection", "page-write", "malformed"), cut
        again = ServerProcess(args, tmp_path / "home", port=srv.port)
        try:
            found = ledger.check(client, again.url)
        finally:
            assert again.stop() == 0
    # both turns' prompts, the first reply whole, the second's row as the page last saved it
    assert found["lost"] == [] and found["truncated"] == [] and found["messages"] == 4


def test_every_protocols_client_reads_the_answer(tiny, tmp_path):
    srv = ServerProcess(["--target", str(tiny.fim_target), "--threads", str(THREADS), "-c", "512"], tmp_path / "home")
    bodies = {"messages": [{"role": "user", "content": "hello"}], "prompt": "the cat", "input": "hello",
              "system": "be brief", "input_prefix": "def f(", "input_suffix": ")\n", "max": 8}
    try:
        with httpx.Client() as client:
            for protocol in PROTOCOLS:
                for stream in (True, False):
                    out = send(client, srv.url, Request(protocol, "", bodies, stream=stream))
                    assert out.answered and out.first_s is not None, (protocol, stream, out.failure, out.detail)
    finally:
        assert srv.stop() == 0


def test_counters_that_reset_with_an_unload_are_summed():
    series = 'localspec:requests_total{model="a"}'
    samples = [Sample(t, 0, {}, m) for t, m in enumerate([{series: 3}, {series: 5}, {}, {series: 2}, {series: 4}])]
    assert counter_total(samples, "localspec:requests_total") == {series: 9}  # 3 + 2, unloaded, then 2 + 2


def test_only_requests_in_flight_at_a_kill_are_excused():
    def outcome(started, total, phase="crash"):
        o = Outcome(Request("openai-chat", "m", {"max": 1}), started, total_s=total, failure="connection")
        o.extra.update(server="localspec", phase=phase)
        return o
    marks = {"down": [(100.0, 110.0)]}
    found = _failures([outcome(95, 6), outcome(104, 0.1), outcome(120, 1), outcome(95, 6, phase="load")], marks)
    assert found["cut_by_kill"] == 2 and len(found["outside_documented"]) == 2
    assert pct([3, 1, 2], 0.5) == 2 and pct([], 0.99) is None


def test_an_unloaded_models_memory_goes_back_to_the_system(tiny, tmp_path):
    """Requests at once on several threads leave a model's freed buffers in their threads' malloc arenas;
    after the soak's hour the server held them as its own. An unload hands them back."""
    import shutil

    from conftest import real_pair_paths

    pair = real_pair_paths()
    if pair is None:
        pytest.skip("the real pair is not installed")
    models = tmp_path / "models"
    models.mkdir()
    (models / "big.gguf").symlink_to(pair[0])
    shutil.copy(tiny.target, models / "small.gguf")
    srv = ServerProcess(["--models-dir", str(models), "--models-max", "1", "--parallel", "2", "-c", "2048"],
                        tmp_path / "home")

    def ask(model: str, i: int) -> None:
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=600, json={
            "model": model, "max_tokens": 24, "messages": [{"role": "user", "content": f"Name thing {i}."}]})
        assert r.status_code == 200, r.text

    def unloaded_anon_mb() -> float:
        for name in ("big", "small"):
            httpx.post(srv.url + "/models/unload", json={"model": name}, timeout=600)
        with open(f"/proc/{srv.proc.pid}/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("RssAnon:")) / 1024

    try:
        ask("big", 0)
        before = unloaded_anon_mb()
        clients = [threading.Thread(target=lambda i=i: [ask(("big", "small")[(i + k) % 2], k) for k in range(6)])
                   for i in range(4)]
        for t in clients:
            t.start()
        for t in clients:
            t.join()
        assert unloaded_anon_mb() - before < 100
    finally:
        assert srv.stop() == 0
