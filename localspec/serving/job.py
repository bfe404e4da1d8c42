"""A request as the worker runs it: `Job` (how to build its prompt and settings, its options, where its events
go) and `JobOptions`, the generation-time options that are not engine settings (editor limits, logit bias).
Events: ("start", prompt_len), ("live", (source, Stats)), ("text", str), then ("done", Stats) or ("error",
LocalspecError); the server maps the error to a status in one place (server/apierrors.py)."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..errors import InternalError, LocalspecError
from .log import log_unexpected

Emit = Callable[[tuple], None]
BiasItem = tuple  # (token id or text, added logit; -inf bans)


@dataclass
class JobOptions:
    n_indent: int = 0  # /infill: stop at a new line indented less than this
    t_max_predict_ms: int = 0  # stop at the first new line after this many ms of generation
    logit_bias: list[BiasItem] = field(default_factory=list)  # resolved by the worker, with the model at hand
    ignore_eos: bool = False  # llama-server's: every end-of-generation token banned (a bias of -inf)
    timings_per_token: bool = False  # llama-server's: each streamed piece carries the figures so far


@dataclass(eq=False)  # each job is itself (the running set holds them)
class Job:
    prepare: Callable[[object], tuple[list[int], object]]  # engine -> (prompt tokens, GenConfig); runs in the worker
    options: JobOptions
    emit: Emit
    cancel: threading.Event = field(default_factory=threading.Event)
    background: bool = False  # a warm-up (n_predict 0): served after the others, gives way to them
    slot: str | None = None  # an editor slot: a newer completion from it supersedes this one
    priority: bool = False  # an editor's completion: its passes go ahead of the other requests' decoding
    queued_at: float = field(default_factory=time.perf_counter)



def resolve_logit_bias(items: list[BiasItem], model, ignore_eos: bool = False) -> dict[int, float]:
    """Token ids -> bias for this model; an id outside the vocabulary is refused. ignore_eos bans every
    end-of-generation token, as llama-server does."""
    out: dict[int, float] = dict.fromkeys(model.eog_tokens(), -math.inf) if ignore_eos else {}
    for tok, bias in items:
        ids = [tok] if isinstance(tok, int) else model.tokenize(tok, add_special=False, parse_special=False)
        for t in ids:
            if not 0 <= t < model.n_vocab:
                raise LocalspecError(f'"logit_bias" has a token id outside the vocabulary (0..{model.n_vocab - 1})')
            out[t] = out.get(t, 0.0) + bias
    return out


def emit_failure(job: Job, e: Exception, doing: str) -> None:
    """A job's failure as its one error event: the user's own error as it is; anything else logged, and the
    client told that the server broke while `doing` (never the internals). The server stays up."""
    if isinstance(e, LocalspecError):
        job.emit(("error", e))
        return
    log_unexpected(f"a request, while {doing}", e)
    job.emit(("error", InternalError(f"the server failed while {doing}; see its log")))
