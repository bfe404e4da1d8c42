"""Every model this machine can serve offline, found without loading or downloading anything: the
pairs in models.yaml and the user's file whose files are present, then each GGUF in the data root's
models folder that is not already a pair's target: one with its own NextN head drafts with it, another is
paired with the smallest compatible GGUF there that is smaller than it (the headers' vocabularies, as
`localspec check` decides), else served with n-gram drafting alone. Drafter files (EAGLE-3, DFlash, Gemma 4
assistants) are neither served nor paired: localspec does not drive them yet (archs.drafter_refusal).
A server without a pair on its command line serves what this lists."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import paths
from ..errors import LocalspecError
from ..pairing import first_mismatch
from .archs import DRAFTER_ARCHS, draft_head
from .check import nextn_layers, vocab_info_from_header
from .gguf_header import GgufHeaderError, read_header_file
from .registry import DEFAULT_PAIR, load_registry
from .resolve import locate

PRESENT = ("path", "hf-cache", "bundle", "bundle-chunks")  # bundle-chunks: assembled on first load


@dataclass
class CatalogEntry:
    """One servable model: a named pair (`pair`), or a GGUF file with an optional draft file."""
    name: str
    pair: str | None = None
    target: Path | None = None  # a lone GGUF's file (a pair's files are resolved when it loads)
    draft: Path | None = None
    size: int = 0  # bytes of the weights on disk, target and draft (0: not assembled yet)
    aliases: set[str] = field(default_factory=set)
    n_ctx: int = 0  # the pair's context (models.yaml), the least a server gives it; 0: LoadConfig's

    def choice_fields(self) -> dict:
        """What a `session.ModelChoice` needs to load this entry: a pair's name, or its files."""
        if self.pair:
            return {"pair": self.pair, "target": None, "draft": None}
        return {"pair": None, "target": str(self.target), "draft": str(self.draft) if self.draft else None}

    def find(self, name: str) -> bool:
        return name == self.name or name in self.aliases

    @property
    def files(self) -> list[Path]:
        """The weights' files where they are on disk now (a bundle not yet assembled has none)."""
        return [p for p in (self.target, self.draft) if p is not None]


def find_models(models_dir: Path | None = None) -> list[CatalogEntry]:
    """The default pair first (when present), then the other pairs, then the lone GGUFs, by name;
    `models_dir`: only the GGUFs in that folder (llama-server's --models-dir)."""
    entries, claimed = [], set()
    for name, spec in ({} if models_dir else load_registry()).items():
        sides = [locate(s) for s in (spec.target, spec.draft) if s is not None]
        if not all(loc.state in PRESENT for loc in sides):
            continue
        files = [loc.path for loc in sides if loc.path is not None]
        claimed.update(p.resolve() for p in files[:1])
        entry = CatalogEntry(name, pair=name, size=sum(p.stat().st_size for p in files), n_ctx=spec.n_ctx)
        if len(files) == len(sides):
            entry.target, entry.draft = files[0], (files[1] if len(files) > 1 else None)
        # the target's file name even before a bundle is assembled: a copy of it in the models folder is this pair
        target_name = sides[0].path.name if sides[0].path else spec.target.file_name
        entry.aliases = {name, target_name, Path(target_name).stem}
        entries.append(entry)
    entries.sort(key=lambda e: (e.name != DEFAULT_PAIR, e.name))
    lone = sorted(p for p in _gguf_files(models_dir or paths.models_dir()) if p.resolve() not in claimed)
    taken = {a for e in entries for a in e.aliases}
    kinds = {p: _drafter_kind(p) for p in lone}
    lone = [p for p in lone if kinds[p] not in DRAFTER_ARCHS]  # a drafter file drafts for a target; it is not one
    for path in lone:
        if path.stem in taken:
            continue
        # its own NextN head drafts for it (`--drafter auto`'s first choice): no draft model beside it
        draft = None if kinds[path] == "nextn" else _smallest_compatible(path, lone)
        size = path.stat().st_size + (draft.stat().st_size if draft else 0)
        entries.append(CatalogEntry(path.stem, target=path, draft=draft, size=size, aliases={path.stem, path.name}))
    return entries


def _gguf_files(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.suffix == ".gguf" and p.is_file()]
    except OSError:
        return []


def _drafter_kind(path: Path) -> str | None:
    """"nextn" (the file carries its own head), a drafter file's architecture, or None (archs.draft_head)."""
    try:
        header = read_header_file(path)
    except (GgufHeaderError, LocalspecError, OSError, ValueError):
        return None  # the load reports what is wrong with it
    return draft_head(header.architecture, nextn_layers(header))


def _smallest_compatible(target: Path, candidates: list[Path]) -> Path | None:
    """A draft for a lone GGUF: the smallest other file at most half its size with a matching vocabulary."""
    try:
        want = vocab_info_from_header(target)
    except (GgufHeaderError, LocalspecError, OSError, ValueError):
        return None  # the load reports what is wrong with it
    size = target.stat().st_size
    for p in sorted(candidates, key=lambda c: c.stat().st_size):
        if p == target or p.stat().st_size * 2 > size:
            continue
        try:
            if first_mismatch(want, vocab_info_from_header(p)) is None:
                return p
        except (GgufHeaderError, LocalspecError, OSError, ValueError):
            continue
    return None
