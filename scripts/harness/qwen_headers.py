"""Header-only GGUFs shaped as Qwen2.5 models at Q4_K_M: the key/values and tensor descriptions a real file
has (names, shapes, llama.cpp's Q4_K_M type per tensor), and no weights. What a placement is computed from
(localspec/models/placement.py), for sizes this machine cannot hold.

    write_qwen25_header(path, "7b")
"""

from __future__ import annotations

from pathlib import Path

# Qwen2.5's published configurations: layers, width, feed-forward width, heads, KV heads, vocabulary, tied output
# (the small ones tie it, but their GGUFs still carry an output.weight of its own, and so do these)
QWEN25 = {
    "0.5b": (24, 896, 4864, 14, 2, 151936, False),
    "1.5b": (28, 1536, 8960, 12, 2, 151936, False),
    "7b": (28, 3584, 18944, 28, 4, 152064, False),
    "14b": (48, 5120, 13824, 40, 8, 152064, False),
    "32b": (64, 5120, 27648, 40, 8, 152064, False),
}
F32, Q5_0, Q8_0, Q4_K, Q6_K = 0, 6, 8, 12, 14
# a K-quant needs rows of whole 256-element blocks; llama.cpp falls back to these where they are not (0.5B's 896)
K_FALLBACK = {Q4_K: Q5_0, Q6_K: Q8_0}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's Q4_K_M recipe gives attn_v and ffn_down Q6_K in these layers (llama-quant.cpp)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def qwen25_tensors(size: str) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, GGUF shape (fastest dimension first), ggml type) of every tensor, as a Q4_K_M file lists them."""
    n_layer, d, ff, heads, kv_heads, vocab, tied = QWEN25[size]
    hd = d // heads
    out = [("token_embd.weight", (d, vocab), Q4_K)]
    for i in range(n_layer):
        more = use_more_bits(i, n_layer)
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (d,), F32),
                (b + "attn_q.weight", (d, d), Q4_K), (b + "attn_q.bias", (d,), F32),
                (b + "attn_k.weight", (d, kv_heads * hd), Q4_K), (b + "attn_k.bias", (kv_heads * hd,), F32),
                (b + "attn_v.weight", (d, kv_heads * hd), Q6_K if more else Q4_K),
                (b + "attn_v.bias", (kv_heads * hd,), F32),
                (b + "attn_output.weight", (d, d), Q4_K), (b + "ffn_norm.weight", (d,), F32),
                (b + "ffn_gate.weight", (d, ff), Q4_K), (b + "ffn_up.weight", (d, ff), Q4_K),
                (b + "ffn_down.weight", (ff, d), Q6_K if more else Q4_K)]
    out.append(("output_norm.weight", (d,), F32))
    if not tied:
        out.append(("output.weight", (d, vocab), Q6_K))
    return [(name, shape, K_FALLBACK.get(kind, kind) if shape[0] % 256 else kind) for name, shape, kind in out]


def write_qwen25_header(path: Path, size: str, tokenizer_from: str | None = None) -> Path:
    """tokenizer_from: a Qwen2.5 GGUF whose tokenizer the file takes (padded to the model's vocabulary, as
    Qwen's own 7B+ files are), so llama.cpp loads it; without one, placeholder tokens (a header to size a load by)."""
    import gguf
    import numpy as np

    n_layer, d, ff, heads, kv_heads, vocab, _ = QWEN25[size]
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name(f"Qwen2.5 {size.upper()} shape (header only)")
    w.add_file_type(15)  # Q4_K_M
    w.add_block_count(n_layer)
    w.add_context_length(32768)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    if tokenizer_from:
        copy_tokenizer(gguf.GGUFReader(tokenizer_from), w, vocab)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"t{i}" for i in range(vocab)])
        w.add_bos_token_id(151643)
        w.add_eos_token_id(151645)
    for name, shape, kind in qwen25_tensors(size):
        block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
        n = int(np.prod(shape))
        # numpy order (slowest first); a quantized row is given in bytes, as the writer expects
        rows = tuple(reversed(shape[1:]))
        np_shape = rows + ((shape[0] // block * nbytes,) if kind != F32 else (shape[0],))
        w.add_tensor_info(name, np_shape, np.dtype(np.float32 if kind == F32 else np.uint8),
                          n // block * nbytes, raw_dtype=gguf.GGMLQuantizationType(kind))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


def copy_tokenizer(reader, writer, vocab: int) -> None:
    import gguf

    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type") and len(value) < vocab:
            pad = [f"<|pad_{i}|>" for i in range(len(value), vocab)] if key.endswith("tokens") else \
                [gguf.TokenType.USER_DEFINED] * (vocab - len(value))
            value = list(value) + pad
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, field.types[0], sub_type=sub)


def write_qwen25_twin(path: Path, size: str, tokenizer_from: str) -> Path:
    """A Qwen2.5-shaped model with random weights of the Q4_K_M types (scripts/shape_twin.py fills them in): what a
    pass costs on a device, from no download. Its outputs are noise."""
    import json
    import struct

    import shape_twin

    from localspec.models.gguf_header import read_layout_file

    head_only = write_qwen25_header(Path(f"{path}.header"), size, tokenizer_from)
    h = read_layout_file(head_only)
    layout = [[t.name, t.ggml_type, h.data_start + t.offset, t.n_bytes] for t in h.tensors]
    head = head_only.read_bytes().ljust(h.data_start, b"\0")
    end = max(o + n for _, _, o, n in layout)
    meta = json.dumps({"size": -(-end // 32) * 32, "tensors": layout}).encode()  # the data padded, as llama.cpp reads it
    twin = Path(f"{path}.twin")
    twin.write_bytes(shape_twin.MAGIC + struct.pack("<QQ", len(meta), len(head)) + meta + head)
    shape_twin.build(str(twin), str(path))
    head_only.unlink()
    twin.unlink()
    return path
