"""The one internal chat request and the one event stream every protocol translates to and from, and the
figures every answer carries (llama-server's `timings`, localspec's own).

A protocol module turns its request body into a `ChatRequest` (a conversation or a prompt of its own,
tools, generation settings), opens it as a `bridge.Run` and turns its events (`Text`, `ToolCall`, `End`)
into its own JSON or stream: OpenAI chat completions, Anthropic Messages, OpenAI Responses and Ollama's API share the
same engine, speculation, tools, constraints, prompt cache and stats underneath.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Callable

from starlette.requests import Request

from ..chat_format import Message
from ..config import GenConfig
from ..errors import LocalspecError
from .apierrors import ApiError, api_error, check_prompt_fits
from .bridge import Run
from .settings import Extras
from .state import ServerState
from .tools import ToolRequest, call_grammar, require_tools_template


@dataclass
class ChatRequest:
    cfg: GenConfig
    extras: Extras
    messages: list[Message] = field(default_factory=list)
    tools: ToolRequest | None = None
    prompt: Callable[[object], list[int]] | None = None  # engine -> tokens: a prompt that is not a conversation
    slot: str | None = None  # an editor slot (a newer request from it supersedes this one)


# --- the figures every protocol's answer carries: llama-server's `timings` and localspec's own ----------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def timings(st) -> dict:
    """llama-server's `timings`, by its definitions: the prompt's pass, whose last row gives the first
    token, is `prompt_n` tokens in `prompt_ms` (the engine evaluates the prompt's last token in it too);
    `predicted_ms` runs from there to the last token, and `predicted_per_second` is the tokens after the
    first (end of text included, as llama-server counts it) over that time."""
    prompt_s, gen_s, prompt_n = st.prompt_eval_s, st.generation_s, st.prompt_eval_tokens
    steps = st.decode_steps
    t = {
        "cache_n": max(0, st.prompt_tokens - prompt_n),
        "prompt_n": prompt_n,
        "prompt_ms": prompt_s * 1e3,
        "prompt_per_token_ms": prompt_s * 1e3 / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / prompt_s if prompt_s > 0 else 0.0,
        "predicted_n": st.tokens,
        "predicted_ms": gen_s * 1e3,
        "predicted_per_token_ms": gen_s * 1e3 / steps if steps else 0.0,
        "predicted_per_second": steps / gen_s if gen_s > 0 else 0.0,
    }
    if st.drafted:
        t["draft_n"] = st.drafted
        t["draft_n_accepted"] = st.accepted
    return t


def localspec_stats(st) -> dict:
    return {
        "spec": st.spec_mode,
        "drafters": sorted(st.drafted_by_drafter),
        "acceptance_rate": round(st.acceptance_rate, 4),
        "mean_accepted_length": round(st.mean_accepted_length, 4),
        "target_passes": st.target_passes,
        "rounds_plain": st.rounds_plain,
        "drafted_by_drafter": st.drafted_by_drafter,
        "accepted_by_drafter": st.accepted_by_drafter,
        "tokens_by_source": st.tokens_by_source,
        "stop_reason": st.stop_reason,
        "policy": st.policy,
        "speedup_estimate": st.speedup_estimate,
        "stats": st.to_dict(),  # every figure (what `localspec run --json` prints), for clients that want it
    }


def live_fields(live) -> dict:
    """llama-server's `timings_per_token`: a streamed piece's figures so far; localspec adds which model
    the piece's last token came from ("target", or "model"/"ngram" for an accepted draft)."""
    source, st = live
    return {"timings": timings(st), "localspec": {"source": source or "target", "stats": st.to_dict()}}


def conversation(state: ServerState, messages: list[Message]) -> list[Message]:
    """The turns the model sees: `serve --system` goes first in conversations that bring no system turn."""
    turns = list(messages)
    system = state.worker.session.system
    if system and not any(m.role == "system" for m in turns):
        turns.insert(0, Message("system", system))
    return turns


def _prepare(state: ServerState, chat: ChatRequest):
    if chat.prompt is not None:
        return lambda engine: (chat.prompt(engine), chat.cfg)
    turns = conversation(state, chat.messages)
    tools = chat.tools.tools if chat.tools else None
    return lambda engine: (engine.prompt_tokens(turns, tools=tools), chat.cfg)


async def open_chat(request: Request, state: ServerState, chat: ChatRequest) -> Run:
    """Queue the request; returns once its prompt is accepted (an error before any text raises)."""
    if chat.tools is not None:
        require_tools_template(state.worker.engine.chat_template())
        forced = call_grammar(chat.tools)
        if forced and chat.cfg.grammar:
            raise ApiError(400, "a required tool call and a structured output format cannot both shape one answer")
        chat.cfg.grammar = forced or chat.cfg.grammar
    prompt = await _fitting_prompt(state, chat)
    run = Run(state, lambda engine: (prompt, chat.cfg), chat.extras, slot=chat.slot, tools=chat.tools)
    await run.start(request)
    return run


async def _fitting_prompt(state: ServerState, chat: ChatRequest) -> list[int]:
    """The request's prompt tokens, made off the event loop before it queues: one that does not fit the
    context is a 400 at once, whatever the lanes are doing."""
    engine = state.worker.engine
    try:
        prompt, _ = await asyncio.to_thread(_prepare(state, chat), engine)
    except LocalspecError as e:
        raise api_error(e) from None
    check_prompt_fits(engine, prompt)
    return prompt


async def prompt_size(engine, messages: list[Message], tools: list | None) -> int:
    """How many tokens a conversation takes as a prompt (the count_tokens endpoints), off the event loop."""
    try:
        return len(await asyncio.to_thread(engine.prompt_tokens, messages, False, tools))
    except LocalspecError as e:
        raise api_error(e) from None


def joined_text(content, where: str, text_kinds: tuple[str, ...], skipped: tuple[str, ...] = ()) -> str:
    """A string, or the text of a list of typed parts joined (parts of a kind in `skipped` dropped); any
    other part is a 400 that names it."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where} must be a string or a list of content parts")
    parts = []
    for i, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in text_kinds and isinstance(p.get("text"), str):
            parts.append(p["text"])
        elif kind not in skipped:
            raise ApiError(400, f"{where}[{i}]: {kind or 'a part without a type'} parts are not supported here "
                                f"(only {', '.join(text_kinds)})")
    return "".join(parts)
