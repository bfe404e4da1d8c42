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

from .. import costmodel as predict
from ..config import GenConfig
from ..costmodel import CostProfile
from ..chat_format import Message
from ..errors import ConfigError
from ..fim import fim_stop_tokens, infill_tokens
from ..stats import Stats
from .workloads import BUILTIN, Prompt

SPECS = ("on", "auto")
DRAFTERS = ("model", "ngram", "hybrid")


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
class Run:
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
        raise ConfigError("--spec auto needs the engine's cost profile (localspec.tuning.ensure_profile)")
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
        runs: list[Run] = []
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


def _run_prompt(engine, p: Prompt, toks, budget, r, order, every, opts, progress, workload) -> list[Run]:
    seed = opts.seed + r  # the same seed for A and B: under sampling they draw from the same stream start
    stop = fim_stop_tokens(engine.target_model) if p.fim else frozenset()
    runs: list[Run] = []
    for s in schedule(order, every):
        progress.step(f"{workload} {p.id} {'plain' if s is None else s.label}")
        chunks = list(engine.generate(toks, _gen_config(s, opts, budget, seed, stop)))
        runs.append(Run(p.id, r, s, engine.last_stats, "".join(c.text for c in chunks)))
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


# --- aggregation ------------------------------------------------------------------------------

def spread(values: list[float]) -> dict | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def _add_dicts(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def pool_stats(stats: list[Stats]) -> dict:
    """Counters and times summed over runs, and the figures derived from the sums."""
    t = {"runs": len(stats), "tokens": 0, "target_passes": 0, "rounds_plain": 0, "drafted": 0, "accepted": 0,
         "prompt_tokens": 0, "prompt_eval_tokens": 0,
         "drafted_by_position": [], "accepted_by_position": [], "drafted_by_drafter": {},
         "accepted_by_drafter": {}, "tokens_by_source": {}, "stop_reasons": {},
         "prompt_eval_s": 0.0, "draft_s": 0.0, "verify_s": 0.0, "other_s": 0.0, "generation_s": 0.0}
    for s in stats:
        for k in ("tokens", "target_passes", "rounds_plain", "drafted", "accepted", "prompt_tokens",
                  "prompt_eval_tokens"):
            t[k] += getattr(s, k)
        for k in ("prompt_eval_s", "draft_s", "verify_s", "other_s", "generation_s"):
            t[k] += getattr(s, k)
        for k in ("drafted_by_position", "accepted_by_position"):
            t[k] = _add_lists(t[k], getattr(s, k))
        for k in ("drafted_by_drafter", "accepted_by_drafter", "tokens_by_source"):
            t[k] = _add_dicts(t[k], getattr(s, k))
        t["stop_reasons"][s.stop_reason] = t["stop_reasons"].get(s.stop_reason, 0) + 1
    dbp, abp = t["drafted_by_position"], t["accepted_by_position"]
    draft_rounds = t["target_passes"] - t["rounds_plain"]
    t["draft_rounds"] = draft_rounds
    t["tokens_per_second"] = t["tokens"] / t["generation_s"] if t["generation_s"] > 0 else 0.0
    t["acceptance_rate"] = t["accepted"] / t["drafted"] if t["drafted"] else None
    t["alpha"] = predict.estimate_alpha(dbp, abp)
    t["mean_accepted_length"] = t["accepted"] / draft_rounds if draft_rounds else None
    t["mean_draft_length"] = t["drafted"] / draft_rounds if draft_rounds else None
    t["tokens_per_pass"] = t["tokens"] / t["target_passes"] if t["target_passes"] else None
    t["passes_per_token"] = t["target_passes"] / t["tokens"] if t["tokens"] else None
    t["acceptance_by_position"] = [a / d if d else None for a, d in zip(abp, dbp)]
    t["conditional_acceptance_by_position"] = predict.conditional_by_position(dbp, abp)
    t["acceptance_by_drafter"] = {k: (t["accepted_by_drafter"].get(k, 0) / v if v else None)
                                  for k, v in t["drafted_by_drafter"].items()}
    total = t["prompt_eval_s"] + t["generation_s"]
    t["time_split"] = {k: (t[f"{k}_s"] / total if total > 0 else 0.0)
                       for k in ("prompt_eval", "draft", "verify", "other")}
    return t


def summarize_setting(setting: Setting, runs: list[Run], prompts: list[Prompt], costs: CostProfile) -> dict:
    mine = [r for r in runs if r.setting == setting]
    per_prompt = []
    for p in prompts:
        rs = [r for r in mine if r.prompt == p.id]
        if not rs:
            continue
        ratios = [r.ratio for r in rs if r.ratio is not None]
        per_prompt.append({
            "id": p.id,
            "spec_tps": statistics.median([r.tps for r in rs]),
            "plain_tps": statistics.median([r.baseline_tps for r in rs if r.baseline_tps] or [0.0]),
            "ratio": statistics.median(ratios) if ratios else None,
            "tokens": statistics.median([r.stats.tokens for r in rs]),
            "acceptance_rate": (sum(r.stats.accepted for r in rs) / sum(r.stats.drafted for r in rs)
                                if sum(r.stats.drafted for r in rs) else None),
            "identical": None if rs[0].identical is None else all(r.identical for r in rs),
            "latency_s": statistics.median([r.stats.total_s for r in rs]),
            "reference_match": (None if p.reference is None else
                                sum(_same_code(r.text, p.reference) for r in rs) / len(rs)),
        })
    pooled = pool_stats([r.stats for r in mine])
    timed = [r for r in mine if r.baseline_tps]
    spec_s = sum(r.stats.generation_s for r in timed)
    plain_s = sum(r.stats.tokens / r.baseline_tps for r in timed)  # plain's time for the same tokens
    ratio_pooled = plain_s / spec_s if spec_s > 0 and plain_s > 0 else None
    model_share = ((pooled["drafted_by_drafter"].get("model", 0) / pooled["drafted"]) if pooled["drafted"]
                   else (1.0 if setting.drafter == "model" else 0.0))
    plain_share = pooled["rounds_plain"] / pooled["target_passes"] if pooled["target_passes"] else 0.0
    lev = (predict.predict_leviathan(pooled["alpha"], setting.k, costs, model_share, plain_share)
           if setting.spec == "on" else None)
    rounds = predict.predict_from_rounds(pooled["tokens"], pooled["rounds_plain"], pooled["drafted_by_position"],
                                         pooled["drafted_by_drafter"], costs)
    identical = [x["identical"] for x in per_prompt if x["identical"] is not None]
    return {
        "setting": setting.to_dict(),
        "ratio": spread([x["ratio"] for x in per_prompt]),
        "spec_tps": spread([x["spec_tps"] for x in per_prompt]),
        "plain_tps": spread([x["plain_tps"] for x in per_prompt if x["plain_tps"] > 0]),
        "ratio_pooled": ratio_pooled,
        "predicted": {"leviathan": lev, "rounds": rounds},
        "identical_outputs": ({"same": sum(identical), "of": len(identical)} if identical else None),
        "latency_s": spread([x["latency_s"] for x in per_prompt]),
        "reference_match": _matches(per_prompt),
        "pooled": pooled,
        "per_prompt": per_prompt,
    }


def _matches(per_prompt: list[dict]) -> dict | None:
    """Runs (pooled over prompts) whose completion reproduces the real lines: {"same", "of"}."""
    shares = [x["reference_match"] for x in per_prompt if x["reference_match"] is not None]
    return {"same": round(sum(shares), 2), "of": len(shares)} if shares else None


def _same_code(text: str, reference: str) -> bool:
    """The completion reproduces the cut lines (trailing whitespace aside)."""
    def norm(s: str) -> list[str]:
        return [ln.rstrip() for ln in s.strip("\n").splitlines()]
    return norm(text)[:len(norm(reference))] == norm(reference)


def summarize_workload(name: str, prompts: list[Prompt], runs: list[Run], settings: list[Setting],
                       costs: CostProfile) -> dict:
    plain = [r for r in runs if r.setting is None]
    plain_pp = []
    for p in prompts:
        rs = [r for r in plain if r.prompt == p.id]
        plain_pp.append({"id": p.id, "tps": statistics.median([r.tps for r in rs]), "runs": len(rs),
                         "tokens": statistics.median([r.stats.tokens for r in rs]),
                         "latency_s": statistics.median([r.stats.total_s for r in rs]),
                         "reference_match": (None if p.reference is None else
                                             sum(_same_code(r.text, p.reference) for r in rs) / len(rs))})
    return {
        "workload": name,
        "description": BUILTIN.get(name, "user prompts (--prompts)"),
        "prompts": [p.id for p in prompts],
        "plain": {"tps": spread([x["tps"] for x in plain_pp if x["tps"] > 0]), "pooled": pool_stats([r.stats for r in plain]),
                  "latency_s": spread([x["latency_s"] for x in plain_pp]),
                  "reference_match": _matches(plain_pp), "per_prompt": plain_pp},
        "settings": [summarize_setting(s, runs, prompts, costs) for s in settings],
    }
