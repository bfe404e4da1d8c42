"""Which lane a request runs on: `LanePool`.

A request gets the free lane whose cache shares the longest prefix with its prompt (llama-server's slot
selection by similarity; among equals the emptiest), so a conversation or an editor stays where its
cells are. The other free lanes' sequences are parked: saved to the prompt cache in host memory and
their cells freed. In one unified KV cache every decode attends over every cell in use, masked or not,
so idle lanes' cells slow a lone request (docs/BENCHMARKS.md, "Figures behind the code's rules"). A
parked sequence comes back from the prompt cache, a memory copy, when its client returns.
Idle work (pass costs measured at the last request's depth) holds a lane too, filled as deep as that
request ran; a request lets it hand that lane back (it gives way within a pass) before choosing, so the
lane is parked, or is the request's own conversation, before the request evaluates anything.
"""

from __future__ import annotations

import threading

from ..backend import common_prefix
from .caches.promptcache import KEEP_MIN  # idle sequences shorter than this cost nothing worth a copy


class LanePool:
    # A request waits at most this long for idle work to hand its lane back (it gives way within a pass,
    # then its cache is truncated). Left holding a deep cache beside a request, that lane's cells would be
    # attended over in every one of the request's passes.
    BACKGROUND_WAIT_S = 1.0

    def __init__(self, engine):
        self.engine = engine
        self.free = list(engine.lanes)
        self.cv = threading.Condition()
        self.last = engine.lanes[0]  # the lane of the latest request (idle work measures at its depth)
        self.background = 0  # lanes idle work holds

    def checkout(self, prompt: list[int] | None = None, lane=None, background: bool = False):
        """A free lane for `prompt` (or that `lane`, once free), the other free lanes parked; a request
        first lets idle work (`background`) hand back the lane it holds."""
        with self.cv:
            if not background:
                self.cv.wait_for(lambda: not self.background, timeout=self.BACKGROUND_WAIT_S)
            self.cv.wait_for(lambda: lane in self.free if lane is not None else bool(self.free))
            if lane is None:
                lane = max(self.free, key=lambda x: (common_prefix(x.target.tokens, prompt or []),
                                                     -len(x.target.tokens)))
            self.free.remove(lane)
            self._park()  # the others, lane having left `free`
            if background:
                self.background += 1
            else:
                self.last = lane
            return lane

    def checkin(self, lane, background: bool = False) -> None:
        with self.cv:
            self.free.append(lane)
            if background:
                self.background -= 1
            self.cv.notify_all()

    def _park(self) -> None:
        cache = self.engine.prompt_cache
        if cache is None or len(self.engine.lanes) < 2:
            return
        for lane in self.free:
            if len(lane.target.tokens) >= KEEP_MIN:
                cache.park(lane.target)
