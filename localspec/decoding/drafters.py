"""Drafters propose up to k tokens that continue the confirmed sequence.

- `DraftModel`: a small model with its own context. Its KV cache is kept in step with the
  confirmed text: each round it drops the rejected tail and evaluates only the tokens confirmed
  since the last round (usually 1-2), never the whole prompt again. The prompt itself is
  evaluated in the first round that drafts with the model, not before.
- `NgramDrafter` (prompt lookup, ngram.py): what followed the latest earlier occurrence of the last tokens.
- `HybridDrafter`: the n-gram proposal when its match is long enough to trust, the model otherwise.
- `MtpDrafter`: the target's own NextN (MTP) blocks (backend/mtp.py), caught up with the confirmed text
  beside the target's hidden states, drafting from the pending token.

Each proposes a `Draft` (draft.py).
"""

from __future__ import annotations

import numpy as np

from ..backend import Context, common_prefix
from ..backend.rollback import PARTIAL
from ..config import DRAFTERS, GenConfig
from ..errors import ConfigError
from .draft import Draft
from .ngram import NgramDrafter
from .sampling import logits_to_probs, sample


class DraftModel:
    name = "model"

    def __init__(self, ctx_source, cfg: GenConfig, rng: np.random.Generator):
        """ctx_source: the draft's Context, or a callable giving it (the engine loads it on demand)."""
        self._source = ctx_source
        self.cfg, self.rng = cfg, rng
        self._shared: int | None = None  # the prefix of the text its cache holds (lag), None: not measured
        self._round: tuple[int, int] | None = None  # where the last round's drafts went in, how many did
        self._reach: dict[int, float] = {}  # i -> share of rounds a state saved after their i-th draft would serve

    @property
    def ctx(self) -> Context:
        if callable(self._source):
            self._source = self._source()
        return self._source

    def begin(self, seq: list[int], prediction: list[int] | None = None) -> None:
        """Nothing up front: the draft's cache catches up with the text in the first round that
        drafts with the model (reusing what it already holds), so a prompt that auto never drafts
        for with the model (every prompt on a CPU, where the model draft cannot pay) costs only the
        target's prompt evaluation."""

    def lag(self, seq: list[int]) -> int:
        """Tokens of `seq` the draft's cache would evaluate before drafting: all of them while the draft
        context is not at hand (asking for it would load the model); the prefix it shares is measured
        once until the next model round (the text only grows in between)."""
        if callable(self._source):
            return len(seq)
        if self._shared is None:
            self._shared = common_prefix(self._source.tokens, seq)
        return len(seq) - self._shared

    def propose(self, seq: list[int], room: int, policy) -> Draft:
        cfg = self.cfg
        k = policy.k_for(self.name, min(cfg.draft_max, room), catch_up=lambda: self.lag(seq))
        if k == 0:
            return Draft(source=self.name)
        ctx = self.ctx  # the first round that drafts with the model loads it
        self._shared = None
        # roll back to the confirmed text, then evaluate what was confirmed since last round
        # (a recurrent model's back to its checkpoint: what it then lacks goes in with the new tokens, one pass)
        shared = common_prefix(ctx.tokens, seq)
        self._learn_reach(shared)
        ctx.truncate(ctx.reusable(min(shared, len(seq) - 1)))
        new = seq[len(ctx.tokens):]
        if len(new) > LONG_CATCH_UP and ctx.rollback != PARTIAL:  # a recurrent model's state before the
            ctx.eval(new[:-1], logits="none")  # pending token kept, for the next answer to the same prompt
            ctx.checkpoint()
            new = new[-1:]
        logits = ctx.eval(new, logits="last")[0]
        # a recurrent draft's state saved before a drafted token goes in: its next round comes back to the round's
        # start, or, where saves pay, to its last accepted draft; the state after the last one is the current
        recurrent, start = ctx.rollback != PARTIAL, len(ctx.tokens)
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
                if recurrent and (i == 0 or ctx.miss.step_save_pays(self._reach.get(i, 1.0))):
                    ctx.checkpoint(brief=True, keep=k)
                logits = ctx.eval([t], logits="last")[0]
        self._round = (start, len(ctx.tokens) - start) if recurrent else None
        return draft

    def _learn_reach(self, shared: int) -> None:
        """How far into its evaluated drafts the last round was accepted (the text shares `shared` tokens with the
        draft's cache), into each position's running share."""
        if self._round is not None:
            start, evaluated = self._round
            learn_reach(self._reach, min(max(shared - start, 0), evaluated), evaluated)
            self._round = None


def learn_reach(reach: dict[int, float], accepted: int, evaluated: int, weight: float = 0.2) -> None:
    """reach[i]: the running share of rounds that a state saved after their i-th draft would serve (1 until seen):
    those that accept it and reject a later evaluated one (with all of them accepted, the state is the current)."""
    for i in range(1, evaluated + 1):
        r = reach.get(i, 1.0)
        reach[i] = r + weight * ((i <= accepted < evaluated) - r)


class MtpDrafter:
    name = "mtp"

    def __init__(self, head, cfg: GenConfig, rng: np.random.Generator):
        self.head, self.cfg, self.rng = head, cfg, rng

    def begin(self, seq: list[int], prediction: list[int] | None = None) -> None:
        pass  # the head catches up in its first round, from the hidden states the prompt's passes kept

    def propose(self, seq: list[int], room: int, policy) -> Draft:
        cfg, head = self.cfg, self.head
        k = policy.k_for(self.name, min(cfg.draft_max, room))
        draft = Draft(source=self.name)
        if k == 0:
            return draft
        pending = len(seq) - 1  # its position; the head reads it beside the target's state before it
        # caught up with the confirmed text and the first step taken in one pass
        logits, h = head.sync(seq[:pending], then=(seq[-1], head.hidden.rows[head.seq][pending - 1]))
        head.tokens.append(seq[-1])  # its row stays valid; the drafted ones go at the next sync
        for i in range(k):
            token, q = _pick(logits, cfg, self.rng)
            if token is None:
                break
            draft.tokens.append(token)
            draft.probs.append(q)
            if i + 1 < k:
                logits, h = head.step(token, pending + i + 1, h)
        return draft


def _pick(logits: np.ndarray, cfg: GenConfig, rng) -> tuple[int | None, np.ndarray | None]:
    """The drafted token and the distribution it was drawn from (None: greedy); None when the head's
    confidence is under p_min."""
    if cfg.temperature <= 0:
        return (None, None) if cfg.p_min > 0 and _top_prob(logits) < cfg.p_min else (int(logits.argmax()), None)
    q = logits_to_probs(logits, cfg)
    return (None, None) if cfg.p_min > 0 and q.max() < cfg.p_min else (sample(q, rng), q)


LONG_CATCH_UP = 64  # tokens the draft's cache catches up with that make a prompt's evaluation, not a round's


def _top_prob(logits: np.ndarray) -> float:
    m = logits.max()
    return float(1.0 / np.exp(logits - m).sum())


class HybridDrafter:
    """The n-gram draft when the match is at least `trust_len` tokens long, else the model's."""

    name = "hybrid"

    def __init__(self, ngram: NgramDrafter, model: DraftModel | None, trust_len: int = 3):
        self.ngram, self.model, self.trust_len = ngram, model, trust_len

    def begin(self, seq: list[int], prediction: list[int] | None = None) -> None:
        self.ngram.begin(seq, prediction)
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


class DraftFloor:
    """llama-server's `speculative.n_min`: a draft shorter than n_min is not worth a verification
    pass, so the round decodes plainly instead (an n-gram proposal is kept as the policy's shadow)."""

    def __init__(self, inner, n_min: int):
        self.inner, self.n_min = inner, n_min
        self.name = inner.name

    def begin(self, seq: list[int], prediction: list[int] | None = None) -> None:
        self.inner.begin(seq, prediction)

    def propose(self, seq: list[int], room: int, policy) -> Draft:
        d = self.inner.propose(seq, room, policy)
        if 0 < len(d.tokens) < self.n_min:
            shadow = d.tokens if d.source == "ngram" else d.shadow
            return Draft(source=d.source, match_len=d.match_len, shadow=shadow, origin=d.origin, resync=d.resync)
        return d


def assemble_drafter(cfg: GenConfig, model: DraftModel | None, ngram: NgramDrafter, recall: bool,
                     mtp: MtpDrafter | None = None):
    """The drafter a generation's settings ask for, from a lane's model draft (None without a draft model),
    n-gram drafter and NextN drafter (None: the target has no head); `recall`: n-grams from other requests'."""
    ngram.n_min, ngram.n_max = cfg.ngram_min, cfg.ngram_max
    ngram.recall = recall
    ngram.k_max = cfg.ngram_draft_max if cfg.spec == "auto" else cfg.draft_max
    if cfg.drafter == "model":
        if model is None:
            raise ConfigError("--drafter model needs a draft model; pass --draft PATH or use --drafter ngram")
        drafter = model
    elif cfg.drafter == "ngram":
        drafter = ngram
    elif cfg.drafter in ("hybrid", "auto"):  # the engine chose which of the model and the head fills the slot
        drafter = HybridDrafter(ngram, model or mtp)
    elif cfg.drafter == "mtp":
        if mtp is None:
            raise ConfigError("--drafter mtp needs a target with NextN (MTP) blocks; "
                              "`localspec check MODEL` says whether it has them")
        drafter = mtp
    else:
        raise ConfigError(f"unknown drafter {cfg.drafter!r}; use one of {', '.join(DRAFTERS)}")
    return DraftFloor(drafter, cfg.draft_min) if cfg.draft_min > 1 else drafter
