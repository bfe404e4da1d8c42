"""Facts of this machine that several layers read (the doctor reports them; a server sizes its context by them)."""

from __future__ import annotations

import os


def memory_bytes() -> dict[str, int | None]:
    total = available = None
    try:
        with open("/proc/meminfo") as f:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:2]}
        total, available = fields.get("MemTotal"), fields.get("MemAvailable")
    except (OSError, ValueError, IndexError):
        try:  # macOS and other Unixes
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            pass
    return {"total": total, "available": available}
