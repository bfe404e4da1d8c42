"""Constraints on what the target may say: a grammar the output must follow (GBNF, or a JSON schema
turned into one), applied to the target's distribution beside sampling.

Speculation stays exact under a grammar the way llama-server keeps it (common_sampler_sample_and_accept_n):
drafts are made without the grammar; verification walks the verified rows in order, each row constrained
by the grammar *after* the draft tokens before it, and keeps a draft token only under the same rule as
unconstrained decoding applied to the constrained row (greedy: it is the constrained argmax; sampling:
min(1, p_c(x)/q(x)), with p_c the target's distribution renormalised over what the grammar allows). A
draft token the grammar forbids has p_c = 0 and is always rejected. With no drafts a round is one plain
constrained step, so plain and speculative decoding run the same code.

Greedy rows check the unconstrained argmax first (one token through the grammar, microseconds), as
llama.cpp's common sampler does, then the next best candidates one by one; sampled rows find the top-k
allowed tokens the same way (top-k of the constrained row is exactly those). Only when the candidates
run out is the whole vocabulary masked (a large share of a decode step on Qwen's 151,936 tokens).
"""

from __future__ import annotations

import json

import numpy as np

from ..errors import ConfigError
from .sampling import accept_token, logits_to_probs, residual, sample


class GrammarConstraint:
    """The grammar's state after the confirmed output; `accept_round` is step 3 of the loop under it."""

    def __init__(self, sampler):
        self.state = sampler  # backend.GrammarSampler after every confirmed token

    def accept_round(self, draft, logits: np.ndarray, cfg, rng) -> tuple[int, int]:
        """(number of draft tokens accepted, the target's own next token), the grammar advanced by both."""
        walker = self.state.clone()
        greedy = cfg.temperature <= 0
        for i, x in enumerate(draft.tokens):
            if greedy:
                best = _allowed_argmax(logits[i], walker)
                if x != best:
                    return self._advance(walker, i, best)
            else:
                q = draft.probs[i]
                p = _allowed_probs(logits[i], walker, cfg)
                if not accept_token(p, q, x, rng):
                    return self._advance(walker, i, sample(residual(p, q, x), rng))
            walker.accept(x)
        last = logits[len(draft.tokens)]
        fix = _allowed_argmax(last, walker) if greedy else sample(_allowed_probs(last, walker, cfg), rng)
        return self._advance(walker, len(draft.tokens), fix)

    def _advance(self, walker, n: int, fix: int) -> tuple[int, int]:
        walker.accept(fix)
        old, self.state = self.state, walker
        old.close()
        return n, fix

    def close(self) -> None:
        self.state.close()


SCAN = 64  # candidates checked one by one (each a grammar step) before the whole vocabulary is masked


def _allowed_top(row: np.ndarray, grammar, k: int) -> np.ndarray | None:
    """The k best tokens the grammar allows, best first, found among the SCAN * k best of the row;
    None when fewer are allowed there (then only a full mask can tell)."""
    n = min(row.size, SCAN * k)
    cand = np.argpartition(row, -n)[-n:]
    cand = cand[np.argsort(-row[cand], kind="stable")]
    found = []
    for t in cand:
        if not np.isfinite(row[t]):
            break
        if grammar.allows(int(t)):
            found.append(int(t))
            if len(found) == k:
                return np.array(found)
    return None


def _allowed_argmax(row: np.ndarray, grammar) -> int:
    """The constrained argmax: the row's best token if the grammar allows it (the common case), else the
    best allowed one among the next candidates, else after masking the whole vocabulary."""
    best = int(row.argmax())
    if grammar.allows(best):
        return best
    top = _allowed_top(row, grammar, 1)
    return int(top[0]) if top is not None else int(_masked(row, grammar).argmax())


def _allowed_probs(row: np.ndarray, grammar, cfg) -> np.ndarray:
    """The constrained distribution: top-k of the allowed tokens (then top-p, min-p, temperature as
    always). With top-k on, the k best allowed tokens decide it, so a full mask is rarely needed."""
    top = _allowed_top(row, grammar, cfg.top_k) if 0 < cfg.top_k < row.size // SCAN else None
    if top is not None:
        kept = np.full_like(row, -np.inf)
        kept[top] = row[top]
        return logits_to_probs(kept, cfg)
    return logits_to_probs(_masked(row, grammar), cfg)


def _masked(row: np.ndarray, grammar) -> np.ndarray:
    """The row with every forbidden token at -inf; a grammar that allows nothing here is the user's error."""
    masked = grammar.mask(row)
    if not np.isfinite(masked.max()):
        raise ConfigError("the grammar allows no token here (it cannot be completed); check it")
    return masked


# llama-cpp-python's converter lets a string hold raw control characters, which JSON forbids (a model's newline
# inside a value would not parse); llama.cpp's own converter and json.gbnf exclude them, as here
_LOOSE_CHAR = r'char ::= [^"\\] |'
_JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] |'


def schema_grammar(schema: dict) -> str:
    """A JSON schema as GBNF, by the converter llama.cpp ships (json-schema-to-grammar, as llama-server
    uses): the output then always parses and validates."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    remote = _remote_ref(schema)
    if remote is not None:  # never fetched (a server must not reach out where a request points it)
        raise ConfigError(f"the JSON schema refers to {remote!r}; only local references (#/...) are supported")
    try:
        gbnf = json_schema_to_gbnf(json.dumps(schema))
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError, RecursionError,
            NotImplementedError) as e:
        raise ConfigError(f"the JSON schema cannot be turned into a grammar ({type(e).__name__}: {e})") from None
    return gbnf.replace(_LOOSE_CHAR, _JSON_CHAR)


def _remote_ref(node, depth: int = 0):
    """The first "$ref" that does not point inside the schema itself, or None."""
    if depth > 200:
        raise ConfigError("the JSON schema is nested too deeply")
    if isinstance(node, dict):
        ref = node.get("$ref")
        if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
            return ref
        node = list(node.values())
    if isinstance(node, list):
        for x in node:
            found = _remote_ref(x, depth + 1)
            if found is not None:
                return found
    return None


def json_grammar() -> str:
    """Any JSON object (OpenAI's response_format json_object)."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return JSON_GBNF


def starts_with_grammar(text: str) -> str:
    """GBNF for any text that starts with `text` (token healing: the output re-creates a token the
    prompt left out, whatever tokens the model spells it with)."""
    escaped = "".join(_GBNF_ESCAPES.get(c, c) for c in text)
    return f'root ::= "{escaped}" .*'


_GBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
