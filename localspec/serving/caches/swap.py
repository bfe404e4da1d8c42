"""When the shared KV cache is full: a waiting sequence's cells moved to host memory, and back.

In one unified cache every lane grows into the same cells. When a step does not fit even after the idle
lanes' cells are freed, the batch thread swaps out a sequence whose pass is waiting in it (its thread is
blocked there, so nothing else touches its cells): the sequence's KV is copied out and its cells freed,
its pass held back until cells are free again, then the KV is put back bit for bit and the pass goes on.
So a request that fits the context alone waits instead of being refused or cut (vLLM preempts the same
way); only a sequence that alone outgrows the context ends with "context full".
"""

from __future__ import annotations


class SwapSpace:
    def __init__(self, ctx):
        self.ctx = ctx
        self.held: dict[int, tuple] = {}  # seq -> (its KV, its tokens, its cuts, its checkpoints)
        self.moves = 0  # sequences swapped out so far

    def __contains__(self, seq: int) -> bool:
        return seq in self.held

    def __bool__(self) -> bool:
        return bool(self.held)

    def out(self, seq: int) -> None:
        tokens = list(self.ctx.seq_tokens[seq])
        self.held[seq] = (self.ctx.snapshot(seq), tokens, self.ctx.seq_cuts[seq].copy(), self.ctx.seq_ckpts[seq].copy())
        self.ctx.clear(seq)
        self.moves += 1

    def back(self, order: list[int], make_room) -> None:
        """Put sequences back, in `order` (oldest first), freeing idle lanes' cells as needed; stops at the
        first that does not fit, so no younger one overtakes it."""
        for seq in order:
            entry = self.held.get(seq)  # a generation that ended meanwhile dropped its own
            if entry is None:
                continue
            state, tokens, cuts, ckpts = entry
            while not self.ctx.restore(state, tokens, seq, cuts, ckpts):
                if not (make_room and make_room()):
                    return
            self.held.pop(seq, None)

    def drop(self, seq: int) -> None:
        self.held.pop(seq, None)
