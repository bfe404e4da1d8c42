"""Measured pass costs per (pair, device, threads), stored in the data dir for --spec auto.

The first `run`/`chat` on a new combination measures T_decode, T_verify(n) and T_draft in a few
seconds (`passtimes.measure_costs`) and saves them; `localspec tune` measures again.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from . import paths
from .costmodel import QUICK_SIZES, CostProfile
from .passtimes import measure_costs, steady_verify


def profile_key(engine) -> str:
    from .backend import system_info

    load = engine.load
    info = system_info()
    device = "gpu" if info["gpu_offload"] and load.n_gpu_layers_target != 0 else "cpu"
    parts = {
        "target": paths.file_id(engine.target_model.path),
        "draft": paths.file_id(engine.draft_path) if engine.draft_path else None,
        "device": device,
        "threads": load.n_threads,
        "threads_batch": load.n_threads_batch,
        "gpu_layers": [load.n_gpu_layers_target, load.n_gpu_layers_draft],
        "llama_cpp_python": info["llama_cpp_python"],
        "curve": CURVE_VERSION,
    }
    if engine.flash_attn != "auto":  # other pass costs; profiles measured before the flag keep their key
        parts["flash_attn"] = engine.flash_attn
    if load.exact:  # other kernels, other costs
        parts["exact"] = True
    return json.dumps(parts, sort_keys=True)


CURVE_VERSION = 2  # profiles priced to 64-token passes; older ones (to 6-12) are measured again


def profile_path(key: str):
    return paths.profiles_dir() / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")


def load_profile(engine, notify=None) -> CostProfile | None:
    """The stored profile of this engine's (pair, device, threads), or None. A stored file that is not
    usable is reported in one line through `notify` and treated as absent (it is measured again)."""
    key = profile_key(engine)
    path = profile_path(key)
    try:
        prof = CostProfile.load(path)
    except ValueError as e:
        if notify is not None:
            notify(f"note: ignoring {path} ({e}); measuring the pass costs again")
        return None
    return prof if prof and prof.key == key else None


def tune(engine, n_max: int | None = None, repeats: int = 3, warmup: int = 1, quick: bool = False,
         save: bool = True) -> CostProfile:
    """Measure this engine's pass costs and store them as the profile of its (pair, device, threads):
    the one way a profile is made (`localspec tune`, `bench --costs --save`, auto's first run).
    quick: auto's first profile, measured in seconds while idle: fewer, shallower passes,
    and a draft model not loaded yet is priced from its size instead of being loaded to be timed.
    save=False: the caller stores it (keep_profile) once it knows the machine was quiet meanwhile."""
    key = profile_key(engine)
    if quick:
        prof = measure_costs(engine, repeats=2, warmup=1, depth=32, load_draft=False, sizes=QUICK_SIZES)
        prof.extra["quick"] = True
    else:
        prof = measure_costs(engine, n_max=n_max, repeats=repeats, warmup=warmup)
        prof.extra["steady_verify"] = steady_verify(engine.target, 12)  # for doctor's shape check
    prof.key = key
    if save:
        keep_profile(prof)
    return prof


def tune_while_quiet(engine, busy) -> CostProfile | None:
    """auto's first profile for an engine that has none, measured now (quick, on the thread that decodes) and
    kept, in the engine and the data dir, only if `busy()` says no other program used the cores meanwhile:
    a figure measured on a busy machine is not this machine's (None then; measured again later)."""
    prof = engine.decoding(lambda: tune(engine, quick=True, save=False))
    if busy():
        return None
    keep_profile(prof)
    engine.profile = prof
    return prof


def measure_when_idle(engine, busy, stop) -> bool:
    """What this machine has not measured yet, now that nobody waits for it: auto's pass costs first (kept
    only if `busy()` says the cores stayed free), then the attention kernel (attention.py; given up when
    `stop()` says). True when one was due (measured, or given up to be tried at the next idle moment)."""
    from . import attention

    if engine.profile is None:
        tune_while_quiet(engine, busy)
        return True
    if attention.engine_pending(engine):
        attention.measure_for(engine, stop, busy)
        return True
    return False


def keep_profile(prof: CostProfile) -> None:
    try:
        prof.save(profile_path(prof.key))
    except OSError:  # a read-only data dir: use it now, measure again next time
        pass


def check_pair(target: Path, draft: Path) -> None:
    """llama.cpp's draft/target rules (compat.py) from the two GGUF headers, so the draft model can
    load later, only when a round drafts with it. A verdict of "compatible" is kept per pair of files
    (name, size, mtime): the header check costs ~0.5 s on Qwen's 151,936-token vocabulary."""
    from .compat import require_compatible
    from .models.check import vocab_info_from_header

    key = f"{_file_key(target)} | {_file_key(draft)}"
    store = paths.home() / "compatible-pairs.json"
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):  # valid JSON of another shape: start afresh
        known = {}
    if known.get(key) is True:
        return
    require_compatible(vocab_info_from_header(target), vocab_info_from_header(draft))
    known[key] = True
    try:
        paths.write_atomic(store, json.dumps(known, indent=1))
    except OSError:  # a read-only data dir: the check simply runs again next time
        pass


def _file_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


HINT_MAX_AGE_S = 60.0  # a machine busy a minute ago is likely still busy


def _hint_file() -> Path:
    return paths.home() / "threads.json"


def threads_hint(max_threads: int) -> int | None:
    """The thread count the last process settled on, if it was recent and fewer than the maximum: a
    `run` under load then starts (and evaluates its prompt) at the count that was fastest, instead of
    learning it again from slow passes."""
    try:
        h = json.loads(_hint_file().read_text())
        n, at = int(h["threads"]), float(h["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return n if 1 <= n < max_threads and 0 <= time.time() - at <= HINT_MAX_AGE_S else None


def save_threads_hint(n: int) -> None:
    try:
        paths.write_atomic(_hint_file(), json.dumps({"threads": n, "at": time.time()}))
    except OSError:
        pass
