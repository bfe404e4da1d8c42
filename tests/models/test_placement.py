"""The pair's placement on a device of a given size (models/placement.py), from header-only GGUFs shaped as
Qwen2.5 at Q4_K_M (scripts/harness/qwen_headers.py); the hand arithmetic behind one row is in docs/MODELS.md."""

from pathlib import Path

import pytest

from harness.qwen_headers import write_qwen25_header
from localspec.errors import ConfigError
from localspec.models.gguf_header import read_layout_file
from localspec.models.placement import FIT_MARGIN, GiB, fit_pair, shape_of


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen-headers")
    return {s: shape_of(read_layout_file(write_qwen25_header(d / f"{s}.gguf", s)))
            for s in ("0.5b", "1.5b", "7b", "14b", "32b")}


# (target, GiB free) -> (target layers of n_layer + 1, draft layers, context): the server's 32k context asked for,
# not given (so reduced to fit, down to 4096); the 0.5B-shaped draft whole on the device in every case
TABLE = {
    ("7b", 4): (12, 25, 4096), ("7b", 8): (29, 25, 30208), ("7b", 12): (29, 25, 32768), ("7b", 24): (29, 25, 32768),
    ("14b", 4): (8, 25, 4096), ("14b", 8): (33, 25, 4096), ("14b", 12): (49, 25, 10496), ("14b", 24): (49, 25, 32768),
    ("32b", 4): (5, 25, 4096), ("32b", 8): (19, 25, 4096), ("32b", 12): (33, 25, 4096), ("32b", 24): (65, 25, 15360),
    ("1.5b", 4): (29, 25, 29696), ("1.5b", 8): (29, 25, 32768),
}


@pytest.mark.parametrize("size,gib", sorted(TABLE))
def test_the_table_of_placements(shapes, size, gib):
    p = fit_pair(shapes[size], shapes["0.5b"], gib * GiB, 32768, ctx_given=False)
    assert (p.target_layers, p.draft_layers, p.n_ctx) == TABLE[size, gib]
    assert p.fits and p.device_bytes <= gib * GiB - FIT_MARGIN


def test_each_choice_is_the_largest_that_fits(shapes):
    t, d = shapes["14b"], shapes["0.5b"]
    p = fit_pair(t, d, 8 * GiB, 32768, ctx_given=False)
    one_more = t.device_bytes(p.target_layers + 1, p.n_ctx) + d.device_bytes(25, p.n_ctx)
    assert p.device_bytes <= 7 * GiB < one_more
    p = fit_pair(t, d, 12 * GiB, 32768, ctx_given=False)  # every layer: the context is the largest multiple of 256
    assert t.device_bytes(49, p.n_ctx + 256) + d.device_bytes(25, p.n_ctx + 256) > 11 * GiB


def test_a_context_the_user_gave_is_kept_and_layers_give_way(shapes):
    p = fit_pair(shapes["14b"], shapes["0.5b"], 8 * GiB, 8192, ctx_given=True)
    assert (p.target_layers, p.n_ctx) == (29, 8192)
    assert p.why == "20 of the target's layers on the CPU"


def test_the_output_layer_goes_first(shapes):
    t = shapes["7b"]
    assert t.on_device(1) == (t.output_bytes, 0)
    assert t.on_device(2)[0] == t.output_bytes + t.layer_bytes[-1]


def test_a_draft_that_does_not_fit_stays_whole_on_the_cpu(shapes):
    p = fit_pair(shapes["7b"], shapes["1.5b"], FIT_MARGIN + 1 * GiB, 4096, ctx_given=True)
    assert p.draft_layers == 0 and 0 < p.target_layers < 29
    p = fit_pair(shapes["7b"], shapes["0.5b"], 8 * GiB, 4096, ctx_given=True, draft_on_device=False)
    assert p.draft_layers == 0  # -ngld 0: kept


def test_a_pair_that_cannot_fit_says_what_would(shapes):
    p = fit_pair(shapes["32b"], shapes["0.5b"], 4 * GiB, 4096, ctx_given=False, host_memory=8 * GiB)
    assert not p.fits
    assert p.why == ("the pair's weights alone take 18.9 GiB, more than the GPU's 3.0 and the host's 8.0 GiB together: "
                     "a quantization of at most 9.9 GiB of weights would fit (or free memory)")


def test_the_shaped_headers_weigh_what_the_real_files_do(shapes):
    """The real pair's files (the bundle) against headers written from the published configuration alone: the
    same tensors of the same types (which blocks got the Q6_K tensors differs with the quantizer's version)."""
    from conftest import real_pair_paths

    real = real_pair_paths()
    if real is None:
        pytest.skip("the default pair's bundle is not installed")
    for path, size in zip(real, ("1.5b", "0.5b")):
        r, s = shape_of(read_layout_file(path)), shapes[size]
        assert (sorted(r.layer_bytes), r.output_bytes, r.host_bytes, r.kv_per_token) == \
            (sorted(s.layer_bytes), s.output_bytes, s.host_bytes, s.kv_per_token)


def test_the_shape_of_a_real_file_is_its_tensors(tiny):
    h = read_layout_file(tiny.target)
    s = shape_of(h)
    assert s.n_layer == 2 and s.weights == sum(t.n_bytes for t in h.tensors)
    assert Path(tiny.target).stat().st_size - s.weights < 64 * 1024  # the rest is the header and alignment


def test_place_on_device_keeps_the_users_layers_and_fits_the_rest(tiny, monkeypatch):
    """The session's glue: the user's -ngl/-c win; where left to it, the fit's numbers and one line for the load."""
    from localspec import session
    from localspec.backend import devices

    gpu = {"name": "CUDA0", "description": "NVIDIA GeForce RTX 4060", "type": "gpu",
           "memory_free": FIT_MARGIN + (64 << 20), "memory_total": 8 * GiB}
    monkeypatch.setattr(devices, "gpu_devices", lambda: [gpu])
    monkeypatch.setattr("localspec.backend.system_info", lambda: {"gpu_offload": True})
    sel = session.Selection("tiny", str(tiny.target), str(tiny.perturbed), None)
    load = session.load_config(session.ModelChoice(target=str(tiny.target)), sel)
    assert (load.n_gpu_layers_target, load.n_gpu_layers_draft) == (3, 3)  # two blocks and the output layer each
    assert load.placement.startswith("placement: target 3/3 layers on the GPU, draft on the GPU, context 4096: ")
    load = session.load_config(session.ModelChoice(target=str(tiny.target), n_gpu_layers=1), sel)
    assert (load.n_gpu_layers_target, load.n_gpu_layers_draft, load.placement) == (1, 1, "")
    gpu["description"] = "llvmpipe (LLVM 19.1.7, 256 bits)"  # lavapipe: slower than the CPU, nothing goes there
    load = session.load_config(session.ModelChoice(target=str(tiny.target)), sel)
    assert (load.n_gpu_layers_target, load.n_gpu_layers_draft) == (0, 0) and "runs on the CPU" in load.placement
    gpu["description"], gpu["memory_free"] = "NVIDIA", 0
    monkeypatch.setattr("localspec.machine.memory_bytes", lambda: {"total": 1 << 20, "available": 1 << 20})
    with pytest.raises(ConfigError, match="would fit"):
        session.load_config(session.ModelChoice(target=str(tiny.target)), sel)
