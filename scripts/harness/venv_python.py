"""Python scripts run by path (`scripts/draft-replay ...`) re-run themselves under the project's virtual
environment, creating it with scripts/bootstrap when it is missing, instead of failing on `import localspec`."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository


def ensure() -> None:
    try:
        import numpy  # noqa: F401

        import localspec  # noqa: F401
        return
    except ImportError:
        pass
    python = ROOT / ".venv" / "bin" / "python"
    if Path(sys.prefix).resolve() == (ROOT / ".venv").resolve() or os.environ.get("LOCALSPEC_SCRIPT_REEXEC"):
        sys.exit("localspec is not importable here: run scripts/bootstrap, then .venv/bin/python " + sys.argv[0])
    if subprocess.run([str(ROOT / "scripts" / "bootstrap")], stdout=sys.stderr).returncode != 0:
        sys.exit("scripts/bootstrap failed: see above, then run " + sys.argv[0] + " again")
    os.environ["LOCALSPEC_SCRIPT_REEXEC"] = "1"
    os.execv(str(python), [str(python), *sys.argv])
