"""The set-up's choice of llama.cpp backend (localspec/backends.py), over machines described by hand."""

import pytest

from localspec.backends import MachineFacts, backend_of_cmake_args, choose, vulkan_devices

LAVAPIPE = ("llvmpipe (LLVM 19.1.7, 256 bits)", "PHYSICAL_DEVICE_TYPE_CPU")
RADEON = ("AMD Radeon RX 7800 XT (RADV NAVI32)", "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU")
VULKAN_TOOLS = dict(vulkan_loader=True, vulkan_headers=True, glslc="/usr/bin/glslc")


@pytest.fixture(autouse=True)
def no_amx(monkeypatch):
    """On an AMX CPU every plan also leaves that kernel out (machine.py); these tests are about the rest."""
    monkeypatch.setattr("localspec.machine.has_amx", lambda: False)


def plan(facts, cmake="", forced=""):
    p = choose(facts, cmake, forced)
    return p.backend, p.cmake_args, p.why


def test_nothing_found_is_the_cpu_with_rpc():
    backend, args, why = plan(MachineFacts(system="Linux", arch="x86_64"))
    assert (backend, why) == ("cpu", "no GPU found")
    assert "-DGGML_RPC=on" in args and "GGML_CUDA" not in args


def test_nvidia_with_nvcc_builds_cuda_for_its_architecture_alone():
    backend, args, why = plan(MachineFacts(system="Linux", nvidia_driver=True, nvcc="/usr/local/cuda/bin/nvcc",
                                           cuda_arch="90"))
    assert backend == "cuda"
    assert args.split()[:3] == ["-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=90", "-DGGML_RPC=on"]
    assert why == "an NVIDIA driver and nvcc found (compute capability 9.0)"


def test_a_driver_without_the_toolkit_says_what_is_missing():
    backend, _, why = plan(MachineFacts(system="Linux", nvidia_driver=True))
    assert backend == "cpu" and "no nvcc" in why


def test_apple_silicon_keeps_metal():
    assert plan(MachineFacts(system="Darwin", arch="arm64"))[0] == "metal"
    assert plan(MachineFacts(system="Darwin", arch="x86_64"))[0] == "cpu"


def test_lavapipe_is_seen_and_not_used():
    backend, _, why = plan(MachineFacts(system="Linux", vulkan_devices=[LAVAPIPE], **VULKAN_TOOLS))
    assert backend == "cpu"
    assert why == ("no GPU found: only a software Vulkan device (llvmpipe (LLVM 19.1.7, 256 bits): slower than the "
                   "CPU backend, not used)")


def test_a_real_vulkan_gpu_needs_the_shader_compiler():
    facts = MachineFacts(system="Linux", vulkan_devices=[LAVAPIPE, RADEON], **VULKAN_TOOLS)
    assert plan(facts)[0] == "vulkan"
    facts.glslc = None
    backend, _, why = plan(facts)
    assert backend == "cpu" and "no glslc" in why


def test_rocm():
    assert plan(MachineFacts(system="Linux", hipcc="/opt/rocm/bin/hipcc"))[:2] == ("hip", "-DGGML_HIP=on -DGGML_RPC=on")


def test_the_users_cmake_args_win_and_the_variable_forces():
    gpu = MachineFacts(system="Linux", nvidia_driver=True, nvcc="nvcc")
    assert plan(gpu, cmake="-DGGML_VULKAN=ON")[:3] == ("vulkan", "-DGGML_VULKAN=ON -DGGML_RPC=on", "your CMAKE_ARGS")
    assert plan(gpu, cmake="-DGGML_RPC=OFF")[1] == "-DGGML_RPC=OFF"  # theirs, untouched
    assert plan(gpu, forced="cpu")[:1] == ("cpu",)
    assert plan(MachineFacts(), forced="Vulkan")[:2] == ("vulkan", "-DGGML_VULKAN=on -DGGML_RPC=on")
    with pytest.raises(ValueError, match="LOCALSPEC_BACKEND=tpu is not a backend; use one of cpu, cuda"):
        choose(MachineFacts(), "", "tpu")


def test_backend_of_cmake_args():
    assert backend_of_cmake_args("-DGGML_CUDA=1 -DCMAKE_CUDA_ARCHITECTURES=89") == "cuda"
    assert backend_of_cmake_args("-DGGML_CUDA=off") == "cpu"
    assert backend_of_cmake_args("-DGGML_HIP=ON") == "hip"


def test_vulkaninfo_summary_is_read():
    summary = """Devices:
========
GPU0:
	apiVersion         = 1.4.305
	deviceType         = PHYSICAL_DEVICE_TYPE_CPU
	deviceName         = llvmpipe (LLVM 19.1.7, 256 bits)
"""
    assert vulkan_devices(summary) == [("llvmpipe (LLVM 19.1.7, 256 bits)", "PHYSICAL_DEVICE_TYPE_CPU")]
