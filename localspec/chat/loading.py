"""The chat app's loading: the pair loads in a thread worker (workers.load_session), which posts its steps and
the result; these handlers show them (`ChatApp` mixes this in)."""

from __future__ import annotations

import time
from pathlib import Path

from textual import work
from textual.content import Content
from textual.widgets import Static

from .messages import Loaded, LoadFailed, LoadStep
from .state import State
from .workers import load_session


class LoadingEvents:
    @work(thread=True, group="load", exit_on_error=False)
    def _load(self) -> None:
        result = load_session(self.options.models, self.options.gen, self._post, self.options.local)
        with self._engine_lock:
            if self._closing and isinstance(result, Loaded):
                result.session.close()
                return
        self._post(result)

    async def switch_model(self, fields: dict, name: str) -> None:
        """/model NAME: the conversation stays; the old session closes and the new one loads in its place."""
        with self._engine_lock:
            old, self.session = self.session, None
        if old is not None:
            old.close()
        for key, value in fields.items():
            setattr(self.options.models, key, value)
        self.loading, self.state, self.load_error = True, State.LOADING, None
        self._load_started, self._load_text = time.monotonic(), f"loading {name}"
        await self.say(f"switching to {name}; the conversation goes on with it", "info")
        self.refresh_status()
        self._load()

    def _post(self, message) -> None:
        try:
            self.post_message(message)
        except RuntimeError:  # the event loop is gone (the app has exited)
            pass

    def on_load_step(self, msg: LoadStep) -> None:
        self._load_text = msg.text
        self._tick_loading()

    def _tick_loading(self) -> None:
        if not self.loading:
            self._load_ticker.stop()  # no timer waking the UI while replies stream
            return
        try:
            label = self.query_one("#load-label", Static)
        except Exception:
            return
        label.update(Content(f"{self._load_text}… {time.monotonic() - self._load_started:.1f} s"))

    async def on_loaded(self, msg: Loaded) -> None:
        with self._engine_lock:
            self.session = msg.session
        self.cfg = msg.session.gen
        for k, v in self.overrides.items():
            setattr(self.cfg, k, v)
        self.state = State.READY
        await self._remove_loading()
        e = self.engine
        sel = msg.session.selection
        bits = [f"target {Path(sel.target).name}",
                f"draft {Path(sel.draft).name}" if sel.draft else "its NextN head drafts" if getattr(e, "heads", None)
                else "no draft model (n-gram drafts only)",
                f"context {e.target.n_ctx}"]
        if e.profile is not None:
            rel = e.profile.relative_verify()
            bits.append(f"measured: decode {1000 * e.profile.t_decode:.1f} ms, verify(5) {rel[min(4, len(rel) - 1)]:.2f}×")
        notes = "".join(f"\n{n}" for n in msg.session.notes)  # e.g. answered through a running server
        await self.say(f"ready in {msg.seconds:.1f} s · " + " · ".join(bits) + notes, "ok")
        self.loading = False
        self.refresh_status()
        await self.send_queued()

    async def on_load_failed(self, msg: LoadFailed) -> None:
        await self.fail_load(msg.error)

    async def fail_load(self, error: str) -> None:
        self.load_error = error
        if self.queued:  # nothing typed is lost: the first queued message goes back into the box
            box = self.prompt_box
            if not box.text.strip():
                box.load_text(self.queued[0][0])
            self.queued.clear()
        self.state = State.NO_MODEL
        await self._remove_loading()
        await self.say(f"could not start: {error}\nFix that and start `localspec chat` again; "
                       "/history and /help still work here, ctrl+q quits.", "error")
        self.loading = False
        self.refresh_status()

    async def _remove_loading(self) -> None:
        for w in self.query("#loading"):
            await w.remove()
