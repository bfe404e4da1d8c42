"""The lines a server writes on its stderr: failures nobody anticipated and requests served differently than asked."""

from __future__ import annotations

import os
import sys
import traceback


def log_unexpected(where: str, e: BaseException) -> None:
    """One line on the server's stderr for a failure nobody anticipated (the traceback only with
    LOCALSPEC_DEBUG=1): the client gets an error JSON, the log stays readable."""
    if os.environ.get("LOCALSPEC_DEBUG"):
        traceback.print_exception(e)
    sys.stderr.write(f"localspec serve: unexpected error in {where}: {type(e).__name__}: {e} "
                     "(LOCALSPEC_DEBUG=1 shows the traceback)\n")
    sys.stderr.flush()


_NOTED: set[str] = set()


def log_note(message: str) -> None:
    """A line on the server's stderr about a request the server served differently than asked, once
    per distinct message (an agent sends the same tools on every turn)."""
    if message not in _NOTED:
        _NOTED.add(message)
        sys.stderr.write(f"localspec serve: {message}\n")
        sys.stderr.flush()
