"""The chat app's widgets: the prompt box, the messages, the status bar.

Only confirmed text ever reaches these widgets. An assistant message keeps two views of its
reply: Markdown (streamed while the reply is written, re-rendered once in full at the end so
code fences come out right) and the provenance view, the same text coloured by where each token
came from: an accepted draft token or a token the target produced itself.
"""

from __future__ import annotations

from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.widgets import Markdown, Static, TextArea
from textual.widgets.markdown import MarkdownStream

from .status import DRAFT_STYLE, TARGET_STYLE, is_draft

# C0 controls (but newline and tab), DEL and C1 controls would drive the terminal if printed:
# a model can emit any byte, so show them as visible symbols instead (the stored text is untouched).
_CONTROL = {c: chr(0x2400 + c) for c in range(0x20) if c not in (0x09, 0x0A)}
_CONTROL[0x7F] = "\u2421"
_CONTROL.update({c: "\ufffd" for c in range(0x80, 0xA0)})


def printable(text: str) -> str:
    return text.translate(_CONTROL)


class PromptInput(TextArea):
    """The input box. Enter sends; ctrl+j (or shift/alt+Enter where the terminal reports them)
    inserts a newline; up on the first line / down on the last line walk through earlier prompts."""

    NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter", "ctrl+enter")

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, history: list[str] | None = None, **kw) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", compact=True, **kw)
        self.prompts: list[str] = list(history or [])
        self._pos: int | None = None  # index into history while recalling, None when editing fresh text
        self._draft = ""  # what was typed before recalling started

    async def _on_key(self, event) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
            return
        if event.key in self.NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            start, end = self.selection
            self._replace_via_keyboard("\n", start, end)
            return

    def remember(self, text: str) -> None:
        if text.strip() and (not self.prompts or self.prompts[-1] != text):
            self.prompts.append(text)
        self._pos = None
        self._draft = ""

    def action_cursor_up(self, select: bool = False) -> None:
        if not select and self.cursor_location[0] == 0 and self.prompts:
            if self._pos is None:
                self._draft, self._pos = self.text, len(self.prompts)
            if self._pos > 0:
                self._pos -= 1
                self._recall(self.prompts[self._pos])
            return
        super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        if not select and self._pos is not None and self.cursor_location[0] == self.document.line_count - 1:
            self._pos += 1
            if self._pos >= len(self.prompts):
                text, self._pos = self._draft, None
            else:
                text = self.prompts[self._pos]
            self._recall(text)
            return
        super().action_cursor_down(select)

    def _recall(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)


class Notice(Static):
    """A line from localspec itself: the banner, help, errors, command results."""

    def __init__(self, text: str | Content, kind: str = "info") -> None:
        super().__init__(text if isinstance(text, Content) else Content(printable(text)), classes=f"notice {kind}")


class UserMessage(Static):
    def __init__(self, text: str) -> None:
        super().__init__(Content(printable(text)), classes="user")


class AssistantMessage(Vertical):
    """One reply: Markdown view, provenance view (hidden unless toggled) and a footnote."""

    def __init__(self, text: str = "", runs: list[tuple[str, str]] | None = None, provenance: bool = False,
                 note: str = "") -> None:
        super().__init__(classes="assistant")
        self.text = text
        self.runs: list[tuple[str, str]] = list(runs or [])  # (text, source) per confirmed chunk
        self.show_provenance = provenance
        self.stream: MarkdownStream | None = None
        self.md = Markdown(printable(text))
        self.prov = Static("", classes="provenance")
        self.note = Static(Content(note), classes="footnote")
        self.streaming = False

    def compose(self):
        yield self.md
        yield self.prov
        yield self.note

    def on_mount(self) -> None:
        self.note.display = bool(self.note.content)
        self.set_provenance(self.show_provenance)

    def start_stream(self) -> None:
        self.streaming = True
        self.stream = Markdown.get_stream(self.md)

    async def add(self, pieces: list[tuple[str, str]]) -> None:
        text = "".join(t for t, _ in pieces)
        self.runs.extend(pieces)
        self.text += text
        if self.stream is not None:
            await self.stream.write(printable(text))
        if self.show_provenance:
            self._render_provenance()

    async def finish(self, text: str, note: str = "") -> None:
        """The reply is over: stop streaming and render the whole Markdown once."""
        self.streaming = False
        if self.stream is not None:
            await self.stream.stop()
            self.stream = None
        self.text = text
        await self.md.update(printable(text))
        self.set_note(note)
        if self.show_provenance:
            self._render_provenance()

    def set_note(self, note: str) -> None:
        self.note.update(Content(note))
        self.note.display = bool(note)

    def set_provenance(self, on: bool) -> None:
        self.show_provenance = on
        if on:
            self._render_provenance()
        self.prov.display = on
        self.md.display = not on

    def _render_provenance(self) -> None:
        if not self.runs:
            text = printable(self.text)
            self.prov.update(Content.assemble((text, "dim")) if text else Content(""))
            return
        self.prov.update(provenance_content(self.runs))


def provenance_content(runs: list[tuple[str, str]]) -> Content:
    """Accepted draft tokens in one colour, the target's own tokens in another; consecutive tokens
    of the same kind are merged into one span."""
    parts: list[tuple[str, str]] = []
    cur_text, cur_draft = [], None
    for text, source in runs:
        d = is_draft(source)
        if cur_draft is not None and d != cur_draft:
            parts.append(("".join(cur_text), DRAFT_STYLE if cur_draft else TARGET_STYLE))
            cur_text = []
        cur_text.append(printable(text))
        cur_draft = d
    if cur_text:
        parts.append(("".join(cur_text), DRAFT_STYLE if cur_draft else TARGET_STYLE))
    return Content.assemble(*parts)


class StatusBar(Static):
    pass
