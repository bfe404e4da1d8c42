"""Run plain and speculative decoding alternately on the same prompts, and aggregate.

Schedule, per prompt and repeat: a plain run (A), then the speculative settings (B1, B2, ...)
with another plain run after every `baseline_every` of them and at the end:

    baseline_every=1:  A B1 A B2 A B3 A        (strict A B A B)
    baseline_every=2:  A B1 B2 A B3 B4 A

Every speculative run is compared with the mean tok/s of the two plain runs that bracket it, so
a machine that drifts (thermal throttling, another process) affects both sides of each ratio.
The order of the settings is reversed on every other prompt/repeat so that no setting always
runs first. The prompt's KV cache is reused between runs of the same prompt (as in a chat, and
the same for A and B); tok/s counts generation only, prompt evaluation is reported apart.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ..chat_format import Message
from ..config import DRAFTERS, GenConfig
from ..costs.costmodel import CostProfile
from ..errors import ConfigError
from ..fim.layout import fim_stop_tokens, infill_tokens
from ..stats import Stats
from .summary import summarize_workload
from .workloads import Prompt

SPECS = ("on", "auto")


@dataclass(frozen=True)
class Setting:
    spec: str  # "on" (fixed k) | "auto" (the cost model picks k <= the cap per round)
    drafter: str  # "model" | "ngram" | "hybrid"
    k: int  # the draft model's k (and the n-gram drafter's, unless ngram_k says otherwise)
    p_min: float = 0.0
    ngram_k: int | None = None  # auto only: the n-gram drafts' own cap (run's default is longer than k)

    @property
    def ngram_cap(self) -> int:
        return self.ngram_k if self.spec == "auto" and self.ngram_k else self.k

    @property
    def cap(self) -> int:
        """The longest draft this setting can verify."""
        return max(self.k, self.ngram_cap)

    @property
    def label(self) -> str:
        if self.spec == "auto":
            s = f"auto {self.drafter} k<={self.k}"
            if self.ngram_cap != self.k and self.drafter != "model":
                s += f"/{self.ngram_cap}"
        else:
            s = f"{self.drafter} k={self.k}"
        return s + (f" p_min={self.p_min:g}" if self.p_min else "")

    def arg(self) -> str:
        """The --setting value that reproduces it."""
        k = f"{self.k}/{self.ngram_cap}" if self.ngram_cap != self.k else str(self.k)
        return f"{self.spec}:{self.drafter}:{k}" + (f":{self.p_min:g}" if self.p_min else "")

    def to_dict(self) -> dict:
        return {"label": self.label, "spec": self.spec, "drafter": self.drafter, "k": self.k,
                "ngram_k": self.ngram_cap, "p_min": self.p_min}


def parse_setting(text: str, default_k: int, default_ngram_k: int | None = None) -> Setting:
    """"SPEC:DRAFTER[:K[:P_MIN]]", e.g. "auto:hybrid", "on:ngram:6", "on:model:4:0.3".

    As with `localspec run`, an explicit K caps every drafter; "auto:DRAFTER" without K is run's
    default: the pair's k for the draft model and the longer default cap for n-gram drafts
    (`default_ngram_k`). "K/N" gives auto the two caps apart: "auto:hybrid:4/8"."""
    parts = [x.strip() for x in text.split(":")]
    hint = ' (expected SPEC:DRAFTER[:K[:P_MIN]], e.g. "on:ngram:6" or "auto:hybrid")'
    if not 2 <= len(parts) <= 4:
        raise ConfigError(f"--setting {text!r}: wrong number of fields{hint}")
    spec, drafter = parts[0], parts[1]
    if spec not in SPECS:
        raise ConfigError(f"--setting {text!r}: spec must be one of {', '.join(SPECS)}{hint}")
    if drafter not in DRAFTERS:
        raise ConfigError(f"--setting {text!r}: drafter must be one of {', '.join(DRAFTERS)}{hint}")
    try:
        if len(parts) > 2 and parts[2]:
            k_text, _, n_text = parts[2].partition("/")
            k = int(k_text)
            ngram_k = int(n_text) if n_text else None
        else:
            k, ngram_k = default_k, (default_ngram_k if spec == "auto" else None)
        p = float(parts[3]) if len(parts) > 3 and parts[3] else 0.0
    except ValueError:
        raise ConfigError(f"--setting {text!r}: k must be a whole number (or K/N) and p_min a number{hint}")
    if k < 1 or (ngram_k is not None and ngram_k < 1):
        raise ConfigError(f"--setting {text!r}: k must be 1 or more (k = 0 is the plain baseline, always run)")
    if ngram_k is not None and spec != "auto" and ngram_k != k:
        raise ConfigError(f"--setting {text!r}: a separate n-gram cap (K/N) applies to auto only")
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"--setting {text!r}: p_min must be between 0 and 1")
    return Setting(spec, drafter, k, p if drafter != "ngram" else 0.0,
                   ngram_k if spec == "auto" and ngram_k not in (None, k) else None)


def build_settings(specs: list[str], drafters: list[str], ks: list[int], p_mins: list[float],
                   extra: list[Setting], has_draft: bool) -> list[Setting]:
    """The grid spec x drafter x k x p_min, then the extra settings; duplicates dropped.
    `auto` chooses k per round itself, so it runs once per drafter with the largest k as its cap.
    --p-min only affects drafts of the draft model, so n-gram settings ignore it."""
    out: list[Setting] = []
    for spec in specs:
        for drafter in drafters:
            for k in (ks if spec == "on" else [max(ks)]):
                for p in (p_mins if drafter != "ngram" else [0.0]):
                    out.append(Setting(spec, drafter, k, p))
    out += extra
    out = list(dict.fromkeys(out))
    if not has_draft:
        needs = [s.label for s in out if s.drafter == "model"]
        if needs:
            raise ConfigError(f"{needs[0]}: the model drafter needs a draft model; pass --draft PATH "
                              "(or a pair with a draft), or use --drafter ngram")
    if not out:
        raise ConfigError("no speculative settings to run; give -k, --drafter and --spec values")
    return out


@dataclass
class Options:
    max_tokens: int = 128
    repeat: int = 1
    temperature: float = 0.0
    seed: int = 0
    baseline_every: int = 1
    warmup: bool = True


@dataclass
class BenchRun:
    """One generation of a prompt under a setting (or plain decoding), with its figures."""
    prompt: str
    repeat: int
    setting: Setting | None  # None = plain
    stats: Stats
    text: str
    baseline_tps: float | None = None
    identical: bool | None = None  # greedy: same text as the plain run (None under sampling)

    @property
    def tps(self) -> float:
        return self.stats.tokens_per_second

    @property
    def ratio(self) -> float | None:
        return self.tps / self.baseline_tps if self.baseline_tps and self.tps > 0 else None


def schedule(settings: list[Setting], every: int) -> list[Setting | None]:
    seq: list[Setting | None] = [None]
    for i, s in enumerate(settings):
        seq.append(s)
        if (i + 1) % every == 0 or i == len(settings) - 1:
            seq.append(None)
    return seq


def runs_per_prompt(n_settings: int, every: int, repeat: int) -> int:
    return repeat * (n_settings + 1 + math.ceil(n_settings / every))


def messages_for(p: Prompt) -> list[Message]:
    return ([Message("system", p.system)] if p.system else []) + [Message("user", p.prompt)]


def prompt_tokens(engine, p: Prompt) -> list[int]:
    if p.fim is None:
        return engine.prompt_tokens(messages_for(p))
    return infill_tokens(engine.target_model, {"input_prefix": p.fim[0], "input_suffix": p.fim[1]}, [],
                         engine.target.n_ctx, p.max_tokens or 0)


class NullProgress:
    def start(self, total: int) -> None:
        pass

    def step(self, what: str) -> None:
        pass

    def finish(self) -> None:
        pass


def run_bench(engine, workloads: dict[str, list[Prompt]], settings: list[Setting], opts: Options,
              costs: CostProfile, progress=None) -> list[dict]:
    """Run the whole schedule; return one result dict per workload (see `summarize_workload`)."""
    progress = progress or NullProgress()
    if any(s.spec == "auto" for s in settings) and engine.profile is None:
        raise ConfigError("--spec auto needs the engine's cost profile (session.ensure_profile)")
    every = max(1, opts.baseline_every)
    n_ctx = engine.target.n_ctx
    k_max = max(s.cap for s in settings)
    tokenized: dict[str, list[tuple[Prompt, list[int], int]]] = {}
    for name, prompts in workloads.items():
        rows = []
        for p in prompts:
            toks = prompt_tokens(engine, p)
            budget = min(opts.max_tokens, p.max_tokens or opts.max_tokens)
            if len(toks) + budget + k_max + 1 > n_ctx:
                raise ConfigError(f"prompt {p.id!r} ({name}) is {len(toks)} tokens; with {budget} new tokens "
                                  f"and k={k_max} it needs a context of {len(toks) + budget + k_max + 1}, "
                                  f"the context holds {n_ctx}: raise --ctx-size or lower --max-tokens")
            rows.append((p, toks, budget))
        tokenized[name] = rows

    total = sum(len(rows) for rows in tokenized.values()) * runs_per_prompt(len(settings), every, opts.repeat)
    if opts.warmup:
        _warmup(engine, next(iter(tokenized.values()))[0][1], settings, opts)
    progress.start(total)
    results = []
    n_prompt = 0
    for name, rows in tokenized.items():
        runs: list[BenchRun] = []
        for p, toks, budget in rows:
            for r in range(opts.repeat):
                order = settings if (n_prompt + r) % 2 == 0 else settings[::-1]
                runs += _run_prompt(engine, p, toks, budget, r, order, every, opts, progress, name)
            n_prompt += 1
        results.append(summarize_workload(name, [p for p, _, _ in rows], runs, settings, costs))
    progress.finish()
    return results


def _gen_config(setting: Setting | None, opts: Options, budget: int, seed: int,
                stop_tokens: frozenset[int] = frozenset()) -> GenConfig:
    cfg = GenConfig(temperature=opts.temperature, seed=seed, max_tokens=budget, stop_tokens=stop_tokens)
    if setting is None:
        return cfg.with_(spec="off")
    return cfg.with_(spec=setting.spec, drafter=setting.drafter, draft_max=setting.k,
                     ngram_draft_max=setting.ngram_cap, p_min=setting.p_min)


def _warmup(engine, toks: list[int], settings: list[Setting], opts: Options) -> None:
    """A few untimed tokens per code path, so first-touch costs (page faults, thread start-up,
    weight repacking) do not land in the first measured run."""
    seen = set()
    for s in [None, *settings]:
        key = None if s is None else (s.spec, s.drafter)
        if key in seen:
            continue
        seen.add(key)
        for _ in engine.generate(toks, _gen_config(s, opts, 8, opts.seed)):
            pass


def _run_prompt(engine, p: Prompt, toks, budget, r, order, every, opts, progress, workload) -> list[BenchRun]:
    seed = opts.seed + r  # the same seed for A and B: under sampling they draw from the same stream start
    stop = fim_stop_tokens(engine.target_model) if p.fim else frozenset()
    runs: list[BenchRun] = []
    for s in schedule(order, every):
        progress.step(f"{workload} {p.id} {'plain' if s is None else s.label}")
        chunks = list(engine.generate(toks, _gen_config(s, opts, budget, seed, stop)))
        runs.append(BenchRun(p.id, r, s, engine.last_stats, "".join(c.text for c in chunks)))
    plain_idx = [i for i, x in enumerate(runs) if x.setting is None]
    ref = runs[0].text
    for i, run in enumerate(runs):
        if run.setting is None:
            continue
        before = max(j for j in plain_idx if j < i)
        after = min(j for j in plain_idx if j > i)
        side = [runs[before].tps, runs[after].tps]
        run.baseline_tps = statistics.fmean(side) if all(x > 0 for x in side) else None
        run.identical = (run.text == ref) if opts.temperature <= 0 else None
    return runs
