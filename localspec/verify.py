"""Exactness self-test: speculative greedy vs plain greedy on the user's own pair.

llama.cpp's batched and single-token evaluations round differently (measured up to ~0.6 logit on
Qwen2.5-Coder-1.5B), so speculation, which verifies in batches, can pick the other token where the
top two are nearly tied. We say so and measure it: a parting is fine when the plain run's
top-1/top-2 margin there is within the batched-vs-single noise measured on this pair.
"""

from __future__ import annotations

import numpy as np

from .config import GenConfig
from .sampling import top2_margin


def logit_noise(engine, prompt: list[int], n: int = 6) -> float:
    """Largest |logit difference| between one batched pass over the last n prompt tokens and
    n single-token passes over the same tokens."""
    tgt = engine.target
    n = min(n, len(prompt) - 1)
    head, tail = prompt[:-n], prompt[-n:]
    tgt.sync(head)
    batched = tgt.eval(tail, logits="all")
    tgt.truncate(len(head))
    single = np.stack([tgt.eval([t], logits="last")[0] for t in tail])
    tgt.truncate(len(head))
    return float(np.abs(batched - single).max())


def plain_greedy_with_margins(engine, prompt: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    """Plain greedy decoding, one token per pass (the same computation as --no-spec), recording
    the top-1/top-2 logit margin at every step."""
    tgt, m = engine.target, engine.target_model
    tgt.sync(prompt[:-1])
    seq, out, margins = list(prompt), [], []
    for _ in range(max_tokens):
        logits = tgt.eval([seq[-1]], logits="all")[0]
        tok = int(logits.argmax())
        margins.append(top2_margin(logits))
        if m.is_eog(tok):
            break
        out.append(tok)
        seq.append(tok)
    return out, margins


def verify_exactness(engine, prompts: list[list[int]], cfg: GenConfig) -> dict:
    noise = max(logit_noise(engine, p) for p in prompts)
    bound = max(2.0 * noise, 1e-4)  # both runs can be off by the noise, in opposite directions
    results = []
    for prompt in prompts:
        plain, margins = plain_greedy_with_margins(engine, prompt, cfg.max_tokens)
        spec = [c.token for c in engine.generate(prompt, cfg) if c.token is not None]
        st = engine.last_stats
        parted = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
        if parted is None and len(plain) != len(spec) and min(len(plain), len(spec)) < cfg.max_tokens:
            parted = min(len(plain), len(spec))  # one run ended (EOS) where the other went on
        margin = margins[parted] if parted is not None and parted < len(margins) else None
        results.append({"tokens": len(plain), "parted_at": parted, "margin": margin,
                        "near_tie": parted is None or (margin is not None and margin <= bound),
                        "acceptance_rate": st.acceptance_rate})
    ok = all(r["near_tie"] for r in results)
    return {"noise": noise, "near_tie_bound": bound, "prompts": results, "verdict": "OK" if ok else "MISMATCH"}
