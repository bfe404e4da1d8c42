"""`localspec tune`: the stored profile, its display, and the Q4_0 draft comparison."""

from __future__ import annotations

import json

from conftest import THREADS

from localspec.backend import Model
from localspec.cli import main


def test_tune_measures_stores_and_shows(tiny, capsys, localspec_home):
    pair = ["--target", str(tiny.target), "--draft", str(tiny.perturbed), "--threads", str(THREADS)]
    assert main(["tune", *pair, "--show"]) == 1
    assert "no profile stored" in capsys.readouterr().err
    assert main(["tune", *pair, "--json"]) == 0
    measured = json.loads(capsys.readouterr().out)
    assert len(measured["t_verify_ms"]) == 64  # the curve to 64-token passes
    assert all(t > 0 for t in measured["t_verify_ms"])
    assert measured["verify_relative"][0] == 1.0 and measured["t_draft_ms"] > 0
    assert set(measured["model_draft_break_even"]) == {"alpha=0.6", "alpha=0.8", "alpha=0.9", "alpha=0.95"}
    assert main(["tune", *pair, "--show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["t_verify_ms"] == measured["t_verify_ms"]  # read back, not re-measured
    assert len(list((localspec_home / "profiles").glob("*.json"))) == 1


def test_quantize_draft_builds_a_loadable_q4_0_and_measures_it(tiny, capsys, localspec_home):
    rc = main(["tune", "--target", str(tiny.target), "--draft", str(tiny.perturbed), "--threads", str(THREADS),
               "--quantize-draft", "--json"])
    assert rc == 0
    q = json.loads(capsys.readouterr().out)["q4_0_draft"]
    assert q["path"].startswith(str(localspec_home / "models"))
    m = Model(q["path"])
    assert m.meta("general.file_type") == "2"  # LLAMA_FTYPE_MOSTLY_Q4_0
    m.close()
    assert 0.0 <= q["acceptance_q4_0"] <= 1.0 and q["t_draft_ms_q4_0"] > 0
    assert q["advice"].startswith(("use it", "keep the original"))
