"""Upper bound for n-gram drafting on this machine: an oracle that knows how many proposed tokens
the target will accept and drafts exactly those (plain step when none), priced with the stored
cost profile of the default pair (`localspec tune`). Prints the oracle's speedup over plain per prompt.

    scripts/ngram-oracle edit,docqa [PROMPTS=4] [MAX_TOKENS=96]
"""
import argparse
import json
from pathlib import Path

from localspec import models
from localspec.chat_format import Message
from localspec.config import GenConfig, LoadConfig
from localspec.decoding.ngram import NgramDrafter
from localspec.engine import Engine
from localspec.session import ensure_profile

root = Path(__file__).resolve().parent.parent / "localspec" / "workloads"
parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("workloads", nargs="?", default="edit,docqa",
                    help="comma-separated: " + ",".join(sorted(p.stem for p in root.glob("*.jsonl"))))
parser.add_argument("prompts", nargs="?", type=int, default=4)
parser.add_argument("max_tokens", nargs="?", type=int, default=96)
args = parser.parse_args()
workloads, n_prompts, max_tokens = args.workloads.split(","), args.prompts, args.max_tokens
unknown = [w for w in workloads if not (root / f"{w}.jsonl").is_file()]
if unknown or n_prompts < 1 or max_tokens < 1:
    parser.error(f"unknown workload {unknown[0]!r}" if unknown else "prompts and max_tokens must be >= 1")
r = models.resolve_pair()
e = Engine(r.target_path, None, LoadConfig())
rel = ensure_profile(e).relative_verify()


def verify_cost(n: int) -> float:
    return rel[n - 1] if n <= len(rel) else rel[-1] + (n - len(rel)) * (rel[-1] - rel[-2])


for w in workloads:
    speedups = []
    for line in (root / f"{w}.jsonl").read_text().splitlines()[:n_prompts]:
        p = json.loads(line)
        msgs = ([Message("system", p["system"])] if p.get("system") else []) + [Message("user", p["prompt"])]
        prompt = e.prompt_tokens(msgs)
        out = [c.token for c in e.generate(prompt, GenConfig(temperature=0, spec="off", max_tokens=max_tokens))
               if c.token is not None]
        seq, best = prompt + out, 0.0
        for k_max in (3, 4, 6, 8, 12):
            ngram, i, cost = NgramDrafter(2, 4, k_max), len(prompt), 0.0
            while i < len(seq):
                found, _ = ngram.lookup(seq[:i], k_max)
                m = 0
                while m < len(found) and i + m < len(seq) and found[m] == seq[i + m]:
                    m += 1
                if m and (m + 1) / verify_cost(m + 1) > 1:  # draft exactly the tokens that will be accepted
                    cost, i = cost + verify_cost(m + 1), i + m + 1
                else:
                    cost, i = cost + 1, i + 1
            best = max(best, len(out) / cost)
        speedups.append(round(best, 3))
    print(f"{w}: oracle n-gram speedup over plain per prompt {speedups}")
