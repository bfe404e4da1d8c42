"""Build tiny llama-architecture GGUF models with the `gguf` package, for tests and CI.

A ~320-token SentencePiece-style vocabulary (control tokens, 256 byte-fallback tokens and a few
dozen word pieces), two transformer blocks of width 64, random F32 weights from a fixed seed.
The output layer is scaled up so the logits are peaked (clear argmaxes, few near-ties), which
makes the greedy golden tests meaningful.

    build_tiny_model(path, seed=0)                      -> the target
    build_tiny_model(path, seed=0)                      -> an identical draft (100% acceptance)
    build_tiny_model(path, seed=0, perturb=0.5)         -> a perturbed draft (partial acceptance)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

N_EMBD = 64
N_HEAD = 4
N_LAYER = 2
N_FF = 128
N_CTX_TRAIN = 2048

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

WORDS = [
    "the", "a", "cache", "model", "token", "draft", "target", "fast", "slow", "def", "return",
    "import", "print", "hello", "world", "code", "python", "file", "read", "write", "data",
    "line", "value", "list", "for", "in", "if", "else", "and", "or", "not", "is", "to", "of",
    "it", "on", "with", "as", "by", "at", "haiku", "about", "caches", "function", "parse", "csv",
]
# words of that vocabulary the benchmarks build their prompts from (the shape twins share the vocabulary)
PROMPT_WORDS = "the cache model token draft target fast slow read write data line value list code file".split()


FIM_TOKENS = {"pre": "<|fim_prefix|>", "suf": "<|fim_suffix|>", "mid": "<|fim_middle|>", "pad": "<|fim_pad|>",
              "rep": "<|repo_name|>", "sep": "<|file_sep|>"}  # Qwen2.5-Coder's


def tiny_vocab(fim: bool = False) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, types). ids 0..2 are <unk>, <s>, </s>; chatml markers are control tokens;
    with fim, Qwen's six FIM tokens follow (control tokens too), so every other id stays the same."""
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [2, 3, 3, 3, 3]  # UNKNOWN, CONTROL...
    scores = [0.0] * len(tokens)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(6)  # BYTE
        scores.append(0.0)
    pieces = ["▁" + w for w in WORDS] + list("abcdefghijklmnopqrstuvwxyz") + ["▁"]
    for i, p in enumerate(pieces):
        tokens.append(p)
        types.append(1)  # NORMAL
        scores.append(-float(i))  # earlier pieces merge first
    if fim:
        tokens += list(FIM_TOKENS.values())
        types += [3] * len(FIM_TOKENS)
        scores += [0.0] * len(FIM_TOKENS)
    return tokens, scores, types


def build_tiny_model(path: str | Path, seed: int = 0, perturb: float = 0.0, perturb_seed: int = 1,
                     chat_template: str | None = CHATML, out_scale: float = 4.0, fim: bool = False,
                     width: int = N_EMBD) -> Path:
    """width: the model's embedding size (256 lets llama.cpp quantize every matrix to a K-quant)."""
    import gguf

    path = Path(path)
    tokens, scores, types = tiny_vocab(fim)
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)
    noise = np.random.default_rng(perturb_seed)

    def w(*shape, scale=None):
        scale = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        a = rng.standard_normal(shape).astype(np.float32) * scale
        if perturb:
            a = a + noise.standard_normal(shape).astype(np.float32) * scale * perturb
        return a.astype(np.float16)  # F16 matrices: llama.cpp's CPU mul_mat path for F32 weights is not used

    n_ff = 2 * width
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"tiny-llama-seed{seed}-perturb{perturb}")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(width)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(width // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(1)  # MOSTLY_F16
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(4)  # <|im_end|> ends a turn, like chatml models
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if chat_template:
        writer.add_chat_template(chat_template)
    if fim:
        for key, text in FIM_TOKENS.items():
            writer.add_uint32(f"tokenizer.ggml.fim_{key}_token_id", tokens.index(text))

    writer.add_tensor("token_embd.weight", w(n_vocab, width, scale=1.0))
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(width, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", w(width, width))
        writer.add_tensor(f"blk.{i}.attn_k.weight", w(width, width))
        writer.add_tensor(f"blk.{i}.attn_v.weight", w(width, width))
        writer.add_tensor(f"blk.{i}.attn_output.weight", w(width, width))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(width, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", w(n_ff, width))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", w(n_ff, width))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", w(width, n_ff))
    writer.add_tensor("output_norm.weight", np.ones(width, dtype=np.float32))
    writer.add_tensor("output.weight", w(n_vocab, width, scale=out_scale / np.sqrt(width)))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":  # python scripts/harness/tinygguf.py DIR  -> writes the test trio there
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    build_tiny_model(out / "tiny-target.gguf", seed=0)
    build_tiny_model(out / "tiny-draft-same.gguf", seed=0)
    build_tiny_model(out / "tiny-draft-perturbed.gguf", seed=0, perturb=0.1)
    print(out)
