"""The devices ggml sees, with their kind and free memory, from ggml's own registry (libggml exports it;
llama-cpp-python does not wrap it). The copy opened is the one libllama links to by its soname: the wheel
ships `libggml.so` and `libggml.so.0` as separate files, and a device registered in the wrong one (an RPC
host) is one llama.cpp never sees."""

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
    names = ("libggml.so.0", "libggml.so", "libggml.0.dylib", "libggml.dylib", "ggml.dll")  # libllama's soname first
    candidates = [Path(lib_dir) / n for n in names]
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
    lib.ggml_backend_reg_by_name.restype, lib.ggml_backend_reg_by_name.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_register.restype, lib.ggml_backend_register.argtypes = None, [ctypes.c_void_p]
    return lib


def llama_lib_dir() -> Path | None:
    """llama_cpp's own library folder, found without importing it (backend.model loads the library)."""
    spec = importlib.util.find_spec("llama_cpp")
    return Path(spec.origin).parent / "lib" if spec is not None and spec.origin is not None else None


def ggml_lib():
    """The libggml libllama uses (None where the wheel has none by these names)."""
    lib_dir = llama_lib_dir()
    return _lib(str(lib_dir)) if lib_dir is not None else None


def ggml_registry(lib_dir: Path | None = None) -> dict[str, Any]:
    """{"registered": backend names, "devices": [{name, description, type, memory_free, memory_total}]};
    {} where the library or its registry API is not there."""
    lib_dir = lib_dir or llama_lib_dir()
    if lib_dir is None:
        return {}
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
            name = lib.ggml_backend_dev_name(dev).decode()
            if not name.startswith("RPC"):  # an RPC host's memory is a network call, which aborts if it is gone
                lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            devices.append({"name": name,
                            "description": lib.ggml_backend_dev_description(dev).decode(),
                            "type": DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "other"),
                            "memory_free": free.value, "memory_total": total.value})
    except (OSError, AttributeError):  # an older ggml without the registry API
        return {}
    return {"registered": regs, "devices": devices}


def is_local_gpu(d: dict[str, Any]) -> bool:
    """A GPU or integrated GPU of this machine (ggml counts an RPC host as a GPU too)."""
    return d["type"] in GPU_TYPES and not d["name"].startswith("RPC")


def gpu_devices() -> list[dict[str, Any]]:
    """This machine's devices llama.cpp offloads layers to (GPUs and integrated GPUs)."""
    return [d for d in ggml_registry().get("devices", []) if is_local_gpu(d)]


def rpc_devices() -> list[dict[str, Any]]:
    """The RPC hosts registered in this process (`description`: host:port), with their free memory."""
    return [d for d in ggml_registry().get("devices", []) if d["name"].startswith("RPC")]


@cache
def has_gpu_device() -> bool:
    """Is there a GPU llama.cpp can offload to? (llama_supports_gpu_offload also says yes for a build with RPC
    client support and no GPU at all, which would price and place a CPU machine's passes as a GPU's.)"""
    return any(is_local_gpu(d) for d in ggml_registry().get("devices", []))
