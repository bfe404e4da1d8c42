"""The pieces of a split over RPC hosts that need no host: the one rule for host:port lists (flag and
models.yaml), where llama.cpp's load lines put each layer, the relay's delay, and what a lost model says."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.serverproc import free_port
from localspec.config import rpc_endpoints
from localspec.models.placement import describe_layers, layer_ranges
from localspec.serving.isolated import lost_reason

RELAY = Path(__file__).resolve().parents[1] / "scripts" / "harness" / "relay.py"


def test_rpc_endpoints_are_host_port_lists():
    assert rpc_endpoints(" 10.0.0.2:50052, [::1]:50053 ,") == "10.0.0.2:50052,[::1]:50053"
    for bad, why in (("10.0.0.2", "'10.0.0.2' is not host:port"), ("h:0", "'h:0' is not host:port"),
                     (":50052", "':50052' is not host:port"), (",", "no host:port given")):
        with pytest.raises(ValueError, match=why):
            rpc_endpoints(bad)


def test_a_bad_rpc_flag_is_one_line_and_exit_2(capsys):
    from localspec.cli import main

    with pytest.raises(SystemExit) as e:
        main(["run", "--rpc", "10.0.0.2", "hello"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == ("error: argument --rpc: '10.0.0.2' is not host:port (for example "
                                         "192.168.1.20:50052) (see `localspec run --help`)\n")


def test_a_bad_rpc_servers_entry_names_its_line(tmp_path, monkeypatch):
    from localspec import models
    from localspec.errors import ConfigError

    (tmp_path / "models.yaml").write_text("pairs:\n  p:\n    target: /x.gguf\n    rpc_servers: [10.0.0.2:x]\n")
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match=r"models.yaml:4: '10.0.0.2:x' is not host:port"):
        models.load_registry()


LINES = [f"load_tensors: layer {i:3d} assigned to device {dev}, is_swa = 0"
         for i, dev in enumerate(["CPU"] * 3 + ["RPC0"] * 2 + ["RPC1"] * 2)]


def test_where_each_layer_went():
    assert layer_ranges(LINES + ["load_tensors: offloaded 4/7 layers to GPU"]) == [
        ("CPU", 0, 2), ("RPC0", 3, 4), ("RPC1", 5, 6)]
    assert describe_layers(LINES, {"RPC0": "10.0.0.2:50052", "RPC1": "10.0.0.3:50052"}) == (
        "layers 0-2 here, 3-4 on 10.0.0.2:50052, 5-6 on 10.0.0.3:50052 (the last is the output layer)")
    assert describe_layers(["load_tensors: offloaded 0/7 layers to GPU"], {}) is None


def test_the_relay_holds_each_way_and_keeps_order():
    echo = socket.create_server(("127.0.0.1", 0))
    port, relay_port = echo.getsockname()[1], free_port()

    def serve_echo():
        conn, _ = echo.accept()
        while data := conn.recv(1 << 16):
            conn.sendall(data)
        conn.close()

    threading.Thread(target=serve_echo, daemon=True).start()
    relay = subprocess.Popen([sys.executable, str(RELAY), "--listen", f"127.0.0.1:{relay_port}",
                              "--to", f"127.0.0.1:{port}", "--delay-ms", "50"])
    try:
        for _ in range(100):
            try:
                c = socket.create_connection(("127.0.0.1", relay_port))
                break
            except OSError:
                time.sleep(0.05)
        t0 = time.perf_counter()
        for i in range(20):
            c.sendall(b"%d," % i)
        got = b""
        while len(got) < len(b"".join(b"%d," % i for i in range(20))):
            got += c.recv(1 << 16)
        assert got == b"".join(b"%d," % i for i in range(20))
        assert time.perf_counter() - t0 >= 0.1  # held 50 ms out and 50 ms back (a floor: never a timed ceiling)
        c.close()
    finally:
        relay.kill()
        relay.wait()
        echo.close()


class Ended:
    exitcode = -9


def test_a_lost_model_says_which_host_went_away():
    gone = f"127.0.0.1:{free_port()}"
    live = socket.create_server(("127.0.0.1", 0))
    here = f"127.0.0.1:{live.getsockname()[1]}"
    try:
        assert lost_reason(Ended(), f"{here},{gone}") == (
            f"the model is unavailable: its RPC host {gone} went away (signal 9); it loads again when the host answers")
        assert lost_reason(Ended(), here).startswith("the model is unavailable: its process ended (signal 9) while split")
        assert lost_reason(Ended(), None) == ("the model is unavailable: its process ended (signal 9); it loads again "
                                              "on the next request")
    finally:
        live.close()


def test_a_split_has_its_own_pass_costs(tiny):
    from types import SimpleNamespace

    from localspec.config import LoadConfig
    from localspec.costs.tuning import profile_key

    def key(rpc):
        load = LoadConfig(rpc_servers=rpc)
        return profile_key(SimpleNamespace(load=load, target_model=SimpleNamespace(path=tiny.target), draft_path=None,
                                           flash_attn="off"))

    assert key(None) != key("10.0.0.2:50052") != key("10.0.0.2:50052,10.0.0.3:50052")
    assert '"rpc": "10.0.0.2:50052"' in key("10.0.0.2:50052")
