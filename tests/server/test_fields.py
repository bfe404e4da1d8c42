"""Request fields, tool calls and timings as the protocols read and write them."""

from __future__ import annotations

import json

import pytest

from localspec.config import GenConfig
from localspec.server.apierrors import ApiError
from localspec.server.protocols.llama_api import pick_fields
from localspec.server.settings import gen_settings


def test_request_fields():
    base = GenConfig(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, max_tokens=99)
    cfg, ex = gen_settings({"samplers": ["top_k", "top_p", "infill"], "n_predict": 7, "speculative.n_max": 3,
                            "speculative": {"n_min": 2}, "drafter": "ngram", "stream": True}, base, oai=False)
    assert (cfg.top_k, cfg.top_p, cfg.min_p, cfg.temperature) == (40, 0.95, 0.0, 1.0)  # as llama-server's chain
    assert (cfg.max_tokens, cfg.draft_max, cfg.draft_min, cfg.drafter, ex.stream) == (7, 3, 2, "ngram", True)
    cfg, _ = gen_settings({"max_tokens": 5, "max_completion_tokens": 6, "stop": "x", "seed": -1}, base, oai=True)
    assert (cfg.max_tokens, cfg.stop, cfg.seed) == (6, ["x"], None)
    assert base.max_tokens == 99 and base.stop == []  # the server's defaults are never changed by a request
    for bad in ({"top_p": 2}, {"top_k": 1.5}, {"n": 2}, {"speculative": 3}, {"stream_options": []}):
        with pytest.raises(ApiError):
            gen_settings(bad, base, oai=True)
    assert pick_fields({"a": {"b": 1}, "c": 2}, ["a/b", "c", "", "x/y"]) == {"a/b": 1, "c": 2}


def test_tool_calls_with_doubled_braces_are_parsed():
    """Qwen2.5-Coder 1.5B, given a system prompt, answers '{{"name": ..., "arguments": {...}}}' (measured);
    the call inside is taken, and ordinary text with braces stays text."""
    from localspec.server.tools import split_calls

    names = ["get_weather"]
    for text in ('{{"name": "get_weather", "arguments": {"city": "Paris"}}}',
                 '{{"name": "get_weather", "arguments": {"city": "Paris"}}}}'):
        content, calls = split_calls(text, names)
        assert content == "" and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    for text in ('{{"name": "other", "arguments": {}}}', '{{ not json }}', '{"name": "get_weather"} and more'):
        assert split_calls(text, names) == (text, [])


def test_timings_count_as_llama_server_does():
    """The first token comes from the prompt's pass (its last token is evaluated there): llama-server
    counts that pass and token in the prompt, and its decode rate is the tokens after the first (end of
    text included) over the time after the prompt."""
    from localspec.server.request import timings
    from localspec.stats import Stats

    st = Stats(prompt_tokens=30, prompt_eval_tokens=21, prompt_eval_s=0.35, tokens=90, target_passes=90,
               generation_s=3.0, stop_reason="eos")
    t = timings(st)
    assert (t["cache_n"], t["prompt_n"], t["predicted_n"]) == (9, 21, 90)
    assert t["prompt_ms"] == pytest.approx(350) and t["predicted_ms"] == pytest.approx(3000)
    assert t["predicted_per_second"] == pytest.approx(30.0) and t["predicted_per_token_ms"] == pytest.approx(100 / 3)
    cut = timings(Stats(prompt_tokens=5, prompt_eval_tokens=5, tokens=10, target_passes=10, generation_s=0.9,
                        stop_reason="length"))
    assert cut["predicted_per_second"] == pytest.approx(10.0) and cut["cache_n"] == 0
    assert timings(Stats(prompt_tokens=5))["predicted_per_second"] == 0.0  # nothing generated yet
