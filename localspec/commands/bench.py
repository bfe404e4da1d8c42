"""`localspec bench`: acceptance and speed by workload, speculative against plain, in one run;
`localspec bench --costs`: the measured pass costs (T_decode, T_draft, T_verify(n)) on this machine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import GenConfig
from ..errors import ConfigError, LocalspecError
from ..session import ensure_profile, load_config, open_engine, select_models
from .common import add_model_args, model_choice, nonneg_float, nonneg_int, pos_int, seed_arg, stderr_note

COST_N_MAX = 16


def register(sub) -> None:
    p = sub.add_parser(
        "bench", help="measure speculative vs plain decoding by workload (or --costs: pass costs)",
        description="Runs plain decoding and each speculative setting alternately on the same prompts and "
                    "reports tok/s and their ratio, acceptance, passes per token, time split, and the speedup "
                    "predicted from measured pass costs. Without -k/--drafter/--spec/--setting it compares plain "
                    "with the fixed-k model draft and with `run`'s default (auto, hybrid).",
        epilog='examples:\n  localspec bench --workloads edit,docqa -k 2,4 --drafter model,ngram\n'
               '  localspec bench --spec on,auto --drafter hybrid -k 4 --report out/bench.md\n'
               '  localspec bench --costs',
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, positional_pair=True)
    g = p.add_argument_group("what to run")
    g.add_argument("--workloads", metavar="LIST",
                   help="comma-separated workloads (default: all shipped ones, or only --prompts' own; 'all' = both)")
    g.add_argument("--prompts", action="append", default=[], metavar="FILE",
                   help='your own prompts, JSONL: {"id", "prompt", optional "workload", "system", "max_tokens"} (repeatable)')
    g.add_argument("--prompts-per-workload", type=nonneg_int, default=4, metavar="N",
                   help="first N prompts of each workload (default 4; 0 = all)")
    g.add_argument("-k", "--draft-max", dest="ks", metavar="LIST", help="draft lengths, e.g. 1,2,3,4,6 (default: the pair's, 4)")
    g.add_argument("--drafter", dest="drafters", metavar="LIST", help="model,ngram,hybrid (default: model, or ngram without a draft)")
    g.add_argument("--spec", dest="specs", metavar="LIST",
                   help="on (fixed k) and/or auto (the cost model picks k <= the largest -k per round); default on")
    g.add_argument("--p-min", dest="p_mins", metavar="LIST", help="draft-model probability cutoffs, e.g. 0,0.5 (default 0)")
    g.add_argument("--setting", action="append", default=[], metavar="SPEC:DRAFTER[:K[:P_MIN]]",
                   help='an extra setting besides the grid, e.g. "on:ngram:6", "auto:hybrid:4/8" (K/N: auto\'s '
                        'draft-model and n-gram caps), or "auto:hybrid" = `localspec run`\'s default (repeatable)')
    g.add_argument("-n", "--max-tokens", type=pos_int, default=128, help="new tokens per run (default 128)")
    g.add_argument("--repeat", type=pos_int, default=1, metavar="R", help="A/B rounds per prompt (default 1)")
    g.add_argument("--baseline-every", type=pos_int, default=1, metavar="N",
                   help="a plain run after every N speculative runs (default 1: A B A B ...)")
    g.add_argument("--temperature", "--temp", type=nonneg_float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--seed", type=seed_arg, default=0, help="sampling seed, shared by each A/B pair (default 0)")
    g.add_argument("--no-warmup", action="store_true", help="skip the short untimed warm-up generations")
    g.add_argument("--background-load", type=nonneg_int, default=0, metavar="N",
                   help="run N busy processes (one core each) during the runs, to measure speed on a busy machine")
    g.add_argument("--retune", action="store_true",
                   help="for --spec auto: measure and store this machine's cost profile now instead of reusing the stored one")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print every figure as one JSON document instead of tables")
    o.add_argument("--report", metavar="FILE.md", help="also write a markdown report, FILE.json and PNG plots next to it")
    o.add_argument("--doc-block", metavar="FILE.md:NAME",
                   help="also put the summary tables between <!-- bench:NAME --> and <!-- /bench:NAME --> in FILE.md")
    o.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    o.add_argument("--list", action="store_true", help="list the workloads and their prompts, then exit")
    c = p.add_argument_group("pass costs")
    c.add_argument("--costs", action="store_true", help=f"measure T_decode, T_draft, T_verify(n) for n = 1..{COST_N_MAX} and print them")
    c.add_argument("--save", action="store_true", help="with --costs: store them as this machine's profile for --spec auto")
    c.add_argument("--cost-repeats", type=pos_int, default=5, metavar="R", help="timed passes per size, median taken (default 5)")
    p.set_defaults(func=cmd_bench)


def _list(value: str | None, flag: str, conv, allowed=None) -> list | None:
    if value is None:
        return None
    items = [x.strip() for x in value.split(",") if x.strip()]
    if not items:
        raise ConfigError(f"{flag} is empty")
    out = []
    for x in items:
        try:
            v = conv(x)
        except ValueError:
            raise ConfigError(f"{flag}: {x!r} is not valid")
        if allowed is not None and v not in allowed:
            raise ConfigError(f"{flag}: {x!r} is not one of {', '.join(allowed)}")
        out.append(v)
    return list(dict.fromkeys(out))


def _pair_default(sel, name: str, fallback):
    """A setting of the named pair (draft_max, p_min), or the fallback for explicit files."""
    v = getattr(sel.spec, name, None) if sel.spec is not None else None
    return fallback if v is None else v


def cmd_bench(args) -> int:
    from ..bench import workloads as wl

    if args.list:
        return _list_workloads(args)
    if args.save and not args.costs:
        raise ConfigError("--save goes with --costs (it stores the measured pass costs for --spec auto)")
    if args.temperature < 0:
        raise ConfigError("--temperature must be 0 or more")
    if args.doc_block:
        from ..bench.report import check_block

        check_block(*_doc_block(args.doc_block))
    chosen = None
    if not args.costs:  # check the user's prompt files before loading any model
        chosen = wl.select(args.workloads, args.prompts, args.prompts_per_workload)
    sel = select_models(model_choice(args))
    if args.costs:
        return _cmd_costs(args, sel)
    settings = _settings(args, sel)
    return _cmd_run(args, sel, chosen, settings)


def _settings(args, sel):
    from ..bench.runner import DRAFTERS, SPECS, build_settings, parse_setting

    default_k = int(_pair_default(sel, "draft_max", GenConfig().draft_max)) or GenConfig().draft_max
    ks = _list(args.ks, "-k", int)
    if ks and min(ks) < 1:
        raise ConfigError("-k: values must be 1 or more (k = 0 is the plain baseline, which always runs)")
    drafters = _list(args.drafters, "--drafter", str, DRAFTERS)
    specs = _list(args.specs, "--spec", str, SPECS)
    p_mins = _list(args.p_mins, "--p-min", float)
    if p_mins and not all(0.0 <= p <= 1.0 for p in p_mins):
        raise ConfigError("--p-min: values must be between 0 and 1")
    run_ngram_k = GenConfig().ngram_draft_max  # `run` without -k: n-gram drafts may be longer than k
    # a --setting without K means the pair's own k, as `localspec run` uses it, whatever -k says
    extra = [parse_setting(s, default_k, run_ngram_k) for s in args.setting]
    grid_given = any(x is not None for x in (ks, drafters, specs, p_mins))
    if not grid_given and not extra:  # plain vs the classic fixed-k draft and vs `run`'s default
        extra = [parse_setting("auto:hybrid", default_k, run_ngram_k)]
    if not grid_given and extra:
        specs = ["on"] if not args.setting else []
    ks = ks or [default_k]
    drafters = drafters or ["model" if sel.draft else "ngram"]
    specs = specs if specs is not None else ["on"]
    p_mins = p_mins or [float(_pair_default(sel, "p_min", 0.0))]
    return build_settings(specs, drafters, ks, p_mins, extra, has_draft=bool(sel.draft))


def _engine(args, sel):
    return open_engine(sel, load_config(model_choice(args), sel))


def _cmd_costs(args, sel) -> int:
    from ..bench.document import pair_info
    from ..bench.report import break_even, cost_warnings, costs_dict, costs_lines
    from ..costs.tuning import measure_costs, profile_path, steady_verify, tune

    engine = _engine(args, sel)
    try:
        if not args.quiet:
            sys.stderr.write(f"measuring pass costs (n = 1..{COST_N_MAX}, median of {args.cost_repeats})...\n")
        saved = None
        if args.save:  # the one way a profile is measured and stored
            costs = tune(engine, n_max=COST_N_MAX, repeats=args.cost_repeats, warmup=2)
            saved = profile_path(costs.key)
        else:
            costs = measure_costs(engine, n_max=COST_N_MAX, repeats=args.cost_repeats)
        steady = steady_verify(engine.target, COST_N_MAX)  # the backend's own curve, as llama-bench times it
        threads = engine.load.n_threads
    finally:
        engine.close()
    warnings = cost_warnings(costs, steady=steady)
    for wmsg in warnings:
        sys.stderr.write(f"warning: {wmsg}\n")
    if args.json:
        doc = {"pair": pair_info(sel), "threads": threads, "costs": costs_dict(costs),
               "steady_verify": steady, "steady_verify_ratio": [t / steady[0] for t in steady],
               "break_even": break_even(costs), "saved_to": str(saved) if saved else None, "warnings": warnings}
        print(json.dumps(doc, indent=2))
    else:
        head = (f"pass costs: target {Path(sel.target).name}" + (f", draft {Path(sel.draft).name}" if sel.draft else "")
                + f", {threads} threads (median of {args.cost_repeats} passes each)")
        print("\n".join(costs_lines(costs, head)))
        print("the backend's own curve (each size repeated, as llama-bench times it): "
              + "  ".join(f"{n + 1}: {t / steady[0]:.2f}x" for n, t in enumerate(steady)))
        if saved:
            print(f"\nsaved as this machine's profile for --spec auto: {saved}")
    return 0


def _cmd_run(args, sel, chosen, settings) -> int:
    from ..bench import report
    from ..bench.document import bench_document
    from ..bench.progress import Progress
    from ..bench.runner import NullProgress, Options, run_bench
    from ..costs.tuning import measure_costs

    needs_auto = any(s.spec == "auto" for s in settings)
    engine = _engine(args, sel)
    try:
        warnings = []
        if needs_auto:
            if args.retune and not args.quiet:
                sys.stderr.write("measuring pass costs for --spec auto (--retune)...\n")
            ensure_profile(engine, "auto", None if args.quiet else stderr_note, remeasure=args.retune)
            warnings += report.cost_warnings(engine.profile, "the stored cost profile used by --spec auto")
        k_max = max(s.cap for s in settings)
        if not args.quiet:
            sys.stderr.write(f"measuring pass costs for the predictions (n = 1..{k_max + 1})...\n")
        costs = measure_costs(engine, n_max=max(2, k_max + 1), repeats=args.cost_repeats)
        warnings += report.cost_warnings(costs)
        for wmsg in warnings:
            sys.stderr.write(f"warning: {wmsg}\n")
        opts = Options(max_tokens=args.max_tokens, repeat=args.repeat, temperature=args.temperature,
                       seed=args.seed, baseline_every=args.baseline_every, warmup=not args.no_warmup)
        progress = NullProgress() if args.quiet else Progress()
        from ..bench.load import background_load

        with background_load(args.background_load):
            results = run_bench(engine, chosen, settings, opts, costs, progress)
        doc = bench_document(engine, sel, settings, opts, costs, results, warnings,
                             command=_command_line(args, settings), prompts_per_workload=args.prompts_per_workload,
                             auto_profile=engine.profile if needs_auto else None)
        doc["options"]["background_load"] = args.background_load
    finally:
        engine.close()
    if args.report:
        _write_report(doc, Path(args.report))
    if args.doc_block:
        _fill_doc(doc, args.doc_block, args.report)
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        sys.stdout.write(report.text_report(doc))
    return 0


def _doc_block(spec: str) -> tuple[Path, str]:
    file, sep, name = spec.rpartition(":")
    if not sep or not file or not name:
        raise ConfigError(f"--doc-block {spec!r}: expected FILE.md:NAME")
    return Path(file), name


def _fill_doc(doc: dict, spec: str, report_path: str | None) -> None:
    import os

    from ..bench import report

    path, name = _doc_block(spec)
    link = Path(os.path.relpath(report_path, path.parent)).as_posix() if report_path else None
    report.fill_block(path, name, report.summary_md(doc, link))
    sys.stderr.write(f"updated the {name} block of {path}\n")


def _write_report(doc: dict, path: Path) -> None:
    from ..bench import plots as bench_plots
    from ..bench import report

    if path.suffix.lower() != ".md":
        raise ConfigError(f"--report {path}: give a file name ending in .md")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        base = path.with_suffix("")
        json_path = base.with_suffix(".json")
        doc["json_file"] = json_path.name
        json_path.write_text(json.dumps(doc, indent=1) + "\n")
        note = None
        try:
            plots = bench_plots.make_plots(doc, base)
        except ImportError:
            plots = []
            note = ("matplotlib is not installed, so this report has the tables only; "
                    "`pip install 'localspec[plot]'` adds the plots.")
        path.write_text(report.markdown_report(doc, plots, note))
    except OSError as e:
        raise LocalspecError(f"--report: cannot write {e.filename or path}: {e.strerror}")
    sys.stderr.write(f"report written to {path}" + (f" (+ {len(plots)} plots)" if plots else " (tables only)") + "\n")


def _command_line(args, settings) -> str:
    """The run spelled out in full, so the report says exactly how to reproduce it."""
    import shlex

    parts = ["localspec", "bench"]
    if args.target:
        parts += ["--target", args.target] + (["--draft", args.draft] if args.draft else [])
    elif args.pair_opt or args.pair:
        parts.append(args.pair_opt or args.pair)
    if args.workloads:
        parts += ["--workloads", args.workloads]
    for f in args.prompts:
        parts += ["--prompts", f]
    for s in settings:
        parts += ["--setting", s.arg()]
    parts += ["--max-tokens", str(args.max_tokens), "--prompts-per-workload", str(args.prompts_per_workload),
              "--repeat", str(args.repeat), "--baseline-every", str(args.baseline_every)]
    if args.retune:
        parts.append("--retune")
    if args.background_load:
        parts += ["--background-load", str(args.background_load)]
    if args.temperature:
        parts += ["--temperature", f"{args.temperature:g}", "--seed", str(args.seed)]
    for flag, v in (("--threads", args.threads), ("--ctx-size", args.ctx_size), ("-ngl", args.n_gpu_layers)):
        if v is not None:
            parts += [flag, str(v)]
    if getattr(args, "mmap", None) is False:
        parts.append("--no-mmap")
    return shlex.join(parts)


def _list_workloads(args) -> int:
    from ..bench import workloads as wl

    chosen = wl.select(args.workloads or ",".join(["all", *wl.BUILTIN]), args.prompts, 0)
    for name, prompts in chosen.items():
        print(f"{name} ({len(prompts)} prompts): {wl.BUILTIN.get(name, 'user prompts')}")
        for p in prompts:
            first = p.prompt.strip().splitlines()[0]
            print(f"  {p.id:<12} {first[:90]}")
    return 0
