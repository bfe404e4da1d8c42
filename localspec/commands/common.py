"""Options shared by run, chat, verify and bench, and turning them into a loaded Engine."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from ..config import GenConfig, LoadConfig, default_threads
from ..errors import ConfigError


def add_model_args(p: argparse.ArgumentParser, positional_pair: bool = False) -> None:
    g = p.add_argument_group("models")
    if positional_pair:
        g.add_argument("pair", nargs="?", help="a named pair from models.yaml (default: the default pair)")
    g.add_argument("-m", "--pair", dest="pair_opt", metavar="PAIR", help="a named pair from models.yaml")
    g.add_argument("--target", metavar="GGUF", help="target model file (overrides the pair)")
    g.add_argument("--draft", metavar="GGUF", help="draft model file (needs --target)")
    g.add_argument("--pull", action="store_true", help="download a missing pair instead of stopping")
    g.add_argument("-c", "--ctx-size", type=int, default=None, help="context size in tokens (default: the pair's, or 4096)")
    g.add_argument("-t", "--threads", type=int, default=None, help=f"CPU threads (default: all cores, {default_threads()})")
    g.add_argument("-ngl", "--n-gpu-layers", type=int, default=None, help="layers to offload to the GPU (-1 = all)")
    g.add_argument("--mmap", action="store_true", help="memory-map the weights (faster load, more resident memory)")


def add_gen_args(p: argparse.ArgumentParser) -> None:
    d = GenConfig()
    g = p.add_argument_group("generation")
    g.add_argument("-k", "--draft-max", type=nonneg_int, default=None, help=f"most tokens drafted per round (default {d.draft_max})")
    g.add_argument("--temperature", "--temp", type=_nonneg_float, default=d.temperature, help=f"0 = greedy (default {d.temperature})")
    g.add_argument("--top-k", type=nonneg_int, default=d.top_k, help=f"0 = off (default {d.top_k})")
    g.add_argument("--top-p", type=_unit_float, default=d.top_p, help=f"1 = off (default {d.top_p})")
    g.add_argument("--min-p", type=_unit_float, default=d.min_p, help=f"0 = off (default {d.min_p})")
    g.add_argument("--seed", type=int, default=None, help="make sampling reproducible")
    g.add_argument("-n", "--max-tokens", type=nonneg_int, default=d.max_tokens, help=f"(default {d.max_tokens})")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    g.add_argument("--system", metavar="TEXT", help="system prompt")
    g.add_argument("--spec", choices=["on", "off", "auto"], default=None,
                   help="speculation: auto drafts only when the measured costs say it pays (default auto)")
    g.add_argument("--no-spec", action="store_true", help="plain target-only decoding (same as --spec off)")
    g.add_argument("--drafter", choices=["model", "ngram", "hybrid"], default=None,
                   help="model, n-gram prompt lookup, or hybrid (default hybrid)")
    g.add_argument("--p-min", type=_unit_float, default=None, help="stop drafting below this draft probability")


def _whole(s: str, minimum: int) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a whole number")
    if v < minimum:
        raise argparse.ArgumentTypeError(f"{s} must be {minimum} or more")
    return v


def nonneg_int(s: str) -> int:
    return _whole(s, 0)


def pos_int(s: str) -> int:
    return _whole(s, 1)


def _nonneg_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number")
    if v < 0:
        raise argparse.ArgumentTypeError(f"{s} must be 0 or more")
    return v


def _unit_float(s: str) -> float:
    v = _nonneg_float(s)
    if v > 1:
        raise argparse.ArgumentTypeError(f"{s} must be between 0 and 1")
    return v


@dataclass
class Selection:
    name: str
    target: str
    draft: str | None
    spec: object | None  # models.PairSpec when a named pair was used


def select_models(args, notify=None) -> Selection:
    """notify(message): where progress notes of slow steps go (default: stderr; the chat app shows them)."""
    pair = getattr(args, "pair_opt", None) or getattr(args, "pair", None)
    if args.draft and not args.target:
        raise ConfigError("--draft needs --target too")
    if args.target and pair:
        raise ConfigError("give either a pair name or --target/--draft, not both")
    try:
        from .. import models
    except ImportError:  # the models layer is optional for explicit paths
        models = None
    if models is None:
        if not args.target:
            raise ConfigError("pass --target PATH (and --draft PATH)")
        return Selection(args.target, args.target, args.draft, None)
    kw = {"notify": notify} if notify is not None else {}
    r = models.resolve_pair(pair=pair, target=args.target, draft=args.draft, pull=getattr(args, "pull", False), **kw)
    return Selection(r.name, str(r.target_path), str(r.draft_path) if r.draft_path else None, r.spec)


def load_config(args, sel: Selection) -> LoadConfig:
    load = LoadConfig()
    s = getattr(sel.spec, "settings", None) or sel.spec
    if s is not None:
        for field, attr in (("n_ctx", "n_ctx"), ("n_gpu_layers_target", "n_gpu_layers_target"),
                            ("n_gpu_layers_draft", "n_gpu_layers_draft"), ("chat_template", "chat_template"),
                            ("rpc_servers", "rpc_servers")):
            v = getattr(s, attr, None)
            if v is not None:
                setattr(load, field, v)
    if args.ctx_size:
        load.n_ctx = args.ctx_size
    if args.threads:
        load.n_threads = load.n_threads_batch = args.threads
    if getattr(args, "mmap", False):
        load.mmap = True
    if args.n_gpu_layers is not None:
        load.n_gpu_layers_target = load.n_gpu_layers_draft = args.n_gpu_layers
    return load


def gen_config(args, sel: Selection | None = None) -> GenConfig:
    cfg = GenConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                    seed=args.seed, max_tokens=args.max_tokens, stop=list(args.stop))
    spec = getattr(sel, "spec", None)
    s = getattr(spec, "settings", None) or spec
    if s is not None:
        if getattr(s, "draft_max", None) is not None:
            cfg.draft_max = s.draft_max
        if getattr(s, "p_min", None) is not None:
            cfg.p_min = s.p_min
    if args.draft_max is not None:
        cfg.draft_max = cfg.ngram_draft_max = args.draft_max
    if args.p_min is not None:
        cfg.p_min = args.p_min
    if args.drafter:
        cfg.drafter = args.drafter
    cfg.spec = "off" if args.no_spec else (args.spec or "auto")
    if cfg.spec == "on" and cfg.draft_max == 0:
        raise ConfigError("--spec on with -k 0 drafts nothing; use -k 1 or more")
    return cfg


def open_engine(args, sel: Selection, cfg: GenConfig, quiet: bool = False, tune: bool = True):
    """Load the pair; for --spec auto make sure a measured cost profile exists (tune=False: later,
    with `prepare_auto`, once the prompt is known to be fine)."""
    from ..engine import Engine

    engine = Engine(sel.target, sel.draft, load_config(args, sel))
    if tune:
        prepare_auto(engine, cfg, quiet)
    return engine


def prepare_auto(engine, cfg: GenConfig, quiet: bool = False) -> None:
    from ..tuning import ensure_profile

    if cfg.spec == "auto" and engine.profile is None:
        ensure_profile(engine, on_measure=None if quiet else lambda: sys.stderr.write(
            "measuring pass costs on this machine for --spec auto (once; `localspec tune` redoes it)...\n"))
