"""A shape twin of a released hybrid model: its layer sizes, layer pattern and vocabulary size, random
weights, quantized to Q4_K_M. Pass costs, rollback costs and a conversation's turn latency depend on the
shapes alone, so a twin measures them where the release cannot be downloaded; its text is noise.

  scripts/hybrid-twin OUT.gguf [--model qwen3.5-0.8b] [--perturbed DRAFT.gguf [--noise 0.3]] [--nextn 1]

--perturbed also writes the same weights plus noise (a draft that agrees with the twin part of the time: the
more --noise, the less; docs/RECURRENT.md gives the acceptance of each);
--nextn adds that many NextN (MTP) blocks, as the released files carry one.
The sizes are those of the model's published config.json (hidden size, layers, heads, linear-attention
heads, every fourth layer full attention).
"""
import argparse
import sys
import tempfile
from pathlib import Path

from harness.tinyarch import build_tiny_arch

MODELS = {  # config.json: hidden_size, num_hidden_layers, intermediate_size, num_attention_heads,
    # num_key_value_heads, head_dim (partial_rotary_factor 0.25), linear_num_key_heads, linear_num_value_heads,
    # linear_key_head_dim = linear_value_head_dim, full_attention_interval, vocab_size
    "qwen3.5-0.8b": dict(width=1024, layers=24, ff=3584, heads=8, heads_kv=2, head_dim=256, rope_dim=64,
                         ssm_groups=16, ssm_heads=16, ssm_state=128, ssm_inner=16 * 128, interval=4, vocab=248320),
}
Q4_K_M = 15  # llama_ftype


def quantize(src: Path, dst: Path) -> None:
    from localspec.backend import llama

    L = llama()
    params = L.llama_model_quantize_default_params()
    params.ftype = Q4_K_M
    params.nthread = 0
    if L.llama_model_quantize(str(src).encode(), str(dst).encode(), params) != 0:
        sys.exit(f"hybrid-twin: llama.cpp could not quantize {src}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="qwen3.5-0.8b", choices=sorted(MODELS))
    ap.add_argument("--perturbed", type=Path, help="also write a perturbed copy (a draft) here")
    ap.add_argument("--noise", type=float, default=0.3, help="the perturbed copy's noise (default 0.3)")
    ap.add_argument("--nextn", type=int, default=0, help="NextN (MTP) blocks after the main layers")
    a = ap.parse_args()
    dims = {**MODELS[a.model], "file_type": 1}  # F16 tensors, then Q4_K_M
    with tempfile.TemporaryDirectory(dir=a.out.parent) as tmp:
        for out, perturb in ((a.out, 0.0), (a.perturbed, a.noise)):
            if out is None:
                continue
            f16 = Path(tmp) / "twin-f16.gguf"
            build_tiny_arch(f16, "qwen35", perturb=perturb, dims=dims, nextn=a.nextn)
            quantize(f16, out)
            f16.unlink()
            print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
