"""`localspec chat`: a Textual app that streams only verified tokens.

Threads: the models load in one thread worker and each reply is generated in another; they talk
to the UI only by posting messages (thread-safe, never blocking the worker), and they write the
reply to the history database themselves, so a reply in flight is saved even while the UI is
shutting down. The UI thread renders: Markdown streamed as confirmed text arrives and updated
once in full at the end, the provenance view, the live status bar.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from pathlib import Path

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.content import Content
from textual.message import Message as UIMessage
from textual.widgets import Footer, LoadingIndicator, Static

from .. import paths
from ..engine import Message
from ..errors import ConfigError, ContextFullError, LocalspecError
from .help import help_text
from .history import HistoryError, HistoryStore, message_note
from .status import Live, format_status, reply_note
from .widgets import AssistantMessage, Notice, PromptInput, StatusBar, UserMessage, merge_runs

STREAM_INTERVAL_S = 1 / 30  # the worker posts confirmed text to the UI at most this often
SAVE_INTERVAL_S = 0.5  # ... and writes the reply so far to the history this often


# --- messages from the worker threads -------------------------------------------------------------
class LoadStep(UIMessage):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class Loaded(UIMessage):
    def __init__(self, engine, sel, cfg, seconds: float) -> None:
        super().__init__()
        self.engine, self.sel, self.cfg, self.seconds = engine, sel, cfg, seconds


class LoadFailed(UIMessage):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class ReplyDelta(UIMessage):
    def __init__(self, view: AssistantMessage, pieces: list[tuple[str, str]], live: Live | None) -> None:
        super().__init__()
        self.view, self.pieces, self.live = view, pieces, live


class ReplyNote(UIMessage):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class ReplyDone(UIMessage):
    def __init__(self, turn: "Turn", text: str, stats, live: Live | None, error: str | None) -> None:
        super().__init__()
        self.turn, self.text, self.stats, self.live, self.error = turn, text, stats, live, error


class Turn:
    """One exchange in flight: the prompt, its rows in the history, the reply's view."""

    def __init__(self, prompt: str, view: AssistantMessage, user_id: int | None, reply_id: int | None):
        self.prompt, self.view, self.user_id, self.reply_id = prompt, view, user_id, reply_id


class ChatApp(App):
    TITLE = "localspec chat"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { layout: vertical; }
    #conversation { height: 1fr; padding: 0 1; scrollbar-size-vertical: 1; }
    #loading { height: auto; margin: 1 0; }
    #loading LoadingIndicator { width: 6; height: 1; min-height: 1; }
    #loading #load-label { width: 1fr; color: $text-muted; }
    .notice { margin: 0 0 1 0; color: $text-muted; }
    .notice.banner { color: $text; border-left: thick $accent; padding-left: 1; }
    .notice.error { color: $text-error; border-left: thick $error; padding-left: 1; }
    .notice.ok { color: $text-success; }
    .user { margin: 1 0 0 0; padding: 0 1; background: $boost; border-left: thick $primary; }
    .assistant { height: auto; margin: 0 0 1 0; }
    .assistant Markdown { margin: 0; padding: 0 1; }
    .assistant .provenance { padding: 0 1; }
    .assistant .footnote { padding: 0 1; color: $text-muted; }
    #prompt { height: auto; max-height: 8; min-height: 1; border-top: solid $primary 50%; }
    #status { height: auto; max-height: 3; padding: 0 1; background: $panel; }
    """
    BINDINGS = [
        Binding("ctrl+q", "quit", "quit", priority=True),
        Binding("escape", "cancel", "cancel", priority=True),
        Binding("ctrl+t", "toggle_provenance", "provenance", priority=True),
        Binding("ctrl+y", "copy_reply", "copy reply", priority=True),
    ]

    def __init__(self, args, history_path: str | Path | None = None) -> None:
        super().__init__()
        self.args = args
        self.engine = None
        self.sel = None
        self.cfg = None
        self.system: str | None = getattr(args, "system", None)
        self.turns: list[Message] = []  # the conversation as the model sees it (user/assistant)
        self.conversation_id: int | None = None
        self.overrides: dict = {}  # settings changed by slash commands (survive the load)
        self.provenance = False
        self.generating = False
        self.loading = True
        self.load_error: str | None = None
        self.last_reply: str = ""
        self.last_stats = None
        self.last_live: Live | None = None
        self.state = "loading"
        self.current: Turn | None = None
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
        if self.store_error:
            await self.say(f"{self.store_error}. Chatting without saved history.", "error")
        try:
            from ..commands.common import Selection, gen_config

            # provisional until the pair's own settings are known (after select_models, in the loader)
            self.cfg = gen_config(self.args, Selection("", "", None, None))
        except LocalspecError as e:
            await self.fail_load(str(e))
            return
        if getattr(self.args, "resume", False):
            try:
                await self.resume(None)
            except Exception as e:
                await self.say(f"cannot continue the last conversation ({e}); starting a new one", "error")
        self.set_interval(0.25, self._tick_loading)
        self._tick_loading()
        self.refresh_status()
        self._load()

    # --- loading ------------------------------------------------------------------------------
    @work(thread=True, group="load", exit_on_error=False)
    def _load(self) -> None:
        from ..commands.common import gen_config, load_config, select_models
        from ..engine import Engine
        from ..tuning import ensure_profile, load_profile

        t0 = time.monotonic()
        engine = None
        try:
            self._post(LoadStep("finding the models"))
            sel = select_models(self.args, notify=lambda note: self._post(LoadStep(note)))
            cfg = gen_config(self.args, sel)
            load = load_config(self.args, sel)
            names = Path(sel.target).name + (f" + draft {Path(sel.draft).name}" if sel.draft else " (no draft model)")
            size = sum(Path(p).stat().st_size for p in (sel.target, sel.draft) if p and Path(p).is_file())
            self._post(LoadStep(f"loading {names} ({size / 1e9:.2f} GB)"))
            engine = Engine(sel.target, sel.draft, load)
            if cfg.spec == "auto":
                if load_profile(engine) is None:
                    self._post(LoadStep("measuring pass costs on this machine for --spec auto (once)"))
                ensure_profile(engine)
            else:
                engine.profile = load_profile(engine)  # only for the speedup estimate; may be None
        except LocalspecError as e:
            self._close_quietly(engine)
            self._post(LoadFailed(str(e)))
            return
        except Exception as e:  # an unexpected failure still ends in the UI, not a traceback
            self._close_quietly(engine)
            self._post(LoadFailed(f"{type(e).__name__}: {e}"))
            return
        with self._engine_lock:
            if self._closing:
                engine.close()
                return
        self._post(Loaded(engine, sel, cfg, time.monotonic() - t0))

    @staticmethod
    def _close_quietly(engine) -> None:
        if engine is not None:
            try:
                engine.close()
            except Exception:
                pass

    def _post(self, message: UIMessage) -> None:
        try:
            self.post_message(message)
        except RuntimeError:  # the event loop is gone (the app has exited)
            pass

    def on_load_step(self, msg: LoadStep) -> None:
        self._load_text = msg.text
        self._tick_loading()

    def _tick_loading(self) -> None:
        if not self.loading:
            return
        try:
            label = self.query_one("#load-label", Static)
        except Exception:
            return
        label.update(Content(f"{self._load_text}… {time.monotonic() - self._load_started:.1f} s"))

    async def on_loaded(self, msg: Loaded) -> None:
        with self._engine_lock:
            self.engine, self.sel = msg.engine, msg.sel
        self.cfg = msg.cfg
        for k, v in self.overrides.items():
            setattr(self.cfg, k, v)
        self.state = "ready"
        await self._remove_loading()
        e = self.engine
        bits = [f"target {Path(msg.sel.target).name}",
                f"draft {Path(msg.sel.draft).name}" if msg.sel.draft else "no draft model (n-gram drafts only)",
                f"context {e.target.n_ctx}"]
        if e.profile is not None:
            rel = e.profile.relative_verify()
            bits.append(f"measured: decode {1000 * e.profile.t_decode:.1f} ms, verify(5) {rel[min(4, len(rel) - 1)]:.2f}×")
        await self.say(f"ready in {msg.seconds:.1f} s · " + " · ".join(bits), "ok")
        self.loading = False
        self.refresh_status()

    async def on_load_failed(self, msg: LoadFailed) -> None:
        await self.fail_load(msg.error)

    async def fail_load(self, error: str) -> None:
        self.load_error = error
        self.state = "no model"
        await self._remove_loading()
        await self.say(f"could not start: {error}\nFix that and start `localspec chat` again; "
                       "/history and /help still work here, ctrl+q quits.", "error")
        self.loading = False
        self.refresh_status()

    async def _remove_loading(self) -> None:
        for w in self.query("#loading"):
            await w.remove()

    # --- output helpers -----------------------------------------------------------------------
    def _at_bottom(self) -> bool:
        c = self.conv
        return c.scroll_y >= c.max_scroll_y - 2

    async def add_view(self, widget) -> None:
        await self.conv.mount(widget)
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
        bar.update(format_status(self.state, spec, k, temp, self.last_live, self.provenance, has_profile))

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
        if self.engine is None:
            why = self.load_error or "the model is still loading; press Enter again when the status bar says ready"
            await self.say(f"not sent: {why}", "error")
            return
        if self.generating:
            await self.say("a reply is still being written; Esc cancels it (your text is kept in the box)", "error")
            return
        box.remember(text)
        box.clear()
        await self.send(text)

    async def send(self, text: str) -> None:
        user_id = reply_id = None
        if self.store is not None:
            try:
                cid = self._ensure_conversation()
                user_id = self.store.add_message(cid, "user", text)
                reply_id = self.store.add_message(cid, "assistant", "", complete=False)
            except Exception as e:  # the disk is full, the file went away, ...
                await self.say(f"could not save to the history ({e}); the chat goes on unsaved", "error")
        self.turns.append(Message("user", text))
        await self.add_view(UserMessage(text))
        view = AssistantMessage(provenance=self.provenance)
        await self.add_view(view)
        view.start_stream()
        turn = self.current = Turn(text, view, user_id, reply_id)
        messages = ([Message("system", self.system)] if self.system else []) + list(self.turns)
        self.generating = True
        self.state = "generating"
        self.last_live = None
        self._cancel.clear()
        self._gen_done.clear()
        self.refresh_status()
        self._generate(turn, messages, self.cfg.with_(stop=list(self.cfg.stop)))

    def _ensure_conversation(self) -> int:
        if self.conversation_id is None:
            sel = self.sel
            self.conversation_id = self.store.new_conversation(
                pair=sel.name if sel else None, target=sel.target if sel else None,
                draft=sel.draft if sel else None, system=self.system, settings=self.settings())
        return self.conversation_id

    def settings(self) -> dict:
        c = self.cfg
        return {"k": c.draft_max, "temperature": c.temperature, "spec": c.spec, "top_k": c.top_k,
                "top_p": c.top_p, "min_p": c.min_p, "max_tokens": c.max_tokens, "seed": c.seed,
                "drafter": c.drafter}

    @work(thread=True, group="generate", exit_on_error=False)
    def _generate(self, turn: Turn, messages: list[Message], cfg) -> None:
        from ..tuning import ensure_profile, load_profile

        engine = self.engine
        pieces: list[tuple[str, str]] = []  # not yet posted to the UI
        runs: list[tuple[str, str]] = []  # every confirmed chunk: (text, source)
        text_parts: list[str] = []
        error = None
        stats = None
        live = None
        ntok = 0
        try:
            if cfg.spec == "auto" and engine.profile is None:
                if load_profile(engine) is None:
                    self._post(ReplyNote("measuring pass costs on this machine for --spec auto (once)…"))
                ensure_profile(engine)
            prompt = engine.prompt_tokens(messages)
            t_call = last_post = last_save = time.perf_counter()
            source = "target"
            for chunk in engine.generate(prompt, cfg, cancel=self._cancel.is_set):
                if chunk.token is not None:
                    ntok += 1
                    source = chunk.source or source
                if chunk.text:
                    pieces.append((chunk.text, source))
                    runs.append((chunk.text, source))
                    text_parts.append(chunk.text)
                now = time.perf_counter()
                if pieces and (now - last_post >= STREAM_INTERVAL_S or len(runs) == len(pieces)):
                    st = engine.last_stats
                    live = Live.of(st, now - t_call - st.prompt_eval_s, engine.profile)
                    self._post(ReplyDelta(turn.view, pieces, live))
                    pieces, last_post = [], now
                if turn.reply_id is not None and now - last_save >= SAVE_INTERVAL_S:
                    self._save(turn.reply_id, "".join(text_parts), runs, complete=False)
                    last_save = now
            stats = engine.last_stats
        except ContextFullError as e:
            error = f"{e} (/new starts a fresh conversation)"
        except LocalspecError as e:
            error = str(e)
        except Exception as e:  # a reply that fails mid-way keeps what was confirmed and says why
            error = f"{type(e).__name__}: {e}"
        finally:
            if error is not None and ntok:
                stats = engine.last_stats
            if stats is not None:
                live = Live.of(stats, stats.generation_s, engine.profile)
            text = "".join(text_parts)
            if pieces:
                self._post(ReplyDelta(turn.view, pieces, live))
            if turn.reply_id is not None:
                self._save(turn.reply_id, text, runs, complete=error is None,
                           stop_reason=(stats.stop_reason if stats else None) if error is None else "error",
                           error=error, stats=stats.to_dict() if stats else None)
            self._post(ReplyDone(turn, text, stats, live, error))
            self._gen_done.set()

    def _save(self, reply_id: int, text: str, runs, **kw) -> None:
        try:
            self.store.update_message(reply_id, text, provenance=merge_runs(runs), **kw)
        except Exception:  # the UI reports history trouble when it first happens; never kill a reply
            pass

    async def on_reply_delta(self, msg: ReplyDelta) -> None:
        if self.generating and self.state not in ("generating", "cancelling"):
            self.state = "generating"  # after "measuring pass costs…"
        follow = self._at_bottom()
        await msg.view.add(msg.pieces)
        if msg.live is not None:
            self.last_live = msg.live
            self.refresh_status()
        if follow:
            self.conv.scroll_end(animate=False)

    async def on_reply_note(self, msg: ReplyNote) -> None:
        self.state = msg.text
        self.refresh_status()

    async def on_reply_done(self, msg: ReplyDone) -> None:
        turn = msg.turn
        follow = self._at_bottom()
        stop = msg.stats.stop_reason if msg.stats is not None else ""
        self.generating = False
        self.current = None
        if msg.error and not msg.text:
            # nothing was confirmed: take the prompt back so it can be fixed and sent again
            await turn.view.finish("", "")
            await turn.view.remove()
            if self.turns and self.turns[-1].role == "user":
                self.turns.pop()
            if self.store is not None:
                for mid in (turn.reply_id, turn.user_id):
                    if mid is not None:
                        try:
                            self.store.delete_message(mid)
                        except Exception:
                            pass
            box = self.prompt_box
            if not box.text.strip():
                box.load_text(turn.prompt)
            await self.say(f"not answered: {msg.error}", "error")
            self.state = "ready"
        else:
            await turn.view.finish(msg.text, reply_note(msg.live, stop, msg.error))
            self.turns.append(Message("assistant", msg.text))
            self.last_reply = msg.text
            self.last_stats = msg.stats
            self.last_live = msg.live
            self.state = {"cancelled": "cancelled", "context": "context full"}.get(stop, "ready")
            if msg.error:
                self.state = "reply failed"
        self.refresh_status()
        if follow:
            self.conv.scroll_end(animate=False)

    # --- actions ------------------------------------------------------------------------------
    def action_cancel(self) -> None:
        if self.generating:
            self._cancel.set()
            self.state = "cancelling"
            self.refresh_status()

    async def action_quit(self) -> None:
        self._cancel.set()
        self.exit()

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
            if finished and self.engine is not None:
                self.engine.close()
                self.engine = None
        if finished and self.store is not None:
            self.store.close()

    # --- slash commands -------------------------------------------------------------------------
    async def run_command(self, line: str) -> None:
        name, _, rest = line.partition(" ")
        name, rest = name.lower(), rest.strip()
        handler = {
            "/k": self.cmd_k, "/temp": self.cmd_temp, "/temperature": self.cmd_temp,
            "/system": self.cmd_system, "/spec": self.cmd_spec, "/clear": self.cmd_clear,
            "/new": self.cmd_new, "/history": self.cmd_history, "/stats": self.cmd_stats,
            "/copy": self.cmd_copy, "/help": self.cmd_help, "/?": self.cmd_help,
        }.get(name)
        if handler is None:
            await self.say(f"unknown command {name}; /help lists them (//text sends text starting with /)", "error")
            return
        try:
            await handler(rest)
        except LocalspecError as e:
            await self.say(str(e), "error")
        except Exception as e:  # e.g. the history file became unwritable: report, keep chatting
            await self.say(f"{name} failed: {type(e).__name__}: {e}", "error")
        self.refresh_status()

    def _set(self, **kw) -> None:
        self.overrides.update(kw)
        if self.cfg is not None:
            for k, v in kw.items():
                setattr(self.cfg, k, v)
            if self.conversation_id is not None and self.store is not None:
                self.store.update_conversation(self.conversation_id, settings=self.settings())

    def _next_reply(self) -> str:
        return " (from the next reply on)" if self.generating else ""

    async def cmd_k(self, rest: str) -> None:
        try:
            k = int(rest)
            if k < 0:
                raise ValueError
        except ValueError:
            raise ConfigError(f"/k needs a whole number 0 or more, like /k 4 (now {self.cfg.draft_max})")
        if k == 0 and self.cfg.spec == "on":
            raise ConfigError("/k 0 drafts nothing with /spec on; use /spec off for plain decoding")
        self._set(draft_max=k)
        await self.say(f"k = {k}: at most {k} tokens drafted per round{self._next_reply()}", "ok")

    async def cmd_temp(self, rest: str) -> None:
        try:
            t = float(rest)
            if not t >= 0 or t == float("inf"):
                raise ValueError
        except ValueError:
            raise ConfigError(f"/temp needs a number 0 or more, like /temp 0.7 (now {self.cfg.temperature:g})")
        self._set(temperature=t)
        await self.say(f"temperature = {t:g}{' (greedy)' if t == 0 else ''}{self._next_reply()}", "ok")

    async def cmd_system(self, rest: str) -> None:
        if not rest:
            await self.say(f"system prompt: {self.system}" if self.system else
                           "no system prompt; /system TEXT sets one", "info")
            return
        self.system = None if rest == "-" else rest
        if self.conversation_id is not None and self.store is not None:
            self.store.update_conversation(self.conversation_id, system=self.system)
        await self.say("system prompt removed" if self.system is None else f"system prompt set: {self.system}", "ok")

    async def cmd_spec(self, rest: str) -> None:
        mode = rest.lower()
        if mode not in ("on", "off", "auto"):
            raise ConfigError(f"/spec takes on, off or auto (now {self.cfg.spec})")
        if mode == "on" and self.cfg.draft_max == 0:
            raise ConfigError("/spec on with k = 0 drafts nothing; set /k 4 first")
        self._set(spec=mode)
        what = {"on": "speculate every round", "off": "plain target-only decoding",
                "auto": "speculate when the measured costs say it pays"}[mode]
        await self.say(f"spec {mode}: {what}{self._next_reply()}", "ok")

    async def cmd_clear(self, rest: str) -> None:
        if self.generating:
            raise ConfigError("a reply is being written; Esc cancels it, then /clear")
        for w in list(self.conv.children):
            if not w.has_class("banner") and w.id != "loading":
                await w.remove()
        await self.say("screen cleared; the model still remembers this conversation (/new forgets it)", "ok")

    async def cmd_new(self, rest: str) -> None:
        if self.generating:
            raise ConfigError("a reply is being written; Esc cancels it, then /new")
        self.turns = []
        self.conversation_id = None
        self.last_live = None
        self.system = getattr(self.args, "system", None)
        for w in list(self.conv.children):
            if not w.has_class("banner") and w.id != "loading":
                await w.remove()
        await self.say("new conversation", "ok")

    async def cmd_history(self, rest: str) -> None:
        if self.store is None:
            raise ConfigError(self.store_error or "no history database")
        if rest:
            if self.generating:
                raise ConfigError("a reply is being written; Esc cancels it, then /history ID")
            try:
                cid = int(rest.lstrip("#"))
            except ValueError:
                raise ConfigError("/history ID takes a number from the /history list")
            await self.resume(cid)
            return
        convs = self.store.list_conversations(limit=15)
        if not convs:
            await self.say("no saved conversations yet", "info")
            return
        lines = ["saved conversations (newest first; /history ID opens one, "
                 "`localspec history show ID` prints it):"]
        for c in convs:
            mark = " ◀ this one" if c.id == self.conversation_id else ""
            lines.append(f"  #{c.id}  {_local_time(c.updated_at)}  {c.n_messages:>3} msgs  {c.title or '(untitled)'}{mark}")
        await self.say("\n".join(lines), "info")

    async def cmd_stats(self, rest: str) -> None:
        lines = []
        if self.last_stats is not None:
            lines.append("last reply:")
            lines += ["  " + ln for ln in self.last_stats.summary_lines()]
            if self.last_live is not None and self.last_live.speedup is not None:
                lines.append(f"  estimated speedup over plain decoding from measured pass costs: "
                             f"{self.last_live.speedup:.2f}×")
        else:
            lines.append("no reply yet")
        e = self.engine
        if e is not None and e.profile is not None:
            p = e.profile
            rel = ", ".join(f"{r:.2f}" for r in p.relative_verify()[:6])
            draft = f", draft decode {1000 * p.t_draft:.1f} ms" if p.t_draft else ""
            lines.append(f"measured pass costs: target decode {1000 * p.t_decode:.1f} ms{draft}; "
                         f"verify(n)/decode for n=1..6: {rel}")
        elif e is not None:
            lines.append("no measured pass costs yet (/spec auto measures them; so does `localspec tune`)")
        c = self.cfg
        if c is not None:
            lines.append(f"settings: spec {c.spec}, k {c.draft_max}, temperature {c.temperature:g}, top-k {c.top_k}, "
                         f"top-p {c.top_p:g}, min-p {c.min_p:g}, max tokens {c.max_tokens}, drafter {c.drafter}")
        await self.say("\n".join(lines), "info")

    async def cmd_copy(self, rest: str) -> None:
        if not self.last_reply:
            raise ConfigError("nothing to copy yet; /copy saves the last reply once there is one")
        self.copy_to_clipboard(self.last_reply)
        d = paths.ensure(paths.copies_dir())
        path = d / f"reply-{datetime.now().strftime('%Y%m%d-%H%M%S')}.md"
        n = 1
        while path.exists():
            n += 1
            path = d / f"reply-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{n}.md"
        path.write_text(self.last_reply if self.last_reply.endswith("\n") else self.last_reply + "\n",
                        encoding="utf-8")
        await self.say(f"copied the last reply to the clipboard (OSC 52) and saved it to {path}", "ok")

    async def cmd_help(self, rest: str) -> None:
        await self.say(help_text(), "info")

    # --- resuming -------------------------------------------------------------------------------
    async def resume(self, cid: int | None) -> None:
        """Show a saved conversation and continue it (the last one when cid is None)."""
        if self.store is None:
            await self.say(f"cannot resume: {self.store_error}", "error")
            return
        if cid is None:
            cid = self.store.last_conversation_id()
            if cid is None:
                await self.say("no saved conversation to continue; starting a new one", "info")
                return
        conv = self.store.get(cid)
        for w in list(self.conv.children):
            if isinstance(w, (UserMessage, AssistantMessage)):
                await w.remove()
        self.turns = []
        self.conversation_id = conv.id
        self.system = getattr(self.args, "system", None) or conv.system  # --system overrides the saved one
        if self.system != conv.system:
            self.store.update_conversation(conv.id, system=self.system)
        for m in conv.messages:
            if m.role == "user":
                self.turns.append(Message("user", m.content))
                await self.add_view(UserMessage(m.content))
            elif m.role == "assistant":
                if not m.content and (m.error or not m.complete):
                    continue  # a reply that never confirmed a token
                self.turns.append(Message("assistant", m.content))
                runs = [(t, s) for s, t in (m.provenance or [])]
                await self.add_view(AssistantMessage(m.content, runs, self.provenance, message_note(m)))
                self.last_reply = m.content
        await self.say(f"continuing conversation #{conv.id} “{conv.title or 'untitled'}” "
                       f"({len(self.turns)} messages)", "ok")


def _local_time(iso: str) -> str:
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return iso
