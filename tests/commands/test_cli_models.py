"""Transcripts of `localspec models | paths | check | pull | rm | doctor`, whole outputs asserted."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from hub_helpers import cache_hf_file, gguf_kv_end

from localspec import models, paths

TINY_REGISTRY = """\
pairs:
  tiny:
    target:
      hf: {repo: org/tiny-GGUF, file: target.gguf}
    draft:
      hf: {repo: org/tiny-GGUF, file: draft.gguf, size: 1234}
    draft_max: 3
    notes: a tiny test pair
  remote-only:
    target: org/remote-GGUF/t.gguf
"""


@pytest.fixture
def tiny_registry(tmp_path, monkeypatch):
    """Only the pairs above, so the whole listing can be written down."""
    f = tmp_path / "models.yaml"
    f.write_text(TINY_REGISTRY)
    monkeypatch.setattr(models.registry, "PACKAGE_REGISTRY_FILE", f)
    return f




def test_paths_json(localspec_home, cli):
    code, out, err = cli("paths", "--json")
    hf_home = os.environ["HF_HOME"]
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "home": str(localspec_home),
        "models": str(localspec_home / "models"),
        "profiles": str(localspec_home / "profiles"),
        "history": str(localspec_home / "history.db"),
        "copies": str(localspec_home / "copies"),
        "user_config": str(localspec_home / "models.yaml"),
        "hf_cache": f"{hf_home}/hub",
        "package_models": str(models.PACKAGE_REGISTRY_FILE),
    }


def test_models_json(tiny, tiny_registry, cli):
    target = cache_hf_file(models.hf_cache_dir(), "org/tiny-GGUF", "target.gguf", tiny.target)
    code, out, err = cli("models", "--json")
    assert (code, err) == (0, "")
    settings = {"draft_max": 4, "p_min": 0.0, "n_ctx": 4096, "n_gpu_layers_target": -1, "n_gpu_layers_draft": -1,
                "chat_template": None, "rpc_servers": None}
    assert json.loads(out) == {
        "default": "qwen2.5-coder-1.5b",
        "pairs": [
            {"name": "tiny", "default": False, "settings": {**settings, "draft_max": 3}, "notes": "a tiny test pair",
             "files": [
                 {"role": "target", "source": "org/tiny-GGUF/target.gguf", "state": "hf-cache", "path": str(target),
                  "size": tiny.target.stat().st_size, "problem": None},
                 {"role": "draft", "source": "org/tiny-GGUF/draft.gguf", "state": "missing", "path": None,
                  "size": 1234, "problem": None}]},
            {"name": "remote-only", "default": False, "settings": settings, "notes": "",
             "files": [{"role": "target", "source": "org/remote-GGUF/t.gguf", "state": "missing", "path": None,
                        "size": None, "problem": None}]},
        ],
        "gguf_files": [],
    }


def test_models_lists_the_gguf_files_serve_serves_by_name(tiny, cli):
    import shutil

    from localspec import paths

    folder = paths.ensure(paths.models_dir())
    shutil.copy(tiny.target, folder / "alpha.gguf")
    code, out, err = cli("models")
    assert (code, err) == (0, "")
    size = models.human_size(tiny.target.stat().st_size)
    assert out.endswith(f"GGUF files in {folder} that `localspec serve` also serves, by name:\n"
                        f"  alpha  {size}  n-gram drafts\n")
    listed = json.loads(cli("models", "--json")[1])["gguf_files"]
    assert listed == [{"name": "alpha", "path": str(folder / "alpha.gguf"), "size": tiny.target.stat().st_size,
                       "draft": None}]


def test_models_table_and_list_alias(tiny, tiny_registry, cli):
    cache_hf_file(models.hf_cache_dir(), "org/tiny-GGUF", "target.gguf", tiny.target)
    code, out, _ = cli("list")
    target = models.hf_cached_file("org/tiny-GGUF", "target.gguf")
    size = models.human_size(tiny.target.stat().st_size).ljust(8)  # e.g. "260.3 kB"
    assert code == 0
    assert out == textwrap.dedent(f"""\
        PAIR         ROLE    SIZE      WHERE     FILE
        tiny         target  {size}  HF cache  {target}
                     draft   1.2 kB    missing   org/tiny-GGUF/draft.gguf
        remote-only  target  -         missing   org/remote-GGUF/t.gguf
        * default pair. `localspec pull PAIR` fetches a missing pair; pairs come from {tiny_registry} and {paths.user_config_file()}
        """)


def test_check_json_incompatible(tiny, cli):
    code, out, err = cli("check", str(tiny.target), str(tiny.other_vocab), "--json")
    assert (code, err) == (1, "")

    def side(path):
        return {"ref": str(path), "where": str(path), "architecture": "llama", "name": "tiny-llama-seed0-perturb0.0",
                "basename": None, "file_type": "f16", "vocab_type": "spm", "n_tokens": 334, "bos": 1, "eos": 4,
                "add_bos": True, "header_bytes": gguf_kv_end(path), "bytes_read": os.path.getsize(path),
                "rollback": "partial", "draft_head": None, "nextn_layers": 0}

    assert json.loads(out) == {
        "target": side(tiny.target),
        "draft": side(tiny.other_vocab),
        "compatible": False,
        "mismatch": "token 261 differs: target '▁the', draft '▁zzthe'",
        "suggested_drafts": [],
    }


def test_check_text_compatible(tiny, cli):
    code, out, err = cli("check", str(tiny.target), str(tiny.same))
    assert (code, err) == (0, "")
    assert out == (
        f"target {tiny.target}: llama tiny-llama-seed0-perturb0.0 (f16), spm vocab of 334 tokens, bos 1, eos 4; "
        f"header {gguf_kv_end(tiny.target)} bytes\n"
        f"draft  {tiny.same}: llama tiny-llama-seed0-perturb0.0 (f16), spm vocab of 334 tokens, bos 1, eos 4; "
        f"header {gguf_kv_end(tiny.same)} bytes\n"
        "compatible: the draft can speculate for the target\n")


def test_check_suggests_drafts_known_for_the_target(tiny, tiny_registry, cli):
    cache_hf_file(models.hf_cache_dir(), "org/tiny-GGUF", "target.gguf", tiny.target)
    code, out, err = cli("check", "org/tiny-GGUF/target.gguf", str(tiny.other_vocab))
    assert (code, err) == (1, "")
    assert out.endswith("not compatible: token 261 differs: target '▁the', draft '▁zzthe'\n"
                        "drafts known for this target in models.yaml:\n"
                        "  org/tiny-GGUF/draft.gguf  (pair tiny)\n")


def test_errors_are_one_line_with_the_next_step(tmp_path, cli):
    code, out, err = cli("check", "qwen2.5-coder-1.5", str(tmp_path / "none.gguf"))
    assert (code, out) == (2, "")
    assert err == ("error: unknown pair 'qwen2.5-coder-1.5'; did you mean qwen2.5-coder-1.5b, qwen2.5-coder-14b, "
                   "qwen2.5-coder-7b?\n")
    code, out, err = cli("check", str(tmp_path / "none.gguf"))
    assert (code, out, err) == (1, "", f"error: model file not found: {tmp_path / 'none.gguf'}; pass an existing "
                                       ".gguf path, ORG/REPO/FILE.gguf or a pair name\n")
    code, out, err = cli("pull", "qwen2.5-coder-7b")
    assert (code, out) == (1, "")
    assert err == ("error: bartowski/Qwen2.5-Coder-7B-Instruct-GGUF/Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf is not "
                   "downloaded and HF_HUB_OFFLINE=1 is set; unset HF_HUB_OFFLINE to download it\n")
    assert cli("pull", "gemma3-4") == (2, "", "error: unknown pair 'gemma3-4'; did you mean gemma3-4b, "
                                                      "gemma3-12b?\n")
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"<html>404</html>")
    code, out, err = cli("check", str(bad), str(bad))
    assert (code, err) == (1, f"error: {bad} is not a GGUF model file (it starts with b'<htm'); pass a .gguf file\n")


def test_rm_transcript(tiny, tiny_registry, cli):
    cached = cache_hf_file(models.hf_cache_dir(), "org/tiny-GGUF", "target.gguf", tiny.target)
    size = models.human_size(tiny.target.stat().st_size)
    assert cli("rm", "tiny") == (0, f"removed {cached} ({size})\n", "")
    assert cli("rm", "tiny") == (0, "nothing to remove for tiny: no downloaded or assembled files\n", "")


def test_doctor_json_reports_build_machine_and_reinstall_commands(cli):
    code, out, err = cli("doctor", "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    tail = "pip install --force-reinstall --no-cache-dir llama-cpp-python"
    assert report["reinstall"] == {"cpu": f'CMAKE_ARGS="-DGGML_RPC=on" {tail}',
                                   "cuda": f'CMAKE_ARGS="-DGGML_CUDA=on -DGGML_RPC=on" {tail}',
                                   "metal": f'CMAKE_ARGS="-DGGML_METAL=on -DGGML_RPC=on" {tail}',
                                   "vulkan": f'CMAKE_ARGS="-DGGML_VULKAN=on -DGGML_RPC=on" {tail}',
                                   "hip": f'CMAKE_ARGS="-DGGML_HIP=on -DGGML_RPC=on" {tail}'}
    choice = report["setup_choice"]  # what scripts/bootstrap builds here (no GPU on the test machines: the CPU)
    assert choice["command"] == f"LOCALSPEC_BACKEND={choice['backend']} scripts/bootstrap" and choice["why"]
    assert report["cpu_cores"] == os.cpu_count()
    assert report["memory"]["total"] > 0
    assert report["default_pair"]["name"] == "qwen2.5-coder-1.5b"
    assert [f["role"] for f in report["default_pair"]["files"]] == ["target", "draft"]
    build = report["llama_cpp"]
    if build["importable"]:
        assert build["compiled_backend"] in ("cpu", "cuda", "metal", "vulkan", "hip", "sycl", "opencl", "musa", "cann")
        assert isinstance(build["gpu_offload"], bool) and "CPU" in build["system_info"]
