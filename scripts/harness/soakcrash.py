"""What scripts/soak checks on the data root after each SIGKILL: the saved prompts on disk (every entry whose
metadata exists is whole: its size and CRC-32 match, so no loadable entry is corrupt), the measured profiles
(each loads), and the restarted server's log (which saved prompts it dropped, and no traceback)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path


def saved_prompts(home: Path) -> dict:
    """Entries in the data root's prompt cache: `whole` (size and checksum as their metadata says), `corrupt`
    (an entry the server would refuse), and leftover temporary files of writes a kill cut short."""
    found = {"whole": 0, "corrupt": [], "partial_writes": 0}
    root = home / "prompt-cache"
    for meta in root.rglob("*.json") if root.is_dir() else []:
        try:
            m = json.loads(meta.read_text())
            data = meta.with_suffix(".kv").read_bytes()
            ok = len(data) == m["bytes"] and zlib.crc32(data) == m["crc32"]
        except (OSError, ValueError, KeyError, TypeError):
            ok = False
        if ok:
            found["whole"] += 1
        else:
            found["corrupt"].append(meta.name)
    found["partial_writes"] = len(list(root.rglob(".*.tmp"))) if root.is_dir() else 0
    return found


def damage(home: Path) -> int:
    """Flip a byte in the middle of every saved prompt's state, as a failing disk would; how many."""
    root = home / "prompt-cache"
    n = 0
    for kv in root.rglob("*.kv") if root.is_dir() else []:
        with open(kv, "r+b") as f:
            f.seek(kv.stat().st_size // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0xFF]))
        n += 1
    return n


def profiles(home: Path) -> dict:
    """Each measured profile in the data root loads (CostProfile.load raises on a damaged one)."""
    from localspec.costs.costmodel import CostProfile

    found = {"intact": 0, "damaged": []}
    for p in sorted((home / "profiles").glob("*.json")) if (home / "profiles").is_dir() else []:
        try:
            CostProfile.load(p)
            found["intact"] += 1
        except ValueError as e:
            found["damaged"].append(f"{p.name}: {e}")
    return found


def log_findings(log: str) -> dict:
    lines = log.splitlines()
    return {"dropped_saved_prompts": sum("dropping the saved prompt" in x for x in lines),
            "traceback": "Traceback" in log}
