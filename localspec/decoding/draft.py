"""A draft: the tokens a drafter proposes and, for each, the distribution q it was drawn from (None = a
deterministic proposal, q = one-hot), which is what the speculative accept rule needs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    probs: list[np.ndarray | None] = field(default_factory=list)
    source: str = "none"  # which drafter made it: "model" | "ngram" | "none"
    match_len: int = 0  # n-gram drafts: length of the suffix that matched
    shadow: list[int] | None = None  # an n-gram proposal the policy chose not to verify (it scores it later)
    origin: str = ""  # n-gram drafts: where the text came from ("prediction" | "text" | "memory")
    resync: bool = False  # n-gram drafts: the copy resumed after the target's own token (an edit)
