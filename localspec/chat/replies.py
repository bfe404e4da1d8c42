"""The chat app's replies: confirmed text as the reply worker posts it, the note while it measures, the end
(its history row saved as it grows); `ChatApp` mixes this in."""

from __future__ import annotations

from ..chat_format import Message
from .messages import ReplyDelta, ReplyDone, ReplyNote
from .provenance import encode_runs
from .state import STATE_AFTER_STOP, State
from .status import reply_note


class ReplyEvents:
    def _save(self, reply_id: int, text: str, runs, **kw) -> None:
        try:
            self.store.update_message(reply_id, text, provenance=encode_runs(runs), **kw)
        except Exception:  # the UI reports history trouble when it first happens; never kill a reply
            pass

    async def on_reply_delta(self, msg: ReplyDelta) -> None:
        if self.generating and self.state not in (State.GENERATING, State.CANCELLING):
            self.state = State.GENERATING  # after measuring pass costs
        follow = self._at_bottom()
        await msg.view.add(msg.pieces)
        if msg.live is not None:
            self.last_live = msg.live
            self.refresh_status()
        if follow:
            self.conv.scroll_end(animate=False)

    async def on_reply_note(self, msg: ReplyNote) -> None:
        self.state = State.MEASURING
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
            turns = self.conversation.turns
            if turns and turns[-1].role == "user":
                turns.pop()
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
            self.state = State.READY
        else:
            await turn.view.finish(msg.text, reply_note(msg.live, stop, msg.error))
            self.conversation.turns.append(Message("assistant", msg.text))
            self.last_reply = msg.text
            self.last_stats = msg.stats
            self.last_live = msg.live
            self.state = State.REPLY_FAILED if msg.error else STATE_AFTER_STOP.get(stop, State.READY)
        self.refresh_status()
        if follow:
            self.conv.scroll_end(animate=False)
        self.replies += 1
        await self.send_queued()
