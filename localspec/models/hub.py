"""The Hugging Face Hub: one hub-file type, refs like ORG/REPO/FILE.gguf, the local HF cache,
downloads (resumable, sha256-checked) and remote files read with range requests."""

from __future__ import annotations

import errno
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from ..errors import LocalspecError
from .files import require_free_space, sha256_of_file
from .gguf_header import FIRST_READ_BYTES as READ_BLOCK_BYTES

Notify = Callable[[str], None]

def note_to_stderr(message: str) -> None:
    """Progress for slow steps (assembling a bundle, downloading); stderr keeps stdout clean for answers."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()



# ------------------------------------------------------------------------- the Hugging Face cache


@dataclass(frozen=True)
class HubFile:
    """One file in a Hugging Face repository (models.yaml `hf:` sources and ORG/REPO/FILE.gguf refs)."""
    repo: str  # "ORG/NAME" on the Hugging Face Hub
    file: str  # path inside the repo
    revision: str | None = None  # branch, tag or commit; None = main
    sha256: str | None = None  # checked after `pull` when known
    size: int | None = None  # bytes, shown by `localspec models` before the file is here

    def __str__(self) -> str:
        return f"{self.repo}/{self.file}" + (f"@{self.revision}" if self.revision else "")


def parse_hub_ref(ref: str) -> HubFile | None:
    """`ORG/REPO/path/in/repo.gguf[@REV]` -> HubFile; anything else -> None."""
    text, _, revision = ref.partition("@")
    parts = text.split("/")
    if len(parts) < 3 or not all(parts) or not parts[-1].lower().endswith(".gguf"):
        return None
    return HubFile("/".join(parts[:2]), "/".join(parts[2:]), revision or None)


def hub_offline() -> bool:
    """HF_HUB_OFFLINE read now, not when huggingface_hub was imported (tests and users flip it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")


def hub_endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


@contextmanager
def open_hub_file(hub: HubFile) -> Iterator[BinaryIO]:
    """The file from the local HF cache, else a remote file object whose reads are range requests."""
    cached = hf_cached_file(hub.repo, hub.file, hub.revision)
    if cached is not None:
        with open(cached, "rb") as f:
            yield f
        return
    if hub_offline():
        raise LocalspecError(f"{hub} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1 is set; "
                             "unset HF_HUB_OFFLINE to read its header over the network")
    from huggingface_hub import HfFileSystem

    fs = HfFileSystem(endpoint=hub_endpoint(), skip_instance_cache=True)
    path = f"{hub.repo}/{hub.file}"
    try:
        # cache_type="none": each read(n) is exactly one range request of n bytes, no read-ahead
        f = fs.open(path, "rb", revision=hub.revision, block_size=READ_BLOCK_BYTES, cache_type="none")
    except FileNotFoundError:
        raise LocalspecError(f"{hub} does not exist on the Hugging Face Hub; check the repository and "
                             "file name (the repo's 'Files' tab lists them)") from None
    except Exception as e:  # connection refused, DNS, proxy, 401 on gated repos: one line, next step
        raise LocalspecError(f"could not reach the Hugging Face Hub for {hub} ({type(e).__name__}: {first_line(e)}); "
                             "check the network, or log in with `hf auth login` for gated repositories") from None
    try:
        yield f
    finally:
        f.close()


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def hf_cache_dir() -> Path:
    """huggingface-hub's cache dir, computed now from the environment the way huggingface_hub.constants
    does at import (so a changed HF_HOME is honoured and `paths` does not import huggingface_hub)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface" / "hub"


def hf_cached_file(repo: str, file: str, revision: str | None = None) -> Path | None:
    """The file in huggingface-hub's cache, or None. Reads only the local cache (never the network)."""
    if not (hf_cache_dir() / f"models--{repo.replace('/', '--')}").is_dir():
        return None  # not cached: no need to import huggingface_hub (a noticeable share of every command's start)
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, file, cache_dir=str(hf_cache_dir()), revision=revision)
    return Path(found) if isinstance(found, str) and os.path.isfile(found) else None


def download_hf_file(hf: HubFile, notify: Notify | None = note_to_stderr) -> Path:
    """hf_hub_download into huggingface-hub's cache (resumes an interrupted download), then check sha256."""
    if hub_offline():
        raise LocalspecError(f"{hf} is not downloaded and HF_HUB_OFFLINE=1 is set; unset HF_HUB_OFFLINE to "
                             "download it")
    from huggingface_hub import errors as hf_errors
    from huggingface_hub import hf_hub_download

    cache = hf_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    if hf.size:
        require_free_space(cache, hf.size, f"downloading {hf}")
    if notify is not None:
        notify(f"downloading {hf} into {cache}")
    try:
        found = Path(hf_hub_download(hf.repo, hf.file, revision=hf.revision, cache_dir=str(cache),
                                     endpoint=hub_endpoint()))
    except hf_errors.LocalEntryNotFoundError:  # what hf_hub_download raises when the hub is unreachable
        raise LocalspecError(f"could not reach the Hugging Face Hub to download {hf}; check the network "
                             "and pull again (the download resumes)") from None
    except hf_errors.GatedRepoError:
        raise LocalspecError(f"{hf.repo} is gated; accept its license on huggingface.co/{hf.repo} and run "
                             "`hf auth login`, then pull again") from None
    except (hf_errors.RepositoryNotFoundError, hf_errors.RevisionNotFoundError, hf_errors.EntryNotFoundError):
        raise LocalspecError(f"{hf} does not exist on the Hugging Face Hub; check the repo and file name in "
                             "models.yaml (or your pair file)") from None
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise LocalspecError(f"the disk filled up while downloading {hf} into {cache}; free space (or point "
                                 "HF_HOME at a bigger disk) and pull again: it resumes") from None
        raise LocalspecError(f"downloading {hf} failed ({type(e).__name__}: {first_line(e)}); check the network "
                             "and pull again (it resumes)") from None
    except Exception as e:  # httpx/requests connection errors differ by huggingface-hub version
        raise LocalspecError(f"downloading {hf} failed ({type(e).__name__}: {first_line(e)}); check the network "
                             "and pull again (it resumes)") from None
    if hf.sha256:
        actual = sha256_of_file(found)
        if actual != hf.sha256:
            remove_hf_cached_file(found)
            raise LocalspecError(f"{hf} downloaded with sha256 {actual}, expected {hf.sha256}; it was deleted. "
                                 "Pull again; if it repeats, the file changed upstream: fix sha256 in models.yaml")
    return found


def remove_hf_cached_file(snapshot_file: Path) -> int:
    """Delete one file from huggingface-hub's cache: its snapshot link, and its blob when no other
    snapshot still points at it. Returns the bytes freed."""
    freed = 0
    if snapshot_file.is_symlink():
        blob = snapshot_file.resolve()
        snapshot_file.unlink()
        repo_dir = blob.parent.parent
        still_used = any(p.is_symlink() and p.resolve() == blob for p in (repo_dir / "snapshots").rglob("*"))
        if blob.exists() and not still_used:
            freed = blob.stat().st_size
            blob.unlink()
    elif snapshot_file.exists():
        freed = snapshot_file.stat().st_size
        snapshot_file.unlink()
    return freed
