"""`localspec serve` over a models folder whose target carries NextN blocks, started without any drafting flag,
as a real process: it pairs the target with its own head (not with the smaller model of its vocabulary beside
it), says so when ready, drafts with it on every lane, and reports the head's drafts as its own in the
protocols' stats and in /metrics."""

from __future__ import annotations

import shutil

import httpx
import pytest
from conftest import THREADS

from harness.serverproc import ServerProcess
from harness.tinyarch import build_tiny_arch

WIDE = dict(width=128, head_dim=32, ff=256)  # more than twice the small model's bytes: it would be its draft


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    built, models = tmp_path_factory.mktemp("built"), tmp_path_factory.mktemp("models")
    shutil.copy(build_tiny_arch(built / "t.gguf", "qwen35", seed=0, dims=WIDE, nextn=1), models / "qwen-mtp.gguf")
    shutil.copy(build_tiny_arch(built / "s.gguf", "qwen35", seed=1), models / "small.gguf")
    srv = ServerProcess(["--models-dir", str(models), "--threads", str(THREADS), "-c", "1024", "--parallel", "2"],
                        tmp_path_factory.mktemp("head-home"))
    yield srv
    assert srv.stop() == 0, srv.output()
    assert "Traceback" not in srv.output()


def ask(server, path: str, body: dict) -> dict:
    r = httpx.post(server.url + path, json={"model": "qwen-mtp", **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_head_drafts_without_any_flag_and_is_reported_as_its_own(server):
    # "spec": "on" drafts on every round: on this tiny model the measured costs say no draft pays (auto's
    # choice), which says nothing about which drafter the server chose
    chat = {"messages": [{"role": "user", "content": "write the code to read a csv file"}], "max_tokens": 24,
            "temperature": 0, "spec": "on"}
    out = ask(server, "/v1/chat/completions", chat)
    assert "mtp" in out["localspec"]["drafted_by_drafter"] and "model" not in out["localspec"]["drafted_by_drafter"]
    assert "ready: qwen-mtp (qwen-mtp.gguf (drafts with its NextN head))" in server.output()
    native = ask(server, "/completion", {"prompt": "def parse ( data ) :", "n_predict": 16, "temperature": 0,
                                         "spec": "on"})
    assert native["timings"]["draft_n"] >= native["localspec"]["drafted_by_drafter"].get("mtp", 0) > 0
    assert server.metric('localspec:draft_tokens_total{model="qwen-mtp",drafter="mtp"}') > 0
