"""The one bridge between a request's handler (the event loop) and the worker thread that answers it: `Run`
queues the job and turns the worker's events into text pieces or a chat's `Text`, `ToolCall` and `End`;
`stream` frames them as a streamed response in the protocol's shape. Every protocol translates its request
into a `Run` and these events into its own JSON."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import StreamingResponse

from ..errors import LocalspecError
from ..serving.job import Job
from ..serving.log import log_unexpected
from .apierrors import ApiError, api_error
from .http import ErrorShape, openai_error
from .settings import Extras
from .state import ServerState
from .tools import CallStream, ToolRequest, split_calls

POLL_S = 0.25  # how often a waiting non-streamed request checks that its client is still there
# While a long prompt evaluates (an agent's 10-20k tokens take minutes on a laptop CPU) an SSE stream sends
# a comment this often: SSE parsers skip it, and clients that end a silent stream (Node's fetch after 300 s)
# see bytes arrive.
KEEPALIVE_S = 10.0
KEEPALIVE = ": keep-alive\n\n"

# Why an answer ended, in the internal terms each protocol names its own way
END, STOP_SEQUENCE, LENGTH, TOOL_CALLS = "end", "stop_sequence", "length", "tool_calls"


@dataclass
class Text:
    text: str
    live: tuple | None = None  # (source, Stats so far) when the request asked for per-piece figures


@dataclass
class ToolCall:
    index: int
    call: dict  # OpenAI's {"id", "type": "function", "function": {"name", "arguments": JSON text}}


@dataclass
class Idle:
    """Nothing new for a while (a long prompt is evaluating): streams that keep alive say so."""


@dataclass
class End:
    stats: object  # the engine's Stats
    reason: str  # END | STOP_SEQUENCE | LENGTH | TOOL_CALLS
    stop_word: str | None = None


@dataclass
class Answer:
    """A whole (non-streamed) answer."""
    content: str
    calls: list[dict]
    end: End


def end_of(stats, calls: list) -> End:
    if calls:
        return End(stats, TOOL_CALLS)
    if stats.stop_reason == "stop":
        return End(stats, STOP_SEQUENCE, getattr(stats, "stop_word", None))
    return End(stats, END if stats.stop_reason == "eos" else LENGTH)


class Handoff:
    """The worker's events onto the event loop's queue, in order. Text pieces arriving within COALESCE_S go
    over together: a wakeup of the event loop per piece takes a core from the decoding threads, which a small
    model's sub-millisecond rounds feel (docs/benchmarks/log-2026-11.md, "NextN (MTP) heads"). The first piece
    goes at once: the time to the first token is what an editor waits on."""

    COALESCE_S = 0.003

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
        self.loop, self.queue = loop, queue
        self.lock = threading.Lock()
        self.held: list = []
        self.texts = 0  # text pieces handed over so far

    def emit(self, item) -> None:
        with self.lock:
            self.held.append(item)
            first = self.texts == 0  # up to the first text piece (with its figures) nothing waits
            self.texts += item[0] == "text"
            if len(self.held) > 1:
                return  # a flush is on its way
        urgent = first or item[0] not in ("text", "live")
        try:
            self.loop.call_soon_threadsafe(self._flush if urgent else self._flush_soon)
        except RuntimeError:  # the event loop has closed (shutdown)
            pass

    def _flush_soon(self) -> None:
        self.loop.call_later(self.COALESCE_S, self._flush)

    def _flush(self) -> None:
        with self.lock:
            items, self.held = self.held, []
        for item in items:
            self.queue.put_nowait(item)


class Run:
    """One queued job seen from the event loop: the worker's events arrive on an asyncio queue and leave as
    text pieces (`texts`, `collect`) or, for a chat, as `Text`, `ToolCall` and `End` (`events`, `answer`)."""

    def __init__(self, state: ServerState, prepare, extras: Extras, background: bool = False, slot: str | None = None,
                 priority: bool = False, tools: ToolRequest | None = None):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.job = Job(prepare, extras.job, Handoff(asyncio.get_running_loop(), self.queue).emit,
                       background=background, slot=slot, priority=priority)
        self.stats = None  # the engine's Stats, once done
        self.live = None  # (source, Stats so far) of the latest text piece, when the request asked for them
        self.extras, self.tools = extras, tools  # a chat's tools: their calls are cut out of the text
        self.prompt_len = 0  # once started
        self.jobs = state.worker.jobs
        try:
            state.worker.submit(self.job)
        except LocalspecError as e:
            raise api_error(e) from None

    def cancel(self) -> None:
        """The client is gone, or the response ended: the job ends (leaving the queue if it still waits)."""
        self.jobs.withdraw(self.job)

    async def next(self, request: Request | None = None, idle_s: float | None = None):
        """The next event; a non-streamed request that lost its client cancels its job; ("idle", None)
        after idle_s seconds without one (a long prompt evaluating), for streams that send keep-alives."""
        waited = 0.0
        while True:
            try:
                return await asyncio.wait_for(self.queue.get(), POLL_S)
            except asyncio.TimeoutError:
                if request is not None and await request.is_disconnected():
                    self.cancel()
                    raise ApiError(499, "client closed the request")
                waited += POLL_S
                if idle_s is not None and waited >= idle_s:
                    return "idle", None

    async def start(self, request: Request) -> int:
        kind, value = await self.next(request)
        if kind == "error":
            raise api_error(value)
        self.prompt_len = value
        return value

    async def texts(self, request: Request | None = None, idle_s: float | None = None):
        """The answer's text pieces until the end (then `self.stats` is set); an error event raises;
        None after idle_s seconds without text."""
        while True:
            kind, value = await self.next(request, idle_s)
            if kind == "idle":
                yield None
            elif kind == "live":
                self.live = value
            elif kind == "text":
                yield value
            elif kind == "error":
                raise api_error(value)
            else:
                self.stats = value
                return

    async def collect(self, request: Request):
        parts = [t async for t in self.texts(request)]
        return "".join(parts), self.stats

    async def events(self, request: Request | None = None, idle_s: float | None = None):
        """Text as it is confirmed, each tool call whole once its block closes, then the End (an Idle
        every idle_s seconds without any)."""
        tools = self.tools
        calls = CallStream(tools.names) if tools else None
        n = 0
        async for piece in self.texts(request, idle_s):
            if piece is None or calls is None:
                yield Idle() if piece is None else Text(piece, self.live)
                continue
            content, new = calls.feed(piece)
            if content:
                yield Text(content)
            for c in new:
                yield ToolCall(n, c)
                n += 1
        if calls is not None:
            content, new = calls.finish()
            if content:
                yield Text(content)
            for c in new:
                yield ToolCall(n, c)
                n += 1
        yield end_of(self.stats, calls.calls if calls else [])

    def stream(self, events, **framing):
        """The streamed response of `events` (`stream`: framed in the protocol's shape); it owns this run,
        so a hang-up or any end cancels it."""
        return stream(self, events, **framing)

    async def answer(self, request: Request) -> Answer:
        text, stats = await self.collect(request)
        content, calls = split_calls(text, self.tools.names) if self.tools else (text, [])
        return Answer(content, calls, end_of(stats, calls))


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def named_sse(obj: dict) -> str:
    """SSE with each event named by its type (Anthropic's and the Responses API's framing)."""
    return f"event: {obj.get('type', 'error')}\n{sse(obj)}"


def stream(run: Run, events, media_type: str = "text/event-stream", frame=sse, errors: ErrorShape = openai_error):
    """A streamed response from an async generator of objects (framed by `frame`; a str passes as it is);
    an error ends the stream with an error object in the protocol's shape, never silently; a hang-up (or
    any end) cancels the job."""
    async def body():
        try:
            async for obj in events:
                yield obj if isinstance(obj, str) else frame(obj)
        except ApiError as e:
            yield frame(errors(e))
        except Exception as e:
            log_unexpected("a stream", e)
            yield frame(errors(ApiError(500, "the server failed while streaming; see its log")))
        finally:
            run.cancel()
    return StreamingResponse(body(), media_type=media_type,
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
