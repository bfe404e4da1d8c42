"""How many tokens to draft this round.

- `FixedK`: always the configured k (`--spec on`).
- `AdaptivePolicy` (`--spec auto`): per drafter (and, for n-grams, per length of the match) it
  keeps a running estimate of the per-token acceptance alpha, and picks the k in 0..k_max that
  maximizes expected confirmed tokens per second, (1 - alpha^(k+1)) / (1 - alpha) tokens for
  k * T_draft + T_verify(k+1) seconds under the measured `CostProfile`. k = 0 means a plain
  decoding step, so auto is never knowingly slower than plain. One alpha per bucket (rather than
  one per draft position) extrapolates to draft lengths not tried yet, which is what lets a long
  verbatim copy earn a long draft.

  Acceptance of the n-gram drafter is also learnt in rounds that did not use it: its proposal is
  free, so the policy keeps it aside and scores it against the tokens the target confirms next
  ("shadow" drafts). Under greedy decoding that match is exactly the acceptance a verification
  would have given; under sampling its expectation is p(x), the acceptance probability. This is
  how auto turns speculation back on when the text starts repeating, at no cost.

  A greedy answer that must repeat (`Engine.decides_from_request_alone`) drafts from its text only where
  the match is as long as llama-server's --spec-default asks (`REPEATABLE_MIN_MATCH`): a copy, not a
  chance match whose verify pass could part from plain decoding at a near-tie.
"""

from __future__ import annotations

from ..config import GenConfig
from ..costs.costmodel import CostProfile, best_k, best_k_shared
from .sampling import accept_greedy


class FixedK:
    """Draft as much as the drafter offers, up to its cap (-k)."""

    def __init__(self, k: int):
        self.k = k

    def k_for(self, source: str, k_max: int, match_len: int = 0, origin: str = "", catch_up=None,
              resync: bool = False, held: int = 0) -> int:
        return min(self.k, k_max)

    def update(self, draft, accepted: int, seq: list[int]) -> None:
        pass

    def describe(self) -> str:
        return f"fixed k={self.k}"


NGRAM_BUCKETS = (2, 3, 4, 8, 16, 32, 64)  # match lengths whose acceptance is tracked separately
# A greedy answer that must repeat drafts from its text only where the match reaches back this far, as
# llama-server's --spec-default asks: every verify pass, even one whose draft is rejected, computes the next
# token in a batch, which can part from plain decoding at a near-tie (docs/EXACT.md); a chance match in a
# chat or code answer risks that for a few tokens, a copy pays for it.
REPEATABLE_MIN_MATCH = 24


def _bucket(source: str, match_len: int, origin: str = "", resync: bool = False) -> tuple[str, int]:
    """The acceptance estimate a proposal is judged by: the model's one, or an n-gram's by the length of
    its match, drafts from a request's predicted output apart (a prediction is right or wrong as a whole),
    and a copy resuming after an edit apart (whether this answer's edits are one-token ones)."""
    if source != "ngram":
        return (source, 0)
    if resync:
        return ("resync", 0)
    name = "prediction" if origin == "prediction" else source
    return (name, max([b for b in NGRAM_BUCKETS if b <= match_len] or [NGRAM_BUCKETS[0]]))


class AdaptivePolicy:
    # before any evidence (n-gram: the longer the match, the higher). A prediction starts where a
    # one-token draft just pays on a CPU (T_verify(2) = 1.56 decodes): a wrong one costs little, a
    # right one earns long drafts within a few rounds (its unverified proposals are scored too). An n-gram
    # starts low: chat answers' n-grams rarely hold, and a higher prior drafted more than twice as many
    # tokens for the same kept ones, while a copy's shadow proposals earn its drafts within a few rounds
    # (docs/benchmarks/log-2026-11.md, "A second CPU"). A NextN head starts as a draft model does.
    PRIOR = {"model": 0.7, "mtp": 0.7, "ngram": 0.35, "prediction": 0.75, "resync": 0.75}
    # A NextN head predicts each later position from its own guess, not the target's state: its acceptance is
    # learnt per position, each starting this much below the one before (published heads: docs/MODELS.md)
    HEAD_DEPTH_DECAY = 0.85
    # Acceptance is a count of outcomes, hits and misses, older ones fading (DECAY per new outcome:
    # about the last 100 tokens count), started from PRIOR_WEIGHT pseudo-outcomes at the prior. A running
    # average read a copy that held for a while as near-certain and drafted far into the next edit; counts
    # give the long-run rate, which is what the expected length of a long draft depends on.
    DECAY = 0.99
    PRIOR_WEIGHT = 4.0
    BORROW_AFTER = 12.0  # outcomes (the prior's included) a shorter match's bucket needs to lend its estimate
    MIN_GAIN = 1.05  # draft only when expected to beat plain by at least this factor (estimates are noisy)
    PROBE_EVERY = 48  # model rounds skipped between probes, when the model could pay at all
    # A model round whose draft cache must first catch up with the text (a long prompt it never saw, evaluated
    # by the draft model beside other requests) can cost the whole answer's time: a probe only when catching
    # up costs at most this many decodes
    PROBE_CATCH_UP_DECODES = 4.0

    def __init__(self, costs: CostProfile, k_max: int, load=None, min_match: int = 0, miss=None):
        """load(): (tokens, sequences) the other requests put in the last shared pass (continuous
        batching), so drafts are priced by what they add to everyone's step; None: alone. miss(): seconds
        a rejected tail costs to roll back on the loaded target, as measured so far. min_match: an
        n-gram proposal drafts only once its match (a copy resuming after an edit: how long it had held) is
        this long, unless it comes from the request's predicted output."""
        self.costs, self.k_max, self.load, self.min_match, self.miss = costs, k_max, load, min_match, miss
        self.alpha: dict[tuple[str, int], float] = {}  # the current estimate per bucket
        self.counts: dict[tuple[str, int], tuple[float, float]] = {}  # (hits, misses), decayed
        self.shadow: tuple[tuple[str, int], int, list[int]] | None = None  # (bucket, start, tokens)
        self.skipped_model = 0
        # can a model draft pay on this machine even when it is right 95% of the time?
        _, self.model_ceiling = best_k(0.95, k_max, costs, "model") if costs.t_draft else (0, 0.0)
        self.rounds = {"plain": 0, "ngram": 0, "model": 0, "mtp": 0}

    def estimate(self, key: tuple[str, int]) -> float:
        if key not in self.alpha:
            prior = self.PRIOR[key[0]] * (self.HEAD_DEPTH_DECAY ** key[1] if key[0] == "mtp" else 1.0)
            if key[0] in ("ngram", "prediction"):
                # a longer match is at least as good a bet as a shorter one of the same text: a bucket
                # not tried yet starts from the best that shorter ones have shown (a copy's match grows
                # through 4, 8, 16, ... and would otherwise go back to the prior at each step)
                shorter = [self.alpha[(key[0], b)] for b in NGRAM_BUCKETS
                           if b < key[1] and sum(self.counts.get((key[0], b), ())) >= self.BORROW_AFTER]
                prior = max([prior + 0.03 * NGRAM_BUCKETS.index(key[1]), *shorter])
            self.alpha[key] = prior
        return self.alpha[key]

    def k_for(self, source: str, k_max: int, match_len: int = 0, origin: str = "", catch_up=None,
              resync: bool = False, held: int = 0) -> int:
        """catch_up(): tokens of text the draft model's cache lacks (evaluated before it can draft);
        asked only when it decides (a prefix check over the whole text each round would cost every round).
        held: how long an n-gram proposal's copy has held, before an edit it resumes after included."""
        if source == "ngram" and max(match_len, held) < self.min_match and origin != "prediction":
            return 0  # kept as the shadow: its acceptance is still learnt
        a = ([self.estimate(("mtp", i)) for i in range(k_max)] if source == "mtp"
             else self.estimate(_bucket(source, match_len, origin, resync)))
        rows, others, newcomer = self.load() if self.load is not None else (0, 0, False)
        if newcomer:  # a newer request's first steps go at single-token speed: no drafts meanwhile
            return 0
        k, gain = best_k_shared(a, k_max, self.costs, source, rows, others, self.miss() if self.miss else 0.0)
        if k and gain < self.MIN_GAIN:
            k = 0
        return self._model_k(k, gain, catch_up) if source in ("model", "mtp") else k

    def _model_k(self, k: int, gain: float, catch_up) -> int:
        """A model's (or a NextN head's) round priced with what its draft cache must first evaluate (a prompt
        it never saw): paid back within PROBE_EVERY rounds at the expected gain, or, for a probe, a few decodes.
        A probe tries one token where the prior says no draft pays: a trained head or a good model can be
        right far more often than the prior, and only its drafts show it."""
        if k == 0:
            if self.model_ceiling < 1.1:
                return 0
            self.skipped_model += 1
            if self.skipped_model < self.PROBE_EVERY:
                return 0
            self.skipped_model = 0  # acceptance may have risen: look again, if looking is cheap
            k, budget = 1, self.PROBE_CATCH_UP_DECODES * self.costs.t_decode
        else:
            budget = (gain - 1.0) * self.costs.t_decode * self.PROBE_EVERY
        if catch_up is not None and self.costs.catch_up(catch_up()) > budget:
            return 0
        self.skipped_model = 0
        return k

    def _learn(self, key: tuple[str, int], drafted: int, accepted: int) -> None:
        """Each draft token the target looked at is one outcome: accepted ones hit, the first
        rejected one missed (those after it were never judged)."""
        a = self.estimate(key)
        hits, misses = self.counts.get(key, (a * self.PRIOR_WEIGHT, (1.0 - a) * self.PRIOR_WEIGHT))
        for i in range(min(drafted, accepted + 1)):
            hits, misses = hits * self.DECAY + (i < accepted), misses * self.DECAY + (i >= accepted)
        self.counts[key] = (hits, misses)
        self.alpha[key] = hits / (hits + misses)

    def update(self, draft, accepted: int, seq: list[int]) -> None:
        self.rounds["plain" if not draft.tokens else draft.source] += 1
        if draft.source == "mtp":  # each position judged on its own: a hit, or the first miss (later ones unjudged)
            for i in range(min(len(draft.tokens), accepted + 1)):
                self._learn(("mtp", i), 1, int(i < accepted))
        elif draft.tokens:
            self._learn(_bucket(draft.source, draft.match_len, draft.origin, draft.resync), len(draft.tokens), accepted)
        self._score_shadow(seq)
        if self.shadow and draft.shadow:  # still undecided: keep what matched so far
            key, start, tokens = self.shadow
            m = accept_greedy(seq[start:], tokens)
            if m:
                self._learn(key, m, m)
        if draft.shadow:  # the proposal continued the text as it stood before this round's tokens
            self.shadow = (_bucket("ngram", draft.match_len, draft.origin, draft.resync), len(seq) - accepted - 1,
                           draft.shadow)

    def _score_shadow(self, seq: list[int]) -> None:
        if not self.shadow:
            return
        key, start, tokens = self.shadow
        known = seq[start:start + len(tokens)]
        m = accept_greedy(known, tokens)
        if m < len(known) or len(known) == len(tokens):  # decided: a mismatch, or all confirmed
            self._learn(key, len(tokens), m)
            self.shadow = None

    def describe(self) -> str:
        r = self.rounds
        head = f", {r['mtp']} head" if r["mtp"] else ""
        return (f"auto: {r['plain']} plain, {r['ngram']} n-gram, {r['model']} model{head} rounds; "
                f"T_verify/T_decode = {', '.join(f'{x:.2f}' for x in self.costs.relative_verify()[:6])}")


def make_policy(cfg: GenConfig, profile: CostProfile | None, drafter, load=None, min_match: int = 0, miss=None):
    if cfg.spec == "on":
        return FixedK(max(cfg.draft_max, cfg.ngram_draft_max))  # each drafter applies its own cap
    if cfg.spec == "auto":
        if profile is None:
            raise ValueError("--spec auto needs a cost profile (the engine measures one)")
        return AdaptivePolicy(profile, max(cfg.draft_max, cfg.ngram_draft_max), load, min_match, miss)
    return FixedK(0)
