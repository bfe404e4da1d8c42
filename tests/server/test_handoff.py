"""The worker's events onto the event loop (`bridge.Handoff`): in order, the first text piece at once, later
pieces from a fast model together (one wakeup of the loop for several)."""

from __future__ import annotations

import asyncio
import threading
import time

from localspec.server.bridge import Handoff


def test_events_arrive_in_order_the_first_piece_at_once_and_later_ones_together():
    async def scenario():
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        hand = Handoff(loop, queue)
        wakeups, delayed = [], []  # each flush: how many delayed ones were asked for before it
        flush, soon = hand._flush, hand._flush_soon
        hand._flush = lambda: (wakeups.append(len(delayed)), flush())[1]
        hand._flush_soon = lambda: (delayed.append(1), soon())[1]
        sent = [("start", 3), ("text", "a"), *[("text", str(i)) for i in range(50)], ("done", None)]
        first_at = {}

        def worker():
            for i, item in enumerate(sent):
                hand.emit(item)
                if i == 1:
                    time.sleep(0.05)  # the loop takes the first piece while the worker goes on decoding

        t = threading.Thread(target=worker)
        t.start()
        got = []
        while len(got) < len(sent):
            got.append(await asyncio.wait_for(queue.get(), 5))
            if got[-1] == ("text", "a"):
                first_at["delayed"] = wakeups[-1]
        t.join()
        return got, wakeups, first_at

    got, wakeups, first_at = asyncio.run(scenario())
    sent = [("start", 3), ("text", "a"), *[("text", str(i)) for i in range(50)], ("done", None)]
    assert got == sent
    assert first_at["delayed"] == 0  # the first piece was not held back for company
    assert len(wakeups) < len(sent) / 2  # 50 pieces sent in a burst crossed over in a few flushes
