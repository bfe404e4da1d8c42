"""Continuing a saved conversation: its messages shown again and the model's turns rebuilt."""

from __future__ import annotations

from ..history import message_note
from .provenance import decode_runs
from .widgets import AssistantMessage, UserMessage


async def resume_conversation(app, cid: int | None) -> None:
    """Show a saved conversation and continue it (the last one when cid is None)."""
    if app.store is None:
        await app.say(f"cannot resume: {app.store_error}", "error")
        return
    if cid is None:
        cid = app.store.last_conversation_id()
        if cid is None:
            await app.say("no saved conversation to continue; starting a new one", "info")
            return
    conv = app.conversation.resume(cid, app.options.gen.system)  # --system overrides the saved one
    for w in list(app.conv.children):
        if isinstance(w, (UserMessage, AssistantMessage)):
            await w.remove()
    for m in conv.messages:
        if m.role == "user":
            await app.add_view(UserMessage(m.content))
        elif m.role == "assistant":
            if not m.content and (m.error or not m.complete):
                continue  # a reply that never confirmed a token
            runs = decode_runs(m.provenance)
            await app.add_view(AssistantMessage(m.content, runs, app.provenance, message_note(m)))
            app.last_reply = m.content
    await app.say(f"continuing conversation #{conv.id} “{conv.title or 'untitled'}” "
                   f"({len(app.conversation.turns)} messages)", "ok")
