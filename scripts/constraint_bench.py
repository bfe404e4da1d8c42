"""What a grammar costs while decoding: tok/s of the same prompts unconstrained, under OpenAI's json_object
grammar and under a JSON schema, plain and speculative (auto), greedy, on the default pair (or PAIR
args), RUNS alternating rounds; medians and the ratio to unconstrained, plus the grammar's own time per
token (allowed-argmax checks and full-vocabulary masks).

  scripts/constraint-bench                 # default pair, 5 rounds
  RUNS=3 scripts/constraint-bench --target T.gguf --draft D.gguf
"""

import os
import statistics
import sys
import time

from localspec.backend import GrammarSampler
from localspec.chat_format import Message
from localspec.decoding.constraints import json_grammar, schema_grammar
from localspec.session import GenChoice, ModelChoice, Session

args = sys.argv[1:]
pair = dict(zip(args[::2], args[1::2]))
RUNS = int(os.environ.get("RUNS", 5))
session = Session.open(ModelChoice(target=pair.get("--target"), draft=pair.get("--draft")), GenChoice(temperature=0.0))
session.ensure_profile()
e = session.engine
schema = {"type": "object", "properties": {
    "programmers": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "languages": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "age", "languages"]}}}, "required": ["programmers"]}
prompts = [e.prompt_tokens([Message("user", p)]) for p in (
    "Describe three fictional programmers as JSON: a list with name, age and languages for each.",
    "Give a JSON object describing a Python package: name, version, dependencies and a short description.")]
grammars = {"none": None, "json_object": json_grammar(), "json_schema": schema_grammar(schema)}
rates = {}
for r in range(RUNS + 1):  # the first round warms up
    for spec in ("off", "auto"):
        for name, g in grammars.items():
            toks = secs = 0
            for p in prompts:
                cfg = session.gen.with_(spec=spec, temperature=0.0, max_tokens=96, grammar=g)
                _, st = e.complete(p, cfg)
                toks, secs = toks + st.tokens, secs + st.generation_s
            if r:
                rates.setdefault((spec, name), []).append(toks / secs)
print(f"pair: {session.selection.describe()}; greedy, {len(prompts)} prompts x 96 tokens, median of {RUNS} rounds\n")
print("| decoding | constraint | tok/s | vs unconstrained |\n|---|---|---|---|")
for (spec, name), v in rates.items():
    base = statistics.median(rates[(spec, "none")])
    print(f"| {'plain' if spec == 'off' else 'auto'} | {name} | {statistics.median(v):.1f} | {statistics.median(v) / base:.3f}x |")
g = GrammarSampler(e.target_model, grammars["json_schema"])
import numpy as np  # noqa: E402

logits = np.random.default_rng(0).standard_normal(e.target_model.n_vocab).astype(np.float32)
t0 = time.perf_counter()
for i in range(200):
    g.allows(i)
allow_us = (time.perf_counter() - t0) / 200 * 1e6
t0 = time.perf_counter()
for _ in range(10):
    g.mask(logits.copy())
mask_ms = (time.perf_counter() - t0) / 10 * 1e3
print(f"\ngrammar sampler: one token checked {allow_us:.0f} us; the whole vocabulary masked {mask_ms:.1f} ms "
      f"(plain decoding: {1000 / statistics.median(rates[('off', 'none')]):.1f} ms a token)")
