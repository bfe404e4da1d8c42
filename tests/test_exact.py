"""Temperature 0 means one answer: --exact (batch-invariant kernels) and greedy drafting decided by the
request alone. The kernels are llama.cpp's own, so these tests run them, each mode in a fresh process
(llama.cpp reads its kernel switch once per process)."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import THREADS
from tinygguf import build_tiny_model

from localspec.config import GenConfig, LoadConfig
from localspec.costs.costmodel import CostProfile
from localspec.engine import Engine
from localspec.decoding.policy import REPEATABLE_MIN_MATCH
from localspec.server.apierrors import ApiError
from localspec.server.settings import gen_settings

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def flat_kquant(tmp_path_factory) -> Path:
    """A tiny model wide enough for K-quants (Q4_K_M, the weights --exact needs) with flat logits, so greedy
    decoding meets near-ties where a batched row and a single-token decode can pick different tokens."""
    from localspec.backend import llama

    d = tmp_path_factory.mktemp("kquant")
    build_tiny_model(d / "f16.gguf", seed=0, width=256, out_scale=0.05)
    L = llama()
    params = L.llama_model_quantize_default_params()
    params.ftype = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = 1
    assert L.llama_model_quantize(str(d / "f16.gguf").encode(), str(d / "q4km.gguf").encode(),
                                  ctypes.byref(params)) == 0
    return d / "q4km.gguf"


def exact_run(model: Path, mode: str, threads: int = THREADS, draft: Path | None = None) -> dict:
    r = subprocess.run([sys.executable, str(HERE / "exact_run.py"), str(model), mode, str(threads),
                        *([str(draft)] if draft else [])],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def first_parting(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def test_exact_speculation_has_plain_decodings_bits_where_default_kernels_part(flat_kquant):
    default = exact_run(flat_kquant, "default")
    # the premise: on this build the default kernels give a batched row other bits, and on this model that
    # changes the greedy text (drafts verified every round, most rejected)
    assert default["gap"] > 0 and first_parting(default["off"], default["on"]) is not None
    for threads in sorted({1, 2}):
        ex = exact_run(flat_kquant, "exact", threads)
        assert ex["gap"] == 0.0
        assert ex["on_drafted"] > 100 and ex["on"] == ex["off"]


def test_exact_refuses_kernels_that_are_not_batch_invariant(tiny):
    """The tiny F16 model runs through llama.cpp's llamafile kernels from two rows: measured, refused in one line."""
    r = subprocess.run([sys.executable, "-m", "localspec", "run", "--target", str(tiny.target), "--exact",
                        "-t", "1", "-n", "4", "hello"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "LOCALSPEC_HOME": str(tiny.dir / "home-exact")})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: --exact: a batched row of target.gguf differs from a single-token decode by ")
    assert r.stderr.endswith("(it needs K-quant weights (Q4_K_M, Q5_K_M, Q6_K) and a process that had not decoded "
                             "before); run without --exact\n") and r.stderr.count("\n") == 1


def engine(tiny) -> Engine:
    e = Engine(tiny.target, None, LoadConfig(n_ctx=1024, n_threads=THREADS, n_threads_batch=THREADS))
    # a profile that makes every draft look free: drafting decided by the machine's figures would verify
    # whatever the memory of earlier answers offers
    e.profile = CostProfile(t_decode=1.0, t_verify=[1.0 + 0.001 * n for n in range(64)])
    e.remember_generations = True  # a server's: n-gram drafts may copy earlier answers
    return e


def test_greedy_drafts_come_from_the_request_alone_whatever_ran_before(tiny):
    e = engine(tiny)
    prompt = e.target_model.tokenize("write the code to read a csv file", True)
    cfg = GenConfig(temperature=0.0, spec="auto", drafter="ngram", max_tokens=60)

    def answer(p, c=cfg):
        tokens = [x.token for x in e.generate(p, c) if x.token is not None]
        st = e.last_stats
        return tokens, st.drafted_by_position, st.policy

    fresh = answer(prompt)
    answer(prompt)  # its answer is now in the memory of earlier generations
    other = e.target_model.tokenize("the cache is fast and the model is slow", True)
    answer(other, cfg.with_(temperature=0.7, seed=3))  # and a sampled one, drafting from it
    again = answer(prompt)
    assert again == fresh
    assert "T_verify/T_decode = 1.00, 1.80" in fresh[2]  # priced by the reference curve, not this machine's
    sampled = answer(prompt, cfg.with_(temperature=0.7, seed=3))
    assert "T_verify/T_decode = 1.00, 1.00" in sampled[2]  # sampling keeps the measured figures
    rng = np.random.default_rng(0)
    assert e._drafting(cfg, rng, e.lane, len(prompt))[1].min_match == REPEATABLE_MIN_MATCH  # copies only
    assert e._drafting(cfg.with_(temperature=0.7), rng, e.lane, len(prompt))[1].min_match == 0
    e.close()


def test_a_request_asking_for_exact_output_decodes_plainly_without_exact_kernels(tiny):
    e = engine(tiny)
    prompt = e.target_model.tokenize("the cache is fast and the model is slow", True)
    plain = [x.token for x in e.generate(prompt, GenConfig(temperature=0.0, spec="off", max_tokens=40))]
    asked = [x.token for x in e.generate(prompt, GenConfig(temperature=0.0, spec="on", drafter="ngram",
                                                                max_tokens=40, exact=True))]
    assert asked == plain and e.last_stats.spec_mode == "off" and e.last_stats.drafted == 0
    e.close()


def test_the_exact_request_field_is_validated():
    assert gen_settings({"exact": True}, GenConfig(), oai=True)[0].exact is True
    assert gen_settings({}, GenConfig(), oai=True)[0].exact is False
    with pytest.raises(ApiError) as e:
        gen_settings({"exact": "yes"}, GenConfig(), oai=True)
    assert e.value.status == 400 and '"exact" must be true or false' in str(e.value.body())


def test_a_greedy_prompt_reuses_whole_slices_only_and_never_its_last():
    from localspec.backend.context import aligned_reuse

    assert aligned_reuse(0, 40, 256) == 0
    assert aligned_reuse(39, 40, 256) == 0  # the same short prompt again: evaluated whole, as the first time
    assert aligned_reuse(599, 600, 256) == 512 and aligned_reuse(600, 700, 256) == 512
    assert aligned_reuse(300, 1000, 256) == 256  # a shared system prompt: its whole slices
    assert aligned_reuse(1000, 513, 256) == 512 and aligned_reuse(1000, 512, 256) == 256
