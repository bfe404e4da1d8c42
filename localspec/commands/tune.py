"""`localspec tune`: measure this machine's pass costs for --spec auto, and try a cheaper draft."""

from __future__ import annotations

import json
import sys

from ..config import GenConfig
from ..costs.costmodel import best_k, predicted_speedup
from ..session import load_config, open_engine, select_models
from .common import add_model_args, model_choice

TUNE_PROMPTS = [  # a few short, mixed prompts to compare draft files' acceptance
    "Write a Python function that checks whether a string is a palindrome.",
    "Rewrite this function to use a list comprehension:\n\ndef squares(xs):\n    out = []\n    for x in xs:\n"
    "        out.append(x * x)\n    return out",
    "Explain in three sentences why the sky is blue.",
    "Reply to this customer politely: 'My order #4411 arrived damaged. What can I do?'",
]


def register(sub) -> None:
    p = sub.add_parser("tune", help="measure pass costs on this machine (the inputs of --spec auto)")
    add_model_args(p, positional_pair=True)
    p.add_argument("--show", action="store_true", help="print the stored profile without measuring")
    p.add_argument("--quantize-draft", action="store_true",
                   help="build a Q4_0 copy of the draft and compare its speed and acceptance")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tune)


def cmd_tune(args) -> int:
    from ..costs.tuning import load_profile, tune

    choice = model_choice(args)
    sel = select_models(choice)
    load = load_config(choice, sel)
    engine = open_engine(sel, load)
    if args.show:
        prof = load_profile(engine)
        if prof is None:
            sys.stderr.write("error: no profile stored for this pair, device and thread count; run `localspec tune`\n")
            return 1
    else:
        sys.stderr.write("measuring pass costs (a few seconds)...\n")
        prof = tune(engine)
    report = {"pair": sel.name, "threads": load.n_threads, "t_decode_ms": prof.t_decode * 1e3,
              "t_draft_ms": prof.t_draft * 1e3 if prof.t_draft else None,
              "t_verify_ms": [t * 1e3 for t in prof.t_verify], "verify_relative": prof.relative_verify(),
              "measured_at": prof.measured_at}
    if prof.t_draft:
        report["model_draft_break_even"] = {
            f"alpha={a}": {"best_k": best_k([a] * 8, 8, prof, "model")[0],
                           "speedup": round(best_k([a] * 8, 8, prof, "model")[1], 3)} for a in (0.6, 0.8, 0.9, 0.95)}
    if args.quantize_draft:
        if not sel.draft:
            sys.stderr.write("error: --quantize-draft needs a draft model (a pair or --draft PATH)\n")
            return 2
        report["q4_0_draft"] = compare_q4_0(engine, sel, load)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"pair {sel.name}, {load.n_threads} threads, measured {prof.measured_at}")
    print(f"T_decode (target, 1 token)  {prof.t_decode * 1e3:8.2f} ms")
    if prof.t_draft:
        print(f"T_draft  (draft, 1 token)   {prof.t_draft * 1e3:8.2f} ms  = {prof.t_draft / prof.t_decode:.2f} x T_decode")
    rel, sizes = prof.relative_verify(), prof.extra.get("sizes") or range(1, len(prof.t_verify) + 1)
    print("T_verify(n) / T_decode       " + "  ".join(f"n={n}:{rel[n - 1]:.2f}" for n in sizes if n <= len(rel)))
    if prof.t_draft:
        for a, v in report["model_draft_break_even"].items():
            verdict = f"k={v['best_k']} gives {v['speedup']:.2f}x" if v["best_k"] else "plain is faster"
            print(f"model draft at {a}: {verdict}")
        ng = predicted_speedup(0.9, 4, prof, "ngram")
        print(f"n-gram draft at alpha=0.9, k=4: {ng:.2f}x (free to draft; pays when the text repeats)")
    if "q4_0_draft" in report:
        q = report["q4_0_draft"]
        print(f"Q4_0 draft: {q['path']}")
        print(f"  T_draft {q['t_draft_ms_original']:.2f} ms -> {q['t_draft_ms_q4_0']:.2f} ms; "
              f"greedy acceptance {q['acceptance_original']:.3f} -> {q['acceptance_q4_0']:.3f} "
              f"on {len(TUNE_PROMPTS)} prompts")
        print(f"  {q['advice']}")
    return 0


def compare_q4_0(engine, sel, load) -> dict:
    """Build the Q4_0 draft, then measure its per-token cost and its greedy acceptance against
    the original draft on the same prompts, before anyone uses it."""
    from ..costs.tuning import measure_costs
    from ..engine import Engine
    from ..quantize import quantize_q4_0

    sys.stderr.write("quantizing the draft to Q4_0 (once)...\n")
    q_path = quantize_q4_0(engine.draft_path, threads=load.n_threads)
    q_engine = Engine(sel.target, q_path, load)
    cfg = GenConfig(temperature=0.0, spec="on", drafter="model", draft_max=4, max_tokens=64)

    def acceptance(e) -> float:
        acc = dr = 0
        for p in TUNE_PROMPTS:
            e.complete(e.prompt_tokens(p), cfg)
            acc, dr = acc + e.last_stats.accepted, dr + e.last_stats.drafted
        return acc / dr if dr else 0.0

    t_orig = measure_costs(engine, n_max=2).t_draft
    t_q = measure_costs(q_engine, n_max=2).t_draft
    a_orig, a_q = acceptance(engine), acceptance(q_engine)
    q_engine.close()
    faster, kept = t_q < 0.95 * t_orig, a_q >= a_orig - 0.03
    advice = (f"use it: pass --draft {q_path}" if faster and kept else
              "keep the original draft: " + ("the Q4_0 copy is not faster here" if not faster
                                             else "the Q4_0 copy loses acceptance"))
    return {"path": str(q_path), "t_draft_ms_original": t_orig * 1e3, "t_draft_ms_q4_0": t_q * 1e3,
            "acceptance_original": a_orig, "acceptance_q4_0": a_q, "advice": advice}
