"""The state handlers see: one served model's (`ServerState`), beside what the whole server shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..serving.worker import ModelWorker


@dataclass
class ServerState:
    api_key: str | None = None
    worker: ModelWorker | None = None  # the loaded model behind its queue; None while loading
    model_id: str = "localspec"
    aliases: set[str] = field(default_factory=set)
    load_error: str | None = None
    webui: bool = True  # the page at `/` (off: --no-webui)
    history: object = None  # history.HistoryStore, opened when the page first asks for conversations
    router: object = None  # router.Router: which model a request's `model` names, loaded on demand

    def sibling(self) -> "ServerState":
        """A state for another model of the same server: the key, the page and the router shared."""
        return ServerState(api_key=self.api_key, webui=self.webui, router=self.router)
