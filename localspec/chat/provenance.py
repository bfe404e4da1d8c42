"""Which source each piece of a reply came from, as the history stores it.

In memory a reply's provenance is a list of runs `(text, source)` in the order they were
confirmed (source: "model" | "ngram" | "mtp" for accepted drafts, "target" for the target's own tokens).
Stored, it is compact JSON `[[source, text], ...]` with consecutive runs of one source joined.
This module is the one place that converts between the two."""

from __future__ import annotations

Run = tuple[str, str]  # (text, source)


def encode_runs(runs: list[Run]) -> list[list[str]]:
    out: list[list[str]] = []
    for text, source in runs:
        if out and out[-1][0] == source:
            out[-1][1] += text
        else:
            out.append([source, text])
    return out


def decode_runs(stored: list[list[str]] | None) -> list[Run]:
    return [(text, source) for source, text in (stored or [])]
