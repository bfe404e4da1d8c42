"""The speculative loop on one screen: draft, verify in one pass, accept, roll back.

`speculative_decode` is the whole algorithm (as gpt-fast's and llama.cpp's speculative-simple read);
`engine.Engine` prepares what it needs (the prompt in the cache, a drafter, a policy, a grammar) and
turns the tokens it yields into text and stop reasons.
"""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from ..backend import Context
from ..config import GenConfig
from ..errors import ContextFullError
from ..stats import Stats
from .draft import Draft
from .sampling import accept_greedy, accept_sampled, apply_logit_bias

NO_DRAFT = Draft()


def speculative_decode(target: Context, drafter, policy, seq: list[int], cfg: GenConfig,
                       stats: Stats, rng: np.random.Generator, grammar=None,
                       first: np.ndarray | None = None) -> Iterator[tuple[int, str]]:
    """Yield confirmed (token, source) pairs until the caller stops. `seq` is the confirmed
    sequence (prompt + output); on entry the target's cache holds all of it but the last token, or,
    with `first` (the logits row the prompt's own pass gave its last token), all of it.
    With k = 0 a round is one plain decoding step, so the baseline runs through the same code.
    `grammar` (constraints.GrammarConstraint) limits the target's rows to what the grammar allows."""
    greedy = cfg.temperature <= 0
    while True:
        room = target.n_ctx - len(seq)  # the pending token plus k drafts must fit
        if room < 1:
            raise ContextFullError(f"context full ({target.n_ctx} tokens)")
        # 1. draft up to k tokens; the policy picks k per round, 0 meaning a plain decoding step
        t0 = time.perf_counter()
        draft = drafter.propose(seq, room - 1, policy) if drafter and room > 1 else NO_DRAFT
        t1 = time.perf_counter()
        # 2. verify: the pending token and the whole draft in ONE target pass, logits on each row
        logits = _verify(target, seq, draft.tokens, first)
        first = None
        if cfg.logit_bias:  # constraints shape the target's distribution, never the drafts'
            logits = apply_logit_bias(logits, cfg.logit_bias)
        t2 = time.perf_counter()
        # 3. accept the agreeing prefix; the first disagreement (or the bonus) is the target's own
        if grammar is not None:  # the same rules, each row under the grammar after the drafts before it
            n, fix = grammar.accept_round(draft, logits, cfg, rng)
        elif greedy:
            best = logits.argmax(axis=1)
            n = accept_greedy(draft.tokens, best)
            fix = int(best[n])
        else:
            n, fix = accept_sampled(draft, logits, cfg, rng)
        out = [*draft.tokens[:n], fix]
        # 4. roll the target back to the confirmed text; the new last token stays pending
        seq.extend(out)
        target.truncate(len(seq) - 1)
        policy.update(draft, n, seq)
        stats.add_round(draft.source, len(draft.tokens), n, t1 - t0, t2 - t1, draft.origin)
        for i, tok in enumerate(out):
            yield tok, (draft.source if i < n else "target")


def _verify(target: Context, seq: list[int], draft: list[int], first: np.ndarray | None) -> np.ndarray:
    """The target's rows for the pending token and each draft token; the first round's pending token was
    in the prompt's pass already (`first`), so only the draft goes in (nothing, when there is none)."""
    if first is None:
        return target.eval([seq[-1], *draft], logits="all")
    return np.vstack([first[None], target.eval(draft, logits="all")]) if draft else first[None]
