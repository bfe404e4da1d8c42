"""`localspec check`: can a draft speculate for a target? Decided from the two GGUF headers alone
(llama.cpp's rules in pairing.py); a ref is a path, ORG/REPO/FILE.gguf, or a pair name."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from .. import paths
from ..errors import IncompatiblePairError
from ..pairing import VocabInfo, first_mismatch, require_compatible
from .archs import draft_head, drafter_refusal, rollback_of
from .gguf_header import read_header, read_header_file, vocab_fields
from .manage import open_for_header, suggest_drafts


@dataclass
class ModelHeaderSummary:
    """What `check` shows about one side."""
    ref: str
    where: str  # the local path or hub URL that was actually read
    architecture: str | None
    name: str | None
    basename: str | None  # the model family, e.g. "Qwen2.5-Coder"
    file_type: str | None
    vocab_type: str
    n_tokens: int
    bos: int
    eos: int
    add_bos: bool
    header_bytes: int
    bytes_read: int
    rollback: str = "partial"  # how a rejected draft is rolled back on this architecture (archs.py)
    draft_head: str | None = None  # "nextn" (its own NextN blocks), a drafter architecture, or None
    nextn_layers: int = 0


@dataclass
class CheckResult:
    target: ModelHeaderSummary
    draft: ModelHeaderSummary | None
    compatible: bool | None  # None when no draft was given
    mismatch: str | None
    suggested_drafts: list[dict[str, str]] = field(default_factory=list)  # {"pair", "draft"} from models.yaml

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(ref: str, side: str) -> tuple[ModelHeaderSummary, VocabInfo]:
    """Read one side's header (a path, ORG/REPO/FILE.gguf, or a pair name) and summarize it."""
    with open_for_header(ref, side) as (f, where):
        header = read_header(f, where)
    info = vocab_info(header, where)
    summary = ModelHeaderSummary(
        ref=ref, where=where, architecture=header.architecture, name=header.get("general.name"),
        basename=header.get("general.basename"), file_type=header.file_type_name, vocab_type=info.vocab_type, n_tokens=info.n_tokens, bos=info.bos,
        eos=info.eos, add_bos=info.add_bos, header_bytes=header.header_bytes, bytes_read=header.bytes_read,
        rollback=rollback_of(header.architecture), nextn_layers=nextn_layers(header),
        draft_head=draft_head(header.architecture, nextn_layers(header)))
    return summary, info


def nextn_layers(header) -> int:
    """How many NextN (MTP) draft blocks the model carries after its main layers."""
    n = header.get(f"{header.architecture}.nextn_predict_layers") if header.architecture else None
    return n if isinstance(n, int) and n > 0 else 0


def check_pair_files(target_ref: str, draft_ref: str | None) -> CheckResult:
    """Compatibility of a draft with a target from their headers alone (no weights are read)."""
    target, target_info = summarize(target_ref, "target")
    suggestions = suggest_drafts(target_ref, target)
    if draft_ref is None:
        return CheckResult(target, None, None, None, suggestions)
    draft, draft_info = summarize(draft_ref, "draft")
    why = drafter_refusal(draft.architecture, draft.where) or first_mismatch(target_info, draft_info)
    return CheckResult(target, draft, why is None, why, suggestions)


def vocab_info(header, where: str = "the file") -> VocabInfo:
    return VocabInfo(**vocab_fields(header, where))


def vocab_info_from_header(path_or_fileobj: str | os.PathLike | BinaryIO) -> VocabInfo:
    if hasattr(path_or_fileobj, "read"):
        where = str(getattr(path_or_fileobj, "name", "the file"))
        return vocab_info(read_header(path_or_fileobj, where), where)  # type: ignore[arg-type]
    return vocab_info(read_header_file(path_or_fileobj), str(path_or_fileobj))


def check_pair(target: Path, draft: Path) -> None:
    """llama.cpp's draft/target rules (pairing.py) from the two GGUF headers, so the draft model can
    load later, only when a round drafts with it. A verdict of "compatible" is kept per pair of files
    (name, size, mtime): the header check reads both vocabularies (Qwen's has 151,936 tokens)."""
    key = f"{_file_key(target)} | {_file_key(draft)}"
    store = paths.home() / "compatible-pairs.json"
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):  # valid JSON of another shape: start afresh
        known = {}
    if known.get(key) is True:
        return
    header = read_header_file(draft)
    refused = drafter_refusal(header.architecture, str(draft))
    if refused:
        raise IncompatiblePairError(refused)
    require_compatible(vocab_info_from_header(target), vocab_info(header, str(draft)))
    known[key] = True
    try:
        paths.write_atomic(store, json.dumps(known, indent=1))
    except OSError:  # a read-only data dir: the check simply runs again next time
        pass


def _file_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
