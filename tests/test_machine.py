"""This machine's facts and the llama.cpp builds made for it: llama.cpp's AMX kernel crashes on AMX CPUs
(a general protection fault on the first prompt, seen on a Xeon with GCC 12), so builds leave it out and a
build that has it loads models without it, saying so."""

from __future__ import annotations

import llama_cpp

from localspec import machine
from localspec.backend import model as backend_model
from localspec.session import ModelChoice, load_notes

AMX_BUILD = "CPU : AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | OPENMP = 1 | REPACK = 1 |"
PLAIN_BUILD = "CPU : AVX512 = 1 | AVX512_VNNI = 1 | OPENMP = 1 | REPACK = 1 |"


def test_llama_cpp_is_built_without_the_amx_kernel_on_an_amx_cpu_unless_the_user_chose(monkeypatch):
    monkeypatch.setattr(machine, "has_amx", lambda: True)
    assert machine.llama_cmake_args("") == machine.NO_AMX_CMAKE_ARGS
    assert machine.llama_cmake_args("-DGGML_CUDA=on") == f"-DGGML_CUDA=on {machine.NO_AMX_CMAKE_ARGS}"
    assert machine.llama_cmake_args("-DGGML_AMX_INT8=ON") == "-DGGML_AMX_INT8=ON"  # the user's own choice
    assert machine.llama_cmake_args("-DCMAKE_CXX_FLAGS=-O3") == "-DCMAKE_CXX_FLAGS=-O3"  # would be overridden
    assert machine.amx_build_at_risk(AMX_BUILD) and not machine.amx_build_at_risk(PLAIN_BUILD)
    monkeypatch.setattr(machine, "has_amx", lambda: False)
    assert machine.llama_cmake_args("-DGGML_CUDA=on") == "-DGGML_CUDA=on"
    assert not machine.amx_build_at_risk(AMX_BUILD)


def _loads_seen(monkeypatch) -> list[bool]:
    """use_extra_bufts of each model load (the real load runs)."""
    seen, real = [], llama_cpp.llama_model_load_from_file

    def load(path, params):
        seen.append(bool(params.use_extra_bufts))
        return real(path, params)
    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", load)
    return seen


def test_a_build_with_the_amx_kernel_loads_models_without_it_and_says_how_to_rebuild(monkeypatch, tiny):
    monkeypatch.setattr(machine, "has_amx", lambda: True)
    monkeypatch.setattr(backend_model, "system_info", lambda: {"system_info": AMX_BUILD, "gpu_offload": False})
    monkeypatch.delenv("LOCALSPEC_AMX", raising=False)
    seen = _loads_seen(monkeypatch)
    m = backend_model.Model(tiny.target)
    assert m.tokenize("hello") and seen == [False]
    assert load_notes(ModelChoice()) == [machine.AMX_NOTE]
    assert machine.NO_AMX_CMAKE_ARGS in machine.AMX_NOTE
    monkeypatch.setenv("LOCALSPEC_AMX", "1")  # a build whose AMX kernel works: the user keeps it
    backend_model.Model(tiny.target)
    assert seen == [False, True] and load_notes(ModelChoice()) == []


def test_a_build_without_the_amx_kernel_loads_as_llama_cpp_does(monkeypatch, tiny):
    monkeypatch.setattr(machine, "has_amx", lambda: True)
    monkeypatch.setattr(backend_model, "system_info", lambda: {"system_info": PLAIN_BUILD, "gpu_offload": False})
    seen = _loads_seen(monkeypatch)
    backend_model.Model(tiny.target)
    assert seen == [True] and load_notes(ModelChoice()) == []


def test_the_doctor_names_the_rebuild(monkeypatch, cli):
    import json

    monkeypatch.setattr(machine, "has_amx", lambda: True)
    monkeypatch.setattr(backend_model, "system_info", lambda: {"system_info": AMX_BUILD, "gpu_offload": False})
    monkeypatch.delenv("LOCALSPEC_AMX", raising=False)
    code, out, err = cli("doctor", "--json")
    assert (code, err) == (0, "") and machine.AMX_NOTE in json.loads(out)["advice"]


def test_the_cpu_attention_kernel_is_weighed_per_token_of_a_chat_and_of_a_copy_measured_once(monkeypatch, tiny):
    from localspec.costs import attention

    model = backend_model.Model(tiny.target)
    assert attention.cpu_kernel(model, 2, 2) == "off"  # a tiny model: nothing to measure, the plain kernel
    assert not attention.kernel_pending(model, 2)
    deep = attention.deep_ms(model, 2, 2)  # the real measurements
    for ms in (attention.decode_ms(model, 2, 2), deep["pass"], deep["decode"]):
        assert set(ms) == {"off", "on"} and all(v > 0 for v in ms.values())

    def measured(decode, deep_pass=None, deep_decode=None):
        monkeypatch.setattr(attention, "decode_ms", lambda *a: decode)
        monkeypatch.setattr(attention, "deep_ms", (lambda *a: {"pass": deep_pass, "decode": deep_decode or decode})
                            if deep_pass else lambda *a: (_ for _ in ()).throw(AssertionError("deep passes measured")))

    monkeypatch.setattr(attention, "MIN_PARAMS", 0)
    measure = lambda n: attention.measure_kernel(model, n, n)  # noqa: E731
    # unmeasured, a load runs llama-server's kernel at once, and never measures (a first answer never waits)
    measured({"off": 10.0, "on": 11.0})
    assert attention.cpu_kernel(model, 2, 2) == attention.SERVER_CHOICE == "on" and attention.kernel_pending(model, 2)
    measured({"off": 10.0, "on": 9.95})  # level decodes: the plain kernel, the deep passes not measured
    assert measure(2) == "off" and attention.cpu_kernel(model, 2, 2) == "off" and not attention.kernel_pending(model, 2)
    # a chat token 0.5 ms faster, a copied token 4/16 = 0.25 ms slower: flash attention
    measured({"off": 10.0, "on": 9.5}, {"off": 100.0, "on": 104.0})
    assert attention.cpu_kernel(model, 2, 2) == "off"  # stored: a load uses it
    assert measure(1) == "on" and attention.cpu_kernel(model, 1, 1) == "on"  # another thread count: its own
    # the Xeon 1,024 deep: a chat token 1.9 ms faster, a copied one 20.6/16 = 1.3 ms slower, deep decodes 1.2%
    # slower: within a tie, llama-server's kernel
    measured({"off": 69.8, "on": 67.9}, {"off": 293.1, "on": 313.7}, {"off": 73.4, "on": 74.3})
    assert measure(3) == "on"
    # a copied token losing 64/16 = 4 ms where a chat token gains 1.9: the plain kernel
    measured({"off": 69.8, "on": 67.9}, {"off": 293.0, "on": 357.0}, {"off": 73.4, "on": 74.3})
    assert measure(4) == "off"
    # the EPYC 1,024 deep: decodes 11% slower there: the plain kernel, whatever the passes
    measured({"off": 33.4, "on": 32.6}, {"off": 235.0, "on": 236.0}, {"off": 35.6, "on": 40.0})
    assert measure(5) == "off"
    assert (attention.cpu_kernel(model, 1, 1), attention.cpu_kernel(model, 5, 5)) == ("on", "off")
    attention._path(model, 1).write_text("{not json")  # a corrupt file: llama-server's kernel until measured again
    assert attention.cpu_kernel(model, 1, 1) == "on" and attention.kernel_pending(model, 1)
    # measured while another program used the cores: nothing stored
    measured({"off": 10.0, "on": 11.0})
    assert attention.measure_kernel(model, 6, 6, busy=lambda: True) is None and attention.kernel_pending(model, 6)


def test_a_kernel_measurement_gives_way_between_passes(tiny):
    from localspec.costs import attention

    model = backend_model.Model(tiny.target)
    asked = []
    stop = lambda: asked.append(1) or len(asked) > 2  # noqa: E731
    assert attention.measure_kernel(model, 7, 7, stop=stop) is None and len(asked) == 3
    assert attention.stored_kernel(model, 7) is None
