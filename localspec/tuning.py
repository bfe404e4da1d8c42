"""Measured pass costs per (pair, device, threads), stored in the data dir for --spec auto.

The first `run`/`chat` on a new combination measures T_decode, T_verify(n) and T_draft in a few
seconds (`costmodel.measure_costs`) and saves them; `localspec tune` measures again.
"""

from __future__ import annotations

import hashlib
import json

from . import paths
from .costmodel import CostProfile, measure_costs


def _file_id(path) -> str:
    st = path.stat()
    return f"{path.name}:{st.st_size}"


def profile_key(engine) -> str:
    from .backend import system_info

    load = engine.load
    info = system_info()
    device = "gpu" if info["gpu_offload"] and load.n_gpu_layers_target != 0 else "cpu"
    parts = {
        "target": _file_id(engine.target_model.path),
        "draft": _file_id(engine.draft_model.path) if engine.draft_model else None,
        "device": device,
        "threads": load.n_threads,
        "threads_batch": load.n_threads_batch,
        "gpu_layers": [load.n_gpu_layers_target, load.n_gpu_layers_draft],
        "llama_cpp_python": info["llama_cpp_python"],
    }
    return json.dumps(parts, sort_keys=True)


def profile_path(key: str):
    return paths.profiles_dir() / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")


def load_profile(engine) -> CostProfile | None:
    key = profile_key(engine)
    prof = CostProfile.load(profile_path(key))
    return prof if prof and prof.key == key else None


def tune(engine, n_max: int = 12, repeats: int = 3, warmup: int = 1) -> CostProfile:
    """Measure this engine's pass costs and store them as the profile of its (pair, device, threads):
    the one way a profile is made (`localspec tune`, `bench --costs --save`, auto's first run)."""
    key = profile_key(engine)
    prof = measure_costs(engine, n_max=n_max, repeats=repeats, warmup=warmup)
    prof.key = key
    prof.save(profile_path(key))
    return prof
