"""Drafters that ship with models, recognised from their headers: a target's own NextN (MTP) blocks, and
drafter files of architectures of their own (EAGLE-3, DFlash, Gemma 4 assistants), refused as draft models
with one line that says why."""

from __future__ import annotations

import json

import pytest
from conftest import THREADS, invoke

from harness.tinyarch import TINY, _metadata, build_tiny_arch
from harness.tinygguf import CHATML


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    d = tmp_path_factory.mktemp("heads")
    return {"nextn": build_tiny_arch(d / "nextn.gguf", "qwen35", seed=0, nextn=1),
            "plain": build_tiny_arch(d / "plain.gguf", "qwen35", seed=0),
            "eagle3": _drafter_header(d / "eagle3.gguf", "eagle3")}


def _drafter_header(path, arch: str):
    """A drafter file's header (the tests' vocabulary, no weights): what `check` and pairing read."""
    _metadata(path, arch, CHATML, TINY, f"tiny-{arch}")
    return path


def test_a_targets_nextn_blocks_are_recognised(heads, tmp_path):
    r = invoke("check", str(heads["nextn"]), "--json", home=tmp_path)
    target = json.loads(r.out)["target"]
    assert r.code == 0 and target["draft_head"] == "nextn" and target["nextn_layers"] == 1
    plain = json.loads(invoke("check", str(heads["plain"]), "--json", home=tmp_path).out)["target"]
    assert plain["draft_head"] is None and plain["nextn_layers"] == 0
    text = invoke("check", str(heads["nextn"]), home=tmp_path).out
    assert "target draft head: 1 NextN (MTP) block(s)" in text


def test_a_drafter_file_is_refused_as_a_draft_model_in_one_line(heads, tmp_path):
    r = invoke("check", str(heads["plain"]), str(heads["eagle3"]), "--json", home=tmp_path)
    result = json.loads(r.out)
    assert result["compatible"] is False and result["draft"]["draft_head"] == "eagle3"
    assert "an EAGLE-3 drafter (architecture eagle3), not a draft model" in result["mismatch"]
    r = invoke("run", "--target", str(heads["plain"]), "--draft", str(heads["eagle3"]), "--threads", str(THREADS),
               "-c", "256", "-n", "4", "--spec", "on", "hello", home=tmp_path)
    assert r.code != 0 and r.err.count("\n") == 1 and "not a draft model" in r.err and "Traceback" not in r.err


def test_the_catalog_pairs_a_target_with_its_own_head_first_and_serves_no_drafter_file(heads, tmp_path):
    """A models folder (`localspec serve`'s): a NextN target drafts with its head, not with a smaller model of
    its vocabulary beside it; a target without one gets that model; the drafter file is neither."""
    import shutil

    from localspec.models.catalog import find_models

    wide = dict(width=128, head_dim=32, ff=256)  # more than twice the small model's bytes
    built, d = tmp_path / "built", tmp_path / "models"
    built.mkdir(), d.mkdir()
    shutil.copy(build_tiny_arch(built / "wide.gguf", "qwen35", seed=1, dims=wide), d / "wide.gguf")
    shutil.copy(build_tiny_arch(built / "wide-nextn.gguf", "qwen35", seed=1, dims=wide, nextn=1), d / "wide-nextn.gguf")
    shutil.copy(heads["plain"], d / "small.gguf")
    shutil.copy(heads["eagle3"], d / "eagle3.gguf")
    entries = {e.name: e.draft for e in find_models(d)}
    assert entries == {"small": None, "wide": d / "small.gguf", "wide-nextn": None}
