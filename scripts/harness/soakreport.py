"""scripts/soak's figures from its outcomes and samples, its goals, and the report (markdown, JSON, a plot)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from .soakclients import NOT_FAILURES, Outcome
from .soakrun import Sampler, counter_total

MIN_FOR_P99 = 30  # fewer answers in a tenth: its p99 is one request's, not a figure to hold a goal to
MIN_FOR_RSS_S = 600  # a shorter measured run: saved prompts, lanes and the allocator have not settled yet


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2)


def summarise(outcomes: list[Outcome], sampler: Sampler, marks: dict, quiet: dict[str, str]) -> dict:
    load0, load1 = marks["load_start"], marks["load_end"]
    tenth = (load1 - load0) / 10
    first = [o for o in outcomes if o.extra["phase"] == "load" and o.started < load0 + tenth]
    last = [o for o in outcomes if o.extra["phase"] == "load" and o.started >= load1 - tenth]
    return {"groups": _groups(outcomes, first, last), "failures": _failures(outcomes, marks),
            "drift": _drift(first, last), "memory": _memory(marks, sampler),
            "router": {"loads": _by_model(counter_total(sampler.samples, "localspec:model_loads_total")),
                       "unloads": _by_model(counter_total(sampler.samples, "localspec:model_unloads_total")),
                       "swapped": _by_model(counter_total(sampler.samples, "localspec:sequences_swapped_total"))},
            "greedy": _greedy(outcomes, quiet), "load_s": round(load1 - load0, 1)}


def _groups(outcomes, first, last) -> list[dict]:
    rows = defaultdict(list)
    for o in outcomes:
        rows[(o.extra["server"], o.req.protocol, o.req.model)].append(o)
    out = []
    for (server, proto, model), os_ in sorted(rows.items()):
        kinds = Counter(o.failure for o in os_)
        f = [o for o in first if (o.extra["server"], o.req.protocol, o.req.model) == (server, proto, model)]
        la = [o for o in last if (o.extra["server"], o.req.protocol, o.req.model) == (server, proto, model)]
        out.append({"server": server, "protocol": proto, "model": model, "sent": len(os_),
                    "answered": kinds[""], "overloaded": kinds["overloaded"], "hung_up": kinds["hung-up"],
                    "failed": {k: v for k, v in kinds.items() if k not in NOT_FAILURES},
                    **{f"{w}_{part}_p{q}": pct([getattr(o, w) for o in part_os if o.answered and getattr(o, w)], q / 100)
                       for part, part_os in (("first", f), ("last", la)) for w in ("first_s", "total_s")
                       for q in (50, 95, 99)}})
    return out


def _failures(outcomes, marks) -> dict:
    """Failures outside the documented ones, and those the kills cut (a request in flight when the server
    died: expected, counted apart)."""
    down = marks.get("down", [])  # (killed, answering again) of each crash
    real, cut = [], 0
    for o in outcomes:
        if o.failure in NOT_FAILURES:
            continue
        end = o.started + o.total_s
        if o.extra["phase"] == "crash" and any(o.started <= k <= end + 0.5 or k <= o.started <= up for k, up in down):
            cut += 1
            continue
        real.append(f"{o.extra['server']} {o.req.protocol} {o.req.model}: {o.failure} {o.detail}")
    return {"outside_documented": real, "cut_by_kill": cut}


def _drift(first, last) -> dict:
    """The last tenth's whole-answer p99 against the first tenth's, localspec's answers of the protocol and
    model pairs sent in both (the clients cycle through the same mix, so each tenth holds the same kinds)."""
    def mine(os_):
        return [o for o in os_ if o.extra["server"] == "localspec" and o.answered]
    def kind(o):
        return (o.req.protocol, o.req.model)
    f, la = mine(first), mine(last)
    both = {kind(o) for o in f} & {kind(o) for o in la}
    f2, la2 = [o.total_s for o in f if kind(o) in both], [o.total_s for o in la if kind(o) in both]
    p_f, p_l = pct(f2, 0.99), pct(la2, 0.99)
    enough = len(f2) >= MIN_FOR_P99 and len(la2) >= MIN_FOR_P99
    return {"same_requests": len(both), "first_n": len(f2), "last_n": len(la2), "first_p99": p_f, "last_p99": p_l,
            "first_p50": pct(f2, 0.5), "last_p50": pct(la2, 0.5),
            "ratio": round(p_l / p_f, 2) if p_f and p_l else None, "enough": enough}


def _memory(marks, sampler: Sampler) -> dict:
    """RSS and open files at the two quiet moments (the same two models loaded). The gate is RSS less the
    saved prompts held in memory: a cache bounded by --cache-ram, which fills as conversations park."""
    a, b = marks["quiet_after_warmup"], marks["quiet_at_end"]
    rss = [s.rss_mb for s in sampler.samples]
    net_a, net_b = a["rss_mb"] - a["saved_mb"], b["rss_mb"] - b["saved_mb"]
    return {"quiet_after_warmup": a, "quiet_at_end": b, "rss_growth": round(b["rss_mb"] / a["rss_mb"] - 1, 4),
            "net_growth": round(net_b / net_a - 1, 4), "peak_rss_mb": round(max(rss), 1) if rss else None,
            "files_growth": {k: b["files"][k] - a["files"][k] for k in a["files"]}}


def _by_model(totals: dict[str, float]) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, v in totals.items():
        model = k.split('model="')[1].split('"')[0] if 'model="' in k else "-"
        out[model] = out.get(model, 0) + int(v)
    return out


def _greedy(outcomes, quiet: dict[str, dict[str, str]]) -> dict:
    """Per server: greedy answers equal to the same request sent alone to a quiet server, and the partings
    (near-ties under load, docs/EXACT.md; scripts/soak-ties measures each), speculative and plain (a request's
    `exact` on a server started without --exact) apart, beside llama-server's own."""
    out = {}
    for server, answers in quiet.items():
        same, partings, exact_partings, default_n, texts = 0, [], [], 0, []
        for o in outcomes:
            key = o.req.key()
            if not (o.req.greedy and o.answered and key in answers and o.extra["server"] == server):
                continue
            exact = bool(o.req.body.get("exact")) and server == "localspec"
            default_n += not exact
            if o.text == answers[key]:
                same += 1
                continue
            q = answers[key]
            at = next((i for i, (x, y) in enumerate(zip(o.text, q)) if x != y), min(len(o.text), len(q)))
            seen = (f"{o.req.protocol} {o.req.model} ({o.extra['phase']}): parts at character {at}: "
                    f"{o.text[max(0, at - 20):at + 20]!r} / quiet {q[max(0, at - 20):at + 20]!r}")
            (exact_partings if exact else partings).append(seen)
            texts.append({"key": key, "exact": exact, "text": o.text, "quiet": q, "at": at})
        out[server] = {"same": same, "exact_partings": exact_partings, "partings": partings, "compared_default": default_n,
                       "distinct_requests": len(answers), "parted_texts": texts}
    return out


def goals(doc: dict, args) -> list[str]:
    failed = []
    if doc["failures"]["outside_documented"]:
        failed.append(f"{len(doc['failures']['outside_documented'])} errors outside the documented ones")
    m = doc["memory"]
    if doc["load_s"] >= MIN_FOR_RSS_S and m["net_growth"] > args.rss_growth:
        failed.append(f"RSS less saved prompts grew {m['net_growth']:.1%} after warm-up (at most {args.rss_growth:.0%})")
    if any(v > 0 for v in m["files_growth"].values()):
        failed.append(f"open files grew: {m['files_growth']}")
    d = doc["drift"]
    if d["enough"] and d["ratio"] and d["ratio"] > args.p99_growth:
        failed.append(f"the last tenth's p99 is {d['ratio']}x the first's (at most {args.p99_growth}x)")
    for c in doc["crashes"]:
        conv, saved = c["conversations"], c["saved_prompts"]
        if conv["lost"] or conv["truncated"]:
            failed.append(f"crash {c['crash']}: acknowledged writes lost {conv['lost'][:3]} truncated {conv['truncated'][:3]}")
        if saved["corrupt"] or c["profiles"]["damaged"] or c["log"]["traceback"]:
            failed.append(f"crash {c['crash']}: corrupt {saved['corrupt']} profiles {c['profiles']['damaged']} "
                          f"traceback {c['log']['traceback']}")
        if not isinstance(c["agent_answer_s"], float) or (c.get("damaged") and not c["log"]["dropped_saved_prompts"]):
            failed.append(f"crash {c['crash']}: the agent's request after the restart: {c['agent_answer_s']}, "
                          f"damaged saved prompts {c.get('damaged')}, dropped {c['log']['dropped_saved_prompts']}")
    not_ties = [t for t in doc.get("ties", []) if not t["near_tie"] and t["server"] == "localspec"]
    if not_ties:
        failed.append(f"{len(not_ties)} greedy partings under load that are not near-ties")
    if doc.get("exit_code") != 0 or not doc.get("clean_log"):
        failed.append(f"the server's Ctrl-C: exit {doc.get('exit_code')}, clean log {doc.get('clean_log')}")
    return failed


def markdown(doc: dict, failed: list[str], ties_table: str = "") -> str:
    L = [f"## Soak: {doc['args']['clients']} clients, {doc['load_s']:.0f} s measured after warm-up, "
         f"--parallel {doc['args']['parallel']}, {len(doc['crashes'])} crashes", "",
         "| server | protocol | model | sent | answered | overloaded | hung up | failed | first byte p50/p95/p99 "
         "first tenth -> last (s) | whole answer p50/p95/p99 first tenth -> last (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for g in doc["groups"]:
        def trio(w, part):
            return "/".join("-" if g[f"{w}_{part}_p{q}"] is None else f"{g[f'{w}_{part}_p{q}']:g}" for q in (50, 95, 99))
        L.append(f"| {g['server']} | {g['protocol']} | {g['model']} | {g['sent']} | {g['answered']} | {g['overloaded']} | "
                 f"{g['hung_up']} | {sum(g['failed'].values()) or 0} | {trio('first_s', 'first')} -> {trio('first_s', 'last')} | "
                 f"{trio('total_s', 'first')} -> {trio('total_s', 'last')} |")
    d, m, r = doc["drift"], doc["memory"], doc["router"]
    a, b = m["quiet_after_warmup"], m["quiet_at_end"]
    L += ["", f"- whole-answer p99 over the {d['same_requests']} protocol-and-model kinds sent in both tenths: {d['first_p99']} s "
              f"({d['first_n']} answers) -> {d['last_p99']} s ({d['last_n']}), ratio {d['ratio']}"
              f"{'' if d['enough'] else ' (too few answers to hold the goal to)'}; p50 {d['first_p50']} -> {d['last_p50']} s",
          f"- quiet RSS after warm-up {a['rss_mb']} MB -> at the end {b['rss_mb']} MB ({m['rss_growth']:+.1%}), of which "
          f"saved prompts in memory {a['saved_mb']} -> {b['saved_mb']} MB, anonymous {a.get('anon_mb', '-')} -> "
          f"{b.get('anon_mb', '-')} MB; less the saved prompts {m['net_growth']:+.1%}"
          f"{'' if doc['load_s'] >= MIN_FOR_RSS_S else ' (a run too short to hold the goal to)'}; peak "
          f"{m['peak_rss_mb']} MB; open files {a['files']} -> {b['files']}",
          f"- models loaded {r['loads']}, unloaded {r['unloads']}; sequences swapped {r['swapped']}",
          f"- errors outside the documented ones: {len(doc['failures']['outside_documented'])}; requests cut by a kill: "
          f"{doc['failures']['cut_by_kill']}",
          *(f"- {server}: greedy answers equal to a quiet server's {g['same']}; plain ones (`exact`) parted {len(g['exact_partings'])}; "
            f"default ones parted {len(g['partings'])} of {g['compared_default']} (near-ties under load: docs/EXACT.md); "
            f"{g['distinct_requests']} distinct requests replayed (exempt ones, docs/EXACT.md, are not)"
            for server, g in doc["greedy"].items()),
          f"- first start: listening {doc['started']['health_s']} s, every model answered {doc['started']['answered_s']} s", ""]
    if doc["crashes"]:
        L += ["| crash | at s | restart answered (s) | conversations / messages intact | lost | truncated | saved prompts "
              "whole / corrupt / partial writes | damaged on purpose / dropped | profiles intact | agent answer (s) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for c in doc["crashes"]:
            v, s = c["conversations"], c["saved_prompts"]
            L.append(f"| {c['crash']} | {c['after_s']} | {c['answered_s']} | {v['conversations']} / {v['messages']} | "
                     f"{len(v['lost'])} | {len(v['truncated'])} | {s['whole']} / {len(s['corrupt'])} / {s['partial_writes']} | "
                     f"{c.get('damaged', 0)} / {c['log']['dropped_saved_prompts']} | {c['profiles']['intact']} | {c['agent_answer_s']} |")
    if ties_table:
        L += ["", "Greedy partings under load, each checked (scripts/soak-ties):", "", ties_table]
    L += ["", *(f"- {x}" for x in doc["failures"]["outside_documented"][:20]), *(f"- {server} parted: {x}" for server, g in doc["greedy"].items()
                                                              for x in (g["exact_partings"] + g["partings"])[:12]),
          "", "goals: " + ("all held" if not failed else "FAILED: " + "; ".join(failed))]
    return "\n".join(L)


def save(doc: dict, outcomes: list[Outcome], sampler: Sampler, out: Path, text: str) -> None:
    (out / "soak.md").write_text(text + "\n")
    doc = {**doc, "samples": [{"t": round(s.t, 1), "rss_mb": round(s.rss_mb, 1), "files": s.files} for s in sampler.samples],
           "outcomes": [{"server": o.extra["server"], "kind": o.extra["kind"], "phase": o.extra["phase"],
                         "protocol": o.req.protocol, "model": o.req.model, "stream": o.req.stream,
                         "t": round(o.started - sampler.t0, 2), "first_s": o.first_s and round(o.first_s, 3),
                         "total_s": round(o.total_s, 3), "failure": o.failure, "detail": o.detail} for o in outcomes]}
    (out / "soak.json").write_text(json.dumps(doc, indent=1, default=str))
    try:
        _plot(doc, out / "soak.png")
    except ImportError:
        pass


def _plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] / 60 for s in doc["samples"]]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    a1.plot(t, [s["rss_mb"] for s in doc["samples"]], color="C0")
    a1.set_ylabel("server RSS (MB)")
    for kind, color in (("file", "C1"), ("socket", "C2"), ("pipe", "C3")):
        a2.plot(t, [s["files"][kind] for s in doc["samples"]], color=color, label=kind)
    a2.set_ylabel("open files")
    a2.set_xlabel("minutes")
    a2.legend(fontsize=8)
    for c in doc["crashes"]:
        for ax in (a1, a2):
            ax.axvline(c["after_s"] / 60, color="red", lw=0.8, alpha=0.6)
    a1.set_title("localspec serve under the soak (red: SIGKILL and restart)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
