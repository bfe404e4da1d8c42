"""How a context drops a rejected tail, by the memory in front of it (docs/RECURRENT.md).

A transformer's KV cache drops any tail (`PARTIAL`). A recurrent state (Mamba, LFM2's short convolutions,
Qwen3.5's delta-net) keeps no per-token history, so llama.cpp cannot drop part of it: where the
architecture supports it, llama.cpp keeps the state after each of the last `SNAPSHOTS` tokens of a pass
(`SNAPSHOT`, a rollback within the last pass is free); otherwise, and for longer rollbacks, the
sequence's recurrent part is saved before a pass that may be rolled back and put back, and the kept
tokens are evaluated again (`CHECKPOINT`, a few tokens, not the context). Evaluating the whole kept
text again is the last resort, counted. The same checkpoints, taken where a prompt's passes end, let a
later prompt reuse a cached prefix of a recurrent model.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field

import numpy as np

from ..models.archs import CHECKPOINT, PARTIAL, SNAPSHOT  # noqa: F401 (the kinds, named once there)

# per-token recurrent states asked of llama.cpp per sequence: a verify pass of up to 5 tokens rolls back free; each
# costs a whole state per sequence in memory (docs/RECURRENT.md), so longer drafts take checkpoints instead
SNAPSHOTS = 4
KEEP = 32  # checkpoints per sequence at most, oldest out (llama-server's --ctx-checkpoints)
BUDGET = 256 << 20  # bytes of checkpoints per sequence at most
STEP_SAVE_SHARE = 0.1  # a draft model saves its state per drafted token only where a save costs at most this of a step
REPLAY_SHARE = 0.5  # at least what one more token in a pass costs on a CPU, of a one-token pass (docs/RECURRENT.md)
U8P = ctypes.POINTER(ctypes.c_uint8)
PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the recurrent (or sliding-window) part alone


@dataclass
class Checkpoints:
    """One sequence's saved recurrent states: (position, bytes) ascending, each the state after `position`
    tokens. Those a rejected draft comes back to (`rollback`) are kept only while they are among the last
    ROLLBACK_KEEP; those a later prompt comes back to (where a prompt's passes end) by KEEP and BUDGET,
    the oldest dropped first."""
    items: list[tuple[int, object]] = field(default_factory=list)
    brief: set[int] = field(default_factory=set)  # positions of the rollback ones

    ROLLBACK_KEEP = 2

    def add(self, pos: int, state, rollback: bool = False, keep: int = ROLLBACK_KEEP) -> None:
        """`keep`: how many rollback ones to keep (a draft model's round keeps one per drafted token)."""
        self.drop_after(pos - 1)
        self.items.append((pos, state))
        if rollback:
            self.brief.add(pos)
            for old in sorted(self.brief)[:-keep]:
                self._remove(old)
        while len(self.items) - len(self.brief) > KEEP or (len(self.items) > 2 and self.nbytes() > BUDGET):
            self._remove(self._victim())

    def _victim(self) -> int:
        """The oldest prompt checkpoint; with none, a rollback one after the oldest (a round's start stays)."""
        prompt = [p for p, _ in self.items if p not in self.brief]
        return prompt[0] if prompt else sorted(self.brief)[1]

    def _remove(self, pos: int) -> None:
        self.items = [it for it in self.items if it[0] != pos]
        self.brief.discard(pos)

    def has(self, pos: int) -> bool:
        return any(p == pos for p, _ in self.items)

    def best(self, n: int) -> tuple[int, object] | None:
        """The latest checkpoint at or before position n."""
        return next((it for it in reversed(self.items) if it[0] <= n), None)

    def drop_after(self, n: int) -> None:  # the newest go, in as many steps: a miss costs the same at any depth
        items = self.items
        while items and items[-1][0] > n:
            self.brief.discard(items.pop()[0])

    def copy(self, n: int | None = None) -> "Checkpoints":
        keep = [it for it in self.items if n is None or it[0] <= n]
        return Checkpoints(keep, {p for p, _ in keep if p in self.brief})

    def positions(self) -> list[int]:
        return [p for p, _ in self.items]

    def nbytes(self) -> int:
        return sum(len(s) for _, s in self.items)


def reach(n: int, length: int, positions: list[int], kind: str) -> int:
    """How much of a saved sequence of `length` tokens sharing n tokens with a prompt the prompt can reuse:
    all n where cells can be dropped or nothing need be, else up to its latest checkpoint (at `positions`)
    within them."""
    if kind == PARTIAL or n >= length:
        return n
    return max((p for p in positions if p <= n), default=0)


def recurrent(L, model_ptr) -> bool:
    return bool(L.llama_model_is_recurrent(model_ptr) or L.llama_model_is_hybrid(model_ptr))


def classify(L, model_ptr, ctx_ptr) -> tuple[str, int]:
    """(kind, snapshots) for a context, as llama-server classifies one."""
    if not recurrent(L, model_ptr):
        return PARTIAL, 0
    n_rs = int(L.llama_n_rs_seq(ctx_ptr))
    return (SNAPSHOT if n_rs > 0 else CHECKPOINT), n_rs


def save_state(L, ctx_ptr, seq: int):
    """The sequence's recurrent part, to put back with load_state (uninitialised memory: llama.cpp fills it all)."""
    size = L.llama_state_seq_get_size_ext(ctx_ptr, seq, PARTIAL_ONLY)
    buf = np.empty(size, np.uint8)
    if L.llama_state_seq_get_data_ext(ctx_ptr, buf.ctypes.data_as(U8P), size, seq, PARTIAL_ONLY) != size:
        return None
    return buf


def load_state(L, ctx_ptr, seq: int, state) -> bool:
    return L.llama_state_seq_set_data_ext(ctx_ptr, state.ctypes.data_as(U8P), len(state), seq, PARTIAL_ONLY) != 0


@dataclass
class MissCost:
    """What rolling a rejected draft back has cost on this context beyond dropping cells, as running averages:
    seconds spent, and tokens evaluated again (they go in with the next pass): the cost model prices a
    round's possible miss with them."""
    seconds: float = 0.0
    replay: float = 0.0
    count: int = 0
    fallbacks: int = 0  # rollbacks that evaluated the whole kept text again
    save_s: float = 0.0  # saving a checkpoint, and a one-token pass, running averages (`step_save_pays`)
    step_s: float = 0.0

    def record(self, t0: float, replayed: int) -> None:
        dt = time.perf_counter() - t0
        self.count += 1
        w = 1.0 if self.count == 1 else 0.2
        self.seconds += w * (dt - self.seconds)
        self.replay += w * (replayed - self.replay)

    def saved(self, dt: float) -> None:
        self.save_s = running(self.save_s, dt)

    def stepped(self, dt: float) -> None:
        self.step_s = running(self.step_s, dt)

    def step_save_pays(self, reach: float) -> bool:
        """Whether a recurrent draft model saves its state before its next drafted token goes in, so that the rounds
        accepting the drafts so far (a share `reach` of them) come back there instead of evaluating one more of
        them again: where the save costs less than that share of a token's replay (REPLAY_SHARE of a step), and
        at most STEP_SAVE_SHARE of a step (not on a GPU: a save crosses to the host there, a longer pass costs
        little)."""
        return 0 < self.save_s <= min(STEP_SAVE_SHARE, reach * REPLAY_SHARE) * self.step_s


def running(avg: float, x: float, weight: float = 0.2) -> float:
    """A running average that starts at its first sample (0: none yet)."""
    return x if avg == 0 else avg + weight * (x - avg)
