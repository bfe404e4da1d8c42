"""pull, rm, the status of a pair's files, and draft suggestions for `check`."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from ..errors import ConfigError, ModelLoadError
from .bundle import ChainedChunks, assembled_path, stamp_path
from .gguf_header import GgufHeaderError
from .hub import (
    HubFile,
    Notify,
    download_hf_file,
    hf_cached_file,
    note_to_stderr,
    open_hub_file,
    parse_hub_ref,
    remove_hf_cached_file,
)
from .registry import ModelSource, PairSpec, get_pair, load_registry
from .resolve import locate, materialize

# ------------------------------------------------------------------ pull, rm, listing, check helpers


@dataclass
class FileStatus:
    role: str
    source: str
    state: str
    path: str | None
    size: int | None
    problem: str | None = None


def file_status(source: ModelSource, role: str) -> FileStatus:
    loc = locate(source)
    size = loc.path.stat().st_size if loc.path is not None else source.known_size
    return FileStatus(role, source.label, loc.state, str(loc.path) if loc.path else None, size, loc.problem)


def pair_status(spec: PairSpec) -> list[FileStatus]:
    out = [file_status(spec.target, "target")]
    if spec.draft is not None:
        out.append(file_status(spec.draft, "draft"))
    return out


def pull_pair(name: str, notify: Notify | None = note_to_stderr) -> list[tuple[str, Path]]:
    """Make both files of a pair present (bundle first, else download). Returns (role, path) pairs."""
    spec = get_pair(name)
    sources = [("target", spec.target)] + ([("draft", spec.draft)] if spec.draft else [])
    return [(role, materialize(source, name, role, pull=True, notify=notify)) for role, source in sources]


def pull_ref(ref: str, notify: Notify | None = note_to_stderr) -> Path:
    hub = parse_hub_ref(ref)
    if hub is None:
        raise ConfigError(f"{ref!r} is neither a pair name nor ORG/REPO/FILE.gguf; `localspec models` lists pairs")
    hf = HubFile(hub.repo, hub.file, hub.revision)
    return hf_cached_file(hf.repo, hf.file, hf.revision) or download_hf_file(hf, notify)


def remove_pair(name: str) -> list[tuple[str, int]]:
    """Delete the pair's downloaded and assembled files (never files named by `path:`).
    Returns (path, bytes freed) for each file removed."""
    spec = get_pair(name)
    removed: list[tuple[str, int]] = []
    for source in (spec.target, spec.draft):
        if source is None:
            continue
        if source.bundle is not None:
            dest = assembled_path(source)
            if dest.exists():
                size = dest.stat().st_size
                dest.unlink()
                stamp_path(dest).unlink(missing_ok=True)
                removed.append((str(dest), size))
        if source.hf is not None:
            cached = hf_cached_file(source.hf.repo, source.hf.file, source.hf.revision)
            if cached is not None:
                removed.append((str(cached), remove_hf_cached_file(cached)))
    return removed


def suggest_drafts(target_ref: str, target_summary: Any = None) -> list[dict[str, str]]:
    """Drafts from the registry for a target: pairs with this exact target first, then pairs whose
    target repo belongs to the same model family (the GGUF's general.basename, e.g. Qwen2.5-Coder)."""
    registry = load_registry()
    hub = parse_hub_ref(target_ref)
    where = Path(getattr(target_summary, "where", "") or "")
    family = _family_of(target_summary)

    def same_target(spec: PairSpec) -> bool:
        t = spec.target
        if spec.name == target_ref:
            return True
        if hub is not None and t.hf is not None and (t.hf.repo, t.hf.file) == (hub.repo, hub.file):
            return True
        return bool(where.name) and (t.file_name == where.name or (t.path is not None and t.path == where))

    def same_family(spec: PairSpec) -> bool:
        repo = spec.target.hf.repo.split("/")[1].lower() if spec.target.hf else ""
        return bool(family) and repo.startswith(family)

    out: list[dict[str, str]] = []
    for match in (same_target, same_family):
        for spec in registry.values():
            if spec.draft is not None and match(spec):
                entry = {"pair": spec.name, "draft": spec.draft.label}
                if entry not in out:
                    out.append(entry)
    return out


def _family_of(summary: Any) -> str:
    """The model family in lower case: general.basename ('Qwen2.5-Coder'), else the leading words of
    general.name before the size ('Qwen2.5 Coder 1.5B Instruct' -> 'qwen2.5-coder')."""
    basename = getattr(summary, "basename", None)
    if basename:
        return basename.lower().replace(" ", "-")
    name = (getattr(summary, "name", None) or "").lower().replace(" ", "-")
    words = []
    for word in name.split("-"):
        if word and (word[0].isdigit() and word[-1] in "bm") or word in ("instruct", "it", "gguf", "chat"):
            break
        words.append(word)
    return "-".join(w for w in words if w)


@contextmanager
def open_for_header(ref: str, side: str) -> Iterator[tuple[BinaryIO, str]]:
    """Open what a `check` argument names, for reading its header: a path, ORG/REPO/FILE.gguf (HF cache,
    else range reads over the network), or a pair name (its target or draft: local copy, the bundle's
    chunks read in place, or the hub)."""
    path = Path(ref).expanduser()
    if path.exists():
        if path.is_dir():
            raise GgufHeaderError(f"{path} is a directory; pass the .gguf file inside it")
        with open(path, "rb") as f:
            yield f, str(path)
        return
    hub = parse_hub_ref(ref)
    if hub is None and (ref.lower().endswith(".gguf") or os.sep in ref):
        raise GgufHeaderError(f"model file not found: {ref}; pass an existing .gguf path, ORG/REPO/FILE.gguf "
                              "or a pair name")
    if hub is None:
        spec = get_pair(ref)
        source = spec.target if side == "target" else spec.draft
        if source is None:
            raise ConfigError(f"pair {ref} has no draft model; name a draft file or another pair")
        loc = locate(source)
        if loc.ready:
            with open(loc.path, "rb") as f:
                yield f, str(loc.path)
            return
        if loc.state == "bundle-chunks":
            with ChainedChunks(loc.chunks) as f:
                yield f, f.name
            return
        if source.hf is None:
            raise ModelLoadError(f"the {side} of pair {ref} ({source.label}) is not on this machine")
        hub = HubFile(source.hf.repo, source.hf.file, source.hf.revision)
    with open_hub_file(hub) as f:
        yield f, str(hub)

