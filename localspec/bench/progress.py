"""A dependency-free progress bar on stderr.

On a terminal it redraws one line: `[#######.......]  37/120  edit edit-03 model k=4  ETA 4m10s`.
Elsewhere (a log file, `| tee`) it prints a plain line every 10% so logs stay short.
"""

from __future__ import annotations

import shutil
import sys
import time


def fmt_duration(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class Progress:
    def __init__(self, stream=None, width: int = 24):
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.width = width
        self.total = self.done = 0
        self.t0 = 0.0
        self.last_pct = -1
        self.current = ""

    def start(self, total: int) -> None:
        self.total, self.done, self.t0 = total, 0, time.perf_counter()
        self._draw()

    def step(self, what: str) -> None:
        """Called as a run starts: the bar counts finished runs and names the one in progress."""
        if self.current:
            self.done += 1
        self.current = what
        self._draw()

    def finish(self) -> None:
        if self.current:
            self.done += 1
        self.current = ""
        self._clear()
        self.stream.write(f"bench: {self.done} runs in {fmt_duration(time.perf_counter() - self.t0)}\n")
        self.stream.flush()

    def _eta(self) -> str:
        if not self.done:
            return "ETA ?"
        left = (time.perf_counter() - self.t0) / self.done * (self.total - self.done)
        return f"ETA {fmt_duration(left)}"

    def _clear(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K")

    def _draw(self) -> None:
        if not self.total:
            return
        frac = self.done / self.total
        if self.tty:
            filled = int(frac * self.width)
            line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done:>{len(str(self.total))}}/{self.total}"
                    f"  {self._eta()}  {self.current}")
            cols = shutil.get_terminal_size((100, 20)).columns
            self.stream.write("\r\x1b[2K" + line[: cols - 1])
        else:
            pct = int(frac * 10) * 10
            if pct == self.last_pct:
                return
            self.last_pct = pct
            self.stream.write(f"bench: {pct:3d}% ({self.done}/{self.total} runs) {self._eta()}\n")
        self.stream.flush()
