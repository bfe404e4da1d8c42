"""Several models behind one server, as Ollama and llama-server's router serve them: each request's
`model` picks one; a model loads on the first request that names it (one load at a time) and unloads
when `keep_alive` or `--idle-unload` runs out, when `POST /models/unload` or `keep_alive: 0` asks, or
when a new one needs its place (`--models-max`, the memory budget: least recently used first, never
one with a request running or waiting). With one model served, every name is that model (the
single-model contract: llama.vim sends "", aider "gpt-4o"). Each loaded model is its own
`ServerState` (its `ModelWorker`: lanes, caches, pass costs, n-gram memory, metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import LocalspecError
from ..machine import memory_bytes, process_rss, release_freed_memory
from ..models.catalog import CatalogEntry
from ..models.sizing import SERVE_CTX_FIT, fit_tokens, kv_bytes_per_token
from ..session import GenChoice, ModelChoice
from .apierrors import ApiError
from .state import ServerState

DEFAULT_NAME = "localspec"  # the default model's name on every server (llm's and the docs' `-m localspec`)
UNLOAD_WAIT_S = 30.0  # an idle model's threads leave llama.cpp within a pass; a measurement may take longer
EXPIRY_TICK_S = 1.0
BAD_NAME = re.compile(r"(^|[/\\])\.\.($|[/\\])|^[/\\~]|\x00")  # a path, `..`, or a NUL is never a model name


@dataclass
class Slot:
    """One catalog entry's place in the router."""
    entry: CatalogEntry
    state: ServerState | None = None  # set while loaded
    status: str = "unloaded"  # unloaded | loading | loaded | failed | lost (its process died: isolated.py)
    error: str | None = None
    loading: asyncio.Future | None = None
    last_used: float = 0.0
    expires_at: float | None = None  # monotonic; None: until evicted or asked to unload
    pending: int = 0  # requests routed here whose job is not queued yet
    unload_when_idle: bool = False
    estimate: int = 0  # bytes the load was expected to take (weights, KV, buffers)
    lost_worker: object = None  # an isolated model's worker whose process died: asked when its hosts answer
    loads: int = 0  # since the start: /metrics counts them (a soak's evictions under load)
    unloads: int = 0

    @property
    def busy(self) -> bool:
        srv = self.state.worker if self.state is not None else None
        return self.pending > 0 or (srv is not None and (bool(srv.jobs.running) or srv.jobs.qsize() > 0))


@dataclass
class Limits:
    models_max: int = 4  # llama-server's router default
    idle_unload_s: float | None = None  # --idle-unload; None: stay loaded


@dataclass
class Budget:
    """Memory for models: `--models-memory` bytes for the whole process, else what is free at each load."""
    limit: int | None = None
    overhead: int = 96 << 20  # per model beyond weights, KV and logits: compute buffers, the session's arrays
    reserve: int = 512 << 20  # without a limit: left free for the rest of the machine
    wait_s: float = 60.0  # how long a load waits for a busy model to free its place before a 503

    def room(self, rss: int) -> int:
        if self.limit is not None:
            return self.limit - rss
        free = memory_bytes()["available"]
        return free - self.reserve if free else 1 << 62


@dataclass
class LoadRecipe:
    """How every model is loaded: the user's choices, with each entry's files put in."""
    choice: ModelChoice
    gen: GenChoice
    load: Callable  # (state, ModelChoice, GenChoice) -> bool, setting state.worker or state.load_error
    notify: Callable[[str], None] = print


@dataclass
class Router:
    slots: list[Slot]
    recipe: LoadRecipe
    shared: ServerState  # the app's state: the key, the page, the default model's ModelWorker
    limits: Limits = field(default_factory=Limits)
    budget: Budget = field(default_factory=Budget)
    catalog: list[CatalogEntry] | None = None  # several models found offline; None: the one chosen at start
    models_dir: Path | None = None  # --models-dir: the folder the catalog came from (None: the data root's)

    def __post_init__(self):
        self._load_lock: asyncio.Lock | None = None
        self._expiry: asyncio.Task | None = None
        self.loads = 0  # completed loads (/health says ok once the first is done)
        self.closing = False  # set at the first Ctrl-C or SIGTERM
        self.base_rss = process_rss()  # the server before any model: counted in the budget

    @property
    def single(self) -> bool:
        """One model, chosen at start (`localspec serve NAME`, or the only one found): every name is it."""
        return self.catalog is None

    def rescan(self) -> None:
        """Models pulled or deleted while serving: new ones listed, unloaded ones whose files went dropped."""
        if self.single:
            return
        from ..models.catalog import find_models

        found = {e.name: e for e in find_models(self.models_dir)}
        self.slots = [s for s in self.slots if s.entry.name in found or s.status == "loaded"]
        known = {s.entry.name for s in self.slots}
        self.slots += [Slot(e) for name, e in found.items() if name not in known]

    @property
    def default(self) -> Slot:
        return self.slots[0]

    # --- finding ---------------------------------------------------------------------------------
    def find(self, name: str | None) -> Slot:
        """The slot a request's `model` names: any name when one model is served; else the exact name,
        an alias, `name:latest` or Ollama's `name:tag`; empty, missing or "localspec": the default."""
        if self.single or not name or name == DEFAULT_NAME:
            return self.default
        if BAD_NAME.search(name):
            raise ApiError(400, f'"model" {name!r} is a path, not a model name; GET /v1/models lists the names')
        wanted = [name, name.lower()]
        if ":" in name:
            base, tag = name.rsplit(":", 1)
            wanted += [base, f"{base}-{tag}", base.lower(), f"{base}-{tag}".lower()]
        for w in wanted:
            for slot in self.slots:
                if slot.entry.find(w):
                    return slot
        names = ", ".join(s.entry.name for s in self.slots)
        raise ApiError(404, f"model '{name}' not found; this server has: {names} (`localspec serve NAME` serves one "
                            "model under any name)", "not_found_error")

    def busy_besides(self, slot: Slot) -> bool:
        """Another loaded model answers: a model's idle measurements wait for it (same process, same cores)."""
        return any(s.busy for s in list(self.slots) if s is not slot and s.status == "loaded")

    def last_used_name(self) -> str | None:
        loaded = [s for s in self.slots if s.status == "loaded"]
        return max(loaded, key=lambda s: s.last_used).entry.name if loaded else None

    # --- using -----------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def use(self, name: str | None, keep_alive: float | None = None):
        """The loaded state of the named model for one request (loading it first), held against eviction
        until the request's job is queued; `keep_alive` (seconds; 0: unload after it, < 0: forever)."""
        slot = self.find(name)
        slot.pending += 1
        try:
            state = await self.ensure_loaded(slot)
            yield state
        finally:
            slot.pending -= 1
            slot.last_used = time.monotonic()
            self._set_keep_alive(slot, keep_alive)

    def _set_keep_alive(self, slot: Slot, keep_alive: float | None) -> None:
        if self.single or slot.status != "loaded":
            return
        if keep_alive is None:
            keep_alive = self.limits.idle_unload_s
        if keep_alive is None or keep_alive < 0:
            slot.expires_at = None
        elif keep_alive == 0:
            slot.unload_when_idle = True
        else:
            slot.expires_at = time.monotonic() + keep_alive

    async def ensure_loaded(self, slot: Slot) -> ServerState:
        if slot.status == "loaded" and slot.state is not None:
            if slot.state.worker is None or not slot.state.worker.lost:
                return slot.state
            await self._lose(slot)  # its process died since the last look: loaded again now
        if self.single and slot.status not in ("unloaded", "lost"):  # loading at start: 503 until then
            return self.shared
        if self.closing:
            raise ApiError(503, "the server is shutting down")
        if slot.loading is None:
            slot.loading = asyncio.ensure_future(self._load(slot))
        loading = slot.loading
        while not loading.done():  # a shutdown does not wait for a load: its requests get their 503 at once
            await asyncio.wait([loading], timeout=0.2)
            if self.closing:
                raise ApiError(503, "the server is shutting down")
        if loading.exception() is not None:
            raise loading.exception()
        if slot.status != "loaded":
            raise ApiError(503 if slot.error is None else 500,
                           f"model '{slot.entry.name}' could not be loaded: {slot.error or 'unknown reason'}")
        return slot.state

    async def _load(self, slot: Slot) -> None:
        if self._load_lock is None:
            self._load_lock = asyncio.Lock()
        try:
            async with self._load_lock:  # one load at a time: the second waits for the first's memory
                slot.status, slot.error = "loading", None
                choice = await self._make_room(slot)
                state = self.shared if slot is self.default else self.shared.sibling()
                ok = await asyncio.to_thread(self.recipe.load, state, choice, self.recipe.gen)
                if ok and self.closing:  # stopped while it loaded: freed now, not left to the process's exit
                    await asyncio.to_thread(state.worker.close, UNLOAD_WAIT_S)
                    ok, state.load_error = False, "the server is shutting down"
                if ok:
                    state.worker.neighbours_busy = lambda: self.busy_besides(slot)
                    slot.state, slot.status = state, "loaded"
                    slot.last_used, slot.unload_when_idle, slot.lost_worker = time.monotonic(), False, None
                    self.loads += 1
                    slot.loads += 1
                    self._set_keep_alive(slot, None)
                    session = state.worker.session
                    self.recipe.notify(f"ready: {state.model_id} "
                                       f"({session.selection.describe(head=session.engine.heads is not None)})")
                else:  # a lost model stays lost: it is tried again when its hosts answer
                    slot.status = "lost" if slot.lost_worker is not None else "failed"
                    slot.error = state.load_error or "the model did not load"
                    if not self.single:
                        self.recipe.notify(f"error: {slot.entry.name}: {slot.error}")
        except ApiError:  # no room: the model stays unloaded, the next request tries again
            slot.status, slot.error = "unloaded", None
            raise
        except LocalspecError as e:  # its file is missing, truncated or not a GGUF: this model fails, not others
            slot.status, slot.error = "lost" if slot.lost_worker is not None else "failed", str(e)
            self.recipe.notify(f"error: {slot.entry.name}: {e}")
        finally:
            slot.loading = None

    async def _make_room(self, slot: Slot) -> ModelChoice:
        """Evict idle models, least recently used first, until one more fits `--models-max` and the memory
        budget; waits for busy ones to finish, then answers 503 naming the memory it needs."""
        if self.single:
            return self.recipe.choice
        deadline = time.monotonic() + self.budget.wait_s
        while True:
            loaded = [s for s in self.slots if s.status == "loaded"]
            room = self.budget.room(max(process_rss(), self.base_rss + sum(s.estimate for s in loaded)))
            choice, need = self.choice_for(slot, room)
            if len(loaded) < self.limits.models_max and need <= room:
                slot.estimate = need
                return choice
            idle = sorted((s for s in loaded if not s.busy), key=lambda s: s.last_used)
            if idle:
                await self.unload(idle[0], why="to make room")
                continue
            if not loaded or time.monotonic() > deadline:  # nothing to wait for, or waited long enough
                raise ApiError(503, f"model '{slot.entry.name}' needs about {need >> 20} MiB and {max(0, room) >> 20} "
                                    f"MiB are free within the memory budget (--models-memory) with every other model "
                                    f"busy or unloaded; try again when a request ends, or raise the budget",
                               "server_error")
            await asyncio.sleep(0.25)

    def choice_for(self, slot: Slot, room: int) -> tuple[ModelChoice, int]:
        """The load options for an entry, with a context whose KV fits `room` (and under --models-memory a
        prompt cache of at most half what is left), and the bytes it will take at most."""
        e, base = slot.entry, self.recipe.choice
        if self.single:
            return base, 0
        choice = dataclasses.replace(base, **e.choice_fields())
        per_token, trained = kv_bytes_per_token(e.files) if e.files else (0, 0)
        fixed = e.size + self.budget.overhead + logits_bytes(e.files)
        limited = self.budget.limit is not None
        if base.ctx_size:
            n_ctx = base.ctx_size
        else:
            if limited:
                choice.memory_room = max(0, room - fixed)
            n_ctx = max(e.n_ctx, fit_tokens(per_token, trained, base.ctx_fit or SERVE_CTX_FIT, choice.memory_room))
        need = fixed + per_token * n_ctx
        if limited:  # saved prompts grow to their limit: it is part of the model's share
            choice.cache_ram_mib = min(base.cache_ram_mib, max(0, room - need) // 2 >> 20)
            need += choice.cache_ram_mib << 20
        return choice, need

    async def unload(self, slot: Slot, why: str = "") -> None:
        state = slot.state
        if state is None:
            return
        slot.status, slot.state, slot.expires_at, slot.unload_when_idle = "unloaded", None, None, False
        slot.unloads += 1
        await asyncio.to_thread(state.worker.close, UNLOAD_WAIT_S)
        if state is self.shared:
            state.worker = None  # the default model is loaded again into the app's state
        await asyncio.to_thread(release_freed_memory)
        self.recipe.notify(f"unloaded {slot.entry.name}" + (f" ({why})" if why else ""))

    # --- background: keep_alive, idle TTL, unload requests ----------------------------------------
    def start(self) -> None:
        self._expiry = asyncio.ensure_future(self._expire_loop())

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(EXPIRY_TICK_S)
            await self._watch_lost()
            now = time.monotonic()
            for slot in list(self.slots):
                if slot.status != "loaded" or slot.busy or self.single:
                    continue
                if slot.unload_when_idle or (slot.expires_at is not None and now >= slot.expires_at):
                    await self.unload(slot, why="keep_alive" if slot.unload_when_idle else "idle")

    async def _watch_lost(self) -> None:
        """A model whose process died (isolated.py: an RPC host gone) is marked lost, its state says why
        (/health, /props, /models), and it loads again once its hosts answer; a request naming it first
        tries at once."""
        for slot in list(self.slots):
            worker = slot.state.worker if slot.state is not None else None
            if slot.status == "loaded" and worker is not None and worker.lost:
                await self._lose(slot)
            elif slot.status == "lost" and slot.loading is None and not self.closing and slot.lost_worker is not None:
                if await asyncio.to_thread(slot.lost_worker.hosts_answer):
                    self.recipe.notify(f"{slot.entry.name}: loading it again")
                    with contextlib.suppress(Exception):  # a failed load leaves it failed, for the next request
                        await self.ensure_loaded(slot)

    async def _lose(self, slot: Slot) -> None:
        worker = slot.state.worker
        slot.status, slot.error, slot.lost_worker = "lost", worker.lost, worker
        slot.state.worker, slot.state.load_error, slot.state = None, worker.lost, None
        self.recipe.notify(f"error: {slot.entry.name}: {worker.lost}")
        await asyncio.to_thread(worker.close, 1.0)

    def samples(self) -> list[tuple[str, str, str, str, int]]:
        """/metrics rows of the router itself: each model's loads and unloads since the start."""
        if self.single:
            return []
        return [(name, "counter", help_, f'model="{s.entry.name}"', getattr(s, field))
                for name, field, help_ in (("localspec:model_loads_total", "loads", "Times the model was loaded."),
                                           ("localspec:model_unloads_total", "unloads", "Times the model was unloaded "
                                            "(evicted, expired or asked to)."))
                for s in self.slots]

    def loaded_states(self) -> list[tuple[Slot, ServerState]]:
        """(slot, state) of each model loaded now, its ModelWorker there to ask."""
        return [(s, s.state) for s in list(self.slots)
                if s.status == "loaded" and s.state is not None and s.state.worker is not None]

    def close_all(self) -> bool:
        """Shutdown: every model's session closed (False when one is still inside llama.cpp)."""
        freed = True
        for slot, state in self.loaded_states():
            if not state.worker.close():
                freed = False
        return freed


def logits_bytes(files: list) -> int:
    """A batch's logits, float32 for every token of the vocabulary, in each model of the entry."""
    from ..config import LoadConfig
    from ..models.check import vocab_info_from_header

    return sum(4 * LoadConfig().n_batch * vocab_info_from_header(p).n_tokens for p in files)


def placeholder_router(state: ServerState) -> Router:
    """One model that never loads by itself: what a hand-made state (the page's tests) answers with."""
    router = Router([Slot(CatalogEntry("localspec"), status="loading")],
                    LoadRecipe(ModelChoice(), GenChoice(), lambda *args: False), state)
    return router


def begin_shutdown_all(router: Router) -> None:
    router.closing = True
    for _, state in router.loaded_states():
        if not state.worker.closing:
            threading.Thread(target=state.worker.begin_shutdown, name="localspec-stop", daemon=True).start()

