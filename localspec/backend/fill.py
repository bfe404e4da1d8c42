"""A prompt into a cache: the longest prefix it can keep reused, the rest evaluated in the passes
passes.py says (a recurrent model's cache checkpointed at their ends), the first token's row back."""

from __future__ import annotations

import numpy as np

from ..errors import PassInterrupted
from .passes import boundaries, pass_ends, reuse_point
from .rollback import PARTIAL


def sync_cache(cache, tokens: list[int], should_stop=None, step: int = 128, background: bool = False) -> int:
    """Make a cache (a Context's sequence 0, or one sequence of a shared one) hold exactly `tokens`,
    reusing the longest common prefix (prompt cache across chat turns). Returns how many tokens had to
    be evaluated. With `should_stop`, the evaluation goes `step` tokens at a time and ends early (the
    cache then holds a prefix of `tokens`) when it says so: background work gives way to a request, and
    with `background` its passes are asked too while they run (a request's own fill, which stops only
    when its client hangs up, is not: `should_stop` is then asked between slices)."""
    n = cache.reusable(common_prefix(cache.tokens, tokens))
    _begin(cache, n, clean=False)
    _evaluate(cache, tokens, n, _slices(n, len(tokens), step, should_stop), "none", should_stop, background)
    return len(cache.tokens) - n


def fill_to_answer(cache, tokens: list[int], should_stop=None, step: int = 128,
                   repeatable: bool = False) -> tuple[int, np.ndarray | None]:
    """sync_cache for a prompt about to be answered: the prompt's last token goes in the prompt's own
    (last) pass, and that pass's last logits row, the first token's distribution, comes back with the
    count of tokens evaluated; None when `should_stop` ended the fill first. Evaluated alone, as the
    first round's pass, that token would cost a whole decode step where one more row of the prompt's pass
    costs little: llama-server's first token comes from the prompt's pass too. `repeatable` (a greedy
    request's): the prompt goes in the passes a fresh evaluation makes (passes.py), so its answer does not
    depend on what the cache held; otherwise as much of the cache as matches is reused, as llama-server does."""
    shared = cache.reusable(min(common_prefix(cache.tokens, tokens), len(tokens) - 1))
    if repeatable:
        bounds = boundaries(tokens, cache.turn_starts, step)
        n = reuse_point(cache.cuts, shared, len(tokens), bounds)
        ends, clean = pass_ends(bounds, n, len(tokens)), n == 0 or n in bounds
    elif cache.rollback != PARTIAL:  # a recurrent cache: passes end where a later prompt may come back to
        n = shared
        ends, clean = pass_ends(boundaries(tokens, cache.turn_starts, step), n, len(tokens)), False
    else:
        n = min(shared, len(tokens) - 1)
        ends, clean = _slices(n, len(tokens), step, should_stop), False
    _begin(cache, n, clean)
    row = _evaluate(cache, tokens, n, ends, "last", should_stop, False)
    cache.cuts.decoded(len(cache.tokens))  # what follows is the answer's
    return len(cache.tokens) - n, row


def _slices(start: int, length: int, step: int, should_stop) -> list[int]:
    """Pass ends every `step` tokens when the fill may be stopped between them, else one pass."""
    return [*range(start + step, length, step), length] if should_stop is not None else [length]


def _begin(cache, n: int, clean: bool) -> None:
    """Keep the first n cached rows, from where the fill begins; rows after n come from its passes, which
    a fresh evaluation makes too only when `clean`."""
    cache.truncate(n)
    cache.checkpoint()  # a recurrent cache can come back to where this fill began (a user turn's start)
    cuts = cache.cuts
    if clean or (cuts.dirty_from is not None and cuts.dirty_from < n):  # else a pass before may straddle n
        cuts.add(n)
    if not clean:
        cuts.dirty(n)


def _evaluate(cache, tokens: list[int], start: int, ends: list[int], logits: str, should_stop,
              background: bool) -> np.ndarray | None:
    """Evaluate tokens[start:] in passes ending at `ends`, asking `should_stop` between them; with logits
    "last", the last row once every token went in (None if it stopped first)."""
    out = None
    for a, b in zip([start, *ends], ends):
        if a >= b:
            continue
        if should_stop is not None and should_stop():
            return None
        try:
            out = cache.eval(tokens[a:b], logits=logits if b == ends[-1] else "none",
                             stop=should_stop if background else None)
        except PassInterrupted:  # a request came while the pass ran: it was given up, rolled back
            return None
        cache.cuts.add(b)
        cache.checkpoint()  # a recurrent model's later prompts and rollbacks come back to pass ends
    return None if out is None else out[-1]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share. Asked every round (a draft cache against the text): slices compare
    at C speed, halving towards the first difference, where a token-by-token loop cost a tiny model's decode."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 32:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while a[lo] == b[lo]:
        lo += 1
    return lo
