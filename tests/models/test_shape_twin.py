"""scripts/shape-twin: a model's exact header with random weights of the same types, run as a process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import THREADS

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "shape_twin.py"


def twin_of(model: Path, tmp: Path) -> Path:
    for args in (["header", model, tmp / "m.twin"], ["build", tmp / "m.twin", tmp / "twin.gguf"]):
        r = subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r
    assert (tmp / "m.twin").stat().st_size < model.stat().st_size
    return tmp / "twin.gguf"


def test_twin_keeps_the_header_types_and_shapes_and_runs(tiny, tmp_path):
    from gguf import GGUFReader

    from localspec.backend import Context, Model
    from localspec.quantize import quantize_q4_0

    q4 = quantize_q4_0(tiny.target, tmp_path / "q4_0.gguf", threads=THREADS)  # quantized blocks, not only F16
    twin = twin_of(q4, tmp_path)
    assert twin.stat().st_size == q4.stat().st_size
    real, copy = GGUFReader(q4), GGUFReader(twin)
    assert [(t.name, t.tensor_type, list(t.shape), int(t.data_offset)) for t in real.tensors] == \
           [(t.name, t.tensor_type, list(t.shape), int(t.data_offset)) for t in copy.tensors]
    assert q4.read_bytes()[:real.data_offset] == twin.read_bytes()[:copy.data_offset]
    assert any(t.tensor_type == 2 for t in copy.tensors)  # Q4_0 blocks were filled
    assert not all(np.array_equal(a.data, b.data) for a, b in zip(real.tensors, copy.tensors))
    m = Model(twin, n_gpu_layers=0)
    ctx = Context(m, 256, 256, THREADS, THREADS)
    logits = ctx.eval(m.tokenize("the code of the cache", True), logits="all")
    assert np.isfinite(logits).all() and m.n_vocab == Model(q4, n_gpu_layers=0).n_vocab
    ctx.close()


def test_twin_usage_line(tmp_path):
    r = subprocess.run([sys.executable, SCRIPT, "header"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == "" and r.stderr.startswith("scripts/shape-twin header MODEL.gguf")
