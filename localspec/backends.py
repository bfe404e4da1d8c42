"""Which llama.cpp backend the set-up builds for this machine, and why (scripts/bootstrap; `localspec doctor`).

A pure choice (`choose`) over what a cheap look at the machine finds (`probe`): CUDA where an NVIDIA driver
and nvcc are there, Metal on Apple Silicon (llama-cpp-python's own default there), ROCm/HIP where hipcc is,
Vulkan where the loader, headers and glslc are there and a real GPU answers (lavapipe and llvmpipe run on
the CPU, slower than the CPU backend), else the CPU. The user's own CMAKE_ARGS win; LOCALSPEC_BACKEND
forces one. RPC client support is built into every choice, so splitting a target across machines needs
no reinstall. Nothing here loads a driver or llama.cpp.
"""

from __future__ import annotations

import ctypes.util
import glob
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from .machine import llama_cmake_args

FORCE_VARIABLE = "LOCALSPEC_BACKEND"
RPC_FLAG = "-DGGML_RPC=on"
# backend -> the CMake switch that builds it (Metal: llama-cpp-python's default on Apple Silicon)
CMAKE_FLAGS = {"cpu": "", "cuda": "-DGGML_CUDA=on", "metal": "-DGGML_METAL=on", "vulkan": "-DGGML_VULKAN=on",
               "hip": "-DGGML_HIP=on"}
BACKENDS = tuple(CMAKE_FLAGS)


@dataclass
class MachineFacts:
    """What the set-up looks at; each field is something a cheap check found (tests build these by hand)."""
    system: str = ""  # platform.system(): Linux, Darwin, Windows
    arch: str = ""  # platform.machine()
    nvidia_driver: bool = False
    nvcc: str | None = None
    cuda_arch: str | None = None  # e.g. "90": the GPU's compute capability (nvidia-smi), built for alone
    hipcc: str | None = None
    vulkan_loader: bool = False
    vulkan_headers: bool = False
    glslc: str | None = None
    vulkan_devices: list[tuple[str, str]] = field(default_factory=list)  # (name, type) as vulkaninfo says


@dataclass
class BuildPlan:
    backend: str
    cmake_args: str
    why: str
    forced: bool = False  # asked for (CMAKE_ARGS or LOCALSPEC_BACKEND): built even where a check found nothing

    @property
    def key(self) -> str:
        """What tells one build from another in the wheel cache."""
        return re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{self.backend}-{self.cmake_args}")[:120]


SOFTWARE_DEVICES = ("llvmpipe", "lavapipe", "swiftshader")


def software_device(name: str, kind: str = "") -> bool:
    """A Vulkan device that runs on the CPU (Mesa's lavapipe, llvmpipe, SwiftShader): slower than the CPU backend."""
    return "CPU" in kind.upper() or any(s in name.lower() for s in SOFTWARE_DEVICES)


def backend_of_cmake_args(args: str) -> str:
    upper = args.upper()
    for name, flag in CMAKE_FLAGS.items():
        if flag and re.search(rf"{flag.split('=')[0].upper()}=(ON|1|TRUE|YES)\b", upper):
            return name
    return "cpu"


def with_rpc(args: str) -> str:
    return args if "GGML_RPC" in args.upper() else f"{args} {RPC_FLAG}".strip()


def choose(facts: MachineFacts, cmake_args: str = "", forced: str = "") -> BuildPlan:
    """The backend to build, its CMAKE_ARGS (with RPC and this CPU's own needs) and the reason in words."""
    if cmake_args.strip():
        backend = backend_of_cmake_args(cmake_args)
        return BuildPlan(backend, llama_cmake_args(with_rpc(cmake_args.strip())), "your CMAKE_ARGS", forced=True)
    if forced:
        name = forced.strip().lower()
        if name not in CMAKE_FLAGS:
            raise ValueError(f"{FORCE_VARIABLE}={forced} is not a backend; use one of {', '.join(BACKENDS)}")
        flags = CMAKE_FLAGS[name]
        if name == "cuda" and facts.cuda_arch:
            flags += f" -DCMAKE_CUDA_ARCHITECTURES={facts.cuda_arch}"
        return BuildPlan(name, llama_cmake_args(with_rpc(flags)), f"{FORCE_VARIABLE}={name}", forced=True)
    plan = _found(facts)
    return BuildPlan(plan.backend, llama_cmake_args(with_rpc(plan.cmake_args)), plan.why)


def _found(f: MachineFacts) -> BuildPlan:
    if f.system == "Darwin" and f.arch == "arm64":
        return BuildPlan("metal", "", "Apple Silicon: Metal (llama-cpp-python's default there)")
    if f.nvidia_driver and f.nvcc:
        flags = CMAKE_FLAGS["cuda"] + (f" -DCMAKE_CUDA_ARCHITECTURES={f.cuda_arch}" if f.cuda_arch else "")
        arch = f" (compute capability {f.cuda_arch[:-1]}.{f.cuda_arch[-1]})" if f.cuda_arch else ""
        return BuildPlan("cuda", flags, f"an NVIDIA driver and nvcc found{arch}")
    if f.hipcc:
        return BuildPlan("hip", CMAKE_FLAGS["hip"], f"ROCm's compiler found ({f.hipcc})")
    gpus = [name for name, kind in f.vulkan_devices if not software_device(name, kind)]
    if gpus and f.vulkan_loader and f.vulkan_headers and f.glslc:
        return BuildPlan("vulkan", CMAKE_FLAGS["vulkan"], f"a Vulkan GPU answers ({gpus[0]}) and glslc is there")
    reasons = []
    if f.nvidia_driver:
        reasons.append("an NVIDIA driver but no nvcc (install the CUDA toolkit for a CUDA build)")
    soft = [name for name, kind in f.vulkan_devices if software_device(name, kind)]
    if gpus:
        missing = [w for w, ok in (("the Vulkan loader", f.vulkan_loader), ("its headers", f.vulkan_headers),
                                   ("glslc", f.glslc)) if not ok]
        reasons.append(f"a Vulkan GPU ({gpus[0]}) but no {' or '.join(missing)}")
    if soft:
        reasons.append(f"only a software Vulkan device ({soft[0]}: slower than the CPU backend, not used)")
    return BuildPlan("cpu", "", "no GPU found" + (f": {'; '.join(reasons)}" if reasons else ""))


def probe() -> MachineFacts:
    """Look at this machine: programs on PATH, driver files, `vulkaninfo --summary` and `nvidia-smi` (each a
    few hundred milliseconds at most, bounded; a tool that fails counts as absent)."""
    nvcc = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.access(p, os.X_OK)), None)
    hipcc = shutil.which("hipcc") or next((p for p in ("/opt/rocm/bin/hipcc",) if os.access(p, os.X_OK)), None)
    nvidia = os.path.exists("/proc/driver/nvidia/version") or bool(shutil.which("nvidia-smi"))
    cap = _run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]) if nvidia else ""
    cap = cap.splitlines()[0].strip().replace(".", "") if cap.strip() else None
    loader = bool(ctypes.util.find_library("vulkan") or glob.glob("/usr/lib/*/libvulkan.so.1"))
    return MachineFacts(
        system=platform.system(), arch=platform.machine(), nvidia_driver=nvidia, nvcc=nvcc,
        cuda_arch=cap if cap and cap.isdigit() else None, hipcc=hipcc, vulkan_loader=loader,
        vulkan_headers=os.path.exists("/usr/include/vulkan/vulkan.h") or bool(os.environ.get("VULKAN_SDK")),
        glslc=shutil.which("glslc"), vulkan_devices=vulkan_devices(_run(["vulkaninfo", "--summary"])))


def vulkan_devices(summary: str) -> list[tuple[str, str]]:
    """(deviceName, deviceType) per device in `vulkaninfo --summary`'s output."""
    names = re.findall(r"deviceName\s*=\s*(.+)", summary)
    kinds = re.findall(r"deviceType\s*=\s*(\S+)", summary)
    return [(n.strip(), k.strip()) for n, k in zip(names, kinds)]


def _run(cmd: list[str]) -> str:
    if not shutil.which(cmd[0]):
        return ""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def rebuild_command(backend: str) -> str:
    """What rebuilds this checkout's .venv for `backend` (the same set-up path, forced)."""
    return f"{FORCE_VARIABLE}={backend} scripts/bootstrap"


if __name__ == "__main__":  # `python -m localspec.backends`: the plan for this machine, as bootstrap sees it
    try:
        p = choose(probe(), os.environ.get("CMAKE_ARGS", ""), os.environ.get(FORCE_VARIABLE, ""))
    except ValueError as e:
        sys.exit(f"error: {e}")
    print(f"{p.backend}\t{p.cmake_args}\t{p.why}")
