"""PNG plots of a bench result (matplotlib, `pip install 'localspec[plot]'`): the speedup and the acceptance
by workload and drafter, written next to the report."""

from __future__ import annotations

from pathlib import Path


def make_plots(doc: dict, base: Path) -> list[tuple[str, str]]:
    """Write PNGs next to `base` (a path without suffix); return [(title, file name)].
    Raises ImportError when matplotlib is not installed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fixed = [s for s in doc["settings"] if s["spec"] == "on"]
    drafters = list(dict.fromkeys(s["drafter"] for s in fixed))
    if drafters:
        written.append(_speedup_plot(plt, doc, drafters, base))
    acceptance = _acceptance_plot(plt, doc, drafters, base)
    if acceptance:
        written.append(acceptance)
    return written


def _speedup_plot(plt, doc: dict, drafters: list[str], base: Path) -> tuple[str, str]:
    fig, axes = plt.subplots(1, len(drafters), figsize=(5.5 * len(drafters), 4), squeeze=False)
    for ax, d in zip(axes[0], drafters):
        for i, w in enumerate(doc["workloads"]):
            pts = sorted((s["setting"]["k"], s) for s in w["settings"]
                         if s["setting"]["spec"] == "on" and s["setting"]["drafter"] == d and not s["setting"]["p_min"])
            pts = [(k, s) for k, s in pts if s["ratio"]]
            if not pts:
                continue
            ks = [k for k, _ in pts]
            color = f"C{i % 10}"
            ax.plot(ks, [s["ratio"]["median"] for _, s in pts], "o-", color=color, label=w["workload"])
            ax.fill_between(ks, [s["ratio"]["min"] for _, s in pts], [s["ratio"]["max"] for _, s in pts],
                            color=color, alpha=0.12)
            lev = [(k, s["predicted"]["leviathan"]) for k, s in pts if s["predicted"]["leviathan"]]
            if lev:
                ax.plot([k for k, _ in lev], [v for _, v in lev], "--", color=color, alpha=0.6)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(f"{d} drafter (dashed: predicted)")
        ax.set_xlabel("k (draft tokens per round)")
        ax.set_ylabel("speedup over plain (median over prompts)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    name = base.name + "-speedup.png"
    fig.savefig(base.parent / name, dpi=110)
    plt.close(fig)
    return ("Speedup over plain by k, per workload", name)


def _acceptance_plot(plt, doc: dict, drafters: list[str], base: Path) -> tuple[str, str] | None:
    fig, axes = plt.subplots(1, max(1, len(drafters)), figsize=(5.5 * max(1, len(drafters)), 4), squeeze=False)
    any_line = False
    for ax, d in zip(axes[0], drafters or ["model"]):
        for i, w in enumerate(doc["workloads"]):
            cand = [s for s in w["settings"] if s["setting"]["drafter"] == d and s["setting"]["spec"] == "on"
                    and s["pooled"]["drafted"]]
            if not cand:
                continue
            s = max(cand, key=lambda x: x["setting"]["k"])
            acc = [(j + 1, a) for j, a in enumerate(s["pooled"]["acceptance_by_position"]) if a is not None]
            if acc:
                any_line = True
                ax.plot([j for j, _ in acc], [a for _, a in acc], "o-", color=f"C{i % 10}",
                        label=f"{w['workload']} (k={s['setting']['k']})")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{d} drafter: acceptance by draft position")
        ax.set_xlabel("draft position")
        ax.set_ylabel("share of rounds accepting it")
        if ax.get_legend_handles_labels()[0]:  # a drafter that drafted in no workload has no lines
            ax.legend(fontsize=8)
    fig.tight_layout()
    found = None
    if any_line:
        name = base.name + "-acceptance.png"
        fig.savefig(base.parent / name, dpi=110)
        found = ("Acceptance by draft position", name)
    plt.close(fig)
    return found
