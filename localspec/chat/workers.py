"""The chat's two jobs off the UI thread, as plain functions: load the session, generate a reply.

They talk to the UI only through `post(message)` (messages.py) and never touch a widget, so they
run the same under Textual's thread workers and in tests. The generate worker writes the reply to
the history itself (`save`), so a reply in flight is kept even while the UI shuts down.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

from ..client.remote import attach
from ..costs import idle
from ..costs.threads import quiet_watch
from ..errors import ContextFullError, LocalspecError
from ..session import GenChoice, ModelChoice, Session, SessionFace
from .messages import (
    Loaded,
    LoadFailed,
    LoadStep,
    ReplyDelta,
    ReplyDone,
    ReplyNote,
    Turn,
)
from .status import Live

STREAM_INTERVAL_S = 0.5  # the worker posts confirmed text to the UI at most this often (the first piece at once):
# each update reflows and repaints the conversation on the UI thread, which takes CPU from the decode threads
# (docs/BENCHMARKS.md, "Figures behind the code's rules")
SAVE_INTERVAL_S = 0.5  # ... and writes the reply so far to the history this often

Post = Callable[[object], None]


def load_session(models: ModelChoice, gen: GenChoice, post: Post, local: bool = False) -> Loaded | LoadFailed:
    """Resolve and load the pair (or find a running server that holds it, unless `local`), and make
    sure --spec auto has its pass costs."""
    t0 = time.monotonic()
    session = None
    try:
        post(LoadStep("finding the models"))

        def note(text: str) -> None:
            post(LoadStep(text.rstrip(".")))

        session = None if local else attach(models, gen, note)
        session = session or _open(models, gen, note)
        session.ensure_profile(note, measure=False)  # a stored profile only: no one waits for a measurement
        load_draft_in_background(session)
    except LocalspecError as e:
        _close_quietly(session)
        return LoadFailed(str(e))
    except Exception as e:  # an unexpected failure still ends in the UI, not a traceback
        _close_quietly(session)
        return LoadFailed(f"{type(e).__name__}: {e}")
    for text in session.notes:
        post(LoadStep(text))
    return Loaded(session, time.monotonic() - t0)


def _open(models: ModelChoice, gen: GenChoice, note) -> Session:
    from .. import session as s

    sel = s.select_models(models, notify=note)
    size = sum(Path(p).stat().st_size for p in (sel.target, sel.draft) if p and Path(p).is_file())
    note(f"loading {sel.describe()} ({size / 1e9:.2f} GB)")
    return Session.from_selection(sel, models, gen, note)


def load_draft_in_background(session) -> None:
    """When replies will draft with the model, load it now in the background: the first reply need
    not wait for it (the first round that drafts with it waits only for what is left)."""
    if session.wants_draft():
        threading.Thread(target=_load_draft_quietly, args=(session,), name="localspec-draft", daemon=True).start()


def _load_draft_quietly(session) -> None:
    try:
        session.engine.load_draft()
    except Exception:  # the first round that drafts with the model loads it again and reports the error
        pass


def _close_quietly(session) -> None:
    if session is not None:
        try:
            session.close()
        except Exception:
            pass


def generate_reply(session: SessionFace, turn: Turn, messages, cfg, cancel: Callable[[], bool], post: Post,
                   save: Callable[..., None]) -> None:
    """Stream one reply; then, while the user reads, measure what this machine has not measured yet."""
    busy = quiet_watch()  # other programs' use of the cores during this reply: none, or nothing is measured
    _stream_reply(session, turn, messages, cfg, cancel, post, save, busy)
    engine = session.engine
    mine = getattr(engine, "answers_started", 0)
    try:  # what is left (the attention kernel), given up when the next reply starts or another program works
        session.measure_when_idle(busy, request=lambda: getattr(engine, "answers_started", 0) != mine)
    except Exception:  # a measurement must never break the chat: the next idle moment tries again
        pass


def _stream_reply(session: SessionFace, turn: Turn, messages, cfg, cancel: Callable[[], bool], post: Post,
                  save: Callable[..., None], busy: Callable[[], bool]) -> None:
    """Post confirmed text in batches, save it as it grows, post ReplyDone last."""
    engine = session.engine
    pieces: list[tuple[str, str]] = []  # not yet posted to the UI
    runs: list[tuple[str, str]] = []  # every confirmed chunk: (text, source)
    text_parts: list[str] = []
    error = stats = live = None
    ntok = 0
    # --spec auto with no measured pass costs yet (the first reply on this machine): priced by the reference
    # curve now (engine.py) and measured right after, so nobody waits for the measurement before the first token
    measure_after = cfg.spec == "auto" and session.costs_pending()
    try:
        prompt = engine.prompt_tokens(messages)
        t_call = last_post = last_save = time.perf_counter()
        source = "target"
        for chunk in engine.generate(prompt, cfg, cancel=cancel):
            if chunk.source is not None:  # a confirmed token (a remote piece: its last token)
                ntok += 1
                source = chunk.source
            if chunk.text:
                pieces.append((chunk.text, source))
                runs.append((chunk.text, source))
                text_parts.append(chunk.text)
            now = time.perf_counter()
            if pieces and (now - last_post >= STREAM_INTERVAL_S or len(runs) == len(pieces)):
                st = engine.last_stats
                # a server's figures count its own generation time (not the wait in its queue, nor HTTP)
                elapsed = session.elapsed(st, t_call, now)
                live = Live.of(st, elapsed, engine.profile)
                post(ReplyDelta(turn.view, pieces, live))
                pieces, last_post = [], now
            if turn.reply_id is not None and now - last_save >= SAVE_INTERVAL_S:
                save(turn.reply_id, "".join(text_parts), runs, complete=False)
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
            post(ReplyDelta(turn.view, pieces, live))
        if turn.reply_id is not None:
            save(turn.reply_id, text, runs, complete=error is None,
                 stop_reason=(stats.stop_reason if stats else None) if error is None else "error",
                 error=error, stats=stats.to_dict() if stats else None)
        if measure_after:
            _measure(session, post, busy)
        post(ReplyDone(turn, text, stats, live, error))


def _measure(session: SessionFace, post: Post, busy) -> None:
    if busy():  # another program used the cores during the reply: the next quiet reply measures
        return
    post(ReplyNote())
    try:
        idle.measure_due(session.engine, busy, what="costs")  # pass costs (seconds) before the next turn
        load_draft_in_background(session)
    except Exception:  # the next reply tries again (and decodes plainly meanwhile)
        pass
