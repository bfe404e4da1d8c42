"""Tiny random-weight GGUFs of any architecture llama.cpp loads (mamba, mamba2, lfm2, qwen35...), for tests.

The metadata (hyperparameters and scripts/harness/tinygguf.py's vocabulary) is written with the `gguf` package;
llama.cpp itself then creates every tensor the architecture needs at the shapes it expects
(`llama_model_init_from_user`), this module fills them from a seed, and llama.cpp saves the file
(`llama_model_save_to_file`), as llama.cpp's own test-llama-archs does. A perturbed draft is the same
weights plus scaled noise, so its drafts agree with the target's tokens part of the time.

    build_tiny_arch(path, "qwen35", seed=0)                -> a hybrid target
    build_tiny_arch(path, "qwen35", seed=0, perturb=0.3)   -> a draft that disagrees now and then
"""

from __future__ import annotations

import ctypes
import zlib
from pathlib import Path

import numpy as np

from .tinygguf import CHATML, N_CTX_TRAIN, tiny_vocab

ARCHS = ("mamba", "mamba2", "lfm2", "qwen35", "granitehybrid", "nemotron_h")
TINY = dict(width=64, layers=4, heads=4, heads_kv=4, head_dim=16, ff=128, interval=2, vocab=0)
F32, F16 = 0, 1  # ggml_type


def _hparams(w, arch: str, d: dict) -> None:
    """The keys each architecture's loader reads, as test-llama-archs sets them; `d`: TINY's sizes, or a
    released model's (a shape twin: scripts/hybrid-twin)."""
    a, N_HEAD, N_LAYER = arch, d["heads"], d["layers"]
    w.add_uint32(f"{a}.context_length", N_CTX_TRAIN)
    w.add_uint32(f"{a}.embedding_length", d["width"])
    w.add_uint32(f"{a}.block_count", N_LAYER + d.get("nextn", 0))
    if d.get("nextn"):  # multi-token-prediction (NextN) blocks after the main ones, as Qwen3.5 ships them
        w.add_uint32(f"{a}.nextn_predict_layers", d["nextn"])
    w.add_uint32(f"{a}.feed_forward_length", d["ff"])
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(f"{a}.attention.layer_norm_epsilon", 1e-5)
    # hybrids: every other layer attends, the first too (per-layer head counts, 0 = recurrent); qwen35 by its interval
    heads = [N_HEAD if i % 2 == 0 else 0 for i in range(N_LAYER)]
    if a in ("lfm2", "granitehybrid", "nemotron_h"):
        w.add_array(f"{a}.attention.head_count", heads)
        w.add_array(f"{a}.attention.head_count_kv", heads)
    else:
        w.add_uint32(f"{a}.attention.head_count", N_HEAD)
        w.add_uint32(f"{a}.attention.head_count_kv", d["heads_kv"])
    w.add_uint32(f"{a}.attention.key_length", d["head_dim"])
    w.add_uint32(f"{a}.attention.value_length", d["head_dim"])
    rope = d.get("rope_dim", d["head_dim"])
    w.add_uint32(f"{a}.rope.dimension_count", rope)
    w.add_uint32(f"{a}.full_attention_interval", d["interval"])
    w.add_uint32(f"{a}.ssm.conv_kernel", 4)
    # qwen35: value heads (time_step_rank) x state = inner size; key heads = group count
    w.add_uint32(f"{a}.ssm.inner_size", d.get("ssm_inner", 256 if a == "qwen35" else 2 * d["width"]))
    w.add_uint32(f"{a}.ssm.state_size", d.get("ssm_state", 64 if a == "qwen35" else 16))
    w.add_uint32(f"{a}.ssm.time_step_rank", d.get("ssm_heads", N_HEAD))
    w.add_uint32(f"{a}.ssm.group_count", d.get("ssm_groups", 2 if a != "mamba" else 0))
    w.add_uint32(f"{a}.shortconv.l_cache", 3)
    half = rope // 2
    w.add_array(f"{a}.rope.dimension_sections", [half - 2 * (half // 3), half // 3, half // 3, 0])


def _metadata(path: Path, arch: str, chat_template: str | None, d: dict, name: str) -> None:
    import gguf

    tokens, scores, types = tiny_vocab()
    if d["vocab"]:  # a twin's chat roles are single tokens, as in the released model's vocabulary (with every
        for word in ("user", "assistant", "system", "▁user", "▁assistant", "▁system"):  # prefix, for spm's merges)
            for piece in (word[:i] for i in range(2, len(word) + 1)):
                if piece not in tokens:
                    tokens.append(piece)
                    scores.append(float(len(piece)))
                    types.append(1)
    for i in range(len(tokens), d["vocab"]):  # a released model's vocabulary size: the output layer's cost
        tokens.append(f"<|unused{i}|>")
        scores.append(-1e4)
        types.append(4)  # USER_DEFINED: never produced by tokenizing text
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_file_type(d.get("file_type", 0))
    _hparams(w, arch, d)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(4)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def _libggml():
    import llama_cpp

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, _InitParams]
    lib.gguf_free.argtypes = [ctypes.c_void_p]
    lib.ggml_get_name.restype = ctypes.c_char_p
    lib.ggml_get_name.argtypes = [ctypes.c_void_p]
    lib.ggml_nelements.restype = ctypes.c_int64
    lib.ggml_nelements.argtypes = [ctypes.c_void_p]
    lib.ggml_nbytes.restype = ctypes.c_size_t
    lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_tensor_set.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    return lib


class _InitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


def _values(name: str, n: int, seed: int, perturb: float, width: int) -> np.ndarray:
    """A tensor's values from the seed and its name; norms around 1, decays negative, outputs peaked."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    a = rng.standard_normal(n).astype(np.float32)
    if perturb:
        noise = np.random.default_rng([seed + 1000, zlib.crc32(name.encode())])
        a = a + noise.standard_normal(n).astype(np.float32) * perturb
    if "norm" in name:
        return 1.0 + 0.1 * a
    if "ssm_a" in name:
        return -np.abs(a)
    if name.startswith("output.") or name.startswith("token_embd"):
        return a * (4.0 / np.sqrt(width) if name.startswith("output.") else 1.0)
    return a * (1.0 / np.sqrt(width))


def build_tiny_arch(path: str | Path, arch: str, seed: int = 0, perturb: float = 0.0,
                    chat_template: str | None = CHATML, dims: dict | None = None, nextn: int = 0) -> Path:
    """dims: sizes over TINY's (a shape twin's: a released model's widths, layers and vocabulary); nextn: that
    many NextN (MTP) draft blocks after the main layers, saved with the model."""
    from localspec.backend.model import llama

    L = llama()  # llama.cpp's log kept quiet
    path = Path(path)
    meta = path.with_suffix(".meta.gguf")
    d = {**TINY, **(dims or {}), "nextn": nextn}
    _metadata(meta, arch, chat_template, d, f"tiny-{arch}" if dims is None else f"twin-{arch}")
    lib = _libggml()
    ctx = lib.gguf_init_from_file(str(meta).encode(), _InitParams(True, None))
    if not ctx:
        raise RuntimeError(f"could not read {meta}")

    @L.llama_model_set_tensor_data_t
    def fill(tensor, _ud):
        name = lib.ggml_get_name(tensor).decode()
        n = lib.ggml_nelements(tensor)
        kind = ctypes.c_int.from_address(tensor).value  # ggml_tensor's first field: its type
        vals = _values(name, n, seed, perturb, d["width"])
        data = vals.astype(np.float16 if kind == F16 else np.float32)
        lib.ggml_backend_tensor_set(tensor, data.ctypes.data, 0, lib.ggml_nbytes(tensor))

    params = L.llama_model_default_params()
    params.n_gpu_layers = 0
    params.load_mtp = bool(nextn)  # else llama.cpp skips the NextN blocks' tensors
    try:
        model = L.llama_model_init_from_user(ctypes.c_void_p(ctx), fill, None, params)
        if not model:
            raise RuntimeError(f"llama.cpp could not build a tiny {arch}")
        L.llama_model_save_to_file(model, str(path).encode())
        L.llama_model_free(model)
    finally:
        lib.gguf_free(ctx)
        meta.unlink(missing_ok=True)
    if nextn:  # llama.cpp saves the per-layer recurrence flags for the main layers only, and would refuse the
        _extend_layers(path, f"{arch}.attention.recurrent_layers", nextn)  # file: the NextN blocks attend
    return path


def _extend_layers(path: Path, key: str, extra: int) -> None:
    """The GGUF at `path` written again with the per-layer array `key` extended by `extra` zeros (tensors as
    they are; empty arrays, which gguf cannot write, left out: llama.cpp reads them as absent)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    out = path.with_suffix(".tmp.gguf")
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    for f in reader.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        if sub is not None and not f.data:
            continue
        value = f.contents() + [0] * extra if f.name == key else f.contents()
        writer.add_key_value(f.name, value, f.types[0], sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data)
    writer.close()
    del reader
    out.replace(path)


if __name__ == "__main__":  # PYTHONPATH=scripts python -m harness.tinyarch DIR ARCH...
    import sys

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for arch in sys.argv[2:] or ARCHS:
        print(build_tiny_arch(out / f"tiny-{arch}.gguf", arch))
