"""Conversations through a GGUF's chat template."""

from __future__ import annotations

import pytest


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
