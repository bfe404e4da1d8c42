"""Which lane a request runs on: `LanePool`.

A request gets the free lane whose cache shares the longest prefix with its prompt (llama-server's slot
selection by similarity; among equals the emptiest), so a conversation or an editor stays where its
cells are. The other free lanes' sequences are parked: saved to the prompt cache in host memory and
their cells freed. In one unified KV cache every decode attends over every cell in use, masked or not:
three idle lanes holding 3,000 tokens each made a lone request decode 22% slower here (26.3 -> 20.4
tok/s). A parked sequence comes back from the prompt cache, a memory copy, when its client returns.
"""

from __future__ import annotations

import threading

from ..backend import common_prefix
from ..promptcache import KEEP_MIN  # idle sequences shorter than this cost nothing worth a copy


class LanePool:
    def __init__(self, engine):
        self.engine = engine
        self.free = list(engine.lanes)
        self.cv = threading.Condition()
        self.last = engine.lanes[0]  # the lane of the latest request (idle work measures at its depth)

    def checkout(self, prompt: list[int] | None = None, lane=None):
        """A free lane for `prompt` (or that `lane`, once free), the other free lanes parked."""
        with self.cv:
            self.cv.wait_for(lambda: lane in self.free if lane is not None else bool(self.free))
            if lane is None:
                lane = max(self.free, key=lambda x: (common_prefix(x.target.tokens, prompt or []),
                                                     -len(x.target.tokens)))
            self.free.remove(lane)
            self._park()  # the others, lane having left `free`
            self.last = lane
            return lane

    def checkin(self, lane) -> None:
        with self.cv:
            self.free.append(lane)
            self.cv.notify_all()

    def _park(self) -> None:
        cache = self.engine.prompt_cache
        if cache is None or len(self.engine.lanes) < 2:
            return
        for lane in self.free:
            if len(lane.target.tokens) >= KEEP_MIN:
                cache.park(lane.target)
