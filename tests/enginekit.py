"""What the engine's tests share: loading a pair, greedy settings, one run, and the statistical checks that sampling stays the target's."""

from __future__ import annotations

import numpy as np
from conftest import GPU_LAYERS, THREADS

from localspec.config import GenConfig, LoadConfig
from localspec.decoding.sampling import logits_to_probs
from localspec.engine import Engine


def load(target, draft=None, n_ctx=512):
    return Engine(target, draft, LoadConfig(n_ctx=n_ctx, n_threads=THREADS, n_threads_batch=THREADS,
                                            n_gpu_layers_target=GPU_LAYERS[0], n_gpu_layers_draft=GPU_LAYERS[1]))


def greedy(**kw) -> GenConfig:
    base = dict(temperature=0.0, spec="on", drafter="model", draft_max=4, max_tokens=48)
    return GenConfig(**{**base, **kw})


def run(engine, prompt, cfg):
    chunks = list(engine.generate(prompt, cfg))
    return [c.token for c in chunks if c.token is not None], "".join(c.text for c in chunks), engine.last_stats


def pool_eog(e, p: np.ndarray) -> np.ndarray:
    """End-of-generation tokens are not emitted, so pool their mass into one extra last bin."""
    eog = e.target_model._eog
    return np.append(np.where(eog, 0.0, p), p[eog].sum())


def _chi2_fails(counts: np.ndarray, p: np.ndarray, n: int) -> tuple[bool, float, float]:
    """Pearson chi-square goodness of fit, bins with expectation < 5 pooled; True = reject at 1e-3."""
    exp = p * n
    big = exp >= 5
    obs_b = np.append(counts[big], counts[~big].sum())
    exp_b = np.append(exp[big], exp[~big].sum())
    keep = exp_b > 0
    chi2 = float(((obs_b[keep] - exp_b[keep]) ** 2 / exp_b[keep]).sum())
    dof = int(keep.sum()) - 1
    z = 3.09  # Wilson-Hilferty: the 0.999 quantile of chi2(dof)
    crit = dof * (1 - 2 / (9 * dof) + z * np.sqrt(2 / (9 * dof))) ** 3
    return chi2 > crit, chi2, crit


def assert_second_token_is_the_targets(e, prompt: list[int], cfg: GenConfig, seeds: int, min_samples: int) -> None:
    """Two-token answers over `seeds` seeds: after the most likely first token, the second token's frequencies
    fit the target's own p(second | first), which is what can be computed exactly."""
    e.target.sync(prompt[:-1])
    first = int(logits_to_probs(e.target.eval([prompt[-1]], logits="last")[0], cfg).argmax())
    p2 = pool_eog(e, logits_to_probs(e.target.eval([first], logits="last")[0], cfg))
    e.target.truncate(len(prompt) - 1)
    counts, n = np.zeros(p2.size), 0
    for seed in range(seeds):
        tokens, _, _ = run(e, prompt, cfg.with_(seed=seed))
        if tokens and tokens[0] == first:
            counts[tokens[1] if len(tokens) == 2 else -1] += 1
            n += 1
    assert n > min_samples
    fails, chi2, crit = _chi2_fails(counts, p2, n)
    assert not fails, f"chi2 {chi2:.1f} > {crit:.1f} over {n} samples"
