"""Exactness self-test: speculative greedy vs plain greedy on the user's own pair.

llama.cpp's batched and single-token evaluations round differently (docs/EXACT.md gives the size),
so speculation, which verifies in batches, can pick the other token where the
top two are nearly tied. We say so and measure it: a parting is fine when the plain run's
top-1/top-2 margin there is within the batched-vs-single noise measured on this pair.
"""

from __future__ import annotations

from .backend.exact import invariance_gap
from .config import GenConfig
from .decoding.sampling import top2_margin


def logit_noise(engine, prompt: list[int], n: int = 6) -> float:
    """Largest |logit difference| between one batched pass over the last n prompt tokens and
    n single-token passes over the same tokens."""
    return invariance_gap(engine.target, prompt, min(n, len(prompt) - 1))


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


def history_independence(engine, prompts: list[list[int]], cfg: GenConfig) -> dict:
    """Each prompt answered as `cfg` says on the engine as loaded, then again after the others and a sampled
    answer ran (in reverse order, with a server's memory of earlier answers on): the same tokens?"""
    engine.remember_generations = True

    def answer(p: list[int], c: GenConfig = cfg) -> list[int]:
        return [x.token for x in engine.generate(p, c) if x.token is not None]

    fresh = [answer(p) for p in prompts]
    answer(prompts[0], cfg.with_(temperature=0.8, seed=1, spec="on"))
    again = [answer(p) for p in reversed(prompts)][::-1]
    engine.remember_generations = False
    return {"parted_at": [first_parting(a, b) for a, b in zip(fresh, again)], "fresh": fresh, "again": again}


def default_mode_partings(engine, prompts: list[list[int]], plains: list[list[int]], max_tokens: int) -> list:
    """Where each prompt's greedy answer in the default mode (--spec auto: it drafts only where it pays)
    first parts from plain decoding's `plains` (None: the same tokens)."""
    cfg = GenConfig(temperature=0.0, max_tokens=max_tokens)
    return [first_parting(plain, [c.token for c in engine.generate(p, cfg) if c.token is not None])
            for p, plain in zip(prompts, plains)]


def verify_exactness(engine, prompts: list[list[int]], cfg: GenConfig, exact: bool = False) -> dict:
    """exact: the engine runs batch-invariant kernels (--exact), so any parting from plain decoding is a fault."""
    noise = max(logit_noise(engine, p) for p in prompts)
    bound = 0.0 if exact else max(2.0 * noise, 1e-4)  # both runs can be off by the noise, in opposite directions
    results = []
    for prompt in prompts:
        plain, margins = plain_greedy_with_margins(engine, prompt, cfg.max_tokens)
        spec = [c.token for c in engine.generate(prompt, cfg) if c.token is not None]
        st = engine.last_stats
        parted = first_parting(plain, spec)
        margin = margins[parted] if parted is not None and parted < len(margins) else None
        results.append({"tokens": len(plain), "parted_at": parted, "margin": margin,
                        "near_tie": parted is None or (not exact and margin is not None and margin <= bound),
                        "acceptance_rate": st.acceptance_rate,
                        # what another build's report is compared with (compare_builds)
                        "prompt": list(prompt), "plain": plain, "spec": spec,
                        "margins": [round(x, 5) for x in margins]})
    ok = all(r["near_tie"] for r in results)
    return {"noise": noise, "near_tie_bound": bound, "max_tokens": cfg.max_tokens, "prompts": results,
            "verdict": "OK" if ok else "MISMATCH"}


# --- one build against another ----------------------------------------------------------------
# Two builds (CPU and Vulkan, say) run the same weights through different kernels, so their logits
# differ by some rounding noise and greedy decoding may pick the other token where the top two are
# that close. A parting between the builds' outputs is a near-tie when, at that token, both builds'
# plain runs saw a top-1/top-2 margin within twice the larger noise: each build's own (batched vs
# single-token) and the one between them, read off the margins both computed for the same context.

def first_parting(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where a and b differ (or where the shorter one ended), or None."""
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return min(len(a), len(b)) if i is None and len(a) != len(b) else i


def _margin_at(result: dict, seq: list[int], i: int) -> float | None:
    """This build's plain-run margin at token i of seq, if its plain run had seq's context there."""
    plain, margins = result["plain"], result["margins"]
    return margins[i] if i < len(margins) and plain[:i] == seq[:i] else None


def compare_builds(here: dict, there: dict) -> dict:
    """Compare two `verify_exactness` reports of the same prompts made by two builds (or placements)."""
    pairs = list(zip(here["prompts"], there["prompts"]))
    if len(here["prompts"]) != len(there["prompts"]) or any(a["prompt"] != b["prompt"] for a, b in pairs):
        raise ValueError("the two reports are not of the same prompts and model")
    if here["max_tokens"] != there["max_tokens"]:
        raise ValueError(f"the two reports ran {here['max_tokens']} and {there['max_tokens']} tokens; use the same -n")
    cross = 0.0  # margins of one context should agree up to twice the logit noise between the builds
    for a, b in pairs:
        n = first_parting(a["plain"], b["plain"])
        for x, y in list(zip(a["margins"], b["margins"]))[:n]:
            cross = max(cross, abs(x - y) / 2)
    bound = 2.0 * max(here["noise"], there["noise"], cross, 5e-5)
    out = []
    for a, b in pairs:
        row = {}
        for kind in ("plain", "spec"):
            i = first_parting(a[kind], b[kind])
            m = (_margin_at(a, a[kind], i), _margin_at(b, b[kind], i)) if i is not None else (None, None)
            known = [x for x in m if x is not None]
            # no margin known: both speculative runs had parted from their own plain runs before
            # this token, which each build's own verdict judged
            tie = True if i is None else (max(known) <= bound if known else None)
            row[kind] = {"parted_at": i, "margins": list(m), "tokens": [len(a[kind]), len(b[kind])],
                         "near_tie": tie}
        out.append(row)
    ok = here["verdict"] == there["verdict"] == "OK" and all(r[k]["near_tie"] is not False for r in out
                                                            for k in ("plain", "spec"))
    return {"cross_noise": cross, "near_tie_bound": bound, "prompts": out, "verdict": "OK" if ok else "MISMATCH"}
