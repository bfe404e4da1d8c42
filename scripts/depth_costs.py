"""Pass costs deep in a context, per llama.cpp setting: a decode, a 16- and a 64-token pass (the fastest
of 3) and the prompt speed (512-token passes) at each depth, for each flash-attention setting, on the
default pair's target with the machine's threads. Shows where `-fa off` pays (an agent's prompt, 19k
tokens deep) and what it costs in memory (llama.cpp's compute buffer, with LOCALSPEC_DEBUG=1). With a
third argument, OTHERS tokens of three other conversations sit in the same cache first (a server's
shared cache, --parallel 4): what a short request pays for them under each setting.

    scripts/depth-costs                  # depths 128,2048,8192; -fa on and off (~10 min here)
    scripts/depth-costs 128,1024 off     # quicker
    scripts/depth-costs 64 on,off 9000   # a short chat beside 9,000 cached tokens of others
"""
import argparse
import sys
import sysconfig
import time
from pathlib import Path

from localspec import models
from localspec.backend import Context, Model
from localspec.config import default_threads

SIZES = (1, 16, 64)


def measure(model: Model, tokens: list[int], depth: int, fa: str, others: int = 0) -> str:
    seqs = 4 if others else 1
    ctx = Context(model, max(4096, depth + others + 1024), 512, default_threads(), n_seq=seqs, flash_attn=fa)
    try:
        for seq in range(1, seqs):  # the other conversations go in first, as they do on a server
            ctx.eval(tokens[:others // 3], "none", seq=seq)
        t0 = time.perf_counter()
        ctx.eval(tokens[:depth], "last")
        prompt = depth / (time.perf_counter() - t0)
        costs = []
        for n in SIZES:
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                ctx.eval(tokens[depth:depth + n], "all")
                best = min(best, time.perf_counter() - t0)
                ctx.truncate(depth)
            costs.append(f"{1000 * best:,.1f} ms")
        return f"| {depth:,} | {others:,} | {fa} | " + " | ".join(costs) + f" | {prompt:.1f} tok/s |"
    finally:
        ctx.close()


def positive_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give depths as positive integers, e.g. 128,2048")
    return values


def fa_modes(text: str) -> list[str]:
    modes = text.split(",")
    if not set(modes) <= {"on", "off", "auto"}:
        raise argparse.ArgumentTypeError(f"{text!r}: flash attention modes are on, off, auto (e.g. on,off)")
    return modes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("depths", nargs="?", type=positive_list, default=[128, 2048, 8192])
    parser.add_argument("modes", nargs="?", type=fa_modes, default=["on", "off"])
    parser.add_argument("others", nargs="?", type=int, default=0, help="tokens of three other conversations")
    args = parser.parse_args()
    depths, modes, others = args.depths, args.modes, max(0, args.others)
    pair = models.resolve_pair()
    model = Model(str(pair.target_path))
    text = (Path(sysconfig.get_paths()["stdlib"]) / "typing.py").read_text()
    tokens = model.tokenize(text * (1 + max(depths) // 20000), add_special=False, parse_special=False)
    while len(tokens) < max(depths) + max(64, others // 3):
        tokens += tokens
    print("| depth | others' tokens | flash attention | decode | 16-token pass | 64-token pass | prompt (512-token passes) |")
    print("|---|---|---|---|---|---|---|")
    for depth in depths:
        for fa in modes:
            print(measure(model, tokens, depth, fa, others), flush=True)
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
