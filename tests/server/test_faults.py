"""The fault suite's fast part on the tiny models: hostile bodies, foreign pages, big inputs, hang-ups,
signals, unwritable and corrupt state, bad flags. Each of these broke main before (a 500, a traceback, a
wedged server, a hang); scripts/fault-check runs the same probes on any pair, plus the soak."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import THREADS

from harness.faults import (
    post_json,
    probe_big_inputs,
    probe_call_ids,
    probe_concurrent_streams,
    probe_damaged_saved_prompts,
    probe_error_shapes,
    probe_foreign_pages,
    probe_hangups,
    probe_hostile_bodies,
    probe_long_prompts_together,
    request,
    stream_then_signal,
)
from harness.serverproc import ROOT, ServerProcess


def tiny_server(tiny, home, *extra, env=None, ctx=1024):
    return ServerProcess(["--target", str(tiny.fim_target), "--draft", str(tiny.fim_draft), "--threads", str(THREADS),
                          "-c", str(ctx), "--temperature", "0", *extra], home, env=env)


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    srv = tiny_server(tiny, tmp_path_factory.mktemp("faults-home"))
    yield srv
    assert srv.stop() == 0, srv.output()
    out = srv.output()
    assert "Traceback" not in out and "ERROR" not in out, out


def assert_findings(findings):
    bad = [f for f in findings if not f.ok]
    assert not bad, "\n".join(f"{f.probe}: {f.seen}" for f in bad)


def test_hostile_bodies_get_a_400_and_never_a_500(server):
    assert_findings(probe_hostile_bodies(server.port))
    assert request(server.port, "GET", "/health")[0] == 200


def test_web_pages_cannot_drive_a_keyless_server(server):
    assert_findings(probe_foreign_pages(server.port))


def test_cors_names_the_origins_a_browser_may_use(tiny, tmp_path):
    srv = tiny_server(tiny, tmp_path, "--cors", "http://localhost:3000")
    try:
        s, h, _ = request(srv.port, "OPTIONS", "/v1/chat/completions",
                          headers={"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"})
        assert s == 204 and h["access-control-allow-origin"] == "http://localhost:3000"
        assert "content-type" in h["access-control-allow-headers"].lower()
        s, h, _ = post_json(srv.port, "/completion", {"prompt": "the", "n_predict": 1},
                            {"Origin": "http://localhost:3000"})
        assert s == 200 and h["access-control-allow-origin"] == "http://localhost:3000"
        s, _, _ = post_json(srv.port, "/completion", {"prompt": "the", "n_predict": 1}, {"Origin": "http://evil.example"})
        assert s == 403
    finally:
        assert srv.stop() == 0


def test_big_inputs_do_not_stall_the_server(server):
    assert_findings(probe_big_inputs(server.port, stall_s=1.5))  # lenient: CI machines are noisy


def test_foreign_paths_answer_in_their_protocols_error_shape(server):
    assert_findings(probe_error_shapes(server.port))


def test_tool_results_that_answer_no_call_get_a_400_naming_the_field(server):
    assert_findings(probe_call_ids(server.port))


def _deferred(metrics) -> float:
    return next(row[-1] for row in metrics.samples() if row[0] == "llamacpp:requests_deferred")


def test_a_waiter_that_hangs_up_leaves_the_queue_at_once():
    """The count that refuses requests with a 503 is of waiters that are there (on the real pair,
    scripts/fault-check holds every lane with a long stream and lets 68 clients hang up)."""
    from localspec.errors import Unavailable
    from localspec.serving.job import Job
    from localspec.serving.jobqueue import JobQueue
    from localspec.serving.metrics import Metrics
    from localspec.serving.worker import MAX_WAITING, ModelWorker

    srv = ModelWorker.__new__(ModelWorker)  # its queue and counters alone: no lane takes a job
    srv.jobs = JobQueue(lambda job: None)
    srv.metrics = Metrics(srv.jobs)
    jobs = [Job(None, None, lambda item: None) for _ in range(MAX_WAITING)]
    for job in jobs:
        srv.submit(job)
    with pytest.raises(Unavailable, match="already waiting"):
        srv.submit(Job(None, None, lambda item: None))
    for job in jobs:
        srv.jobs.withdraw(job)
    assert srv.jobs.qsize() == 0 and _deferred(srv.metrics) == 0 and all(j.cancel.is_set() for j in jobs)
    srv.submit(Job(None, None, lambda item: None))
    assert _deferred(srv.metrics) == 1


def test_hangups_and_concurrent_streams(server):
    assert_findings(probe_hangups(server.port))
    assert_findings(probe_concurrent_streams(server.port, clients=4, each=2))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_running_streams_with_an_error_event_and_exits_at_once(tiny, tmp_path, sig):
    srv = tiny_server(tiny, tmp_path, ctx=8192)
    eos_banned = {"ignore_eos": True}  # llama-server's: the stream runs until the signal
    finding = stream_then_signal(srv.proc, srv.port, sig,
                                 {"prompt": "the cache", "n_predict": 100_000, "stream": True, **eos_banned})
    srv.log_file.close()
    out = srv.output()
    assert finding.ok, f"{finding.seen}\n{out}"
    assert "Traceback" not in out and "ERROR" not in out and "CancelledError" not in out, out


def test_an_unwritable_data_dir_never_wedges_the_server(tiny, tmp_path):
    """A long prompt makes the idle depth measurement save the profile; the save must not kill the
    generation thread (main: every later request waited forever while /health said ok)."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the data dir's parent should be")
    srv = tiny_server(tiny, tmp_path / "log-home", env={"LOCALSPEC_HOME": str(blocker / "home")})
    try:
        long_prompt = " ".join(["the cache of the model"] * 30)  # ~700 tokens: a depth bucket to measure
        s, _, raw = post_json(srv.port, "/completion", {"prompt": long_prompt, "n_predict": 4})
        assert s == 200, raw
        time.sleep(1.0)  # the idle measurement runs after the answer
        for i in range(3):
            s, _, raw = post_json(srv.port, "/completion", {"prompt": f"the model {i}", "n_predict": 4}, timeout=60)
            assert s == 200, raw
        assert request(srv.port, "GET", "/health")[0] == 200
    finally:
        assert srv.stop() == 0
    assert "Traceback" not in srv.output(), srv.output()


def test_a_mistyped_profile_is_named_and_measured_again(cli, tiny, localspec_home):
    args = ["run", "--target", str(tiny.target), "--threads", str(THREADS), "-c", "512", "-n", "4",
            "--temperature", "0", "the cache"]
    assert cli(*args).code == 0
    (profile,) = list((localspec_home / "profiles").glob("*.json"))
    good = json.loads(profile.read_text())
    for bad in ({**good, "t_verify": "fast"}, {**good, "t_decode": None}, [1, 2], {**good, "by_depth": {"x": 1}}):
        profile.write_text(json.dumps(bad))
        r = cli(*args)
        assert r.code == 0, r.err
        assert f"note: ignoring {profile} (" in r.err and "measuring the pass costs again" in r.err, r.err
        assert json.loads(profile.read_text())["t_verify"] != "fast"  # measured and saved afresh
    profile.write_text('{"t_decode": 0.01, "t_ver')  # truncated
    r = cli(*args)
    assert r.code == 0 and "not valid JSON" in r.err, r.err


def test_state_writes_are_atomic_under_races(tmp_path):
    from localspec.paths import write_atomic

    target = tmp_path / "profile.json"
    errors = []

    def writer(i):
        for j in range(50):
            try:
                write_atomic(target, json.dumps({"writer": i, "n": j, "pad": "x" * 5000}))
            except OSError as e:
                errors.append(e)
    ts = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors and json.loads(target.read_text())["n"] == 49
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]  # no temporary file left behind
    with pytest.raises(OSError):
        write_atomic(tmp_path / "profile.json" / "x.json", "{}")  # under a file: an error, nothing half-written


@pytest.mark.parametrize("flags, words", [
    (["--temperature", "nan"], "not a finite number"),
    (["--top-p", "nan"], "not a finite number"),
    (["--min-p", "inf"], "not a finite number"),
    (["-t", "999"], "more than this machine's"),
    (["-t", "0"], "must be 1 or more"),
    (["-n", "0"], "must be 1 or more"),
    (["--ctx-size", "-5"], "must be 1 or more"),
    (["--seed", "-2"], "must be -1 or more"),
    (["--seed", str(2**32)], "the largest seed"),
    (["-ngl", "-3"], "must be -1 or more"),
])
def test_bad_flags_get_one_line_and_exit_2(cli, tiny, flags, words, capsys):
    from localspec.cli import main

    for command in ("run", "serve", "chat"):
        rest = ["the cache"] if command == "run" else []
        with pytest.raises(SystemExit) as e:
            main([command, "--target", str(tiny.target), *flags, *rest])
        err = capsys.readouterr().err
        assert e.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, (command, err)


def test_seed_minus_one_means_random_as_in_llama_cpp(cli, tiny):
    r = cli("run", "--target", str(tiny.target), "--threads", str(THREADS), "-c", "512", "-n", "3", "--seed", "-1",
            "--json", "the cache")
    assert r.code == 0, r.err
    assert json.loads(r.out)["tokens"] <= 3


def test_run_gives_up_on_a_silent_server(tiny, tmp_path):
    """A server that takes the request and never answers (wedged) must not hang a shell's `run`."""
    props = {"model_alias": "target", "localspec": {"target": str(tiny.target), "draft": None, "load": {}}}

    class Wedged(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(props).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            time.sleep(30)

        def log_message(self, *a):
            pass
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Wedged)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        env = {**os.environ, "LOCALSPEC_SERVER": f"127.0.0.1:{httpd.server_address[1]}",
               "LOCALSPEC_SERVER_TIMEOUT": "1", "LOCALSPEC_HOME": str(tmp_path)}
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "localspec", "run", "--target", str(tiny.target), "hello"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert time.monotonic() - t0 < 20
        assert r.returncode != 0 and r.stderr.startswith("error: the server sent nothing for 1 s"), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    finally:
        httpd.shutdown()


def test_the_shared_cache_waits_instead_of_refusing_long_prompts(tiny, tmp_path):
    """Two prompts that fit the context alone but not together, at once: both answered whole (each was a
    400 "no KV-cache slot", or one cut to a token); short conversations in every lane, then a prompt that
    fills the context: answered (the idle lanes' cells all freed first)."""
    srv = tiny_server(tiny, tmp_path / "home", "--parallel", "4", ctx=512)
    try:
        assert_findings(probe_long_prompts_together(srv.port, 512, lanes=4))
    finally:
        assert srv.stop() == 0, srv.output()


def test_damaged_saved_prompts_are_dropped_with_one_line_and_evaluated_again(tiny, tmp_path):
    """A saved prompt's entry replaced by [], null, a number or garbage: the server answered 500
    ("'list' object has no attribute 'get'") or dropped it without a word; now it says which, in one line,
    and evaluates the prompt again."""
    home = tmp_path / "home"
    findings = probe_damaged_saved_prompts(lambda: tiny_server(tiny, home, ctx=2048), home)
    assert_findings(findings)
