"""One data root for everything localspec writes, overridable by LOCALSPEC_HOME.

Layout under the root:
    models/     assembled bundle models and other GGUFs localspec made (Q4_0 drafts, ...)
    profiles/   measured pass costs per (pair, device, threads) for --spec auto
    history.db  chat history (SQLite)
    copies/     replies saved by /copy
The user's pair file lives in the platformdirs config dir (or $LOCALSPEC_HOME/models.yaml).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs

APP = "localspec"


def home() -> Path:
    env = os.environ.get("LOCALSPEC_HOME")
    root = Path(env).expanduser() if env else Path(platformdirs.user_data_dir(APP))
    return root


def ensure(p: Path) -> Path:
    from .errors import ConfigError

    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create {p} ({e.strerror or e}); set LOCALSPEC_HOME to a writable directory") from None
    return p


def write_atomic(path: Path, data: str | bytes | memoryview) -> None:
    """Write a whole file or nothing: a unique temporary name beside it (two processes saving the same
    file never share one), then one rename. Raises OSError (an unwritable or full disk); the caller
    decides whether that matters."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w" if isinstance(data, str) else "wb", **({"encoding": "utf-8"} if isinstance(data, str) else {})) as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def models_dir() -> Path:
    return home() / "models"


def profiles_dir() -> Path:
    return home() / "profiles"


def prompt_cache_dir() -> Path:
    return home() / "prompt-cache"


def history_db() -> Path:
    return home() / "history.db"


def copies_dir() -> Path:
    return home() / "copies"


def user_config_file() -> Path:
    if os.environ.get("LOCALSPEC_HOME"):
        return home() / "models.yaml"
    return Path(platformdirs.user_config_dir(APP)) / "models.yaml"


def all_paths() -> dict[str, str]:
    return {
        "home": str(home()),
        "models": str(models_dir()),
        "profiles": str(profiles_dir()),
        "history": str(history_db()),
        "copies": str(copies_dir()),
        "user_config": str(user_config_file()),
    }


def file_id(path) -> str:
    """A model file's identity in stored keys (pass-cost profiles, the attention kernel's choice)."""
    st = path.stat()
    return f"{path.name}:{st.st_size}"
