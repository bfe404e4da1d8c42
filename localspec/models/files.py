"""Small file helpers shared by downloads and bundle assembly: hashing, free space, sizes for people."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from ..errors import LocalspecError

COPY_BLOCK_BYTES = 8 * 1024 * 1024
FREE_SPACE_MARGIN_BYTES = 64 * 1024 * 1024

def sha256_of_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(COPY_BLOCK_BYTES):
            h.update(block)
    return h.hexdigest()




def require_free_space(directory: Path, needed: int, doing: str) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed + FREE_SPACE_MARGIN_BYTES:
        raise LocalspecError(f"not enough disk space for {doing}: {gb(needed)} needed, {gb(free)} free in "
                             f"{directory}; free some space or set LOCALSPEC_HOME to a bigger disk")



def gb(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale, digits in (("GB", 1e9, 2), ("MB", 1e6, 1), ("kB", 1e3, 1)):
        if n >= scale / 10 if unit == "GB" else n >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n} B"


def human_size(n: int | None) -> str:
    return "-" if n is None else gb(n)

