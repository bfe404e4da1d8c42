"""`localspec run` / `verify` transcripts and bad input: one line, non-zero exit, no traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import THREADS, tiny_pair_args

from localspec.cli import main


def pair(tiny, draft=None):
    return tiny_pair_args(tiny, draft or tiny.same)


def test_run_json_transcript(tiny, cli):
    rc, out, err = cli("run", *pair(tiny), "--json", "-k", "4", "--temperature", "0", "--spec", "on",
                       "--drafter", "model", "--max-tokens", "24", "hello world")
    assert rc == 0 and err == ""
    obj = json.loads(out)
    assert set(obj) == {"text", "tokens", "pair", "stats"}
    st = obj["stats"]
    assert obj["tokens"] == st["tokens"] > 0
    assert st["acceptance_rate"] == 1.0  # identical draft
    for key in ("target_passes", "drafted", "accepted", "mean_accepted_length", "tokens_per_second",
                "accepted_by_position", "prompt_eval_s", "draft_s", "verify_s", "other_s", "overhead_share"):
        assert key in st
    assert sum(st["accepted_by_position"]) == st["accepted"]
    assert sum(st["drafted_by_position"]) == st["drafted"]


def test_run_streams_same_text_as_json_and_stats_go_to_stderr(tiny, cli):
    args = [*pair(tiny, tiny.perturbed), "--temperature", "0", "--max-tokens", "20", "--spec", "on", "the cache"]
    rc, out, err = cli("run", *args, "--stats")
    assert rc == 0
    rc, js, _ = cli("run", *args, "--json")
    assert out == json.loads(js)["text"] + "\n"
    lines = err.strip().splitlines()
    assert lines[0].startswith("draft acceptance rate = ") and "accepted /" in lines[0]
    assert any(line.startswith("tokens = ") and "target passes" in line for line in lines)


def test_bare_prompt_means_run_and_no_spec_is_plain(tiny, cli):
    rc, out, err = cli(*pair(tiny), "--no-spec", "--json", "--temperature", "0", "-n", "10", "hello")
    st = json.loads(out)["stats"]
    assert rc == 0 and st["drafted"] == 0 and st["spec_mode"] == "off" and st["rounds_plain"] == st["target_passes"]


def test_auto_measures_a_profile_once_after_the_first_answer(tiny, localspec_home, cli, monkeypatch):
    """The first answer never waits for a measurement: the reference curve prices its drafts (auto drafts
    copies alone), the pass costs are measured after it (kept only from a quiet machine: a busy one's
    figures are dropped), and later runs use them."""
    from localspec.commands import run

    busy = [True]
    monkeypatch.setattr(run, "quiet_watch", lambda: lambda: busy[0])
    rc, out, err = cli(*pair(tiny), "-n", "5", "--json", "hello")
    stats = json.loads(out)["stats"]
    assert rc == 0 and stats["spec_mode"] == "auto" and "T_verify/T_decode = 1.00, 1.80" in stats["policy"]
    assert "measuring" not in err and not list((localspec_home / "profiles").glob("*.json"))  # busy: none kept
    busy[0] = False
    rc, out, err = cli(*pair(tiny), "-n", "5", "--json", "hello")
    assert rc == 0 and "T_verify/T_decode = 1.00, 1.80" in json.loads(out)["stats"]["policy"]
    assert list((localspec_home / "profiles").glob("*.json"))  # measured after the answer
    rc, out, err = cli(*pair(tiny), "-n", "5", "--json", "hello")
    assert rc == 0 and json.loads(out)["stats"]["spec_mode"] == "auto" and "measuring" not in err


def test_verify_reports_ok(tiny, cli):
    rc, out, err = cli("verify", *pair(tiny, tiny.perturbed), "-n", "24")
    assert rc == 0, out + err
    lines = out.strip().splitlines()
    assert lines[-1] == "verdict: OK"
    assert out.startswith("logit noise between batched and single-token evaluation: ")
    assert re.fullmatch(r"default mode: [0-3] of 3 answers \(--spec auto\) the same as --spec off's(; parted at .*)?",
                        lines[-3]), out


def test_verify_against_another_build(tiny, cli, tmp_path):
    """--against compares with another build's report; replayed here with the same build (identical) and
    with other weights under the same vocabulary standing in for a build that computes something else."""
    rc, out, err = cli("verify", *pair(tiny, tiny.perturbed), "-n", "24", "--json")
    assert rc == 0, err
    report = tmp_path / "cpu.json"
    report.write_text(out)
    assert {"prompt", "plain", "spec", "margins"} <= set(json.loads(out)["prompts"][0])
    rc, out, err = cli("verify", *pair(tiny, tiny.perturbed), "-n", "24", "--against", str(report))
    assert rc == 0, out + err
    lines = out.strip().splitlines()
    assert lines[-1] == f"verdict against {report}: OK"
    assert lines[-8].startswith(f"against {report}: logit noise between the two builds 0.0000")
    assert all(re.fullmatch(r"prompt \d, (plain|speculative): identical \(\d+ tokens\)", x) for x in lines[-7:-1]), out

    other = ["--target", str(tiny.bad), *pair(tiny, tiny.perturbed)[2:]]
    rc, out, err = cli("verify", *other, "-n", "24", "--against", str(report))
    assert rc == 1 and err == ""
    assert "NOT a near-tie" in out and out.strip().endswith(f"verdict against {report}: MISMATCH")

    rc, out, err = cli("verify", *pair(tiny, tiny.perturbed), "-n", "12", "--against", str(report))
    _one_line_error(rc, out, err, "ran 12 and 24 tokens", "same -n")


@pytest.mark.parametrize("content,needle", [
    (None, "cannot read"),
    (b"{not json", "is not JSON"),
    (b'{"prompts": []}', "is not a `localspec verify --json` report"),
    (b"\xff\xfe junk", "is not UTF-8"),
])
def test_verify_against_bad_report(tiny, cli, tmp_path, content, needle):
    f = tmp_path / "report.json"
    if content is not None:
        f.write_bytes(content)
    _one_line_error(*cli("verify", *pair(tiny), "--against", str(f)), needle)


def test_verify_on_your_own_prompts(tiny, cli, tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("the cache is fast\n\nwrite the code to read a file\n")
    rc, out, err = cli("verify", *pair(tiny, tiny.perturbed), "-n", "12", "--prompts", str(f))
    assert rc == 0, out + err
    assert [ln.split(":")[0] for ln in out.splitlines() if ln.startswith("prompt ")] == ["prompt 1", "prompt 2"]
    assert "of 2 answers" in out
    rc, out, err = cli("verify", *pair(tiny, tiny.perturbed), "-n", "12", "--prompts", str(f), "--quick")
    assert rc == 0 and "history" not in out and "default mode" not in out and out.endswith("verdict: OK\n"), out + err


@pytest.mark.parametrize("content,needle", [(None, "cannot read"), (b"\n  \n", "has no prompt"),
                                            (b"\xff\xfe junk", "is not UTF-8")])
def test_verify_bad_prompts_file(tiny, cli, tmp_path, content, needle):
    f = tmp_path / "prompts.txt"
    if content is not None:
        f.write_bytes(content)
    _one_line_error(*cli("verify", *pair(tiny), "--prompts", str(f)), needle)


def _one_line_error(rc, out, err, *needles):
    assert rc != 0
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_file(tmp_path, cli):
    _one_line_error(*cli("run", "--target", str(tmp_path / "nope.gguf"), "hi"), "nope.gguf", "not found")


def test_not_a_gguf(tmp_path, cli):
    f = tmp_path / "notes.gguf"
    f.write_text("hello, I am a text file pretending to be a model\n" * 100)
    _one_line_error(*cli("run", "--target", str(f), "hi"), "not a GGUF")


def test_truncated_gguf(tiny, tmp_path, cli):
    f = tmp_path / "truncated.gguf"
    f.write_bytes(tiny.target.read_bytes()[:200_000])
    _one_line_error(*cli("run", "--target", str(f), "hi"), "could not load")


def test_incompatible_pair(tiny, cli):
    _one_line_error(*cli("run", "--target", str(tiny.target), "--draft", str(tiny.other_vocab), "hi"),
                    "not compatible", "token")


def test_empty_prompt(tiny, monkeypatch, cli):
    monkeypatch.setattr(sys, "stdin", open(os.devnull))
    _one_line_error(*cli("run", *pair(tiny), "   "), "empty prompt")


def test_prompt_longer_than_context(tiny, cli):
    _one_line_error(*cli("run", *pair(tiny), "--raw", "the cache " * 400), "context holds")


def test_a_model_without_chat_template_is_answered_with_chatml(tiny, cli, capsys):
    """As llama-server does, with one note saying so; --chat-template gives another (a bad one: one line)."""
    args = ["run", "--target", str(tiny.no_template), "--threads", str(THREADS), "-c", "512", "-n", "4",
            "--temperature", "0"]
    rc, out, err = cli(*args, "hi")
    assert rc == 0 and out.strip()
    assert err == (f"note: {tiny.no_template.name} has no chat template in its GGUF: ChatML is used, as llama-server "
                   "does (--chat-template gives another, --raw sends plain text)\n")
    same, _, err = cli(*args, "--chat-template", "chatml", "hi")
    assert same == 0 and err == ""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([*args, "--chat-template", "{% if %}", "hi"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: argument --chat-template: ")
    assert "does not compile" in err and "chatml" in err


def test_bad_flag_value(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--top-p", "3", "hi"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")


def test_piped_stdin_is_prepended(tiny):
    """A real process: stdin piped, text on stdout, nothing else."""
    r = subprocess.run([sys.executable, "-m", "localspec", "run", *pair(tiny), "--json", "--temperature", "0",
                        "-n", "4", "--spec", "off", "summarize this"], input="the cache is fast",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["stats"]["prompt_tokens"] > 15  # both the piped text and the argument went in


def _proc(args, stdin: bytes | None = None, env: dict | None = None):
    import os

    return subprocess.run([sys.executable, "-m", "localspec", *args], input=stdin, capture_output=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_bytes_that_are_not_utf8_get_one_line(tiny):
    r = _proc(["run", *pair(tiny), "-n", "4", "summarize"], stdin=b"\xff\xfe caches \x80")
    assert r.returncode == 2 and r.stdout == b""
    assert r.stderr.decode() == ("error: the piped input is not UTF-8 text (byte 0xff at offset 0); convert it first, "
                                 "e.g. `iconv -f latin1 -t utf-8 FILE | localspec run ...`\n")
    r = _proc(["run", *pair(tiny), "-n", "4", b"caf\xe9".decode("utf-8", "surrogateescape")], stdin=b"")
    assert r.returncode == 2 and r.stderr.decode().startswith("error: the prompt argument is not UTF-8 text (byte 0xe9")


def test_a_data_dir_that_cannot_be_written(tiny, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = _proc(["run", "-n", "2", "hi"], stdin=b"", env={"LOCALSPEC_HOME": str(blocker / "home")})
    err = r.stderr.decode()
    assert r.returncode != 0 and err.count("\n") == 1 and err.startswith("error: ") and "LOCALSPEC_HOME" in err
    assert "Traceback" not in err


def test_gpu_layers_on_a_cpu_build_say_so_and_run(tiny, cli):
    from localspec.backend import system_info

    if system_info()["gpu_offload"]:
        pytest.skip("this llama-cpp-python has a GPU backend")
    rc, out, err = cli("run", *pair(tiny), "-ngl", "99", "-n", "3", "--temperature", "0", "--spec", "off", "hi")
    assert rc == 0 and out.strip()
    assert err.startswith("note: -ngl 99: this llama-cpp-python has no GPU backend, so everything runs on the CPU")


def test_flash_attention_auto_is_off_on_a_cpu_and_asked_settings_are_kept():
    from localspec.backend import system_info
    from localspec.config import LoadConfig
    from localspec.engine import Engine

    cpu = not system_info()["gpu_offload"]
    assert Engine.flash_attn_in_use(LoadConfig()) == ("off" if cpu else "auto")
    assert Engine.flash_attn_in_use(LoadConfig(n_gpu_layers_target=0)) == "off"  # nothing offloaded: a CPU
    for asked in ("on", "off"):
        assert Engine.flash_attn_in_use(LoadConfig(flash_attn=asked, n_gpu_layers_target=0)) == asked


def test_flash_attention_off_gives_the_same_greedy_answer_and_its_own_keys(tiny, cli):
    from localspec.serving.caches.promptdisk import pair_key

    runs = {fa: cli("run", *pair(tiny), "-fa", fa, "-n", "12", "--temperature", "0", "--spec", "on", "--json", "hi")
            for fa in ("auto", "off", "on")}
    assert all(r.code == 0 for r in runs.values()), {k: r.err for k, r in runs.items()}
    texts = {json.loads(r.out)["text"] for r in runs.values()}
    assert len(texts) == 1  # the tiny target has no near-ties at this length
    # a state saved without flash attention (V stored transposed) is never offered to a context with it
    assert pair_key(str(tiny.target)) != pair_key(str(tiny.target), "off") != pair_key(str(tiny.target), "on")
    with pytest.raises(SystemExit) as e:
        main(["run", "-fa", "maybe", "hi"])
    assert e.value.code == 2
