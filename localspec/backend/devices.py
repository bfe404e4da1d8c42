"""The devices ggml sees, with their kind and free memory, from ggml's own registry (libggml exports it;
llama-cpp-python does not wrap it). The library is already loaded by llama_cpp, so this opens the same copy."""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

# enum ggml_backend_dev_type (ggml-backend.h)
DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
GPU_TYPES = ("gpu", "igpu")


@cache
def _lib(lib_dir: str):
    candidates = [Path(lib_dir) / n for n in ("libggml.so", "libggml.dylib", "ggml.dll")]
    path = next((p for p in candidates if p.exists()), None)
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in (lib.ggml_backend_dev_name, lib.ggml_backend_dev_description):
        fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype, lib.ggml_backend_dev_type.argtypes = ctypes.c_int, [ctypes.c_void_p]
    size_p = ctypes.POINTER(ctypes.c_size_t)
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, size_p, size_p]
    return lib


def ggml_registry(lib_dir: Path | None = None) -> dict[str, Any]:
    """{"registered": backend names, "devices": [{name, description, type, memory_free, memory_total}]};
    {} where the library or its registry API is not there."""
    if lib_dir is None:  # llama_cpp's own folder, found without importing it (backend.model loads the library)
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or spec.origin is None:
            return {}
        lib_dir = Path(spec.origin).parent / "lib"
    try:
        lib = _lib(str(lib_dir))
        if lib is None:
            return {}
        regs = [lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode()
                for i in range(lib.ggml_backend_reg_count())]
        devices = []
        for i in range(lib.ggml_backend_dev_count()):
            dev = lib.ggml_backend_dev_get(i)
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            devices.append({"name": lib.ggml_backend_dev_name(dev).decode(),
                            "description": lib.ggml_backend_dev_description(dev).decode(),
                            "type": DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "other"),
                            "memory_free": free.value, "memory_total": total.value})
    except (OSError, AttributeError):  # an older ggml without the registry API
        return {}
    return {"registered": regs, "devices": devices}


def gpu_devices() -> list[dict[str, Any]]:
    """The devices llama.cpp offloads layers to (GPUs and integrated GPUs; RPC hosts count as GPUs in ggml)."""
    return [d for d in ggml_registry().get("devices", []) if d["type"] in GPU_TYPES]


@cache
def has_gpu_device() -> bool:
    """Is there a GPU llama.cpp can offload to? (llama_supports_gpu_offload also says yes for a build with RPC
    client support and no GPU at all, which would price and place a CPU machine's passes as a GPU's.)"""
    return any(d["type"] in GPU_TYPES for d in ggml_registry().get("devices", []))
