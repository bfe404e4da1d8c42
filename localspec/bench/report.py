"""Turn bench results into terminal tables and a markdown report (the PNG plots: plots.py).

Everything here formats data the runner produced; nothing measures.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from ..costs.costmodel import CostProfile, best_k, implausible_pass, shape_penalty

ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


# --- small formatting helpers -----------------------------------------------------------------

def f2(x, nd: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def fspread(s: dict | None, nd: int = 2, sep: str = "-") -> str:
    if not s:
        return "n/a"
    if s["n"] == 1 or abs(s["max"] - s["min"]) < 10 ** -nd:
        return f"{s['median']:.{nd}f}"
    return f"{s['median']:.{nd}f} [{s['min']:.{nd}f}{sep}{s['max']:.{nd}f}]"


def fpos(xs: list, n: int = 8) -> str:
    vals = [("-" if x is None else f"{x:.2f}") for x in xs[:n]]
    return " ".join(vals) + (" ..." if len(xs) > n else "") if vals else "n/a"


def fsplit(split: dict) -> str:
    return "/".join(f"{100 * split[k]:.0f}" for k in ("prompt_eval", "draft", "verify", "other"))


def ms(s: float | None) -> str:
    return "n/a" if s is None else f"{1000 * s:.2f} ms"


def text_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> list[str]:
    right = right if right is not None else set(range(1, len(headers)))
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(r):
        return "  ".join((str(c).rjust(w) if i in right else str(c).ljust(w)) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    return [line(headers), "  ".join("-" * w for w in widths), *[line(r) for r in rows]]


def md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    esc = [[str(c).replace("|", "\\|") for c in r] for r in [headers, *rows]]
    out = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in esc[1:]]
    return out


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}


# --- pass costs -------------------------------------------------------------------------------

def costs_dict(c: CostProfile) -> dict:
    return {
        "t_decode": c.t_decode,
        "t_draft": c.t_draft,
        "t_ngram": c.t_ngram,
        "t_verify": list(c.t_verify),
        "verify_ratio": c.relative_verify(),
        "draft_ratio": (c.t_draft / c.t_decode) if c.t_draft else None,
        "measured_at": c.measured_at,
        "key": c.key,
    }


def cost_warnings(c: CostProfile, what: str = "pass costs", steady: list[float] | None = None) -> list[str]:
    """Signs that the costs were measured on a busy machine: a pass over n tokens cannot be much
    cheaper than a pass over fewer (the weights are read once either way). With `steady` (the
    backend's own curve, tuning.steady_verify): verification much dearer than that curve."""
    out = []
    worse = shape_penalty(c.t_verify, steady) if steady else None
    if worse is not None:
        n, ratio = worse
        out.append(f"verifying {n} tokens costs {c.t_verify[n - 1] / c.t_verify[0]:.2f}x a decode as generation runs it, "
                   f"but {steady[n - 1] / steady[0]:.2f}x when passes of that size repeat (the backend's own curve, "
                   f"as llama-bench measures it): {ratio:.2f}x dearer. Speculation pays only when verifying k tokens "
                   "costs little more than one, so every draft loses here; on CUDA, passes that change shape are "
                   "captured as new graphs each time (constant verify shapes are the default on a GPU; "
                   "GGML_CUDA_DISABLE_GRAPHS=1 shows the difference)")
    bad = implausible_pass(c.t_verify)
    if bad is None:
        return out
    (n, m), tv = bad, c.t_verify
    return out + [f"{what} look disturbed: T_verify({n}) = {1000 * tv[n - 1]:.2f} ms is below T_verify({m}) = "
                  f"{1000 * tv[m - 1]:.2f} ms; the machine was probably busy while measuring, so predictions "
                  "(and --spec auto) may be off: rerun when it is quiet"]


def break_even(c: CostProfile, k_max: int = 8) -> list[dict]:
    """Best k and predicted speedup per drafter at a few per-token acceptance rates."""
    rows = []
    for a in ALPHAS:
        row = {"alpha": a}
        for src in ("model", "ngram"):
            if src == "model" and not c.t_draft:
                row[src] = None
                continue
            k, gain = best_k(a, k_max, c, src)
            row[src] = {"k": k, "speedup": gain}
        rows.append(row)
    return rows


def costs_lines(c: CostProfile, header: str = "") -> list[str]:
    out = [header] if header else []
    out.append(f"T_decode  {ms(c.t_decode)}  (plain decoding: {1 / c.t_decode:.1f} tok/s)")
    if c.t_draft:
        out.append(f"T_draft   {ms(c.t_draft)}  = {c.t_draft / c.t_decode:.2f} x T_decode (one draft-model token)")
    else:
        out.append("T_draft   n/a (no draft model; n-gram drafts cost ~0)")
    out.append("")
    rows = [[str(n), ms(t), f"{t / c.t_decode:.2f}", f"{t / c.t_decode / n:.2f}"] for n, t in enumerate(c.t_verify, 1)]
    out += text_table(["n", "T_verify(n)", "/ T_decode", "per token"], rows)
    out.append("")
    out.append("best k (0 = plain) and predicted speedup over plain, by per-token acceptance alpha:")
    be = break_even(c)
    rows = [[f"{r['alpha']:.2f}",
             "n/a" if r["model"] is None else f"k={r['model']['k']}  {r['model']['speedup']:.2f}x",
             f"k={r['ngram']['k']}  {r['ngram']['speedup']:.2f}x"] for r in be]
    out += text_table(["alpha", "model draft", "n-gram draft"], rows)
    return out


def costs_md(c: CostProfile) -> list[str]:
    out = [f"T_decode = {ms(c.t_decode)} (plain: {1 / c.t_decode:.1f} tok/s); "
           + (f"T_draft = {ms(c.t_draft)} = {c.t_draft / c.t_decode:.2f} x T_decode." if c.t_draft
              else "no draft model."), ""]
    out += md_table(["n", "T_verify(n)", "T_verify(n) / T_decode"],
                    [[str(n), ms(t), f"{t / c.t_decode:.2f}"] for n, t in enumerate(c.t_verify, 1)])
    return out


# --- bench results ----------------------------------------------------------------------------

DETAIL_HEADERS = ["setting", "tok/s", "plain tok/s", "ratio med [min-max]", "pooled", "pred Lev.", "pred rounds",
                  "accept", "alpha", "acc.len", "passes/tok", "accept by position", "time p/d/v/o %", "same"]


def detail_rows(w: dict, sep: str = "-") -> list[list[str]]:
    rows = []
    for s in w["settings"]:
        p = s["pooled"]
        same = s["identical_outputs"]
        rows.append([
            s["setting"]["label"], fspread(s["spec_tps"], 1, sep), fspread(s["plain_tps"], 1, sep),
            fspread(s["ratio"], 2, sep), f2(s["ratio_pooled"]),
            f2(s["predicted"]["leviathan"]), f2(s["predicted"]["rounds"]),
            f2(p["acceptance_rate"]), f2(p["alpha"]), f2(p["mean_accepted_length"]), f2(p["passes_per_token"]),
            fpos(p["acceptance_by_position"]), fsplit(p["time_split"]),
            "n/a" if same is None else f"{same['same']}/{same['of']}",
        ])
    return rows


def matrix(doc: dict, key, plain: bool = False) -> tuple[list[str], list[list[str]]]:
    """Workloads x settings; with `plain`, a column of plain tok/s after the workload."""
    labels = [s["label"] for s in doc["settings"]]
    rows = []
    for w in doc["workloads"]:
        by = {s["setting"]["label"]: s for s in w["settings"]}
        first = [w["workload"]] + ([f2(w["plain"]["tps"]["median"] if w["plain"]["tps"] else None, 1)] if plain else [])
        rows.append([*first, *[key(by[lab]) if lab in by else "" for lab in labels]])
    return ["workload", *(["plain tok/s"] if plain else []), *labels], rows


def header_lines(doc: dict) -> list[str]:
    o, pair, load = doc["options"], doc["pair"], doc["load"]
    mode = "greedy" if o["temperature"] <= 0 else f"temperature {o['temperature']} (seed {o['seed']})"
    files = Path(pair["target"]).name + (f" + {Path(pair['draft']).name}" if pair["draft"] else " (no draft model)")
    same = pair["name"] in (files, Path(pair["target"]).name)
    return [
        f"pair: {files}" if same else f"pair: {pair['name']} ({files})",
        f"{load['threads']} threads, {mode}, max {o['max_tokens']} new tokens, "
        f"{o['prompts_per_workload'] or 'all'} prompt(s) per workload, repeat {o['repeat']}, "
        f"plain run after every {o['baseline_every']} speculative run(s)"
        + (f"; {o['background_load']} busy background process(es) during the runs" if o.get("background_load") else ""),
    ]


def text_report(doc: dict) -> str:
    out = [f"localspec bench ({doc['created']})", *header_lines(doc)]
    c = doc["costs"]
    vr = " ".join(f"{x:.2f}" for x in c["verify_ratio"])
    out.append(f"pass costs: T_decode {ms(c['t_decode'])}; T_verify(n)/T_decode for n=1..{len(c['verify_ratio'])}: {vr}"
               + (f"; T_draft/T_decode {c['draft_ratio']:.2f}" if c["draft_ratio"] else ""))
    for wmsg in doc.get("warnings", []):
        out.append(f"warning: {wmsg}")
    out.append("")
    out.append("speed ratio, speculative / plain tok/s (median over prompts; above 1.00 = faster than plain):")
    h, rows = matrix(doc, lambda s: f2(s["ratio"]["median"]) if s["ratio"] else "n/a", plain=True)
    out += text_table(h, rows)
    out.append("")
    out.append("acceptance rate (accepted / drafted tokens):")
    h, rows = matrix(doc, lambda s: f2(s["pooled"]["acceptance_rate"]))
    out += text_table(h, rows)
    for w in doc["workloads"]:
        out.append("")
        out.append(f"{w['workload']}: {w['description']} ({len(w['prompts'])} prompts; plain {fspread(w['plain']['tps'], 1)} tok/s)")
        out += text_table(DETAIL_HEADERS, detail_rows(w), right=set(range(1, len(DETAIL_HEADERS))))
        out += completion_lines(w)
    out.append("")
    out += LEGEND
    return "\n".join(out) + "\n"


def completion_lines(w: dict) -> list[str]:
    """Per setting: completion latency (prompt + generation, median over prompts) and, for fim, the share
    of completions that reproduce the real lines."""
    rows = [s for s in w["settings"] if s.get("latency_s")]
    if not rows:
        return []
    rows = [{"setting": {"label": "plain"}, **w["plain"]}, *rows]
    out = ["  latency, median [min-max] over prompts" + ("; completions equal to the real lines" if
                                                             rows[0].get("reference_match") else "") + ":"]
    for s in rows:
        ref = s.get("reference_match")
        out.append(f"    {s['setting']['label']:<22} {fspread(s['latency_s'], 2)} s"
                   + (f"; the real lines in {ref['same']:g} of {ref['of']} prompts" if ref else ""))
    return out


LEGEND = [
    "ratio: speculative tok/s over the mean of the two plain runs bracketing it, median [min-max] over prompts;",
    "pooled: all tokens over all time, same pairing; pred Lev.: Leviathan et al. from alpha, k and measured pass",
    "costs (fixed k only); pred rounds: the realised rounds priced by the measured pass costs; accept: accepted /",
    "drafted; alpha: per-token acceptance (i.i.d. estimate); acc.len: accepted tokens per drafting round;",
    "accept by position: share of rounds drafting position i whose token i was accepted; time p/d/v/o: prompt",
    "evaluation / drafting / verification / other, % of run time; same: greedy outputs identical to plain.",
]


def markdown_report(doc: dict, plots: list[tuple[str, str]] | None, plot_note: str | None) -> str:
    o = doc["options"]
    out = ["# localspec bench report", ""]
    out += [f"- date: {doc['created']}",
            f"- localspec {doc['localspec']}, llama-cpp-python {doc['llama_cpp_python']}",
            f"- machine: {doc['machine']['cpu']}, {doc['machine']['cores']} cores, {doc['machine']['platform']}",
            *[f"- {x}" for x in header_lines(doc)],
            f"- command: `{doc['command']}`", ""]
    for wmsg in doc.get("warnings", []):
        out += [f"> **Warning:** {wmsg}", ""]
    out += ["## Method", "",
            "For each prompt, plain decoding (A) and each speculative setting (B) run alternately on the same",
            f"prompt (A B A B ..., a plain run after every {o['baseline_every']} speculative run(s)); each speculative run is",
            "compared with the mean tok/s of the two plain runs around it. tok/s counts generated tokens over",
            "generation time (prompt evaluation excluded; the prompt's cache is reused between runs of the same prompt).",
            "Ratios are summarised as the median and min-max over prompts. Predictions use pass costs measured at the",
            "start of this run (below): Leviathan et al., E[tokens/pass] = (1 - alpha^(k+1)) / (1 - alpha) at cost",
            "k * T_draft + T_verify(k+1) per round (T_draft ~ 0 for n-gram drafts; rounds without an n-gram match",
            "count as plain steps), and the realised rounds priced by the same costs.", ""]
    out += ["## Pass costs", ""] + costs_md(CostProfile(**{k: doc["costs"][k] for k in ("t_decode", "t_verify", "t_draft", "t_ngram")})) + [""]
    if doc.get("auto_profile"):
        ap = doc["auto_profile"]
        out += [f"`--spec auto` used the stored cost profile measured {ap['measured_at'] or '(unknown time)'}: "
                f"T_verify(n)/T_decode = {', '.join(f'{x:.2f}' for x in ap['verify_ratio'][:8])}"
                + (f", T_draft/T_decode = {ap['draft_ratio']:.2f}" if ap["draft_ratio"] else "") + ".", ""]
    out += summary_tables(doc, "##")
    for w in doc["workloads"]:
        out += [f"## {w['workload']}: {w['description']}", "",
                f"Prompts: {', '.join(w['prompts'])}. Plain: {fspread(w['plain']['tps'], 1, '–')} tok/s.", ""]
        out += md_table(DETAIL_HEADERS, detail_rows(w, "–")) + [""]
    out += ["Columns: " + " ".join(LEGEND), ""]
    out += ["## Plots", ""]
    if plots:
        for title, name in plots:
            out += [f"![{title}]({name})", ""]
    else:
        out += [plot_note or "No plots.", ""]
    if doc.get("json_file"):
        out += [f"All figures, per prompt: [{doc['json_file']}]({doc['json_file']}).", ""]
    return "\n".join(out)


def summary_tables(doc: dict, level: str = "**") -> list[str]:
    """The headline tables: speed ratio, measured vs predicted, acceptance (markdown)."""
    def title(t):
        return [f"{level} {t}", ""] if level.startswith("#") else [f"**{t}**", ""]

    out = title("Speed ratio: speculative / plain tok/s, median [min–max] over prompts")
    h, rows = matrix(doc, lambda s: fspread(s["ratio"], 2, "–"), plain=True)
    out += md_table(h, rows) + [""]
    out += title("Measured vs predicted speedup, pooled over prompts: measured / Leviathan / realised rounds")
    h, rows = matrix(doc, lambda s: f"{f2(s['ratio_pooled'])} / {f2(s['predicted']['leviathan'])} / {f2(s['predicted']['rounds'])}")
    out += md_table(h, rows) + [""]
    out += title("Acceptance rate (accepted / drafted) and mean accepted length per drafting round")
    h, rows = matrix(doc, lambda s: f"{f2(s['pooled']['acceptance_rate'])} / {f2(s['pooled']['mean_accepted_length'])}")
    out += md_table(h, rows) + [""]
    return out


def summary_md(doc: dict, report_link: str | None = None) -> str:
    """A self-contained block for docs/BENCHMARKS.md: how it was measured, then the tables."""
    c = doc["costs"]
    m = doc["machine"]
    out = [f"Measured {doc['created']} with localspec {doc['localspec']} and llama-cpp-python {doc['llama_cpp_python']} "
           f"on {m['cpu']} ({m['cores']} cores, {m['platform']}).", ""]
    out += [f"- {x}" for x in header_lines(doc)]
    out += [f"- command: `{doc['command']}`",
            f"- pass costs: T_decode = {ms(c['t_decode'])}; T_verify(n)/T_decode for n = 1..{len(c['verify_ratio'])}: "
            + ", ".join(f"{x:.2f}" for x in c["verify_ratio"])
            + (f"; T_draft/T_decode = {c['draft_ratio']:.2f}" if c["draft_ratio"] else ""), ""]
    for wmsg in doc.get("warnings", []):
        out += [f"> **Warning:** {wmsg}", ""]
    out += summary_tables(doc)
    if report_link:
        out += [f"Full report (per-workload details, acceptance by position, time split, plots): [{report_link}]({report_link}).", ""]
    return "\n".join(out)


def _block(path: Path, name: str) -> tuple[str, int, int]:
    from ..errors import ConfigError

    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    try:
        doc = path.read_text()
    except OSError as e:
        raise ConfigError(f"--doc-block: cannot read {path}: {e.strerror or e}")
    i, j = doc.find(start), doc.find(end)
    if i < 0 or j < i:
        raise ConfigError(f"--doc-block: {path} has no block {start} ... {end}")
    return doc, i + len(start), j


def check_block(path: Path, name: str) -> None:
    """Fail now, not after an hour of benchmarking, when the block is missing."""
    _block(path, name)


def fill_block(path: Path, name: str, text: str) -> None:
    """Replace what stands between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` in a markdown file."""
    doc, i, j = _block(path, name)
    path.write_text(doc[:i] + "\n" + text.rstrip("\n") + "\n" + doc[j:])
