"""The n-gram drafter's lookup."""

from __future__ import annotations

from localspec.decoding.ngram import NgramDrafter
from localspec.decoding.policy import FixedK


def test_ngram_lookup_is_the_latest_earlier_occurrence():
    d = NgramDrafter(2, 3)
    seq = [1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2]
    d.begin(seq)
    draft = d.propose(seq, 3, FixedK(3))
    assert draft.tokens == [3, 5, 7] and draft.match_len == 2 and draft.source == "ngram"
    seq.append(3)  # suffix (1, 2, 3) now matches twice; the latest wins
    assert d.propose(seq, 2, FixedK(2)).tokens == [5, 7]
    assert d.propose([8, 6], 3, FixedK(3)).tokens == []  # another conversation: rebuilt, no match


def test_ngram_memory_drafts_from_earlier_generations():
    d = NgramDrafter()
    d.remember([5, 6, 7, 8, 9, 10, 11])
    found, n = d.lookup([1, 2, 6, 7], 3)
    assert found == [8, 9, 10] and n == 2
    cur = [6, 7, 42, 1, 6, 7]  # the current text wins over the memory
    assert d.lookup(cur, 2)[0] == [42, 1]
    d.memory.MEMORY_TOKENS = 10
    d.remember(list(range(100, 109)))  # the oldest sequence leaves once the memory is full
    assert d.lookup([1, 6, 7], 2) == ([], 0) and d.lookup([1, 101, 102], 2)[0] == [103, 104]
    other = NgramDrafter(memory=d.memory)  # a parallel request's drafter reads the same memory
    assert other.lookup([1, 101, 102], 2)[0] == [103, 104]
