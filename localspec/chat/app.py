"""`localspec chat`: a Textual app that streams only verified tokens.

Threads: the models load in one thread worker and each reply is generated in another
(workers.py: plain functions); they talk to the UI only by posting messages (messages.py), and
the reply is written to the history database by its worker, so a reply in flight is saved even
while the UI is shutting down. The UI thread renders: Markdown streamed as confirmed text arrives
and updated once in full at the end, the provenance view, the live status bar. The loading's and the
replies' handlers are mixed in (loading.py, replies.py); slash commands live in one table (slash.py), the
styles in app.tcss.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Footer, LoadingIndicator, Static

from ..chat_format import Message
from ..errors import LocalspecError
from ..history import HistoryError, HistoryStore
from ..session import gen_config
from .conversation import Conversation
from .loading import LoadingEvents
from .messages import Turn
from .options import ChatOptions
from .replies import ReplyEvents
from .resume import resume_conversation
from .slash import BY_NAME, help_text
from .state import State
from .status import Live, format_status
from .widgets import AssistantMessage, Notice, PromptInput, StatusBar, UserMessage
from .workers import generate_reply

MAX_VIEWS = 200  # messages and notices kept on screen (older ones stay in the history)


class ChatApp(LoadingEvents, ReplyEvents, App):
    TITLE = "localspec chat"
    ENABLE_COMMAND_PALETTE = False
    CSS_PATH = "app.tcss"
    BINDINGS = [
        Binding("ctrl+q", "quit", "quit", priority=True),
        Binding("escape", "cancel", "cancel", priority=True),
        Binding("ctrl+t", "toggle_provenance", "provenance", priority=True),
        Binding("ctrl+y", "copy_reply", "copy reply", priority=True),
        # the conversation scrolls while the prompt box keeps the focus, as in a terminal's scrollback
        Binding("pageup", "scroll_conversation(-1)", show=False, priority=True),
        Binding("pagedown", "scroll_conversation(1)", show=False, priority=True),
        Binding("ctrl+home", "scroll_conversation(-1000000)", show=False, priority=True),
        Binding("ctrl+end", "scroll_conversation(1000000)", show=False, priority=True),
    ]

    def __init__(self, options: ChatOptions | None = None, history_path: str | Path | None = None) -> None:
        super().__init__()
        self.options = options = options or ChatOptions()
        self.session = None  # the loaded Session (session.py), once the load worker is done
        self.cfg = None
        self.overrides: dict = {}  # settings changed by slash commands (survive the load)
        self.provenance = False
        self.generating = False
        self.loading = True
        self.load_error: str | None = None
        self.last_reply: str = ""
        self.last_stats = None
        self.last_live: Live | None = None
        self.state = State.LOADING
        self.current: Turn | None = None
        self.queued: list[tuple[str, UserMessage]] = []  # typed while the model loads: sent when ready
        self.replies = 0  # replies finished (or failed) in this session
        self._cancel = threading.Event()
        self._gen_done = threading.Event()
        self._gen_done.set()
        self._engine_lock = threading.Lock()
        self._closing = False
        self._load_started = time.monotonic()
        self._load_text = "starting"
        self.store: HistoryStore | None = None
        self.store_error: str | None = None
        try:
            self.store = HistoryStore(history_path)
        except HistoryError as e:
            self.store_error = str(e)
        self.conversation = Conversation(self.store, options.gen.system)

    # --- layout -------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with VerticalScroll(id="conversation"):
            yield Notice(self.banner(), "banner")
            with Horizontal(id="loading"):
                yield LoadingIndicator()
                yield Static("", id="load-label")
        try:
            history = self.store.recent_prompts() if self.store else []
        except Exception:  # a damaged history must not keep the chat from starting
            history = []
        yield PromptInput(history, id="prompt")
        yield StatusBar(id="status")
        yield Footer()

    def banner(self) -> str:
        return ("localspec chat — every token shown has been verified by the target model.\n"
                + help_text())

    @property
    def conv(self) -> VerticalScroll:
        return self.query_one("#conversation", VerticalScroll)

    @property
    def prompt_box(self) -> PromptInput:
        return self.query_one("#prompt", PromptInput)

    async def on_mount(self) -> None:
        self.prompt_box.focus()
        # the conversation stays scrolled to its end as a reply grows, whatever the timing of the layout,
        # until the user scrolls up (a reply that started just as the view overflowed stayed off screen)
        self.conv.anchor()
        if self.store_error:
            await self.say(f"{self.store_error}. Chatting without saved history.", "error")
        try:  # provisional until the pair's own settings are known (in the loader)
            self.cfg = gen_config(self.options.gen)
        except LocalspecError as e:
            await self.fail_load(str(e))
            return
        if self.options.resume:
            try:
                await self.resume(None)
            except Exception as e:
                await self.say(f"cannot continue the last conversation ({e}); starting a new one", "error")
        self._load_ticker = self.set_interval(0.25, self._tick_loading)
        self._tick_loading()
        self.refresh_status()
        self._load()

    # --- loading ------------------------------------------------------------------------------
    @property
    def engine(self):
        return self.session.engine if self.session is not None else None

    @property
    def sel(self):
        return self.session.selection if self.session is not None else None

    # --- output helpers -----------------------------------------------------------------------
    def _at_bottom(self) -> bool:
        c = self.conv
        return c.scroll_y >= c.max_scroll_y - 2

    async def add_view(self, widget) -> None:
        await self.conv.mount(widget)
        old = [w for w in self.conv.children if not w.has_class("banner") and w.id != "loading"]
        if len(old) > MAX_VIEWS:  # a long session keeps its memory flat; the history has every message
            await self.conv.remove_children(old[:len(old) - MAX_VIEWS])
        self.conv.scroll_end(animate=False)

    async def say(self, text: str, kind: str = "info") -> Notice:
        n = Notice(text, kind)
        await self.add_view(n)
        return n

    def refresh_status(self) -> None:
        cfg = self.cfg
        spec = cfg.spec if cfg else "?"
        k = cfg.draft_max if cfg else 0
        temp = cfg.temperature if cfg else 0.0
        has_profile = bool(self.engine is not None and self.engine.profile is not None)
        try:
            bar = self.query_one("#status", StatusBar)
        except Exception:
            return
        measuring = self.session.measurement_word() if self.session is not None else None
        bar.update(format_status(str(self.state), spec, k, temp, self.last_live, self.provenance, has_profile,
                                 measuring))

    # --- sending --------------------------------------------------------------------------------
    async def on_prompt_input_submitted(self, msg: PromptInput.Submitted) -> None:
        text = msg.text
        box = self.prompt_box
        if not text.strip():
            return  # empty input is ignored
        stripped = text.strip()
        if stripped.startswith("/") and not stripped.startswith("//"):
            box.remember(text)
            box.clear()
            await self.run_command(stripped)
            return
        if stripped.startswith("//"):  # `//text` sends "/text" literally
            text = text.replace("/", "", 1)
        if self.engine is None and self.load_error is None:  # still loading: shown now, sent when ready
            box.remember(text)
            box.clear()
            view = UserMessage(text)
            await self.add_view(view)
            self.queued.append((text, view))
            await self.say("queued: it is sent as soon as the model is ready", "info")
            return
        if self.engine is None:
            await self.say(f"not sent: {self.load_error}", "error")
            return
        if self.generating:
            await self.say("a reply is still being written; Esc cancels it (your text is kept in the box)", "error")
            return
        box.remember(text)
        box.clear()
        await self.send(text)

    async def send_queued(self) -> None:
        if self.queued and self.engine is not None and not self.generating:
            text, view = self.queued.pop(0)
            await self.send(text, view)

    async def send(self, text: str, shown: UserMessage | None = None) -> None:
        user_id = reply_id = None
        if self.store is not None:
            try:
                cid = self.conversation.saved_id(self.sel, self.settings())
                user_id = self.store.add_message(cid, "user", text)
                reply_id = self.store.add_message(cid, "assistant", "", complete=False)
            except Exception as e:  # the disk is full, the file went away, ...
                await self.say(f"could not save to the history ({e}); the chat goes on unsaved", "error")
        self.conversation.turns.append(Message("user", text))
        if shown is None:
            await self.add_view(UserMessage(text))
        await self._fit_context()
        view = AssistantMessage(provenance=self.provenance)
        await self.add_view(view)
        view.start_stream()
        turn = self.current = Turn(text, view, user_id, reply_id)
        messages = self.conversation.messages()
        self.generating = True
        self.state = State.GENERATING
        self.last_live = None
        self._cancel.clear()
        self._gen_done.clear()
        self.refresh_status()
        # decoding starts once the new views are laid out and painted, so that fixed work does not take
        # CPU from the reply's first rounds (on 2 cores it showed as a few % of a short reply's tok/s)
        self.call_after_refresh(self._generate, turn, messages, self.cfg.with_(stop=list(self.cfg.stop)))

    async def _fit_context(self) -> None:
        """Slide the oldest turns out of the model's view when the next reply would not fit."""
        n_ctx = self.engine.target.n_ctx
        if self.conversation.fit(lambda msgs: len(self.engine.prompt_tokens(msgs)), n_ctx, self.cfg.max_tokens):
            await self.say(f"the oldest messages now leave the model's context ({n_ctx} tokens) as new ones "
                           "come; the history keeps every one (/new starts afresh)", "info")  # once per conversation

    def settings(self) -> dict:
        c = self.cfg
        return {"k": c.draft_max, "temperature": c.temperature, "spec": c.spec, "top_k": c.top_k,
                "top_p": c.top_p, "min_p": c.min_p, "max_tokens": c.max_tokens, "seed": c.seed,
                "drafter": c.drafter}

    @work(thread=True, group="generate", exit_on_error=False)
    def _generate(self, turn: Turn, messages: list[Message], cfg) -> None:
        try:
            generate_reply(self.session, turn, messages, cfg, self._cancel.is_set, self._post, self._save)
        finally:
            self._gen_done.set()

    # --- actions ------------------------------------------------------------------------------
    def action_cancel(self) -> None:
        if self.generating:
            self._cancel.set()
            self.state = State.CANCELLING
            self.refresh_status()

    async def action_quit(self) -> None:
        self._cancel.set()
        self.exit()

    def action_scroll_conversation(self, pages: int) -> None:
        conv = self.conv
        conv.scroll_to(y=conv.scroll_y + pages * max(1, conv.size.height - 2), animate=False)

    def action_toggle_provenance(self) -> None:
        self.provenance = not self.provenance
        for view in self.query(AssistantMessage):
            view.set_provenance(self.provenance)
        self.refresh_status()  # the status bar shows the legend while the view is on

    def action_copy_reply(self) -> None:
        if not self.last_reply:
            self.notify("nothing to copy yet", severity="warning")
            return
        self.copy_to_clipboard(self.last_reply)
        self.notify(f"copied the last reply ({len(self.last_reply)} characters) to the clipboard (OSC 52)")

    def on_unmount(self) -> None:
        with self._engine_lock:
            self._closing = True
        self._cancel.set()
        finished = self._gen_done.wait(timeout=30)  # stops at the next confirmed token
        with self._engine_lock:
            if finished and self.session is not None:
                self.session.close()
                self.session = None
        if finished and self.store is not None:
            self.store.close()

    # --- slash commands -------------------------------------------------------------------------
    async def run_command(self, line: str) -> None:
        name, _, rest = line.partition(" ")
        name, rest = name.lower(), rest.strip()
        command = BY_NAME.get(name)
        if command is None:
            await self.say(f"unknown command {name}; /help lists them (//text sends text starting with /)", "error")
            return
        try:
            await command.handler(self, rest)
        except LocalspecError as e:
            await self.say(str(e), "error")
        except Exception as e:  # e.g. the history file became unwritable: report, keep chatting
            await self.say(f"{name} failed: {type(e).__name__}: {e}", "error")
        self.refresh_status()

    def set_options(self, **kw) -> None:
        """Settings changed by slash commands: kept across the load, saved with the conversation."""
        self.overrides.update(kw)
        if self.cfg is not None:
            for k, v in kw.items():
                setattr(self.cfg, k, v)
            self.conversation.save_settings(self.settings())

    # --- resuming -------------------------------------------------------------------------------
    async def resume(self, cid: int | None) -> None:
        """Show a saved conversation and continue it (the last one when cid is None)."""
        await resume_conversation(self, cid)
