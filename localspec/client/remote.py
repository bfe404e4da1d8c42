"""`localspec chat` through a running `localspec serve` that holds the same pair: a `RemoteSession`
with the face of `session.Session` (selection, gen, engine, notes) whose engine answers over HTTP.

The pair is loaded once, in the server, and the chat shares it with every other client (an editor,
an agent) instead of loading a second copy that would compete for the same cores and memory; its
answers are batched with theirs (`--parallel`). The chat's figures stay live: each streamed piece
asks for llama-server's `timings_per_token`, and the server adds which model the piece came from
and the whole `Stats` so far. Stdlib and the package's own modules only.
"""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Callable, Iterator

from ..chat_format import Message
from ..costs.costmodel import CostProfile
from ..errors import LocalspecError
from ..session import GenChoice, ModelChoice, Selection, gen_config
from ..text import Chunk
from . import connect as client


class RemotePrompt(list):
    """A conversation's token ids as the server formats it, carrying the conversation: the answer is
    asked for by its messages, so the server evaluates exactly these tokens."""

    def __init__(self, tokens: list[int], messages: list[Message]):
        super().__init__(tokens)
        self.messages = messages


@dataclass
class ServerContext:
    n_ctx: int


class RemoteEngine:
    """What the chat needs of an `Engine` (prompt sizes, the context, the cost profile, a stream of
    confirmed text with each piece's source, `last_stats`), answered by the server."""

    def __init__(self, ep: client.Endpoint, props: dict):
        info = props["localspec"]
        self.ep = ep
        self.target = ServerContext(int(props["default_generation_settings"]["n_ctx"]))
        self.profile = _profile(info.get("profile"))
        self.add_bos, self.bos_id = bool(info.get("add_bos")), info.get("bos_id", -1)
        self.draft_path = None  # the server holds the draft: nothing to load here
        self.last_stats = None

    def prompt_tokens(self, messages: list[Message]) -> RemotePrompt:
        """/apply-template then /tokenize: the tokens the server will evaluate for this conversation."""
        text = self._post("/apply-template", {"messages": _messages(messages)})["prompt"]
        tokens = self._post("/tokenize", {"content": text, "add_special": False, "parse_special": True})["tokens"]
        if self.add_bos and (not tokens or tokens[0] != self.bos_id):  # as Engine.prompt_tokens adds it
            tokens = [self.bos_id, *tokens]
        return RemotePrompt(tokens, list(messages))

    def generate(self, prompt: RemotePrompt, cfg, cancel: Callable[[], bool] | None = None) -> Iterator[Chunk]:
        """Confirmed text as the server streams it, each piece with the source of its last token;
        `last_stats` follows the answer. Cancelling hangs up, and the server stops the answer."""
        pairs = [(m.role, m.content) for m in prompt.messages]
        path, body = client.request_body(pairs, cfg, raw=False)
        body["timings_per_token"] = True
        self.last_stats = None
        events = client.stream_events(self.ep, path, body)
        try:
            for event in events:
                self.last_stats = client.event_stats(event) or self.last_stats
                text = client.event_text(event)
                if text:
                    yield Chunk(text, None, (event.get("localspec") or {}).get("source") or "target")
                if cancel and cancel():
                    if self.last_stats is not None:
                        self.last_stats.stop_reason = "cancelled"
                    return
        except client.ServerFailed as e:
            raise LocalspecError(f"{e} (answered by the server at {self.ep.host}:{self.ep.port})") from None
        except (OSError, ValueError, http.client.HTTPException) as e:
            raise self._gone(e) from None
        finally:
            events.close()

    def _post(self, path: str, body: dict) -> dict:
        conn = self.ep.connection(client.silence_s())
        try:
            conn.request("POST", path, body=self.ep.payload(body), headers=self.ep.headers())
            resp = conn.getresponse()
            raw = resp.read()
            if resp.status != 200:
                raise LocalspecError(f"{client.error_message(raw)} (answered by the server at "
                                     f"{self.ep.host}:{self.ep.port})")
            return json.loads(raw)
        except (OSError, ValueError, http.client.HTTPException, socket.timeout) as e:
            raise self._gone(e) from None
        finally:
            conn.close()

    def _gone(self, e: BaseException) -> LocalspecError:
        return LocalspecError(f"the server at {self.ep.host}:{self.ep.port} stopped answering ({e}); "
                              "start the chat with --local to load the models here")

    def load_draft(self) -> None:
        pass  # the server holds the draft

    def close(self) -> None:
        pass


class RemoteSession:
    """A session (`SessionFace`) whose pair is loaded in a running server, which measures its own costs."""
    system = None

    def __init__(self, selection: Selection, gen, engine: RemoteEngine, label: str):
        self.selection, self.gen, self.engine = selection, gen, engine
        self.notes = [f"answering through the localspec server at {engine.ep.host}:{engine.ep.port} ({label}), "
                      "which holds this pair; --local loads the models here instead"]

    def ensure_profile(self, notify=None, spec: str | None = None, measure: bool = True):
        return self.engine.profile  # the server measures its own

    def costs_pending(self) -> bool:
        return False

    def measure_when_idle(self, busy, request) -> None:
        pass  # the server measures its own

    def measurement_word(self) -> str | None:
        return None  # the server's: GET /metrics or `localspec doctor`

    def elapsed(self, stats, t_call: float, now: float) -> float:
        return stats.generation_s  # the server's own figures: not the wait in its queue, nor HTTP

    def wants_draft(self) -> bool:
        return False

    def close(self) -> None:
        pass


def attach(models: ModelChoice, gen: GenChoice, notify=None) -> RemoteSession | None:
    """A session through the running server when it holds this pair, loaded as asked; None otherwise."""
    found = client.find_server(models, notify)
    if found is None:
        return None
    ep, props, sel = found
    try:
        engine = RemoteEngine(ep, props)
    except (KeyError, TypeError, ValueError):  # not the /props this version serves
        return None
    return RemoteSession(sel, gen_config(gen, sel), engine, client.server_label(props))


def _messages(messages: list[Message]) -> list[dict]:
    return [{"role": m.role, "content": m.content} for m in messages]


def _profile(data) -> CostProfile | None:
    if not isinstance(data, dict):
        return None
    try:
        return CostProfile(**data)
    except TypeError:
        return None
