"""Facts of this machine that several layers read (the doctor reports them; a server sizes its context by them)."""

from __future__ import annotations

import os
import sys
from functools import cache

# llama.cpp's AMX kernel (Intel Xeons since Sapphire Rapids) loads a tile configuration that GCC compiles
# into garbage: the process dies of a general protection fault on its first prompt (llama.cpp PR 26954;
# seen with GCC 12 and llama-cpp-python 0.3.36). Built without it, the CPU backend uses its AVX-512
# kernels and repacked weights instead.
NO_AMX_CMAKE_ARGS = "-DCMAKE_C_FLAGS=-U__AMX_INT8__ -DCMAKE_CXX_FLAGS=-U__AMX_INT8__"
# what a user is told when their build has that kernel on such a CPU (models then load without it)
AMX_NOTE = ("this llama-cpp-python has llama.cpp's AMX kernel, which crashes on many AMX CPUs: running without "
            "it and without repacked weights (decoding ~25% slower); rebuild it without that kernel: "
            f'CMAKE_ARGS="{NO_AMX_CMAKE_ARGS}" pip install --force-reinstall --no-cache-dir llama-cpp-python '
            "(or set LOCALSPEC_AMX=1 if yours works)")


def memory_bytes() -> dict[str, int | None]:
    total = available = None
    try:
        with open("/proc/meminfo") as f:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:2]}
        total, available = fields.get("MemTotal"), fields.get("MemAvailable")
    except (OSError, ValueError, IndexError):
        try:  # macOS and other Unixes
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            pass
    return {"total": total, "available": available}


@cache  # read at every model load and note: the CPU does not change under a process
def has_amx() -> bool:
    """Does this CPU have AMX (the instructions llama.cpp's AMX kernel uses)? Linux only (elsewhere: no)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " amx_int8" in line for line in f)
    except OSError:
        return False


def llama_cmake_args(given: str = "") -> str:
    """CMAKE_ARGS that build llama-cpp-python (or llama.cpp's own programs) to run on this machine: the
    user's, with the AMX kernel left out on an AMX CPU unless they chose about it themselves."""
    if not has_amx() or "AMX" in given.upper() or "CMAKE_C_FLAGS" in given or "CMAKE_CXX_FLAGS" in given:
        return given
    return f"{given} {NO_AMX_CMAKE_ARGS}".strip()


def amx_build_at_risk(system_info: str) -> bool:
    """Is the installed llama.cpp one whose AMX kernel this CPU would run (and may crash in)?"""
    return has_amx() and "AMX_INT8 = 1" in system_info


if __name__ == "__main__":  # scripts/bootstrap: the CMAKE_ARGS for this machine (args: the user's own)
    print(llama_cmake_args(" ".join(sys.argv[1:])))


def process_rss() -> int:
    """This process's resident memory in bytes (0 where /proc is not there)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def release_freed_memory() -> bool:
    """Hand the heap's freed pages back to the system (glibc's malloc_trim): a model's buffers, freed by
    threads that each kept their own malloc arena, otherwise stay counted in this process after the model
    is gone (docs/benchmarks/log-2026-11.md, "An hour of the soak"). False where there is no glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False
