"""Speculation stays exact under constraints (a grammar, logit_bias): at temperature 0 the output is plain
constrained decoding's, token for token; at T > 0 it is distributed as the constrained target; a draft
token the constraint forbids is rejected, never emitted. Tiny models here; the real pair at the end."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import real_pair_paths
from enginekit import _chi2_fails, greedy, pool_eog, run

from localspec.backend import GrammarSampler
from localspec.config import GenConfig
from localspec.decoding.constraints import schema_grammar
from localspec.decoding.sampling import logits_to_probs
from localspec.errors import ConfigError

WORDS_GBNF = 'root ::= w{8,}\nw ::= " cache" | " model" | " fast" | " draft" | " data"'
WORDS_RE = re.compile(r"( cache| model| fast| draft| data){8,}")


def prompt_of(e, text="the cache is fast . the cache is"):
    return e.target_model.tokenize(text, True)


@pytest.mark.parametrize("drafter", ["model", "ngram", "hybrid"])
def test_greedy_under_a_grammar_equals_plain_constrained_decoding(perturbed, drafter):
    e, prompt = perturbed, prompt_of(perturbed)
    plain, plain_text, _ = run(e, prompt, greedy(spec="off", grammar=WORDS_GBNF, max_tokens=32))
    spec, spec_text, st = run(e, prompt, greedy(drafter=drafter, grammar=WORDS_GBNF, max_tokens=32))
    assert spec == plain and spec_text == plain_text
    assert re.fullmatch(r"( cache| model| fast| draft| data)*( [a-z]*)?", plain_text) and len(plain) >= 16
    assert st.drafted > 0  # drafts really were verified under the grammar


def test_a_draft_the_grammar_forbids_is_rejected_never_emitted(same):
    """An identical draft proposes the unconstrained argmax: wherever the grammar forbids it, the round
    stops there and the grammar's choice is emitted."""
    e, prompt = same, prompt_of(same)
    free, _, _ = run(e, prompt, greedy(max_tokens=24))
    tokens, text, st = run(e, prompt, greedy(grammar=WORDS_GBNF, max_tokens=24))
    assert tokens != free and WORDS_RE.fullmatch(text)
    assert st.accepted < st.drafted  # forbidden drafts were rejected


def test_logit_bias_greedy_equals_plain_and_bans(perturbed):
    e, prompt = perturbed, prompt_of(perturbed)
    free, _, _ = run(e, prompt, greedy(spec="off", max_tokens=24))
    banned = {free[0]: -np.inf, free[3]: -np.inf}
    plain, _, _ = run(e, prompt, greedy(spec="off", logit_bias=banned, max_tokens=24))
    spec, _, st = run(e, prompt, greedy(logit_bias=banned, max_tokens=24))
    assert spec == plain and not set(banned) & set(spec) and st.drafted > 0


@pytest.mark.parametrize("constraint, top_k", [("grammar", 30), ("grammar", 3), ("logit_bias", 30)])
def test_sampling_under_a_constraint_is_distributed_as_the_constrained_target(bad, constraint, top_k):
    """top_k 3: the constrained top-k found by checking candidates one by one; 30: by masking the vocabulary."""
    e, prompt = bad, prompt_of(bad)
    cfg = GenConfig(temperature=1.0, top_k=top_k, top_p=0.95, min_p=0.0, spec="on", drafter="model", draft_max=3,
                    max_tokens=1)
    e.target.sync(prompt[:-1])
    row = e.target.eval([prompt[-1]], logits="last")[0]
    e.target.truncate(len(prompt) - 1)
    if constraint == "grammar":
        cfg.grammar = WORDS_GBNF
        g = GrammarSampler(e.target_model, WORDS_GBNF)
        row = g.mask(row)
        g.close()
    else:
        top = np.argsort(-row)[:3]
        cfg.logit_bias = {int(top[0]): -np.inf, int(top[1]): 2.0, int(top[2]): -1.0}
        row = row.copy()
        for t, b in cfg.logit_bias.items():
            row[t] += b
    p = pool_eog(e, logits_to_probs(row, cfg))
    n, counts, drafted = 1500, np.zeros(p.size), 0
    for seed in range(n):
        tokens, _, st = run(e, prompt, cfg.with_(seed=seed))
        counts[tokens[0] if tokens else -1] += 1
        drafted += st.drafted
    assert drafted > n * 0.5
    fails, chi2, crit = _chi2_fails(counts, p, n)
    assert not fails, f"chi2 {chi2:.1f} > {crit:.1f}"
    assert counts[p == 0].sum() == 0  # nothing the constraint forbids was ever emitted


def test_a_grammar_that_does_not_parse_is_one_clear_error(perturbed):
    with pytest.raises(ConfigError, match="grammar could not be parsed"):
        perturbed.grammar("root ::= (")


def test_json_schema_grammar_validates():
    g = schema_grammar({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    assert "root ::=" in g
    with pytest.raises(ConfigError, match="JSON schema"):
        schema_grammar({"type": "object", "properties": {"n": {"$ref": "#/nowhere"}}})
    with pytest.raises(ConfigError, match="only local references"):  # never fetched
        schema_grammar({"type": "object", "properties": {"n": {"$ref": "https://example.com/s.json"}}})


def test_a_json_schema_string_never_holds_a_raw_control_character(perturbed):
    """JSON forbids raw control characters in a string: a newline inside a value would not parse."""
    m = perturbed.target_model
    g = GrammarSampler(m, schema_grammar({"type": "object", "properties": {"s": {"type": "string"}}}))
    try:
        for t in m.tokenize('{"s": "a', add_special=False)[1:]:  # [0]: the tokenizer's leading space
            g.accept(t)
        allowed = {c: g.allows(m.tokenize(c, add_special=False)[-1]) for c in ("b", "\n", "\r", "\t", "\x7f")}
    finally:
        g.close()
    assert allowed == {"b": True, "\n": False, "\r": False, "\t": False, "\x7f": False}


@pytest.mark.realpair
def test_real_pair_json_schema_and_logit_bias_are_exact_under_speculation(tmp_path, monkeypatch):
    from localspec.chat_format import Message
    from localspec.config import LoadConfig
    from localspec.engine import Engine

    paths = real_pair_paths()
    if paths is None:
        pytest.skip("the real pair is not installed")
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    e = Engine(paths[0], paths[1], LoadConfig(n_ctx=1024))
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "languages": {"type": "array", "items": {"type": "string"}}},
              "required": ["name", "age", "languages"], "additionalProperties": False}
    prompt = e.prompt_tokens([Message("user", "Describe a fictional programmer as JSON: name, age, languages.")])
    base = GenConfig(temperature=0.0, max_tokens=80, grammar=schema_grammar(schema))
    plain, text, _ = run(e, prompt, base.with_(spec="off"))
    obj = json.loads(text)
    assert set(obj) == {"name", "age", "languages"} and isinstance(obj["age"], int)
    for drafter in ("model", "ngram"):
        spec, _, st = run(e, prompt, base.with_(spec="on", drafter=drafter, draft_max=4))
        assert spec == plain, drafter
        assert st.drafted > 0
    free, _, _ = run(e, prompt, GenConfig(temperature=0.0, max_tokens=24, spec="off"))
    bias = {free[0]: -np.inf}  # the plain answer's first token is banned
    plain_b, _, _ = run(e, prompt, GenConfig(temperature=0.0, max_tokens=24, spec="off", logit_bias=bias))
    spec_b, _, _ = run(e, prompt, GenConfig(temperature=0.0, max_tokens=24, spec="on", drafter="model",
                                            logit_bias=bias))
    e.close()
    assert plain_b[0] != free[0] and spec_b == plain_b
