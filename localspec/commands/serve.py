"""`localspec serve`: keep the pair loaded behind an OpenAI- and llama.cpp-compatible HTTP API."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .common import (
    add_gen_args,
    add_model_args,
    gen_choice,
    model_choice,
    nonneg_int,
    pos_int,
    stderr_note,
)

DEFAULT_PARALLEL = 4
MAX_PARALLEL = 64


def register(sub) -> None:
    from ..server import DEFAULT_PORT

    p = sub.add_parser(
        "serve", help="serve the pair over HTTP (OpenAI, Anthropic, Ollama and llama-server's APIs)",
        description="Loads the pair once and answers OpenAI clients (/v1/chat/completions, /v1/completions, "
                    "/v1/responses, /v1/models), Anthropic clients such as Claude Code (/v1/messages), Ollama "
                    "clients (/api/chat, /api/generate, /api/tags, ...), llama.cpp clients (/completion, /infill "
                    "for llama.vim and llama.vscode, /tokenize, /detokenize, /props, /health, /metrics). Up to "
                    "--parallel requests generate at once, their passes batched together; an editor's /infill "
                    "goes first; more requests wait in order. "
                    "Generation flags set the server's defaults; each request may override them.",
        epilog="examples:\n  localspec serve\n  localspec serve --port 8080 --api-key secret\n"
               "  OPENAI_BASE_URL=http://127.0.0.1:8012/v1 OPENAI_API_KEY=none python my_script.py\n"
               "  ANTHROPIC_BASE_URL=http://127.0.0.1:8012 ANTHROPIC_AUTH_TOKEN=none claude\n"
               "  localspec serve --port 11434        # for apps that assume Ollama's port",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, positional_pair=True)
    add_gen_args(p, unlimited=True)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other needs --api-key)")
    g.add_argument("--port", type=pos_int, default=DEFAULT_PORT, help=f"(default {DEFAULT_PORT}, llama.vim's and llama.vscode's)")
    g.add_argument("--api-key", default=os.environ.get("LOCALSPEC_API_KEY"), metavar="KEY",
                   help="require `Authorization: Bearer KEY` (default: $LOCALSPEC_API_KEY, else none)")
    g.add_argument("--cors", action="append", default=[], metavar="ORIGIN",
                   help="let web pages from ORIGIN (e.g. http://localhost:3000; * = any) call the server from a "
                        "browser (repeatable; default: browser requests from other origins are refused)")
    g.add_argument("-np", "--parallel", type=pos_int, default=DEFAULT_PARALLEL, metavar="N",
                   help=f"requests generating at once, each a sequence of one shared context (its KV cache is "
                        f"shared, not multiplied); more wait in a queue (default {DEFAULT_PARALLEL}, llama-server's)")
    g.add_argument("--log-requests", action="store_true",
                   help="print one line per request, and one with each answer's timings (prompt tokens new and "
                        "cached, tok/s, drafts accepted), as llama-server's log")
    g.add_argument("--no-webui", dest="webui", action="store_false",
                   help="do not serve the chat page at / (a browser then gets what other clients get)")
    m = p.add_argument_group("several models (`localspec serve` without a pair: every model found offline)")
    m.add_argument("--models-dir", metavar="DIR",
                   help="serve the GGUF files in DIR (instead of the pairs in models.yaml and the data root's "
                        "models folder), each paired with a smaller compatible one there, as llama-server's router")
    m.add_argument("--models-max", type=pos_int, default=4, metavar="N",
                   help="models loaded at once; loading one more unloads the least recently used idle one "
                        "(default 4, llama-server's)")
    m.add_argument("--models-memory", type=pos_int, default=None, metavar="MIB",
                   help="memory the server may hold, models, their caches and itself (default: what is free "
                        "at each load, less 512 MiB)")
    m.add_argument("--idle-unload", type=pos_int, default=None, metavar="SECONDS",
                   help="unload a model nobody used for this long (default: keep it; a request's Ollama "
                        "`keep_alive` sets its own)")
    m.add_argument("--isolate", action="store_true",
                   help="run each model in its own process, which the server outlives if it crashes (always "
                        "for a target split over --rpc hosts, whose loss llama.cpp answers by aborting)")
    add_editor_args(p)
    p.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    from ..server.router import Budget, Limits
    from ..server.runner import ServeOptions, serve

    def on_listen(url: str) -> None:
        page = f"; chat page {url}/" if args.webui else ""
        sys.stdout.write(f"localspec serve: listening on {url} (OpenAI base URL {url}/v1{page}); loading the "
                         "models, Ctrl-C stops\n")
        sys.stdout.flush()

    from ..errors import ConfigError
    from ..models.sizing import SERVE_CTX_FIT

    choice = model_choice(args)
    choice.ctx_fit = SERVE_CTX_FIT  # agents' prompts are long: the context the model and memory allow
    if args.parallel > MAX_PARALLEL:
        raise ConfigError(f"--parallel {args.parallel} is more than {MAX_PARALLEL}; each request beyond the "
                          "cores' worth only waits longer for its turn in the batch")
    choice.parallel = args.parallel
    # saved prompts: warm-ups and other files no longer evict the editor's; an agent's outlives the process
    choice.cache_ram_mib, choice.cache_disk_mib = args.cache_ram, args.cache_disk if args.cache_ram else 0
    choice.remember_generations = True  # n-gram drafts may copy earlier answers
    opts = ServeOptions(host=args.host, port=args.port, api_key=args.api_key, log_requests=args.log_requests,
                        cors=args.cors, editor=editor_settings(args), webui=args.webui, isolate=args.isolate,
                        limits=Limits(models_max=args.models_max, idle_unload_s=args.idle_unload),
                        budget=Budget(limit=args.models_memory << 20 if args.models_memory else None))
    if args.models_dir and (choice.pair or choice.target):
        raise ConfigError("--models-dir serves the models it finds; leave out the pair (or --target)")
    if not (choice.pair or choice.target):
        opts.catalog = served_models(choice, args.models_dir)
        opts.models_dir = Path(args.models_dir).expanduser() if args.models_dir else None
    return serve(choice, gen_choice(args), stderr_note, on_listen, opts)


def served_models(choice, models_dir: str | None = None):
    """Every model found offline; none found: the default pair as before (it says how to get it)."""
    from ..errors import ConfigError
    from ..models.catalog import find_models

    folder = Path(models_dir).expanduser() if models_dir else None
    if folder is not None and not folder.is_dir():
        raise ConfigError(f"--models-dir {models_dir}: no such folder")
    found = [] if choice.pull else find_models(folder)
    if folder is not None and not found:
        raise ConfigError(f"--models-dir {models_dir} has no .gguf file")
    if len(found) == 1:  # one model: the single-model server, every name answered by it
        for key, value in found[0].choice_fields().items():
            setattr(choice, key, value)
    return found if len(found) > 1 else None  # none: the default pair (its error says how to get it)


def add_editor_args(p) -> None:
    from ..fim.windows import PREFIX_MAX, PREFIX_MIN, PREFIX_S, SUFFIX_MAX, SUFFIX_MIN, SUFFIX_S, FimBudget

    d = FimBudget()
    g = p.add_argument_group("editors (/infill)")
    g.add_argument("--fim-layout", choices=["editor", "llama-server"], default="editor",
                   help="editor (default): windows that let typing reuse the cached prompt; llama-server: its "
                        "format_infill windows (the last 1,536 prefix tokens, the suffix after the typed text)")
    g.add_argument("--fim-prefix", type=nonneg_int, default=d.prefix, metavar="N",
                   help=f"prefix tokens before the anchor (default 0: about {PREFIX_S:g} s of this machine's "
                        f"prompt speed, {PREFIX_MIN} to {PREFIX_MAX:,})")
    g.add_argument("--fim-suffix", type=nonneg_int, default=d.suffix, metavar="N",
                   help=f"suffix tokens (default 0: about {SUFFIX_S:g} s of this machine's prompt speed, "
                        f"{SUFFIX_MIN} to {SUFFIX_MAX})")
    g.add_argument("--fim-extra", type=nonneg_int, default=d.extra, metavar="N",
                   help=f"tokens of the editor's extra context (other files) (default {d.extra})")
    g.add_argument("--cache-ram", type=nonneg_int, default=2048, metavar="MIB",
                   help="memory for saved prompts, so warm-ups, other files and an agent's side requests do not "
                        "evict each other's (default 2048; 0 = keep only the last prompt)")
    g.add_argument("--cache-disk", type=nonneg_int, default=8192, metavar="MIB",
                   help="disk for saved long prompts (an agent's system prompt and tools), kept across restarts "
                        "under the data root (default 8192; 0 = none)")


def editor_settings(args):
    from ..fim.windows import EditorSettings, FimBudget

    budget = FimBudget(prefix=args.fim_prefix, suffix=args.fim_suffix, extra=args.fim_extra)
    return EditorSettings(layout=args.fim_layout, budget=budget)
