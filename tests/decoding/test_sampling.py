"""Sampling as llama.cpp's samplers do it, and the accept/resample step."""

from __future__ import annotations

import numpy as np

from localspec.config import GenConfig
from localspec.decoding.sampling import accept_greedy, logits_to_probs, residual, top2_margin


def test_logits_to_probs_filters_like_llama_cpp():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    p = logits_to_probs(logits, GenConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0))
    assert np.allclose(p, [0.5, 0.3, 0.15, 0.05])
    p = logits_to_probs(logits, GenConfig(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0))
    assert np.allclose(p, [0.625, 0.375, 0, 0])
    p = logits_to_probs(logits, GenConfig(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0))
    assert np.allclose(p, [0.625, 0.375, 0, 0])  # 0.5 + 0.3 reaches 0.8
    p = logits_to_probs(logits, GenConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2))
    assert np.allclose(p[3], 0) and p[2] > 0  # 0.05 < 0.2 * 0.5 <= 0.15
    hot = logits_to_probs(logits, GenConfig(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0))
    assert hot[3] > 0.05 and np.isclose(hot.sum(), 1)


def test_top_p_on_a_large_vocab_uses_the_head_correctly():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(50_000) * 3
    cfg = GenConfig(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0)
    p = logits_to_probs(logits, cfg)
    full = np.exp(logits - logits.max())
    full /= full.sum()
    order = np.argsort(-full)
    cut = int(np.searchsorted(np.cumsum(full[order]), 0.9)) + 1
    assert set(np.flatnonzero(p)) == set(order[:cut])


def test_accept_greedy_and_residual():
    assert accept_greedy([1, 2, 3], [1, 2, 9, 4]) == 2
    assert accept_greedy([], [5]) == 0
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.2, 0.6, 0.2])
    assert np.allclose(residual(p, q, 1), [1.0, 0.0, 0.0])
    assert np.allclose(residual(p, None, 0), [0.0, 0.6, 0.4])
    assert top2_margin(np.array([1.0, 3.0, 2.5])) == 0.5
