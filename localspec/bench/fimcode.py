"""The `fim` workload: code completion in the middle of real code that nobody here wrote.

Functions of Python's standard-library source as installed on this machine: in each, a span of
whole lines after the docstring is cut out; the model gets the lines before it (prefix) and after
it (suffix) in the FIM layout and is asked for the middle, with the real lines as the reference.
The selection is deterministic for a given Python version (the report names it).
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path

MODULES = ("textwrap.py", "shlex.py", "heapq.py", "bisect.py", "fnmatch.py", "colorsys.py", "calendar.py",
           "difflib.py", "ipaddress.py", "json/encoder.py", "urllib/parse.py", "statistics.py", "csv.py", "string.py")
PER_MODULE = 2
PREFIX_LINES, SUFFIX_LINES = 40, 15
BODY_LINES = (8, 40)  # functions of this many body lines


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def spans(source: str) -> list[tuple[str, int, int]]:
    """(function name, first middle line, line count) for the functions worth cutting, in file order."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
            continue
        body = node.body
        if isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) and len(body) > 1:
            body = body[1:]  # skip the docstring
        first, last = body[0].lineno, node.end_lineno
        n_body = last - first + 1
        if BODY_LINES[0] <= n_body <= BODY_LINES[1]:
            out.append((node.name, first, max(2, min(8, n_body // 3))))
    return sorted(out, key=lambda x: x[1])


def fim_prompts(base: Path | None = None) -> list[dict]:
    """[{"id", "prefix", "suffix", "reference", "where"}] from the installed standard library."""
    base = base or stdlib_dir()
    by_module = []
    for rel in MODULES:
        path = base / rel
        try:
            source = path.read_text(encoding="utf-8")
        except OSError:
            continue
        lines = source.splitlines(keepends=True)
        mine = []
        by_module.append(mine)
        for name, first, count in spans(source)[:PER_MODULE]:
            start, end = first - 1, first - 1 + count
            mine.append({
                "id": f"{rel.removesuffix('.py').replace('/', '.')}.{name}",
                "prefix": "".join(lines[max(0, start - PREFIX_LINES):start]),
                "suffix": "".join(lines[end:end + SUFFIX_LINES]),
                "reference": "".join(lines[start:end]),
                "where": f"{path}:{first}",
            })
    # one function of each module first, then the second ones: the first N prompts span N modules
    return [p for i in range(PER_MODULE) for mine in by_module if i < len(mine) for p in [mine[i]]]
