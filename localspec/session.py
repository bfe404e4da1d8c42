"""One path from a user's choices to a loaded engine.

A user's choices (a pair name or target/draft paths, load settings, generation settings) arrive
as plain dataclasses (`ModelChoice`, `GenChoice`) from whichever front end took them: the CLI's
flags, the chat app, the server's defaults. This module turns them into resolved files
(`Selection`), a `LoadConfig`, a `GenConfig`, a loaded `Engine`, and attaches the stored pass-cost
profile `--spec auto` needs; what is not measured yet, it measures when a front end says nobody waits
(`Session.measure_when_idle`, costs/idle.py). `SessionFace` and `EngineFace` say what a front end may use
of a session and its engine, loaded here or in a running server (client/remote.py). It reports through
a callback and prints nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Protocol

from .backends import software_device
from .config import GenConfig, LoadConfig
from .errors import ConfigError
from .machine import AMX_NOTE
from .models import PairSpec
from .models.sizing import fit_tokens, kv_bytes_per_token

Notify = Callable[[str], None]

MEASURING_NOTE = "measuring pass costs on this machine for --spec auto (once; `localspec tune` redoes it)..."


@dataclass
class ModelChoice:
    """Which models, and how to load them (None: the pair's setting, else the default)."""
    pair: str | None = None
    target: str | None = None
    draft: str | None = None
    pull: bool = False  # download a missing pair instead of stopping
    ctx_size: int | None = None
    threads: int | None = None
    n_gpu_layers: int | None = None
    mmap: bool | None = None  # None: LoadConfig's default (mapped)
    n_gpu_layers_draft: int | None = None  # the draft's own (-ngld); None: as n_gpu_layers
    ctx_fit: int = 0  # without ctx_size: the largest context up to this that the model and memory allow
    parallel: int = 0  # generations at once (a server's --parallel); 0: one
    flash_attn: str | None = None  # "on" | "off" | "auto" (-fa); None: LoadConfig's default
    exact: bool = False  # --exact: batch-invariant kernels (LoadConfig.exact)
    cache_ram_mib: int = 0  # a server's saved prompts, in memory and on disk (LoadConfig's)
    cache_disk_mib: int = 0
    remember_generations: bool = False  # a server's: n-gram drafts may copy earlier answers
    memory_room: int | None = None  # bytes a fitted context's KV may take a share of (None: what is free now)
    chat_template: str | None = None  # --chat-template (a Jinja template): over the pair's and the GGUF's
    rpc: str | None = None  # --rpc host:port,...: the target split over llama.cpp RPC hosts (over the pair's)


@dataclass
class GenChoice:
    """Generation settings as the user gave them (None: the pair's setting, else GenConfig's)."""
    temperature: float = GenConfig.temperature
    top_k: int = GenConfig.top_k
    top_p: float = GenConfig.top_p
    min_p: float = GenConfig.min_p
    seed: int | None = None
    max_tokens: int = GenConfig.max_tokens
    stop: list[str] = field(default_factory=list)
    system: str | None = None
    spec: str | None = None  # "on" | "off" | "auto" (None: auto)
    drafter: str | None = None
    draft_max: int | None = None
    p_min: float | None = None
    prediction: str = ""  # the expected output (`run --predict FILE`): drafted from, never shown


@dataclass
class Selection:
    name: str
    target: str
    draft: str | None
    spec: PairSpec | None  # the named pair's entry; None for explicit --target/--draft files

    def describe(self, head: bool = False) -> str:
        """head: the target drafts with its own NextN head (`Engine.heads`)."""
        if self.draft:
            return Path(self.target).name + (" with its NextN head" if head else "") + f" + draft {Path(self.draft).name}"
        return Path(self.target).name + (" (drafts with its NextN head)" if head else " (no draft model)")


def select_models(choice: ModelChoice, notify: Notify | None = None) -> Selection:
    """notify(message): where progress notes of slow steps go (default: stderr; the chat app shows them)."""
    from . import models

    if choice.target and choice.pair:
        raise ConfigError("give either a pair name or --target/--draft, not both")
    kw = {"notify": notify} if notify is not None else {}
    r = models.resolve_pair(pair=choice.pair, target=choice.target, draft=choice.draft, pull=choice.pull, **kw)
    return Selection(r.name, str(r.target_path), str(r.draft_path) if r.draft_path else None, r.spec)


def load_config(choice: ModelChoice, sel: Selection) -> LoadConfig:
    load = LoadConfig()
    if sel.spec is not None:
        s = sel.spec
        load.n_ctx, load.chat_template, load.rpc_servers = s.n_ctx, s.chat_template, s.rpc_servers
        load.n_gpu_layers_target, load.n_gpu_layers_draft = s.n_gpu_layers_target, s.n_gpu_layers_draft
    if choice.chat_template:
        load.chat_template = choice.chat_template
    if choice.rpc:
        load.rpc_servers = choice.rpc
    if choice.ctx_size:
        load.n_ctx = choice.ctx_size
    elif choice.ctx_fit:
        load.n_ctx = max(load.n_ctx, fit_context(sel, choice.ctx_fit, choice.memory_room))
    if choice.parallel:
        load.n_parallel = choice.parallel
    if choice.threads:
        load.n_threads = load.n_threads_batch = choice.threads
        load.adapt_threads = False
    if choice.mmap is not None:
        load.mmap = choice.mmap
    if choice.flash_attn is not None:
        load.flash_attn = choice.flash_attn
    load.exact = choice.exact
    load.cache_ram_mib, load.cache_disk_mib = choice.cache_ram_mib, choice.cache_disk_mib
    load.remember_generations = choice.remember_generations
    if choice.n_gpu_layers is not None:
        load.n_gpu_layers_target = load.n_gpu_layers_draft = choice.n_gpu_layers
    if choice.n_gpu_layers_draft is not None:
        load.n_gpu_layers_draft = choice.n_gpu_layers_draft
    place_on_device(load, sel, ctx_given=bool(choice.ctx_size))
    return load


def place_on_device(load: LoadConfig, sel: Selection, ctx_given: bool) -> None:
    """Where the layers were left to localspec (-1, no RPC hosts) and a GPU is there: fit the pair to its free
    memory as llama-server's --fit does (models/placement.py); the user's -ngl, -ngld and -c stay as given."""
    if load.n_gpu_layers_target != -1 or load.rpc_servers:
        return
    from .backend import system_info
    from .backend.devices import gpu_devices
    from .machine import memory_bytes
    from .models.gguf_header import read_layout_file
    from .models.placement import FIT_MARGIN, fit_pair, shape_of

    devices = gpu_devices() if system_info()["gpu_offload"] else []
    gpus = [d for d in devices if not software_device(d["description"])]
    if not gpus:
        if devices:  # lavapipe and the like: slower than the CPU backend, so the CPU is the fastest device here
            load.n_gpu_layers_target = load.n_gpu_layers_draft = 0
            load.placement = (f"placement: both models on the CPU: {devices[0]['description']} runs on the CPU, slower "
                              "than the CPU backend (-ngl N puts layers there)")
        return
    target = shape_of(read_layout_file(sel.target))
    draft = shape_of(read_layout_file(sel.draft)) if sel.draft else None
    draft_fixed = None if load.n_gpu_layers_draft == -1 else load.n_gpu_layers_draft != 0  # -ngld N: kept
    free = sum(d["memory_free"] for d in gpus) - FIT_MARGIN * (len(gpus) - 1)  # fit_pair leaves the last margin
    p = fit_pair(target, draft, free, load.n_ctx, ctx_given, memory_bytes()["total"], draft_fixed)
    if not p.fits:
        raise ConfigError(p.why)
    load.n_gpu_layers_target, load.n_ctx = p.target_layers, p.n_ctx
    if draft is not None and draft_fixed is None:
        load.n_gpu_layers_draft = p.draft_layers
    load.placement = "placement: " + p.describe(target, draft)


def fit_context(sel: Selection, ceiling: int, room: int | None = None) -> int:
    """The largest context (a multiple of 256, up to `ceiling`) the target was trained for and whose KV
    caches, target and draft at f16, take at most KV_MEMORY_SHARE of `room` bytes (default: the memory
    available now)."""
    per_token, trained = kv_bytes_per_token([p for p in (sel.target, sel.draft) if p])
    return fit_tokens(per_token, trained or ceiling, ceiling, room)


def gen_config(gen: GenChoice, sel: Selection | None = None) -> GenConfig:
    cfg = GenConfig(temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p, min_p=gen.min_p,
                    seed=gen.seed, max_tokens=gen.max_tokens, stop=list(gen.stop), prediction=gen.prediction)
    if sel is not None and sel.spec is not None:
        cfg.draft_max, cfg.p_min = sel.spec.draft_max, sel.spec.p_min
    if gen.draft_max is not None:
        cfg.draft_max = cfg.ngram_draft_max = gen.draft_max
    if gen.p_min is not None:
        cfg.p_min = gen.p_min
    if gen.drafter:
        cfg.drafter = gen.drafter
    cfg.spec = gen.spec or "auto"
    if cfg.spec == "on" and cfg.draft_max == 0:
        raise ConfigError("--spec on with -k 0 drafts nothing; use -k 1 or more")
    return cfg


def prefetch(path: str) -> None:
    """Ask the kernel to start reading a model file into the page cache now, in the background
    (posix_fadvise WILLNEED). On a cold cache the load that follows then waits less for the disk;
    on a warm one this is a no-op."""
    import os

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # the load reports a missing file properly
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except (OSError, AttributeError):  # not on every platform
        pass
    finally:
        os.close(fd)


def follow_recent_load(engine) -> None:
    """Start at the thread count a process found fastest a moment ago, and remember this one's."""
    from .costs.threads import save_threads_hint, threads_hint

    gov = engine.governor
    if gov is None:
        return
    hint = threads_hint(gov.max_threads)
    if hint is not None:
        gov.start_at(hint, "a process a moment ago found this count fastest")
    gov.on_change = save_threads_hint


def split_note(engine) -> str | None:
    """Where a target split over RPC hosts put its layers (the load line's, doctor's)."""
    if not engine.load.rpc_servers:
        return None
    from .backend.devices import rpc_devices
    from .models.placement import describe_layers

    where = describe_layers(engine.target_model.placement, {d["name"]: d["description"] for d in rpc_devices()})
    return f"split: {where}" if where else None


def load_notes(models: ModelChoice) -> list[str]:
    from .backend import system_info
    from .backend.model import amx_kernel_avoided

    notes = []
    asked = [f"{flag} {n}" for flag, n in (("-ngl", models.n_gpu_layers), ("-ngld", models.n_gpu_layers_draft)) if n]
    if asked and not system_info()["gpu_offload"] and not models.rpc:  # over RPC, -ngl counts the hosts' layers
        notes.append(f"{' '.join(asked)}: this llama-cpp-python has no GPU backend, so everything runs on the "
                     "CPU (`localspec doctor` prints the command that builds it for your GPU)")
    if amx_kernel_avoided():
        notes.append(AMX_NOTE)
    return notes


def open_engine(sel: Selection, load: LoadConfig, notify: Notify | None = None, engine_class=None):
    """An `Engine` (or `engine_class`: a server's `serving.ServingEngine`). The target loads now; the draft
    model when a round first drafts with it (never for --no-spec, --drafter ngram, or auto on a machine
    where the model draft cannot pay). The pair's compatibility
    is checked now, from the GGUF headers, so a wrong draft is still one clear error up front (beside the
    target's load, which runs in llama.cpp without Python's lock: the first check reads two vocabularies)."""
    from concurrent.futures import ThreadPoolExecutor

    from .backend import exact
    from .engine import Engine
    from .models.check import check_pair

    with ThreadPoolExecutor(1) as pool:
        checked = pool.submit(check_pair, Path(sel.target), Path(sel.draft)) if sel.draft else None
        if engine_class is None:
            engine = Engine(sel.target, sel.draft, load, lazy_draft=True)
        else:
            engine = engine_class(sel.target, sel.draft, load, lazy_draft=True)
        try:
            if checked is not None:
                checked.result()
        except BaseException:
            engine.close()
            raise
    if load.exact:  # whether this build's kernels are batch-invariant for this model is measured, never assumed
        try:
            exact.require_batch_invariance(engine.target, engine.target_model, engine.on_gpu(load))
        except ConfigError:
            engine.close()
            raise
    return engine


def ensure_profile(engine, spec: str = "auto", notify: Notify | None = None, remeasure: bool = False,
                   measure: bool = True):
    """Give the engine its measured pass costs. Under --spec auto they are required: reuse the stored
    profile of this (pair, device, threads) or measure one (saying so through `notify`; a quick one,
    ~2 s, the first time; `localspec tune` measures the full one); with `remeasure` measure the full
    one again. Otherwise, or with measure=False, only a stored one is attached."""
    from .costs.tuning import load_profile, tune

    if remeasure or (spec == "auto" and engine.profile is None):
        prof = None if remeasure else load_profile(engine, notify)
        if prof is None and measure:
            if notify is not None:
                notify(MEASURING_NOTE)
            prof = tune(engine, quick=not remeasure)
        engine.profile = prof
    elif engine.profile is None:
        engine.profile = load_profile(engine, notify)
    return engine.profile


class EngineFace(Protocol):
    """What a front end uses of an engine: `Engine` here, `RemoteEngine` through a server."""
    profile: object  # costmodel.CostProfile | None
    last_stats: object  # stats.Stats | None, after a generation

    def prompt_tokens(self, messages: list) -> list[int]: ...

    def generate(self, prompt: list[int], cfg: GenConfig, cancel: Callable[[], bool] | None = None) -> Iterator: ...

    def load_draft(self): ...


class SessionFace(Protocol):
    """What a front end uses of a session: `Session` here, `RemoteSession` through a server."""
    selection: "Selection"
    gen: GenConfig
    engine: EngineFace
    notes: list[str]

    def ensure_profile(self, notify: Notify | None = None, spec: str | None = None, measure: bool = True): ...

    def costs_pending(self) -> bool: ...

    def measure_when_idle(self, busy: Callable[[], bool], request: Callable[[], bool]) -> None: ...

    def measurement_word(self) -> str | None: ...

    def elapsed(self, stats, t_call: float, now: float) -> float: ...

    def wants_draft(self) -> bool: ...

    def close(self) -> None: ...


class Session:
    """A user's choice resolved and loaded in this process: `selection`, `load`, `gen` (the GenConfig), `engine`."""

    def __init__(self, selection: Selection, gen: GenConfig, load: LoadConfig, engine, system: str | None = None,
                 notes: list[str] | None = None):
        self.selection, self.gen, self.load, self.engine, self.system = selection, gen, load, engine, system
        self.notes = notes or []  # things the user should know about this load; front ends show them

    @classmethod
    def open(cls, models: ModelChoice, gen: GenChoice, notify: Notify | None = None,
             engine_class=None) -> "Session":
        return cls.from_selection(select_models(models, notify), models, gen, notify, engine_class)

    @classmethod
    def from_selection(cls, sel: Selection, models: ModelChoice, gen: GenChoice,
                       notify: Notify | None = None, engine_class=None) -> "Session":
        cfg = gen_config(gen, sel)  # before loading: a bad setting fails fast
        load = load_config(models, sel)
        if load.mmap:  # the disk starts reading while Python imports llama.cpp and numpy (with read(), the
            prefetch(sel.target)  # two streams would only compete: slower cold: docs/BENCHMARKS.md)
        engine = open_engine(sel, load, notify, engine_class)
        follow_recent_load(engine)
        notes = load_notes(models) + [n for n in [engine.template_note(), load.placement, split_note(engine)] if n]
        return cls(sel, cfg, load, engine, gen.system, notes)

    def ensure_profile(self, notify: Notify | None = None, spec: str | None = None, measure: bool = True):
        return ensure_profile(self.engine, spec or self.gen.spec, notify, measure=measure)

    def costs_pending(self) -> bool:
        """auto has no pass costs yet on this machine (its answers draft by the reference curve until measured)."""
        return self.engine.profile is None

    def measure_when_idle(self, busy: Callable[[], bool], request: Callable[[], bool]) -> None:
        """What this machine has not measured yet, now that nobody waits (costs/idle.py): a stored profile first
        (another process may have measured it meanwhile); given up when `request()` or `busy()` says."""
        from .costs import idle

        ensure_profile(self.engine, "auto", measure=False)
        idle.measure_due(self.engine, busy, request, what="all")

    def measurement_word(self) -> str | None:
        """Where this machine's first measurements stand, in a word for a status line (None: all done)."""
        from .costs import idle

        return idle.word(self.engine)

    def elapsed(self, stats, t_call: float, now: float) -> float:
        """The generation's seconds so far as live figures count them: the prompt's evaluation left out."""
        return now - t_call - stats.prompt_eval_s

    def wants_draft(self) -> bool:
        """Will generation with these settings draft with the model? (then load it early, in the
        background). Under auto only where the measured costs say a model draft can pay at all."""
        cfg, engine = self.gen, self.engine
        if cfg.spec == "off" or not engine.drafts_with_model(cfg):
            return False
        if cfg.spec == "on":
            return True
        if engine.profile is None or not engine.profile.t_draft:
            return False  # auto without measured costs drafts copies alone (the reference curve prices no model)
        from .costs.costmodel import best_k

        return best_k(0.95, cfg.draft_max, engine.profile, "model")[1] >= 1.1

    def close(self) -> None:
        self.engine.close()
