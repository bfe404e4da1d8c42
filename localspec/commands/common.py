"""Flags shared by run, chat, verify, bench and serve, and turning them into the session layer's choices."""

from __future__ import annotations

import argparse
import math
import os
import sys

from ..config import DRAFTERS, GenConfig, default_threads, rpc_endpoints
from ..errors import ConfigError
from ..session import GenChoice, ModelChoice


def add_model_args(p: argparse.ArgumentParser, positional_pair: bool = False) -> None:
    g = p.add_argument_group("models")
    if positional_pair:
        g.add_argument("pair", nargs="?", help="a named pair from models.yaml (default: the default pair)")
    g.add_argument("-m", "--pair", dest="pair_opt", metavar="PAIR", help="a named pair from models.yaml")
    g.add_argument("--target", metavar="GGUF", help="target model file (overrides the pair)")
    g.add_argument("--draft", metavar="GGUF", help="draft model file (needs --target)")
    g.add_argument("--pull", action="store_true", help="download a missing pair instead of stopping")
    g.add_argument("-c", "--ctx-size", type=pos_int, default=None, help="context size in tokens (default: the pair's, or 4096)")
    g.add_argument("-t", "--threads", type=threads_arg, default=None,
                   help=f"CPU threads, 1 to {max_threads()} (default: all cores, {default_threads()})")
    g.add_argument("-ngl", "--n-gpu-layers", type=gpu_layers, default=None,
                   help="layers to offload to the GPU (-1 = all; the draft's too unless -ngld is given)")
    g.add_argument("-ngld", "--n-gpu-layers-draft", type=gpu_layers, default=None,
                   help="the draft model's layers on the GPU, like llama.cpp's -ngld (0 = keep the draft on the CPU)")
    g.add_argument("--no-mmap", dest="mmap", action="store_false", default=None,
                   help="read the weights into memory instead of memory-mapping them (the default maps them, "
                        "releasing the mapped pages as they load)")
    g.add_argument("--mmap", dest="mmap", action="store_true", help=argparse.SUPPRESS)  # the default; kept for old scripts
    g.add_argument("-fa", "--flash-attn", choices=["on", "off", "auto"], default=None,
                   help="llama.cpp's flash attention, like its -fa (default auto: llama.cpp's choice on a GPU; on "
                        "a CPU the kernel whose answers' tokens cost less, flash attention on a tie, "
                        "measured once; off costs a bigger compute buffer: see docs/SERVE.md)")
    g.add_argument("--chat-template", type=chat_template_arg, default=None, metavar="JINJA",
                   help="a Jinja chat template, or chatml, over the pair's and the GGUF's own (a GGUF without "
                        "one gets ChatML, as with llama-server)")
    g.add_argument("--rpc", type=rpc_arg, default=None, metavar="HOST:PORT,...",
                   help="split the target's layers over llama.cpp RPC hosts, like llama-server's --rpc (start one "
                        "with scripts/rpc-host; see docs/MODELS.md)")
    g.add_argument("--exact", action="store_true", default=False,
                   help="greedy speculation byte-identical to plain decoding on every request: llama.cpp's "
                        "batch-invariant CPU kernels, at some speed (K-quant models; see docs/EXACT.md)")


def add_gen_args(p: argparse.ArgumentParser, unlimited: bool = False) -> None:
    """unlimited: the command has no token limit unless -n is given (serve, like llama-server)."""
    d = GenConfig()
    g = p.add_argument_group("generation")
    g.add_argument("-k", "--draft-max", type=nonneg_int, default=None, help=f"most tokens drafted per round (default {d.draft_max})")
    g.add_argument("--temperature", "--temp", type=nonneg_float, default=d.temperature, help=f"0 = greedy (default {d.temperature})")
    g.add_argument("--top-k", type=nonneg_int, default=d.top_k, help=f"0 = off (default {d.top_k})")
    g.add_argument("--top-p", type=unit_float, default=d.top_p, help=f"1 = off (default {d.top_p})")
    g.add_argument("--min-p", type=unit_float, default=d.min_p, help=f"0 = off (default {d.min_p})")
    g.add_argument("--seed", type=seed_arg, default=None,
                   help=f"make sampling reproducible: 0 to {SEED_MAX} (-1 = random, as in llama.cpp)")
    g.add_argument("-n", "--max-tokens", type=pos_int, default=-1 if unlimited else d.max_tokens,
                   help="most tokens per answer (default: " + ("no limit" if unlimited else str(d.max_tokens)) + ")")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    g.add_argument("--system", metavar="TEXT", help="system prompt")
    g.add_argument("--spec", choices=["on", "off", "auto"], default=None,
                   help="speculation: auto drafts only when the measured costs say it pays (default auto)")
    g.add_argument("--no-spec", action="store_true", help="plain target-only decoding (same as --spec off)")
    g.add_argument("--drafter", choices=DRAFTERS, default=None,
                   help="auto (default: the target's own NextN head, else the draft model, mixed with n-gram "
                        "copies), model, ngram (prompt lookup), hybrid (model and n-grams), or mtp (the head alone)")
    g.add_argument("--p-min", type=unit_float, default=None, help="stop drafting below this draft probability")


def _whole(s: str, minimum: int) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a whole number")
    if v < minimum:
        raise argparse.ArgumentTypeError(f"{s} must be {minimum} or more")
    return v


def chat_template_arg(s: str) -> str:
    from ..chat_format import template_arg

    try:
        return template_arg(s)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--chat-template ")) from None


def rpc_arg(s: str) -> str:
    try:
        return rpc_endpoints(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def nonneg_int(s: str) -> int:
    return _whole(s, 0)


def pos_int(s: str) -> int:
    return _whole(s, 1)


def nonneg_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number")
    if not math.isfinite(v):  # nan passes every comparison and empties the distribution
        raise argparse.ArgumentTypeError(f"{s} is not a finite number")
    if v < 0:
        raise argparse.ArgumentTypeError(f"{s} must be 0 or more")
    return v


def unit_float(s: str) -> float:
    v = nonneg_float(s)
    if v > 1:
        raise argparse.ArgumentTypeError(f"{s} must be between 0 and 1")
    return v


def max_threads() -> int:
    """More decode threads than processors only makes llama.cpp's spinning threads fight each other."""
    return max(1, os.cpu_count() or 1)


def threads_arg(s: str) -> int:
    v = _whole(s, 1)
    if v > max_threads():
        raise argparse.ArgumentTypeError(f"{s} threads is more than this machine's {max_threads()} processors")
    return v


SEED_MAX = 2**32 - 1  # llama.cpp's seeds are 32-bit; its -1 (LLAMA_DEFAULT_SEED) means random


def seed_arg(s: str) -> int | None:
    v = _whole(s, -1)
    if v > SEED_MAX:
        raise argparse.ArgumentTypeError(f"{s} is larger than {SEED_MAX}, the largest seed")
    return None if v == -1 else v


def gpu_layers(s: str) -> int:
    return _whole(s, -1)


def model_choice(args) -> ModelChoice:
    return ModelChoice(pair=getattr(args, "pair_opt", None) or getattr(args, "pair", None), target=args.target,
                       draft=args.draft, pull=getattr(args, "pull", False), ctx_size=args.ctx_size,
                       threads=args.threads, n_gpu_layers=args.n_gpu_layers, mmap=getattr(args, "mmap", None),
                       n_gpu_layers_draft=getattr(args, "n_gpu_layers_draft", None),
                       flash_attn=getattr(args, "flash_attn", None), exact=getattr(args, "exact", False),
                       chat_template=getattr(args, "chat_template", None), rpc=getattr(args, "rpc", None))


def gen_choice(args) -> GenChoice:
    return GenChoice(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                     seed=args.seed, max_tokens=args.max_tokens, stop=list(args.stop), system=args.system,
                     spec="off" if args.no_spec else args.spec, drafter=args.drafter,
                     draft_max=args.draft_max, p_min=args.p_min, prediction=read_prediction(args))


def read_prediction(args) -> str:
    """`--predict FILE`: the text the answer is expected to repeat (a file being edited), as UTF-8."""
    path = getattr(args, "predict", None)
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read --predict {path}: {e.strerror}; give the file the answer is expected to repeat") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"--predict {path} is not UTF-8 text; convert it first (iconv -t utf-8)") from None


def stderr_note(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
