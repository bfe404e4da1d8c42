"""Run in a fresh process by the tests (llama.cpp reads its kernel switch once per process):
python tests/exact_run.py MODEL exact|default THREADS [DRAFT] -> JSON on stdout: the invariance gap, and
greedy plain and speculative tokens with drafts verified every round (n-gram drafts of 8, most rejected on a
flat model; with DRAFT, the draft model's and n-grams' together)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localspec.backend import exact  # noqa: E402
from localspec.config import GenConfig, LoadConfig  # noqa: E402
from localspec.engine import Engine  # noqa: E402

PROMPT = "the cache model token draft target fast slow def return import print hello world code " * 4


def main(model: str, mode: str, threads: int, draft: str | None = None) -> dict:
    load = LoadConfig(n_ctx=1024, n_threads=threads, n_threads_batch=threads, exact=mode == "exact",
                      adapt_threads=False)
    engine = Engine(model, draft, load=load)
    out = {"gap": exact.invariance_gap(engine.target, engine.target_model.tokenize(exact.PROBE_TEXT * 3))}
    prompt = engine.target_model.tokenize(PROMPT)
    for spec in ("off", "on"):
        cfg = GenConfig(temperature=0, spec=spec, drafter="hybrid" if draft else "ngram", draft_max=8,
                        ngram_draft_max=8, max_tokens=200)
        out[spec] = [c.token for c in engine.generate(prompt, cfg) if c.token is not None]
        out[f"{spec}_drafted"] = engine.last_stats.drafted
    engine.close()
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)))
