"""llama.cpp's own programs (llama-server, llama-bench), built from the llama-cpp-python sdist of the
version this project installs, once per version and backend, into ~/.cache/localspec (never into the
repository): the comparisons in scripts/editor-bench and scripts/gpu-check run llama.cpp's code of the
very version localspec runs on."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from localspec.backends import CMAKE_FLAGS, probe
from localspec.machine import llama_cmake_args  # llama.cpp built as localspec's own is (no AMX kernel where it crashes)

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "localspec"
BACKEND_FLAGS = {name: flag.split() for name, flag in CMAKE_FLAGS.items()}  # the set-up's own switch per backend


def sdist_version() -> str:
    """The installed llama-cpp-python's version, else (a helper host without the venv) the one pyproject pins."""
    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        pins = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
        return re.search(r"llama-cpp-python>=([0-9.]+)", pins).group(1)


def build(target: str, backend: str = "cpu") -> Path:
    """The path of llama.cpp's `target` program (llama-server, llama-bench) for `backend`, built if needed."""
    version = sdist_version()
    out = CACHE / f"llama.cpp-{version}" if backend == "cpu" else CACHE / f"llama.cpp-{version}-{backend}"
    binary = out / "build" / "bin" / target
    if binary.exists():
        return binary
    if not (out / "CMakeLists.txt").exists():
        tmp = Path(tempfile.mkdtemp(prefix="llama-sdist-"))
        print(f"fetching llama-cpp-python {version}'s sdist for llama.cpp's sources", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={version}", "-d", str(tmp)], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["tar", "xzf", str(next(tmp.glob("*.tar.gz"))), "-C", str(tmp)], check=True)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(next(tmp.glob("llama_cpp_python-*")) / "vendor" / "llama.cpp", out, symlinks=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"building {target} ({backend}) once; several minutes", file=sys.stderr)
    flags = [*BACKEND_FLAGS[backend], "-DGGML_RPC=on"]  # RPC client and server, as the set-up builds localspec's
    if backend == "cuda" and (arch := probe().cuda_arch):  # the card's architecture alone, as the set-up builds it
        flags.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
    subprocess.run(["cmake", "-B", "build", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    *flags, *shlex.split(llama_cmake_args())], cwd=out, check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", "build", "--target", target, "-j", str(os.cpu_count() or 2)],
                   cwd=out, check=True, stdout=subprocess.DEVNULL)
    return binary


class LlamaServer:
    """llama-server on a free loopback port, ready when its /health says so."""

    def __init__(self, binary: Path, model: str, flags: list[str], log: Path):
        from .serverproc import free_port, wait_healthy

        self.port = free_port()
        self.log = open(log, "w")
        self.proc = subprocess.Popen([str(binary), "-m", model, "--host", "127.0.0.1", "--port", str(self.port), *flags],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if not wait_healthy(f"http://127.0.0.1:{self.port}/health", self.proc, 300):
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}); see {log}")
            raise RuntimeError("llama-server did not become ready")

    def stop(self) -> int:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        return self.proc.returncode
