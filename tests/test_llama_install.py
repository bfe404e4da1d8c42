"""scripts/llama_install.py's flow: a failed GPU build falls back to the CPU build in one line; a venv that already
holds the plan's build is left alone. (The builds themselves are real in scripts/vulkan-check and the set-up.)"""

import llama_install
import pytest

from localspec.backends import MachineFacts


@pytest.fixture
def installer(monkeypatch, tmp_path):
    monkeypatch.setattr(llama_install, "probe", lambda: MachineFacts(system="Linux", hipcc="/opt/rocm/bin/hipcc"))
    monkeypatch.setattr(llama_install, "installed_matches", lambda plan, version: False)
    monkeypatch.setattr("localspec.machine.has_amx", lambda: False)
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    monkeypatch.delenv("LOCALSPEC_BACKEND", raising=False)
    monkeypatch.setattr("sys.argv", ["llama_install.py", "0.3.36"])
    tried = []
    return tried


def test_a_failed_gpu_build_falls_back_to_the_cpu_in_one_line(installer, monkeypatch, capsys):
    def install(plan, version):
        installer.append((plan.backend, plan.cmake_args))
        if plan.backend != "cpu":
            llama_install.say(f"the {plan.backend} build failed: CMake Error: HIP compiler not found")
            return False
        return True
    monkeypatch.setattr(llama_install, "install", install)
    assert llama_install.main() == 0
    assert installer == [("hip", "-DGGML_HIP=on -DGGML_RPC=on"), ("cpu", "-DGGML_RPC=on")]
    assert capsys.readouterr().err == (
        "set-up: llama.cpp backend: hip (ROCm's compiler found (/opt/rocm/bin/hipcc)), with RPC client support\n"
        "set-up: the hip build failed: CMake Error: HIP compiler not found\n"
        "set-up: falling back to the CPU build (LOCALSPEC_BACKEND=cpu): the hip build did not complete\n")


def test_a_cpu_build_that_fails_is_an_error(installer, monkeypatch, capsys):
    monkeypatch.setenv("LOCALSPEC_BACKEND", "cpu")
    monkeypatch.setattr(llama_install, "install", lambda plan, version: False)
    assert llama_install.main() == 1
    assert capsys.readouterr().err.endswith("error: llama-cpp-python could not be built for the CPU either; see the "
                                            "lines above\n")


def test_a_backend_name_that_is_not_one_is_one_line(installer, monkeypatch, capsys):
    monkeypatch.setenv("LOCALSPEC_BACKEND", "tpu")
    assert llama_install.main() == 2
    assert capsys.readouterr().err == "error: LOCALSPEC_BACKEND=tpu is not a backend; use one of cpu, cuda, metal, vulkan, hip\n"


def test_the_venv_holding_the_plan_is_left_alone(installer, monkeypatch, capsys):
    monkeypatch.setattr(llama_install, "installed_matches", lambda plan, version: True)
    monkeypatch.setattr(llama_install, "install", lambda plan, version: pytest.fail("nothing to install"))
    assert llama_install.main() == 0 and capsys.readouterr().err == ""
