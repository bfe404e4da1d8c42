"""Pure helpers: sampling filters, accept rules, text streaming, n-gram lookup, policy."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from localspec.config import GenConfig
from localspec.costs.costmodel import CostProfile
from localspec.decoding.ngram import NgramDrafter
from localspec.decoding.policy import AdaptivePolicy, FixedK
from localspec.decoding.sampling import accept_greedy, logits_to_probs, residual, top2_margin
from localspec.text import TextStream


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


def test_text_stream_never_splits_utf8_and_never_passes_a_stop_string():
    s = TextStream(stop=["END"])
    snow = "é☃".encode()
    out = [s.push(snow[:1]), s.push(snow[1:3]), s.push(snow[3:]), s.push(b" E"), s.push(b"N"), s.push(b"Dmore")]
    assert out[0] == "" and "".join(out) == "é☃ "
    assert s.stopped and s.push(b"x") == "" and s.flush() == ""
    s = TextStream(stop=["END"])
    assert s.push(b"EN") == "" and s.flush() == "EN"  # a held-back prefix is released at the end


def test_ngram_lookup_is_the_latest_earlier_occurrence():
    d = NgramDrafter(2, 3)
    seq = [1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2]
    d.begin(seq)
    draft = d.propose(seq, 3, FixedK(3))
    assert draft.tokens == [3, 5, 7] and draft.match_len == 2 and draft.source == "ngram"
    seq.append(3)  # suffix (1, 2, 3) now matches twice; the latest wins
    assert d.propose(seq, 2, FixedK(2)).tokens == [5, 7]
    assert d.propose([8, 6], 3, FixedK(3)).tokens == []  # another conversation: rebuilt, no match


def test_adaptive_policy_prefers_plain_when_verification_is_expensive():
    cpu = CostProfile(t_decode=1.0, t_verify=[1.0, 1.72, 2.30, 2.50, 3.15, 3.76], t_draft=0.49)
    pol = AdaptivePolicy(cpu, 4)
    assert pol.k_for("model", 4) == 0  # a model draft at 0.49 of the target cannot pay here
    pol.alpha[("ngram", 4)] = 0.95
    assert pol.k_for("ngram", 4, match_len=4) >= 3  # a free draft that is usually right does
    gpu = CostProfile(t_decode=1.0, t_verify=[1.0, 1.02, 1.04, 1.06, 1.08, 1.1], t_draft=0.15)
    assert AdaptivePolicy(gpu, 4).k_for("model", 4) >= 3


def test_a_model_probe_is_skipped_when_the_draft_must_first_catch_up_with_a_long_text():
    # a CPU-like curve where a model right 95% of the time could pay, but today's estimate does not
    cpu = CostProfile(t_decode=1.0, t_verify=[1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4], t_draft=0.3)
    for lag, probes in ((8, True), (2000, False)):
        pol = AdaptivePolicy(cpu, 4)
        pol.alpha[("model", 0)] = 0.05
        assert pol.model_ceiling >= 1.1
        asked = []
        ks = [pol.k_for("model", 4, catch_up=lambda: asked.append(1) or lag) for _ in range(2 * pol.PROBE_EVERY)]
        assert (sum(ks) == 2) is probes and ks.count(0) >= 2 * pol.PROBE_EVERY - 2
        assert len(asked) == 2  # the text is measured only when a probe is due, not every round
    assert cpu.catch_up(2000) == 2000 * (2.4 / 8) * 0.3 and cpu.catch_up(0) == 0.0
    # a round the estimate says pays is still refused when the catch-up would not be paid back
    gpu = CostProfile(t_decode=1.0, t_verify=[1.0, 1.02, 1.04, 1.06, 1.08, 1.1], t_draft=0.15)
    assert AdaptivePolicy(gpu, 4).k_for("model", 4, catch_up=lambda: 100) >= 3
    assert AdaptivePolicy(gpu, 4).k_for("model", 4, catch_up=lambda: 100_000) == 0


def test_adaptive_policy_learns_from_shadow_drafts():
    from localspec.decoding.draft import Draft

    cpu = CostProfile(t_decode=1.0, t_verify=[1.0, 1.72, 2.30, 2.50, 3.15], t_draft=None)
    pol = AdaptivePolicy(cpu, 4)
    pol.alpha[("ngram", 2)] = 0.1
    assert pol.k_for("ngram", 4, 2) == 0
    seq = [1, 2, 3]
    for _ in range(30):  # the text keeps repeating what the n-gram proposed: acceptance rises
        proposal = [7, 8, 9, 10]
        pol.update(Draft(source="ngram", match_len=2, shadow=proposal), 0, seq + [7])
        seq = seq + [7]
        for t in proposal[1:]:
            seq = seq + [t]
            pol.update(Draft(), 0, seq)
    assert pol.alpha[("ngram", 2)] > 0.8
    assert pol.k_for("ngram", 4, 2) > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise on /proc/self/maps ranges: Linux only")
def test_page_releaser_never_touches_memory_that_replaced_an_unmapped_model_range(tmp_path):
    """llama.cpp unmaps the offloaded parts of a model's mapping before its last progress call; if
    that address range is reused at once, releasing "the model's pages" there must not zero it."""
    import ctypes
    import mmap

    from localspec.backend import MappedPageReleaser

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = 16 * mmap.PAGESIZE
    model = tmp_path / "model.gguf"
    model.write_bytes(b"\x01" * size)
    with open(model, "rb") as f:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
    assert addr not in (None, ctypes.c_void_p(-1).value)
    releaser = MappedPageReleaser(model)
    releaser._progress(0.5, None)  # mid-load: the model's pages are released (and read back on use)
    assert ctypes.string_at(addr, 4) == b"\x01" * 4
    libc.munmap(addr, size)  # llama.cpp unmaps the offloaded part ...
    MAP_FIXED_NOREPLACE = 0x100000  # ... and another allocation takes that address range
    anon = libc.mmap(addr, size, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0)
    if anon != addr:
        pytest.skip("the kernel did not give the same address back")
    ctypes.memset(anon, 0x7F, size)
    releaser._progress(1.0, None)  # the last call
    assert ctypes.string_at(anon, size) == b"\x7f" * size
    libc.munmap(anon, size)


def _verify_report(plain, spec, margins, noise=0.01):
    return {"noise": noise, "max_tokens": 8, "verdict": "OK",
            "prompts": [{"prompt": [1, 2], "plain": plain, "spec": spec, "margins": margins}]}


def test_compare_builds_judges_partings_by_both_builds_margins():
    from localspec.verify import compare_builds, first_parting

    assert first_parting([1, 2, 3], [1, 2, 3]) is None
    assert first_parting([1, 2, 3], [1, 5, 3]) == 1
    assert first_parting([1, 2], [1, 2, 3]) == 2  # one ended (EOS) where the other went on
    here = _verify_report([5, 6, 7, 8], [5, 6, 7, 8], [3.0, 0.02, 2.0, 1.0])
    # the other build picks 9 at token 1, where both saw the top two within 0.03: a near-tie
    near = _verify_report([5, 9, 7, 8], [5, 9, 7, 8], [3.02, 0.01, 2.0, 1.0])
    c = compare_builds(here, near)
    assert c["verdict"] == "OK" and c["prompts"][0]["plain"] == {
        "parted_at": 1, "margins": [0.02, 0.01], "tokens": [4, 4], "near_tie": True}
    assert c["cross_noise"] == pytest.approx(0.01)  # |3.0 - 3.02| / 2, before the parting only
    # a confident token (margin 2.0 here) chosen differently there is a real difference
    far = _verify_report([5, 6, 9, 8], [5, 6, 9, 8], [3.0, 0.02, 0.01, 1.0])
    c = compare_builds(here, far)
    assert c["verdict"] == "MISMATCH" and c["prompts"][0]["spec"]["near_tie"] is False
    # both speculative runs left their own plain runs earlier (judged by each build's own verdict)
    a = _verify_report([5, 6, 7, 8], [5, 4, 4, 8], [3.0, 0.0, 2.0, 1.0])
    b = _verify_report([5, 6, 7, 8], [5, 4, 3, 8], [3.0, 0.0, 2.0, 1.0])
    row = compare_builds(a, b)["prompts"][0]
    assert row["plain"]["parted_at"] is None and row["spec"] == {
        "parted_at": 2, "margins": [None, None], "tokens": [4, 4], "near_tie": None}
    with pytest.raises(ValueError, match="same prompts"):
        compare_builds(here, {**near, "prompts": [{**near["prompts"][0], "prompt": [3]}]})
    with pytest.raises(ValueError, match="same -n"):
        compare_builds(here, {**near, "max_tokens": 9})


def test_a_chat_template_is_compiled_once_and_still_renders_each_conversation_and_refuses_bad_ones():
    from types import SimpleNamespace

    from localspec import chat_format
    from localspec.errors import ConfigError

    model = SimpleNamespace(bos=1, eos=2, token_text=lambda i: {1: "<s>", 2: "</s>"}[i])
    tpl = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}"
           "{% endif %}[{{ m.role }}] {{ m.content | tojson }}\n{% endfor %}{% if add_generation_prompt %}>{% endif %}")
    msg = lambda role, text: SimpleNamespace(role=role, content=text)  # noqa: E731
    before = chat_format._compiled.cache_info()
    assert chat_format.render_prompt(tpl, [msg("user", "hi")], model) == '<s>[user] "hi"\n>'
    assert chat_format.render_prompt(tpl, [msg("user", "a"), msg("assistant", "b")], model) == \
        '<s>[user] "a"\n[assistant] "b"\n>'
    after = chat_format._compiled.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)
    with pytest.raises(ConfigError, match="refused this conversation: no tools"):
        chat_format.render_prompt(tpl, [msg("tool", "x")], model)
    for _ in range(2):  # a broken template fails every time (no compiled result is kept for it)
        with pytest.raises(ConfigError, match="failed to render"):
            chat_format.render_prompt("{% for m in messages %}", [msg("user", "hi")], model)


def test_llama_cpp_library_loads_before_numpy():
    """With numpy imported first a CUDA build crashed loading any model (docs/MODELS.md), so
    `import localspec` loads llama.cpp's library before anything imports numpy."""
    code = ("import sys, localspec; names = list(sys.modules); "
            "print(names.index('llama_cpp.llama_cpp') < names.index('numpy'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr


def test_pass_costs_measured_on_a_busy_machine_are_not_kept(tiny, monkeypatch):
    """auto's first profile is measured after an answer, never before, and kept only when no other program
    used the cores meanwhile: a busy machine's figures are not this machine's; it then backs off."""
    from localspec import paths
    from localspec.config import LoadConfig
    from localspec.costs import idle, tuning
    from localspec.engine import Engine

    monkeypatch.setattr(tuning, "noisy_sizes", lambda samples: [])  # the tiny model's passes take microseconds

    e = Engine(tiny.target, None, LoadConfig(n_threads=2, n_threads_batch=2))
    try:
        assert idle.measure_when_idle(e, lambda: True, request=lambda: False) and e.profile is None
        m = idle.state_of(e)
        assert m.state == "waiting" and m.why == "another program used the cores" and m.backoff.gave_way == 1
        assert not list(paths.profiles_dir().glob("*.json"))
        assert m.to_dict()["retry_in_s"] > 10  # backing off
        m.backoff.not_before = 0.0
        assert idle.measure_when_idle(e, lambda: False, request=lambda: False)
        assert e.profile.extra.get("quick") and list(paths.profiles_dir().glob("*.json"))
        assert m.state == "done" and m.backoff.gave_way == 0 and not idle.due(e)
    finally:
        e.close()


def test_a_measurement_gives_way_to_a_request_within_a_pass_and_keeps_its_rounds(tiny, monkeypatch):
    from localspec.config import LoadConfig
    from localspec.costs import idle, tuning
    from localspec.engine import Engine

    monkeypatch.setattr(tuning, "noisy_sizes", lambda samples: [])  # the tiny model's passes take microseconds
    e = Engine(tiny.target, None, LoadConfig(n_threads=1, n_threads_batch=1))
    try:
        conversation = e.prompt_tokens("hello world")
        e.target.eval(conversation, logits="none")
        calls, real = [], e.target.eval
        e.target.eval = lambda tokens, logits="last", **kw: calls.append(len(tokens)) or real(tokens, logits, **kw)
        # a request comes during the second round (a round: the depth's fill, 4 sizes, 4 single tokens)
        assert idle.measure_when_idle(e, lambda: False, request=lambda: len(calls) >= 12)
        m = idle.state_of(e)
        assert e.profile is None and m.state == "pending" and m.why == "gave way to a request"
        assert len(calls) == 12 and m.rounds.done == 1  # within a pass; the first round kept
        assert e.target.tokens == conversation  # the conversation's cache put back
        calls.clear()
        assert idle.measure_when_idle(e, lambda: False, request=lambda: False) and e.profile is not None
        assert 2 * 8 <= len(calls) <= 2 * 9  # the two rounds left (8 passes each; the depth filled again)
    finally:
        e.close()


def test_a_measurement_gives_way_to_another_program_and_backs_off_longer_each_time(tiny, monkeypatch):
    from localspec.config import LoadConfig
    from localspec.costs import idle
    from localspec.engine import Engine

    e = Engine(tiny.target, None, LoadConfig(n_threads=1, n_threads_batch=1))
    try:
        looks = []
        appears = lambda: looks.append(1) or len(looks) > 5  # noqa: E731  (another process starts mid-way)
        assert idle.measure_when_idle(e, appears, request=lambda: False) and e.profile is None
        m = idle.state_of(e)
        first_wait = m.backoff.wait_s()
        assert m.state == "waiting" and m.backoff.gave_way == 1 and idle.BACKOFF_S[0] - 1 < first_wait <= idle.BACKOFF_S[0]
        assert idle.measure_when_idle(e, lambda: False, request=lambda: False) and m.backoff.gave_way == 1  # not yet
        m.backoff.not_before = 0.0
        looks.clear()
        idle.measure_when_idle(e, appears, request=lambda: False)
        assert m.backoff.gave_way == 2 and m.backoff.wait_s() > first_wait  # longer each time
        assert idle.word(e) == "measure later"
    finally:
        e.close()
