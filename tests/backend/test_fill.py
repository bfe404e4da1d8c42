"""`common_prefix`, asked every round of every drafter: the same answer as comparing token by token."""

from __future__ import annotations

import random

from localspec.backend import common_prefix


def test_common_prefix_agrees_with_a_token_by_token_comparison():
    def one_by_one(a, b):
        i = 0
        while i < min(len(a), len(b)) and a[i] == b[i]:
            i += 1
        return i

    rng = random.Random(0)
    for _ in range(5000):
        a = [rng.randint(0, 3) for _ in range(rng.randint(0, 400))]
        b = a[:rng.randint(0, len(a))] + [rng.randint(0, 3) for _ in range(rng.randint(0, 60))]
        for x, y in ((a, b), (b, a), (a, list(a))):
            assert common_prefix(x, y) == one_by_one(x, y)
