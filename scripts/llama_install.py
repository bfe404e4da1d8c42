"""Install llama-cpp-python into this venv built for the backend this machine has (localspec/backends.py).

Run by scripts/bootstrap with the venv's own python. The plan is printed once, when something is built or
installed; a venv that already holds a build of the same plan is left alone. Builds are wheels kept in
~/.cache/localspec/wheels/<version>-<plan> (XDG_CACHE_HOME), so another clone, or a later switch back,
installs in seconds; pip's own cache is not used for it, as it would hand a CPU wheel to a CUDA request.
A GPU build that fails falls back to the CPU build with one line saying why; nothing is installed until a
whole wheel exists, so a failed build never leaves a broken venv.

  python scripts/llama_install.py VERSION       # CMAKE_ARGS and LOCALSPEC_BACKEND are read from the environment
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from localspec.backends import FORCE_VARIABLE, BuildPlan, choose, probe  # noqa: E402

STAMP = Path(sys.prefix) / ".localspec-llama-plan"
HERE = Path(__file__).resolve().parent


def say(msg: str) -> None:
    print(f"set-up: {msg}", file=sys.stderr, flush=True)


def pip(*args: str, env: dict | None = None, quiet: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", *args, *(["-q"] if quiet else [])]
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


def installed_matches(plan: BuildPlan, version: str) -> bool:
    try:
        stamp = STAMP.read_text().strip()
    except OSError:
        return False
    if stamp != f"{version} {plan.key}":
        return False
    probe_lib = ("import llama_cpp, os; d = os.path.join(os.path.dirname(llama_cpp.__file__), 'lib'); "
                 "print(llama_cpp.__version__, *os.listdir(d))")
    r = subprocess.run([sys.executable, "-c", probe_lib], capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.split()[:1] == [version]


def build_wheel(plan: BuildPlan, version: str, out: Path) -> tuple[Path | None, str]:
    """(the wheel, "") or (None, the build's last error line)."""
    with tempfile.TemporaryDirectory() as work:
        r = pip("download", "--no-deps", "--no-binary", ":all:", "-d", work, f"llama-cpp-python=={version}")
        sdists = list(Path(work).glob("llama_cpp_python-*.tar.gz"))
        if r.returncode != 0 or not sdists:
            return None, _last_line(r, "could not download the llama-cpp-python sdist")
        shutil.unpack_archive(str(sdists[0]), work)
        src = next(p for p in Path(work).glob("llama_cpp_python-*") if p.is_dir())
        if plan.backend == "vulkan":  # Debian 12's Vulkan headers predate one block ggml-vulkan uses (the patch says)
            subprocess.run([sys.executable, str(HERE / "vulkan_patch.py"),
                            str(src / "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp")], check=False)
        env = dict(os.environ, CMAKE_ARGS=plan.cmake_args)
        r = pip("wheel", "--no-deps", "--no-cache-dir", "-w", str(Path(work) / "wheel"), str(src), env=env)
        wheels = list((Path(work) / "wheel").glob("llama_cpp_python-*.whl"))
        if r.returncode != 0 or not wheels:
            return None, _last_line(r, "the build failed")
        out.mkdir(parents=True, exist_ok=True)
        part = out / ".partial"
        shutil.copyfile(wheels[0], part)
        part.rename(out / wheels[0].name)  # whole, or not there
        return out / wheels[0].name, ""


def _last_line(r: subprocess.CompletedProcess, default: str) -> str:
    lines = [ln.strip() for ln in (r.stderr + r.stdout).splitlines() if "error" in ln.lower() and ln.strip()]
    return (lines[-1] if lines else default)[:300]


def install(plan: BuildPlan, version: str) -> bool:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "localspec" / "wheels"
    folder = cache / f"{version}-{plan.key}"
    wheel = next(iter(sorted(folder.glob("llama_cpp_python-*.whl"))), None) if folder.is_dir() else None
    if wheel is None:
        say(f"building llama-cpp-python {version} with CMAKE_ARGS=\"{plan.cmake_args}\" "
            "(several minutes on 2 cores, once: the wheel is cached)")
        wheel, why = build_wheel(plan, version, folder)
        if wheel is None:
            say(f"the {plan.backend} build failed: {why}")
            return False
    r = pip("install", "--force-reinstall", "--no-deps", str(wheel))
    if r.returncode == 0:  # its own dependencies (numpy, diskcache, ...), without touching the wheel
        r = pip("install", str(wheel))
    if r.returncode != 0:
        say(f"installing {wheel.name} failed: {_last_line(r, 'pip failed')}")
        return False
    STAMP.write_text(f"{version} {plan.key}\n")
    return True


def main() -> int:
    version = sys.argv[1]
    try:
        plan = choose(probe(), os.environ.get("CMAKE_ARGS", ""), os.environ.get(FORCE_VARIABLE, ""))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if installed_matches(plan, version):
        return 0
    say(f"llama.cpp backend: {plan.backend} ({plan.why}), with RPC client support")
    if install(plan, version):
        return 0
    if plan.backend == "cpu":
        print("error: llama-cpp-python could not be built for the CPU either; see the lines above", file=sys.stderr)
        return 1
    cpu = choose(probe(), "", "cpu")
    say(f"falling back to the CPU build ({FORCE_VARIABLE}=cpu): the {plan.backend} build did not complete")
    return 0 if install(BuildPlan("cpu", cpu.cmake_args, f"the {plan.backend} build failed"), version) else 1


if __name__ == "__main__":
    sys.exit(main())
