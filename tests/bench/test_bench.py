"""`localspec bench` on the tiny GGUF pair: every field present and sane, the prompt sets, the
A/B schedule, --prompts validation, --costs and the markdown report. No timing is asserted:
only that times are positive and that the counts add up."""

from __future__ import annotations

import io
import json
import sys

import pytest
from conftest import THREADS, invoke

from localspec.bench import workloads as wl
from localspec.bench.runner import (
    Setting,
    build_settings,
    parse_setting,
    runs_per_prompt,
    schedule,
)
from localspec.cli import main
from localspec.errors import ConfigError

SETTINGS_KEYS = {"setting", "ratio", "spec_tps", "plain_tps", "ratio_pooled", "predicted", "identical_outputs",
                 "pooled", "per_prompt"}
POOLED_KEYS = {"runs", "tokens", "target_passes", "rounds_plain", "drafted", "accepted", "drafted_by_position",
               "accepted_by_position", "drafted_by_drafter", "accepted_by_drafter", "tokens_by_source",
               "prompt_eval_s", "draft_s", "verify_s", "other_s", "generation_s", "tokens_per_second",
               "acceptance_rate", "alpha", "mean_accepted_length", "tokens_per_pass", "passes_per_token",
               "acceptance_by_position", "conditional_acceptance_by_position", "time_split"}


def bench(argv: list[str], home) -> tuple[int, str, str]:
    """`localspec bench ...` with LOCALSPEC_HOME at `home` (module-scoped fixtures share one)."""
    return tuple(invoke("bench", *argv, home=home))


def model_args(tiny, draft) -> list[str]:
    return ["--target", str(tiny.target), "--draft", str(draft), "--threads", str(THREADS), "--ctx-size", "4096"]


@pytest.fixture(scope="module")
def doc(tiny, tmp_path_factory):
    """One bench over two workloads and a grid of fixed and auto settings, as JSON."""
    home = tmp_path_factory.mktemp("home")
    code, out, err = bench([*model_args(tiny, tiny.perturbed), "--workloads", "chat,edit", "--prompts-per-workload", "2",
                            "-n", "24", "-k", "1,3", "--drafter", "model,ngram,hybrid", "--spec", "on,auto", "--json"],
                           home)
    assert code == 0, err
    return json.loads(out)


def test_bench_json_has_every_field(doc):
    for key in ("schema", "created", "localspec", "llama_cpp_python", "machine", "command", "pair", "load", "options",
                "settings", "costs", "auto_profile", "warnings", "workloads"):
        assert key in doc, key
    labels = [s["label"] for s in doc["settings"]]
    # fixed k over the grid; auto once per drafter, capped by the largest k
    assert labels == ["model k=1", "model k=3", "ngram k=1", "ngram k=3", "hybrid k=1", "hybrid k=3",
                      "auto model k<=3", "auto ngram k<=3", "auto hybrid k<=3"]
    assert [w["workload"] for w in doc["workloads"]] == ["chat", "edit"]
    assert doc["options"]["temperature"] == 0.0 and doc["load"]["threads"] == THREADS
    assert doc["auto_profile"] is not None and doc["auto_profile"]["t_decode"] > 0
    for w in doc["workloads"]:
        assert len(w["prompts"]) == 2
        assert {s["setting"]["label"] for s in w["settings"]} == set(labels)
        for s in w["settings"]:
            assert SETTINGS_KEYS <= set(s), s["setting"]
            assert POOLED_KEYS <= set(s["pooled"]), s["setting"]
            assert [p["id"] for p in s["per_prompt"]] == w["prompts"]


def test_bench_values_are_sane(doc):
    c = doc["costs"]
    assert len(c["t_verify"]) >= 4 and all(t > 0 for t in c["t_verify"])  # n = 1..k_max+1
    assert c["verify_ratio"][0] == pytest.approx(1.0) and c["draft_ratio"] > 0
    for w in doc["workloads"]:
        assert w["plain"]["tps"]["median"] > 0
        plain = w["plain"]["pooled"]
        assert plain["drafted"] == 0 and plain["target_passes"] == plain["tokens"] + plain["stop_reasons"].get("eos", 0)
        # A B A B: one plain run before the settings and one after each of them, per prompt
        assert plain["runs"] == 2 * (1 + len(doc["settings"]))
        for s in w["settings"]:
            label, p = s["setting"]["label"], s["pooled"]
            r = s["ratio"]
            assert 0 < r["min"] <= r["median"] <= r["max"], label
            assert s["ratio_pooled"] > 0 and s["spec_tps"]["median"] > 0 and s["plain_tps"]["median"] > 0
            assert p["runs"] == 2 and p["tokens"] > 0 and p["generation_s"] > 0
            # the per-position counts add up to the drafted and accepted totals
            assert sum(p["drafted_by_position"]) == p["drafted"] == sum(p["drafted_by_drafter"].values()), label
            assert sum(p["accepted_by_position"]) == p["accepted"] == sum(p["accepted_by_drafter"].values()), label
            assert all(a <= d for a, d in zip(p["accepted_by_position"], p["drafted_by_position"]))
            assert p["accepted_by_position"] == sorted(p["accepted_by_position"], reverse=True)
            assert sum(p["tokens_by_source"].values()) == p["tokens"]
            assert p["tokens_by_source"].get("target", 0) + p["accepted"] >= p["tokens"]
            assert 0 < p["passes_per_token"] <= 1.0 + 1e-9 and p["tokens_per_pass"] >= 1.0 - 1e-9
            assert p["target_passes"] - p["rounds_plain"] == p["draft_rounds"]
            if p["drafted"]:
                assert 0.0 <= p["acceptance_rate"] <= 1.0 and 0.0 <= p["alpha"] <= 1.0
                assert all(x is None or 0.0 <= x <= 1.0 for x in p["acceptance_by_position"])
                assert all(x is None or 0.0 <= x <= 1.0 for x in p["conditional_acceptance_by_position"])
                cap = max(s["setting"]["k"], s["setting"]["ngram_k"])
                assert 0.0 <= p["mean_accepted_length"] <= cap
                assert max(len(p["drafted_by_position"]), 1) <= cap
            else:  # only auto may decide never to draft
                assert s["setting"]["spec"] == "auto" and p["acceptance_rate"] is None, label
            split = p["time_split"]
            assert sum(split.values()) == pytest.approx(1.0, abs=1e-6) and all(0 <= v <= 1 for v in split.values())
            assert p["draft_s"] >= 0 and p["verify_s"] > 0 and p["other_s"] >= 0
            # predictions: Leviathan only for a fixed k; the realised rounds for every setting
            pred = s["predicted"]
            if s["setting"]["spec"] == "on":
                assert pred["leviathan"] > 0
                assert s["setting"]["drafter"] != "model" or p["rounds_plain"] == 0
            else:
                assert pred["leviathan"] is None
            assert pred["rounds"] > 0
            # greedy speculation reproduces plain decoding's text on the tiny pair
            assert s["identical_outputs"] == {"same": 2, "of": 2}, label


def test_identical_draft_accepts_everything_and_prediction_follows_the_costs(tiny, tmp_path):
    code, out, err = bench([*model_args(tiny, tiny.same), "--workloads", "code", "--prompts-per-workload", "2",
                            "-n", "20", "-k", "3", "--json", "-q"], tmp_path)
    assert code == 0, err
    d = json.loads(out)
    assert [s["label"] for s in d["settings"]] == ["model k=3"]
    s = d["workloads"][0]["settings"][0]
    p = s["pooled"]
    assert p["acceptance_rate"] == 1.0 and p["alpha"] == 1.0
    assert p["mean_accepted_length"] == pytest.approx(3.0, abs=0.5)  # the last round may be cut short
    assert p["acceptance_by_position"] == [1.0, 1.0, 1.0]
    assert p["tokens_by_source"]["model"] > 0.6 * p["tokens"]
    # at alpha = 1 Leviathan is (k + 1) tokens per k T_draft + T_verify(k + 1), over 1 per T_decode
    c = d["costs"]
    expect = 4 / (3 * c["t_draft"] + c["t_verify"][3]) * c["t_decode"]
    assert s["predicted"]["leviathan"] == pytest.approx(expect, rel=1e-9)
    assert d["auto_profile"] is None  # no auto setting: no stored profile needed


def test_default_settings_are_fixed_model_draft_and_runs_default(tiny, tmp_path):
    code, out, err = bench([*model_args(tiny, tiny.perturbed), "--prompts", str(_write(tmp_path, [
        {"id": "a", "prompt": "hello world the cache"}])), "-n", "8", "--json", "-q"], tmp_path / "home")
    assert code == 0, err
    d = json.loads(out)
    # `run`'s default: auto, hybrid, the pair's k for the draft model and a longer cap for n-grams
    assert [s["label"] for s in d["settings"]] == ["model k=4", "auto hybrid k<=4/64"]
    assert d["settings"][1] == {"label": "auto hybrid k<=4/64", "spec": "auto", "drafter": "hybrid", "k": 4,
                                "ngram_k": 64, "p_min": 0.0}
    assert [w["workload"] for w in d["workloads"]] == ["custom"]  # only the user's prompts by default
    assert "--setting on:model:4 --setting auto:hybrid:4/64" in d["command"]


def test_auto_reuses_the_stored_profile_unless_retune(tiny, tmp_path, monkeypatch):
    from localspec.costs import tuning

    measured = []  # every profile measurement, counted where profiles are made (the predictions' own costs aside)
    real = tuning.tune
    monkeypatch.setattr(tuning, "tune", lambda *a, **kw: measured.append(1) or real(*a, **kw))
    args = [*model_args(tiny, tiny.perturbed), "--workloads", "chat", "--prompts-per-workload", "1", "-n", "6",
            "--setting", "auto:ngram:2", "--json", "-q"]
    home = tmp_path / "home"
    first = json.loads(bench(args, home)[1])["auto_profile"]
    stored = list((home / "profiles").glob("*.json"))
    assert len(measured) == 1
    assert len(stored) == 1 and json.loads(stored[0].read_text())["t_verify"] == first["t_verify"]
    assert json.loads(bench(args, home)[1])["auto_profile"]["t_verify"] == first["t_verify"]  # reused
    assert len(measured) == 1
    third = json.loads(bench([*args, "--retune"], home)[1])
    assert len(measured) == 2  # measured again
    assert json.loads(stored[0].read_text())["t_verify"] == third["auto_profile"]["t_verify"]
    assert "--retune" in third["command"]


def test_text_table_and_sampling(tiny, tmp_path):
    code, out, err = bench([*model_args(tiny, tiny.perturbed), "--workloads", "support", "--prompts-per-workload", "1",
                            "-n", "12", "-k", "2", "--drafter", "ngram", "--temperature", "0.8", "--seed", "3"],
                           tmp_path)
    assert code == 0, err
    assert "speed ratio, speculative / plain tok/s" in out and "acceptance rate" in out
    assert "support:" in out and "ngram k=2" in out and "pred Lev." in out
    assert "temperature 0.8" in out
    assert "bench:" in err  # the progress lines (stderr is not a terminal here)


def test_report_without_matplotlib_has_tables_only(tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    rep = tmp_path / "out" / "bench.md"
    code, out, err = bench([*model_args(tiny, tiny.perturbed), "--workloads", "extract", "--prompts-per-workload", "1",
                            "-n", "8", "-k", "1,2", "--report", str(rep), "-q"], tmp_path / "home")
    assert code == 0, err
    md = rep.read_text()
    assert "matplotlib is not installed" in md and "localspec[plot]" in md
    assert "| extract |" in md and "## Pass costs" in md and "(bench.json)" in md
    assert json.loads((tmp_path / "out" / "bench.json").read_text())["workloads"][0]["workload"] == "extract"
    assert not list((tmp_path / "out").glob("*.png"))
    assert "tables only" in err


def test_report_with_plots(tiny, tmp_path):
    pytest.importorskip("matplotlib")
    rep = tmp_path / "bench.md"
    code, _, err = bench([*model_args(tiny, tiny.perturbed), "--workloads", "extract,edit", "--prompts-per-workload", "1",
                          "-n", "8", "-k", "1,2", "--drafter", "model,ngram", "--report", str(rep), "-q"], tmp_path / "h")
    assert code == 0, err
    md = rep.read_text()
    for png in ("bench-speedup.png", "bench-acceptance.png"):
        assert f"]({png})" in md
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_costs_table_and_save(tiny, tmp_path):
    home = tmp_path / "home"
    code, out, err = bench([*model_args(tiny, tiny.perturbed), "--costs", "--json", "--cost-repeats", "2"], home)
    assert code == 0, err
    d = json.loads(out)
    c = d["costs"]
    assert len(c["t_verify"]) == 16 and all(t > 0 for t in c["t_verify"])
    assert c["verify_ratio"][0] == pytest.approx(1.0) and c["draft_ratio"] > 0
    assert d["saved_to"] is None and not (home / "profiles").exists()  # nothing stored without --save
    assert [r["alpha"] for r in d["break_even"]] == [0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    code, out, err = bench([*model_args(tiny, tiny.perturbed), "--costs", "--save", "--cost-repeats", "2"], home)
    assert code == 0, err
    assert "T_verify(n)" in out and "T_draft" in out and "saved" in out
    saved = list((home / "profiles").glob("*.json"))
    assert len(saved) == 1 and len(json.loads(saved[0].read_text())["t_verify"]) == 16


def _write(tmp_path, rows, name="prompts.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_user_prompts_join_a_named_workload_and_cap_max_tokens(tiny, tmp_path):
    f = _write(tmp_path, [{"id": "mine-1", "workload": "mine", "prompt": "def parse ( data ) : return data",
                           "system": "be brief", "max_tokens": 5},
                          {"id": "mine-2", "workload": "mine", "prompt": "the cache is fast"}])
    code, out, err = bench([*model_args(tiny, tiny.perturbed), "--prompts", f, "--workloads", "mine,chat",
                            "--prompts-per-workload", "2", "-n", "10", "-k", "2", "--json", "-q"], tmp_path / "h")
    assert code == 0, err
    d = json.loads(out)
    mine, chat = d["workloads"]
    assert mine["workload"] == "mine" and mine["prompts"] == ["mine-1", "mine-2"] and chat["workload"] == "chat"
    per = {p["id"]: p for p in mine["plain"]["per_prompt"]}
    assert per["mine-1"]["tokens"] <= 5 and per["mine-2"]["tokens"] <= 10


BAD_FILES = [
    (['{"id": "a", "prompt": "x"}', '{"id": "b", "prompt": '], "line 2: not valid JSON"),
    (['{"id": "a"}'], "line 1: missing required field 'prompt'"),
    (['{"id": "a", "prompt": "x"}', "", '{"id": "b", "promt": "x"}'], "line 3: unknown field 'promt'"),
    (['{"id": "a", "prompt": "x", "max_tokens": 0}'], "line 1: 'max_tokens' must be 1 or more"),
    (['{"id": "a", "prompt": "x", "max_tokens": "64"}'], "line 1: 'max_tokens' must be a whole number"),
    (['{"id": "a", "prompt": "x"}', '{"id": "a", "prompt": "y"}'], "line 2: duplicate id 'a' (first on line 1)"),
    (['["id", "prompt"]'], "line 1: expected a JSON object"),
    (['{"id": "a", "prompt": "   "}'], "line 1: 'prompt' is empty"),
    (['{"id": 7, "prompt": "x"}'], "line 1: 'id' must be a string"),
    ([""], "no prompts in the file"),
]


@pytest.mark.parametrize("rows,message", BAD_FILES)
def test_prompts_file_errors_are_one_line_with_the_line_number(rows, message, tmp_path, capsys):
    f = _write(tmp_path, rows)
    # a model path that does not exist: the prompts are checked before any model is looked at
    code = main(["bench", "--prompts", f, "--target", str(tmp_path / "none.gguf")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert f"{f} {message}" in err or (message in err and f in err), err


def test_prompts_file_missing(tmp_path, capsys):
    code = main(["bench", "--prompts", str(tmp_path / "nope.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and "file not found" in err and err.count("\n") == 1


@pytest.mark.parametrize("argv,message", [
    (["--workloads", "chat,poetry"], "unknown workload 'poetry'"),
    (["-k", "0,2"], "-k: values must be 1 or more"),
    (["-k", "two"], "-k: 'two' is not valid"),
    (["--drafter", "model,oracle"], "--drafter: 'oracle' is not one of"),
    (["--spec", "off"], "--spec: 'off' is not one of"),
    (["--p-min", "1.5"], "--p-min: values must be between 0 and 1"),
    (["--setting", "on:model"], None),  # valid: k from the default
    (["--setting", "sometimes:model:2"], "spec must be one of"),
    (["--save"], "--save goes with --costs"),
])
def test_bad_options_fail_in_one_line(argv, message, tiny, tmp_path, capsys):
    if message is None:
        assert parse_setting(argv[1], 4) == Setting("on", "model", 4)
        return
    code = main(["bench", *argv, "--target", str(tiny.target), "--draft", str(tiny.perturbed), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_model_drafter_needs_a_draft(tiny, tmp_path, capsys):
    code = main(["bench", "--target", str(tiny.target), "--drafter", "model", "-q"])
    assert code == 2 and "needs a draft model" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        build_settings(["on"], ["hybrid"], [2], [0.0], [Setting("on", "model", 2)], has_draft=False)
    # without a draft the n-gram drafter is the default
    assert build_settings(["on"], ["ngram"], [2, 4], [0.0, 0.5], [], has_draft=False) == [
        Setting("on", "ngram", 2), Setting("on", "ngram", 4)]  # --p-min does not apply to n-grams


def test_settings_grid_and_parsing():
    got = build_settings(["on", "auto"], ["model"], [1, 4], [0.0, 0.5], [parse_setting("on:ngram:6", 4)], True)
    assert [s.label for s in got] == ["model k=1", "model k=1 p_min=0.5", "model k=4", "model k=4 p_min=0.5",
                                      "auto model k<=4", "auto model k<=4 p_min=0.5", "ngram k=6"]
    assert parse_setting("auto:hybrid", 5) == Setting("auto", "hybrid", 5)
    assert parse_setting("on:model:3:0.25", 5) == Setting("on", "model", 3, 0.25)
    # like `localspec run`: without K auto keeps the longer n-gram cap, an explicit K caps both
    run_default = parse_setting("auto:hybrid", 4, 8)
    assert (run_default.k, run_default.ngram_cap, run_default.cap, run_default.arg()) == (4, 8, 8, "auto:hybrid:4/8")
    assert parse_setting(run_default.arg(), 2) == run_default
    assert parse_setting("auto:hybrid:6", 4, 8).ngram_cap == 6
    assert parse_setting("on:ngram", 4, 8) == Setting("on", "ngram", 4)
    for bad in ("on", "on:model:0", "on:model:x", "on:model:2:2", "on:telepathy:2", "a:b:c:d:e", "on:ngram:2/8"):
        with pytest.raises(ConfigError):
            parse_setting(bad, 4)


def test_schedule_alternates_plain_and_speculative_runs():
    a, b, c = Setting("on", "model", 1), Setting("on", "model", 2), Setting("on", "ngram", 4)
    assert schedule([a, b, c], 1) == [None, a, None, b, None, c, None]
    assert schedule([a, b, c], 2) == [None, a, b, None, c, None]
    assert runs_per_prompt(3, 1, 2) == 2 * 7 and runs_per_prompt(3, 2, 1) == 6


def test_shipped_workloads():
    assert list(wl.BUILTIN) == ["chat", "code", "edit", "support", "docqa", "extract", "fim"]
    assert wl.CHAT_WORKLOADS == ["chat", "code", "edit", "support", "docqa", "extract"]  # fim runs when named
    all_ids = set()
    for name in wl.BUILTIN:
        prompts = wl.load_builtin(name)
        assert len(prompts) >= 8, name
        assert all(p.workload == name and p.prompt.strip() for p in prompts)
        ids = {p.id for p in prompts}
        assert len(ids) == len(prompts) and not ids & all_ids
        all_ids |= ids
    # the code-editing prompts carry the code to edit; the document ones the document
    assert all("```" in p.prompt and p.prompt.count("\n") >= 10 for p in wl.load_builtin("edit"))
    assert all("Document:" in p.prompt and len(p.prompt) > 1000 for p in wl.load_builtin("docqa"))
    chosen = wl.select("edit,docqa", [], 3)
    assert list(chosen) == ["edit", "docqa"] and all(len(v) == 3 for v in chosen.values())
    assert sum(len(v) for v in wl.select(None, [], 0).values()) == sum(len(wl.load_builtin(n)) for n in wl.CHAT_WORKLOADS)
    assert list(wl.select("all,fim", [], 1)) == [*wl.CHAT_WORKLOADS, "fim"]


def test_list_workloads(capsys):
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    for name in wl.BUILTIN:
        assert f"{name} (" in out
    assert "edit-01" in out


def _documented_command() -> list[str]:
    import re
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "BENCHMARKS.md").read_text()
    block = re.search(r"```sh\n(localspec bench .*?)```", text, re.S).group(1)
    return shlex.split(block.replace("\\\n", " "))


def test_documented_command_matches_the_script():
    from pathlib import Path

    doc = _documented_command()
    script = (Path(__file__).resolve().parents[2] / "scripts" / "bench-default").read_text()
    settings = [doc[i + 1] for i, a in enumerate(doc) if a == "--setting"]
    assert settings == ["on:ngram:4", "on:hybrid:4", "auto:hybrid"]
    for s in settings:
        assert f"--setting {s}" in script
    assert doc[doc.index("-k") + 1] == "1,2,3,4,6" and "K=${K:-1,2,3,4,6}" in script
    assert doc[doc.index("--workloads") + 1] == "chat,code,edit,support,docqa,extract"
    assert "--workloads chat,code,edit,support,docqa,extract" in script
    for flag, env in (("--max-tokens", "MAX_TOKENS:-"), ("--prompts-per-workload", "PROMPTS:-"),
                      ("--baseline-every", "BASELINE_EVERY:-"), ("--repeat", "REPEAT:-")):
        assert f"{env}{doc[doc.index(flag) + 1]}}}" in script, flag


def test_documented_command_runs_and_fills_the_doc_block(tiny, tmp_path):
    """The docs' command on the tiny pair, shrunk (1 prompt, 6 tokens) and writing to a copy of the doc."""
    from pathlib import Path

    argv = _documented_command()[2:]  # drop "localspec bench"
    md = tmp_path / "BENCHMARKS.md"
    original = (Path(__file__).resolve().parents[2] / "docs" / "BENCHMARKS.md").read_text()
    md.write_text(original)
    for flag, value in (("--max-tokens", "6"), ("--prompts-per-workload", "1"),
                        ("--report", str(tmp_path / "bench" / "cpu.md")), ("--doc-block", f"{md}:cpu-default")):
        argv[argv.index(flag) + 1] = value
    code, out, err = bench([*argv, *model_args(tiny, tiny.perturbed), "-q"], tmp_path / "home")
    assert code == 0, err
    text = md.read_text()
    block = text.split("<!-- bench:cpu-default -->")[1].split("<!-- /bench:cpu-default -->")[0]
    assert "To be filled" not in block and "llama-cpp-python 0.3" in block
    assert "| workload | plain tok/s | model k=1 |" in block and "auto hybrid k<=4/64" in block
    assert "| docqa |" in block and "[bench/cpu.md](bench/cpu.md)" in block
    gpu = "<!-- bench:gpu-default -->" + original.split("<!-- bench:gpu-default -->")[1].split("<!-- /bench")[0]
    assert gpu in text and len(gpu) > 40  # other blocks untouched
    assert (tmp_path / "bench" / "cpu.json").exists()


def test_doc_block_is_checked_before_the_run(tmp_path, capsys):
    md = tmp_path / "doc.md"
    md.write_text("# no markers here\n")
    code = main(["bench", "--doc-block", f"{md}:cpu-default", "--target", str(tmp_path / "none.gguf")])
    err = capsys.readouterr().err
    assert code == 2 and "has no block <!-- bench:cpu-default -->" in err


def test_progress_bar():
    from localspec.bench.progress import Progress, fmt_duration

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    p = Progress(tty)
    p.start(3)
    for i in range(3):
        p.step(f"edit edit-0{i} model k={i + 1}")
    p.finish()
    out = tty.getvalue()
    assert "\r\x1b[2K[" in out and "2/3" in out and "edit edit-02 model k=3" in out
    assert out.endswith("bench: 3 runs in 0s\n")
    log = io.StringIO()  # not a terminal: a line per 10%, no control characters
    p = Progress(log)
    p.start(40)
    for i in range(40):
        p.step(str(i))
    p.finish()
    lines = log.getvalue().splitlines()
    assert "\x1b" not in log.getvalue() and len(lines) == 11 and lines[-1] == "bench: 40 runs in 0s"
    assert (fmt_duration(59), fmt_duration(61), fmt_duration(3725)) == ("59s", "1m01s", "1h02m")


def test_fim_workload_from_the_standard_library(tiny, tmp_path):
    from localspec.bench.fimcode import fim_prompts, stdlib_dir

    prompts = fim_prompts()
    assert len(prompts) >= 10 and len({p["id"].split(".")[0] for p in prompts[:8]}) == 8  # spread over modules
    for p in prompts:
        path, line = p["where"].rsplit(":", 1)
        lines = open(path, encoding="utf-8").read().splitlines(keepends=True)
        n = p["reference"].count("\n")
        assert "".join(lines[int(line) - 1:int(line) - 1 + n]) == p["reference"]  # cut at line boundaries
        assert p["prefix"].endswith("\n") and str(stdlib_dir()) in path
    code, out, err = bench(["--target", str(tiny.fim_target), "--draft", str(tiny.fim_draft), "--threads", str(THREADS),
                            "--workloads", "fim", "--prompts-per-workload", "2", "-n", "16", "--json", "-q"], tmp_path)
    assert code == 0, err
    w = json.loads(out)["workloads"][0]
    assert w["workload"] == "fim" and len(w["prompts"]) == 2
    for s in w["settings"]:
        assert s["latency_s"]["median"] > 0 and 0 <= s["reference_match"]["same"] <= s["reference_match"]["of"] == 2
    # a model without FIM tokens: one line that says so
    code, out, err = bench(["--target", str(tiny.target), "--threads", str(THREADS), "--workloads", "fim", "-q"], tmp_path)
    assert code == 1 and err.startswith("error: Infill is not supported by this model") and err.count("\n") == 1


def test_background_load_runs_busy_processes_and_stops_them(tiny, tmp_path):
    import os

    from localspec.bench.load import background_load

    with background_load(2, limit_s=60) as procs:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs)  # gone when the block ends
    code, out, err = bench([*model_args(tiny, tiny.perturbed), "--workloads", "chat", "--prompts-per-workload", "1",
                            "-n", "6", "-k", "2", "--background-load", "1", "--json", "-q"], tmp_path)
    assert code == 0, err
    d = json.loads(out)
    assert d["options"]["background_load"] == 1 and "--background-load 1" in d["command"]
    assert not [p for p in os.popen("pgrep -f 'while time.time() < end'").read().split() if p]
