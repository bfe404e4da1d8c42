"""Render a conversation with the chat template stored in the GGUF (a Jinja template, as HF does).

A model without a template gets ChatML, as llama-server gives it, and the load says so in one note;
`--chat-template` and a pair's `chat_template` setting override either; `--raw` sends the text as-is.
"""

from __future__ import annotations

import datetime as _dt
import functools
from dataclasses import dataclass

from .errors import ConfigError


@dataclass
class Message:
    """One message of a conversation, as the chat template reads it."""
    role: str
    content: str
    extra: dict | None = None  # what else the template reads: an assistant's tool_calls, a tool's tool_call_id


# The roles a conversation may hold, and the names clients use for them: newer OpenAI SDKs and agents
# send `developer` where older ones send `system`; chat templates know only the latter.
ROLES = ("system", "user", "assistant", "tool")
ROLE_ALIASES = {"developer": "system"}


def canonical_role(role: str) -> str | None:
    """The role a template renders for a client's role name, or None for a role no template knows."""
    role = ROLE_ALIASES.get(role, role)
    return role if role in ROLES else None


CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
          " + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
BUILTIN_TEMPLATES = {"chatml": CHATML}  # names --chat-template takes, as llama-server's does


def template_arg(value: str) -> str:
    """A `--chat-template` value: a built-in name or a Jinja template, checked to compile."""
    template = BUILTIN_TEMPLATES.get(value.strip().lower(), value)
    try:
        _compiled(template)
    except Exception as e:  # jinja2's TemplateSyntaxError, or anything else it cannot read
        raise ConfigError(f"--chat-template does not compile ({e}); give a Jinja chat template or one of: "
                          f"{', '.join(BUILTIN_TEMPLATES)}") from None
    return template


def _raise(msg):
    raise ConfigError(f"the chat template refused this conversation: {msg}")


def _tojson(x, indent=None, separators=None, sort_keys=False, ensure_ascii=False):
    """HF's and llama.cpp's `tojson`: plain JSON in the given key order (Jinja's own escapes HTML and sorts)."""
    import json

    return json.dumps(x, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    """The template compiled once per process: compiling is hundreds of times dearer than rendering, and it
    would sit in every request's time to first token."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals.update(raise_exception=_raise,
                       strftime_now=lambda fmt: _dt.datetime.now().strftime(fmt))
    env.filters["tojson"] = _tojson
    return env.from_string(template)


def render_prompt(template: str | None, messages, model, name: str = "model", tools: list | None = None) -> str:
    if not template:
        raise ConfigError(f"{name} has no chat template in its GGUF; use --raw to send plain text, "
                          "or set chat_template for the pair in models.yaml")
    try:
        from jinja2.exceptions import TemplateError
    except ImportError:  # pragma: no cover - jinja2 comes with llama-cpp-python
        raise ConfigError("jinja2 is needed to render chat templates; pip install jinja2")
    bos = model.token_text(model.bos) if model.bos >= 0 else ""
    eos = model.token_text(model.eos) if model.eos >= 0 else ""
    try:
        return _compiled(template).render(
            messages=[{"role": m.role, "content": m.content, **(getattr(m, "extra", None) or {})} for m in messages],
            tools=tools or None, add_generation_prompt=True, bos_token=bos, eos_token=eos)
    except TemplateError as e:
        raise ConfigError(f"the chat template of {name} failed to render ({e}); use --raw")


def chat_text(model, template: str | None, messages: list[Message] | str, tools: list | None = None) -> str:
    """The conversation as `template` writes it for `model` (llama-server's /apply-template)."""
    if isinstance(messages, str):
        messages = [Message("user", messages)]
    return render_prompt(template, messages, model, name=model.path.name, tools=tools)


def prompt_tokens(model, template: str | None, messages: list[Message] | str, raw: bool = False,
                  tools: list | None = None) -> list[int]:
    """The tokens `model` evaluates for a conversation (or, `raw`, its text as it is); the BOS once."""
    if raw:
        text = messages if isinstance(messages, str) else "".join(x.content for x in messages)
        return model.tokenize(text, add_special=True, parse_special=False)
    text = chat_text(model, template, messages, tools)
    bos_text = model.token_text(model.bos) if model.add_bos else ""
    add_bos = model.add_bos and not (bos_text and text.startswith(bos_text))
    return model.tokenize(text, add_special=add_bos, parse_special=True)
