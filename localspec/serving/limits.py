"""The limits editors put on a streamed answer (llama-server's n_indent and t_max_predict_ms), applied by the
worker as text is confirmed."""

from __future__ import annotations

import time


class LineLimits:
    """llama-server's two editor limits on streamed text, applied as it is confirmed:

    - n_indent: once a new line starts, it must be indented by at least n_indent (spaces/tabs)
      or generation stops and that line is cut (a completion that dedents has left the block);
    - t_max_predict_ms: after that long, generation stops at the next new line.

    `push(text)` returns the text that may be sent and whether to stop. Indentation that could
    still belong to a cut line is held back until the line's first other character arrives."""

    def __init__(self, n_indent: int = 0, t_max_predict_ms: int = 0, start: float | None = None):
        self.n_indent, self.t_max = n_indent, t_max_predict_ms
        self.start = start  # generation time counts from the first token, not the prompt (as in llama-server)
        self.seen_newline = False
        self.held = ""  # the current line's leading whitespace, not sent yet
        self.at_line_start = False

    def push(self, text: str) -> tuple[str, bool]:
        if self.start is None:
            self.start = time.perf_counter()
        if not self.n_indent:
            return text, self._time_stop(text)
        out = []
        for ch in text:
            if self.at_line_start:
                if ch in " \t":
                    self.held += ch
                    continue
                if ch != "\n" and len(self.held.expandtabs(1)) < self.n_indent:
                    return "".join(out), True  # the new line dedents: cut it
                out.append(self.held)
                self.held, self.at_line_start = "", False
            out.append(ch)
            if ch == "\n":
                self.seen_newline = self.at_line_start = True
        sent = "".join(out)
        return sent, self._time_stop(text)

    def _time_stop(self, text: str) -> bool:
        if "\n" not in text:
            return False
        self.seen_newline = True
        return bool(self.t_max) and (time.perf_counter() - self.start) * 1000 > self.t_max
