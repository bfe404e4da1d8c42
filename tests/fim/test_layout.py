"""Fill-in-the-middle prompts: llama-server's layout, its budgets, a model without FIM tokens refused."""

from __future__ import annotations

import pytest

from harness.tinygguf import FIM_TOKENS
from localspec.fim import layout as fimmod


def test_fim_prompt_layout(fim_engine):
    m = fim_engine.target_model
    fim = m.fim_tokens()
    assert set(fim) == set(FIM_TOKENS)
    body = {"input_prefix": "def read", "input_suffix": "return data", "prompt": "the",
            "input_extra": [{"filename": "a.py", "text": "import csv"}]}
    toks = fimmod.infill_tokens(m, body, body["input_extra"], 4096, 16)

    def t(s):
        return m.tokenize(s, add_special=False)
    expected = ([fim["rep"], *t("myproject\n"), fim["sep"], *t("a.py\n"), *t("import csv"), fim["sep"], *t("filename\n"),
                 m.bos, fim["pre"], *t("def read"), *t("the"), fim["suf"], *t("return data"), fim["mid"]])
    assert toks == expected
    assert fimmod.fim_stop_tokens(m) == {fim["pad"], fim["rep"], fim["sep"]}


def test_fim_budgets_keep_the_end_of_the_prefix_and_the_newest_extra(fim_engine):
    m = fim_engine.target_model
    long_prefix = "the cache " * 2000
    toks = fimmod.infill_tokens(m, {"input_prefix": long_prefix, "input_suffix": "", "prompt": ""}, [], 4096, 0)
    pre = toks.index(m.fim_tokens()["pre"])
    assert len(toks) - pre - 3 == 3 * fimmod.FIM_BATCH // 4  # 3/4 of a batch of prefix, its end
    extra = [{"text": "word " * 3000}]
    toks = fimmod.infill_tokens(m, {"input_prefix": "a", "input_suffix": "", "prompt": ""}, extra, 4096, 100)
    assert toks.index(m.fim_tokens()["pre"]) <= 4096 - fimmod.FIM_BATCH - 2 * 100 + 1


def test_a_model_without_fim_tokens_is_refused(tiny):
    with pytest.raises(fimmod.FimUnsupported, match="suffix"):
        fimmod.require_fim({"pre": 1, "mid": 2})
