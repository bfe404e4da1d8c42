"""Pure functions: logits -> probabilities, and the speculative accept/resample rules.

Speculative sampling (Leviathan et al. 2023, Chen et al. 2023). The draft proposes x ~ q(x);
the target's distribution there is p(x). Accept x with probability min(1, p(x)/q(x)); on
rejection draw from normalize(max(0, p - q)) and stop the round; if every drafted token is
accepted, draw one bonus token from p at the next position. The emitted tokens are then
distributed exactly as if sampled from p alone. A deterministic proposal (greedy draft model,
n-gram lookup) is the special case q = one-hot(x): accept with probability p(x), else resample
from p with x removed.

At temperature 0 the rule degenerates to: accept while the draft token equals the target's
argmax; the first disagreement is replaced by that argmax.

Temperature, top-k, top-p and min-p are applied by `logits_to_probs` identically to p and q.
"""

from __future__ import annotations

import numpy as np

from ..config import GenConfig


def logits_to_probs(logits: np.ndarray, cfg: GenConfig) -> np.ndarray:
    """Filtered, tempered distribution over the vocabulary (float64, sums to 1).

    Same order as llama.cpp's default sampler chain: top-k, then top-p and min-p on the
    untempered softmax, then temperature over what is left.
    """
    x = logits.astype(np.float64, copy=False)
    n = x.size
    idx = np.argpartition(x, -cfg.top_k)[-cfg.top_k:] if 0 < cfg.top_k < n else None
    if cfg.top_p < 1.0:
        idx = _top_p(x, idx, cfg.top_p)
    if cfg.min_p > 0.0:
        v = x if idx is None else x[idx]
        m = v >= v.max() + np.log(cfg.min_p)  # p/p_max >= min_p, in log space
        idx = np.flatnonzero(m) if idx is None else idx[m]
    z = (x if idx is None else x[idx]) / max(cfg.temperature, 1e-6)
    e = np.exp(z - z.max())
    e /= e.sum()
    if idx is None:
        return e
    p = np.zeros(n)
    p[idx] = e
    return p


def _top_p(x: np.ndarray, idx: np.ndarray | None, top_p: float) -> np.ndarray:
    """Smallest set of candidates whose (temperature-1) mass reaches top_p."""
    cand = np.arange(x.size) if idx is None else idx
    log_z = np.log(np.exp(x[cand] - x[cand].max()).sum()) + x[cand].max()
    head = cand
    if cand.size > 1024:  # sort only a head that already holds top_p of the mass; else sort all
        h = cand[np.argpartition(x[cand], -1024)[-1024:]]
        if np.exp(x[h] - log_z).sum() >= top_p:
            head = h
    order = head[np.argsort(-x[head], kind="stable")]
    cum = np.cumsum(np.exp(x[order] - log_z))
    cut = int(np.searchsorted(cum, top_p)) + 1
    return order[:max(1, cut)]


def apply_logit_bias(logits: np.ndarray, bias: dict[int, float]) -> np.ndarray:
    """Add a fixed bias per token id to every row, in place (-inf bans a token): OpenAI's and
    llama-server's `logit_bias`. The loop applies it to the target's rows before accepting, so a draft
    token the bias forbids is rejected and the output is the biased target's, drafts or not."""
    ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
    logits[..., ids] += np.fromiter(bias.values(), dtype=logits.dtype, count=len(bias))
    return logits


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id. Inverse-CDF on the cumulative sum: one uniform per draw."""
    c = np.cumsum(probs)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), probs.size - 1))


def accept_greedy(draft: list[int], target_argmax: list[int]) -> int:
    """How many leading draft tokens equal the target's argmax at their positions."""
    n = 0
    for d, t in zip(draft, target_argmax):
        if d != t:
            break
        n += 1
    return n


def accept_token(p: np.ndarray, q: np.ndarray | None, x: int, rng: np.random.Generator) -> bool:
    """Accept drafted x with probability min(1, p(x)/q(x)); q None means a one-hot proposal."""
    qx = 1.0 if q is None else q[x]
    if qx <= 0.0:  # cannot happen for a token drawn from q; be safe
        return False
    return rng.random() < min(1.0, p[x] / qx)


def residual(p: np.ndarray, q: np.ndarray | None, x: int) -> np.ndarray:
    """normalize(max(0, p - q)): where to resample after rejecting x."""
    if q is None:
        r = p.copy()
        r[x] = 0.0
    else:
        r = np.maximum(p - q, 0.0)
    s = r.sum()
    return r / s if s > 0 else p  # p == q exactly: nothing to correct


def top2_margin(logits: np.ndarray) -> float:
    """Logit gap between the best and second-best token (small = near-tie)."""
    a, b = np.partition(logits, -2)[-2:]
    return float(abs(b - a))


def accept_sampled(draft, logits: np.ndarray, cfg: GenConfig, rng) -> tuple[int, int]:
    """Speculative sampling over one verified draft (a drafters.Draft): (number accepted, the target's token)."""
    for i, x in enumerate(draft.tokens):
        p = logits_to_probs(logits[i], cfg)
        q = draft.probs[i]
        if not accept_token(p, q, x, rng):
            return i, sample(residual(p, q, x), rng)
    return len(draft.tokens), sample(logits_to_probs(logits[-1], cfg), rng)
