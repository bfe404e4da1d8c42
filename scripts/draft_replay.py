"""Replay known greedy answers through localspec's own n-gram drafter and `--spec auto` policy, offline:
each round the drafter proposes, the policy picks k, the answer says how many drafted tokens the target
would have accepted, and the round is priced by the measured pass curve. Prints the speedup over plain
decoding per request and per workload, and the draft lengths chosen: a drafter or policy change is
judged in seconds, on the answers `scripts/race --json` recorded (llama-server plain's texts), before a
race confirms it. Greedy only; the server's cross-request memory is left out (each request starts fresh).

    scripts/draft-replay RACE.json              # priced by the stored profile (`localspec tune`)
    scripts/draft-replay RACE.json --depth 1100 # the curve measured that deep first (~1 min)
    scripts/draft-replay RACE.json --depth 1100 --curve curve.json  # measured once, then reused
"""
import argparse
import json
import sys
from pathlib import Path

from race import workloads  # noqa: E402

from localspec import models  # noqa: E402
from localspec.chat_format import Message  # noqa: E402
from localspec.config import LoadConfig  # noqa: E402
from localspec.costs.costmodel import CURVE_SIZES  # noqa: E402
from localspec.costs.tuning import measure_at_depth  # noqa: E402
from localspec.decoding.ngram import NgramDrafter  # noqa: E402
from localspec.decoding.policy import AdaptivePolicy  # noqa: E402
from localspec.decoding.sampling import accept_greedy  # noqa: E402
from localspec.engine import Engine  # noqa: E402
from localspec.session import ensure_profile  # noqa: E402


def replay(e: Engine, costs, body: dict, answer: str) -> tuple[int, float, dict]:
    """(tokens, cost in decodes, {k: rounds}) of one request's answer replayed."""
    prompt = e.prompt_tokens([Message(m["role"], m["content"]) for m in body["messages"]])
    m = e.target_model
    out = m.tokenize(answer, add_special=False, parse_special=False) + [m.eos]
    prediction = body.get("prediction", {}).get("content")
    drafter, policy = NgramDrafter(2, 4, 64), AdaptivePolicy(costs, 64)
    seq, i, cost, ks = list(prompt), 0, 0.0, {}
    drafter.begin(seq, m.tokenize(prediction, add_special=False) if prediction else None)
    while i < len(out):
        d = drafter.propose(seq, e.target.n_ctx, policy)
        n = accept_greedy(d.tokens, out[i:i + len(d.tokens)])
        step = out[i:i + n + 1]
        cost += costs.verify(len(d.tokens) + 1) / costs.t_decode
        ks[len(d.tokens)] = ks.get(len(d.tokens), 0) + 1
        seq += step
        i += len(step)
        policy.update(d, n, seq)
    return len(out), cost, ks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("race_json", type=Path, help="a `scripts/race --json` file")
    p.add_argument("--depth", type=int, help="measure the pass curve this many tokens deep first")
    p.add_argument("--curve", type=Path, help="keep the measured curve in this JSON file and reuse it when it exists "
                   "(variants compared on one curve, not on two noisy measurements)")
    p.add_argument("--texts", default="llama", help="whose greedy answers to replay (default llama: llama-server plain)")
    a = p.parse_args()
    try:
        results = json.loads(a.race_json.read_text())["results"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        p.error(f"cannot read {a.race_json} as a race's --json output ({err})")
    e = Engine(models.resolve_pair().target_path, None, LoadConfig(n_ctx=8192))
    costs = ensure_profile(e)
    if a.curve and a.curve.exists():
        try:
            tv = [float(x) for x in json.loads(a.curve.read_text())["t_verify"]]
        except (OSError, ValueError, KeyError, TypeError) as err:
            p.error(f"cannot read {a.curve} as a curve this script wrote ({err}); delete it to measure again")
        costs.t_decode, costs.t_verify = tv[0], tv
    elif a.depth:
        filler = e.target_model.tokenize("def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)\n", False)
        e.target.sync((filler * (a.depth // len(filler) + 1))[:a.depth])
        tv = measure_at_depth(e.target, CURVE_SIZES[-1])
        if tv is None:
            p.error("the machine was too busy to measure the curve (the repeats disagreed); run it again")
        costs.t_decode, costs.t_verify = tv[0], tv
        if a.curve:
            a.curve.write_text(json.dumps({"depth": a.depth, "t_verify": tv}))
    names = list(dict.fromkeys(r["workload"] for r in results))
    sent = workloads(names, False)
    if len(sent) != len(results):  # a --quick race
        sent = workloads(names, True)
    totals: dict[str, list] = {}
    for (w, body), r in zip(sent, results):
        if a.texts not in r:
            continue
        n, cost, ks = replay(e, costs, body, r[a.texts]["text"])
        t = totals.setdefault(w, [0, 0.0])
        t[0], t[1] = t[0] + n, t[1] + cost
        print(f"{w}: {n} tokens in {cost:.0f} decodes = {n / cost:.2f}x plain; rounds by k {dict(sorted(ks.items()))}")
    print(" · ".join(f"{w} {n / c:.2f}x" for w, (n, c) in totals.items()))
    e.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
