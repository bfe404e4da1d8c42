"""The status bar's figures: live speculation stats and the speedup estimated from measured costs.

Estimated speedup over plain decoding = tokens * T_decode / (sum of round costs), the realised
rounds priced by the measured profile (`predictions.predict_from_rounds`, the same figure the bench
prints): a round that drafted k tokens costs T_verify(k + 1) plus the drafting (k * T_draft for
the draft model, ~0 for the n-gram lookup).
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.content import Content

from ..costs.predictions import estimated_speedup

DRAFT_STYLE = "bold #5fd75f"  # accepted draft tokens (draft model or n-gram lookup)
TARGET_STYLE = "#ffaf00"  # tokens the target produced itself (corrections and bonus tokens)


def is_draft(source: str | None) -> bool:
    return source in ("model", "ngram", "mtp")


@dataclass
class Live:
    """A snapshot of a reply's figures, taken in the generation thread."""
    tokens: int = 0
    tok_s: float = 0.0
    drafted: int = 0
    acceptance: float = 0.0
    mean_accepted: float = 0.0
    passes_per_token: float = 0.0
    spec: str = ""
    speedup: float | None = None
    draft_tokens: int = 0  # emitted tokens that were accepted drafts
    stop_reason: str = ""

    @classmethod
    def of(cls, stats, elapsed_s: float, profile) -> "Live":
        return cls(tokens=stats.tokens, tok_s=stats.tokens / elapsed_s if elapsed_s > 0 else 0.0,
                   drafted=stats.drafted, acceptance=stats.acceptance_rate,
                   mean_accepted=stats.mean_accepted_length,
                   passes_per_token=stats.target_passes / stats.tokens if stats.tokens else 0.0,
                   spec=stats.spec_mode, speedup=estimated_speedup(stats, profile),
                   draft_tokens=sum(v for k, v in stats.tokens_by_source.items() if is_draft(k)),
                   stop_reason=stats.stop_reason)


def format_status(state: str, spec: str, k: int, temperature: float, live: Live | None,
                  provenance: bool = False, has_profile: bool = False, measuring: str | None = None) -> Content:
    """One line (wrapping on narrow terminals): state │ settings │ live figures │ legend. measuring: where
    this machine's first measurements stand, in a word, while they are not done (costs/idle.py)."""
    sep = (" │ ", "dim")
    parts: list = [(state, "bold"), sep, (f"spec {spec} k={k} temp={temperature:g}", "")]
    if measuring and not state.startswith("measuring"):
        parts += [sep, (measuring, "dim")]
    if live is not None and live.tokens:
        parts += [sep, (f"{live.tok_s:.1f} tok/s", "bold")]
        if live.drafted:
            parts += [sep, (f"accept {100 * live.acceptance:.0f}%", ""), sep,
                      (f"mean acc len {live.mean_accepted:.2f}", "")]
        else:
            parts += [sep, ("accept n/a", "dim")]
        parts += [sep, (f"{live.passes_per_token:.2f} passes/tok", "")]
        if live.spec == "off":
            parts += [sep, ("plain decoding", "dim")]
        elif live.speedup is not None:
            parts += [sep, (f"≈{live.speedup:.2f}× vs plain (est.)", "bold")]
        else:
            parts += [sep, ("speedup n/a" + (" (noisy cost profile: localspec tune)" if has_profile
                                             else " (no cost profile: /spec auto measures one)"), "dim")]
    if provenance:
        parts += [sep, ("■ draft", DRAFT_STYLE), (" ", ""), ("■ target", TARGET_STYLE)]
    return Content.assemble(*parts)


def reply_note(live: Live | None, stop_reason: str, error: str | None) -> str:
    """The footnote under a finished reply."""
    bits = []
    if live is not None and live.tokens:
        bits.append(f"{live.tokens} tok · {live.tok_s:.1f} tok/s")
        if live.drafted:
            bits.append(f"accept {100 * live.acceptance:.0f}% · {live.draft_tokens}/{live.tokens} from drafts")
        if live.speedup is not None and live.spec != "off":
            bits.append(f"≈{live.speedup:.2f}× est.")
    why = {
        "cancelled": "cancelled — kept what was confirmed",
        "length": "stopped at the token limit (-n / --max-tokens)",
        "context": "the context is full — /new starts a fresh conversation (or raise --ctx-size)",
        "stop": "stopped at a stop string",
    }.get(stop_reason)
    if error:
        why = f"reply failed: {error}" + (" — kept what was confirmed" if live and live.tokens else "")
    if why:
        bits.append(why)
    return " · ".join(bits)
