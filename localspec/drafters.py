"""Drafters propose up to k tokens that continue the confirmed sequence.

- `DraftModel`: a small model with its own context. Its KV cache is kept in step with the
  confirmed text: each round it drops the rejected tail and evaluates only the tokens confirmed
  since the last round (usually 1-2), never the whole prompt again.
- `NgramDrafter` (prompt lookup): finds the latest earlier occurrence of the sequence's last
  n tokens (prompt, conversation or output) and proposes what followed it. An index of n-gram ->
  latest position makes each lookup O(1); no model call, so a draft costs ~nothing.
- `HybridDrafter`: the n-gram proposal when its match is long enough to trust, the model otherwise.

A `Draft` carries, for each token, the distribution q it was drawn from (None = a deterministic
proposal, q = one-hot), which is what the speculative accept rule needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .backend import Context, common_prefix
from .config import GenConfig
from .sampling import logits_to_probs, sample


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    probs: list[np.ndarray | None] = field(default_factory=list)
    source: str = "none"  # which drafter made it: "model" | "ngram" | "none"
    match_len: int = 0  # n-gram drafts: length of the suffix that matched
    shadow: list[int] | None = None  # an n-gram proposal the policy chose not to verify (it scores it later)


class DraftModel:
    name = "model"

    def __init__(self, ctx: Context, cfg: GenConfig, rng: np.random.Generator):
        self.ctx, self.cfg, self.rng = ctx, cfg, rng

    def begin(self, seq: list[int]) -> None:
        """Prefill the draft's cache with the prompt (reusing what it already holds)."""
        self.ctx.sync(seq[:-1])

    def propose(self, seq: list[int], room: int, policy) -> Draft:
        ctx, cfg = self.ctx, self.cfg
        k = policy.k_for(self.name, min(cfg.draft_max, room))
        if k == 0:
            return Draft(source=self.name)
        # roll back to the confirmed text, then evaluate what was confirmed since last round
        ctx.truncate(min(common_prefix(ctx.tokens, seq), len(seq) - 1))
        logits = ctx.eval(seq[len(ctx.tokens):], logits="last")[0]
        draft = Draft(source=self.name)
        greedy = cfg.temperature <= 0
        for i in range(k):
            if greedy:
                t, q = int(logits.argmax()), None
                if cfg.p_min > 0 and _top_prob(logits) < cfg.p_min:
                    break
            else:
                q = logits_to_probs(logits, cfg)
                t = sample(q, self.rng)
                if cfg.p_min > 0 and q.max() < cfg.p_min:
                    break
            draft.tokens.append(t)
            draft.probs.append(q)
            if i + 1 < k:
                logits = ctx.eval([t], logits="last")[0]
        return draft


def _top_prob(logits: np.ndarray) -> float:
    m = logits.max()
    return float(1.0 / np.exp(logits - m).sum())


class NgramDrafter:
    name = "ngram"

    MATCH_CAP = 32  # how far back a match is measured (its length says how trustworthy it is)

    def __init__(self, n_min: int = 2, n_max: int = 4, k_max: int = 8):
        self.n_min, self.n_max, self.k_max = n_min, n_max, k_max
        self.index: dict[tuple[int, ...], int] = {}  # n-gram -> position right after its latest occurrence
        self.seq: list[int] = []  # the sequence the index describes (a reference to the engine's list)
        self.indexed = 0  # n-grams ending at positions < indexed are in the index

    def begin(self, seq: list[int]) -> None:
        if common_prefix(self.seq, seq) < self.indexed:  # a different conversation: rebuild
            self.index.clear()
            self.indexed = 0
        self.seq = seq

    def _update(self, seq: list[int]) -> None:
        # index every n-gram that ends before the last token (the suffix itself is the query)
        index, lo, hi = self.index, self.n_min, self.n_max
        for end in range(max(self.indexed, lo), len(seq)):
            for n in range(lo, min(hi, end) + 1):
                index[tuple(seq[end - n:end])] = end
        self.indexed = max(self.indexed, len(seq))

    def lookup(self, seq: list[int], k: int) -> tuple[list[int], int]:
        """(continuation of the longest matching suffix, match length); ([], 0) when none."""
        if self.seq is not seq:
            self.begin(seq)
        self._update(seq)  # the suffix itself is never in the index, so a match is earlier text
        for n in range(min(self.n_max, len(seq) - 1), self.n_min - 1, -1):
            pos = self.index.get(tuple(seq[-n:]))
            if pos is not None:
                # extend the match backwards: a suffix that repeats 20 tokens of earlier text
                # (copying a function) is a far better bet than a coincidental bigram
                end = len(seq)
                while n < self.MATCH_CAP and pos - n - 1 >= 0 and seq[pos - n - 1] == seq[end - n - 1]:
                    n += 1
                return seq[pos:pos + k], n
        return [], 0

    def propose(self, seq: list[int], room: int, policy) -> Draft:
        found, n = self.lookup(seq, min(self.k_max, room))
        k = policy.k_for(self.name, len(found), n) if found else 0
        return Draft(tokens=found[:k], probs=[None] * k, source=self.name, match_len=n,
                     shadow=found if found and not k else None)


class HybridDrafter:
    """The n-gram draft when the match is at least `trust_len` tokens long, else the model's."""

    name = "hybrid"

    def __init__(self, ngram: NgramDrafter, model: DraftModel | None, trust_len: int = 3):
        self.ngram, self.model, self.trust_len = ngram, model, trust_len

    def begin(self, seq: list[int]) -> None:
        self.ngram.begin(seq)
        if self.model:
            self.model.begin(seq)

    def propose(self, seq: list[int], room: int, policy) -> Draft:
        d = self.ngram.propose(seq, room, policy)
        if d.tokens and (d.match_len >= self.trust_len or self.model is None):
            return d
        m = self.model.propose(seq, room, policy) if self.model else None
        if m and m.tokens:
            m.shadow = d.shadow
            return m
        return d
