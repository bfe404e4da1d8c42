"""A loaded target's prompts (`Prompts`): its chat template, a conversation as tokens or text, the context
check. Shared by `Engine` and by a server's view of a model that runs in another process
(serving/isolated.py), which has the vocabulary and the load but no weights."""

from __future__ import annotations

from .chat_format import CHATML, Message, chat_text, prompt_tokens
from .errors import ConfigError, ContextFullError


class Prompts:
    """Needs `self.load` (a LoadConfig), `self.target_model` (a Model) and `self.target.n_ctx`."""

    def _own_template(self) -> str | None:
        return self.load.chat_template or self.target_model.chat_template()

    def chat_template(self) -> str:
        """The template asked for, else the GGUF's, else ChatML (llama-server's fallback: `template_note`)."""
        return self._own_template() or CHATML

    def template_note(self) -> str | None:
        """What a load without any chat template tells its user, once."""
        if self._own_template():
            return None
        return (f"{self.target_model.path.name} has no chat template in its GGUF: ChatML is used, as llama-server "
                "does (--chat-template gives another, --raw sends plain text)")

    def prompt_tokens(self, messages: list[Message] | str, raw: bool = False, tools: list | None = None) -> list[int]:
        return prompt_tokens(self.target_model, self.chat_template(), messages, raw, tools)

    def chat_text(self, messages: list[Message] | str, tools: list | None = None) -> str:
        """The conversation as the model's chat template writes it (llama-server's /apply-template)."""
        return chat_text(self.target_model, self.chat_template(), messages, tools)

    def check_prompt(self, prompt: list[int]) -> None:
        if not prompt:
            raise ConfigError("empty prompt; give some text to answer")
        if len(prompt) >= self.target.n_ctx:
            raise ContextFullError(f"the prompt is {len(prompt)} tokens but the context holds "
                                   f"{self.target.n_ctx}; shorten it or raise --ctx-size",
                                   n_prompt=len(prompt), n_ctx=self.target.n_ctx)

    def cached_prefix(self, tokens: list[int]) -> int:
        """How much of `tokens` a cache holds already (an editor's window choice prefers those); none here."""
        return 0
