"""Generations on a server's lanes at once (their passes batched), checked against plain decoding."""

from __future__ import annotations

import threading

from localspec.config import GenConfig
from localspec.engine import Engine
from localspec.verify import first_parting, logit_noise, plain_greedy_with_margins


def run_together(e: Engine, prompts: list[list[int]], cfg: GenConfig, cancel_after: dict | None = None) -> list:
    """Each prompt generated on its own lane, all at once; (tokens, stats) per prompt."""
    out: list = [None] * len(prompts)
    cancel_after = cancel_after or {}

    def run(i: int) -> None:
        lane, got = e.lanes[i], []
        stop = lambda: len(got) >= cancel_after.get(i, 1 << 30)  # noqa: E731
        for c in e.generate(prompts[i], cfg, cancel=stop, lane=lane):
            if c.token is not None:
                got.append(c.token)
        out[i] = (got, lane.last_stats)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a batched generation never finished"
    return out


SHARED_STEP_NOISE = 1e-3  # the least a batched near-tie is allowed (see below)


def assert_plain_or_near_tie(e: Engine, prompts: list[list[int]], outputs: list[list[int]]) -> int:
    """Each output equals plain greedy decoding of its prompt on `e` (one sequence, one token per pass)
    or parts from it where plain's top two were within the batched-vs-single noise. Returns partings."""
    # one sequence's noise at its prompt's end understates a step shared with other sequences deeper in (a
    # cancelled neighbour's lane once parted above twice that noise, flash attention on)
    bound = max(2.0 * max(logit_noise(e, p) for p in prompts), SHARED_STEP_NOISE)
    e.target.reset()
    parted = 0
    for p, toks in zip(prompts, outputs):
        plain, margins = plain_greedy_with_margins(e, p, len(toks))
        at = first_parting(plain, toks)
        if at is not None and at < len(margins):
            parted += 1
            assert margins[at] <= bound, (at, margins[at], bound)
    return parted
