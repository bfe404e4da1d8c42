"""The package's shape, checked from its source with `ast`: layers import downward only.

- no import cycle among localspec's modules (imports inside functions count too);
- nothing but cli.py (and the command modules themselves) imports `localspec.commands`;
- no module over 400 lines, no function over 60;
- llama.cpp imported only where docs/ARCHITECTURE.md says, and every module named there;
- every script under scripts/ imports only what the package has.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "localspec"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The localspec modules `name` imports (a `from X import y` names X.y when that is a module)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = {f"{mod}.{a.name}" for a in node.names} & known
            out |= subs or {mod}
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {n: imports_of(n, p, set(mods)) for n, p in mods.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(g[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_the_checker_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    g = graph()
    assert "localspec.session" in g["localspec.commands.run"]  # the walker does see real imports
    assert "localspec.models.hub" in g["localspec.models.registry"]


def test_no_import_cycle():
    assert find_cycle(graph()) is None


def test_only_the_cli_imports_commands():
    wrong = [(n, m) for n, deps in graph().items() for m in deps
             if m.startswith("localspec.commands") and n != "localspec.cli" and not n.startswith("localspec.commands")]
    assert wrong == []


def test_modules_and_functions_stay_small():
    long_modules, long_functions = [], []
    for name, path in modules().items():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            long_modules.append((name, text.count("\n")))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append((f"{name}.{node.name}", n))
    assert long_modules == [] and long_functions == []


LLAMA_CPP_IMPORTERS = {"localspec", "localspec.backend.model", "localspec.decoding.constraints", "localspec.doctor",
                       "localspec.serving.caches.promptdisk"}  # docs/ARCHITECTURE.md, the backend/ row


def test_llama_cpp_is_imported_only_where_the_architecture_says():
    found = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "llama_cpp" for a in node.names):
                found.add(name)
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "llama_cpp":
                found.add(name)
    assert found == LLAMA_CPP_IMPORTERS


def test_the_architecture_page_names_every_module():
    """docs/ARCHITECTURE.md names each module as `pkg/name.py`, `name.py` or `name` (in backquotes)."""
    doc = (PKG.parent / "docs" / "ARCHITECTURE.md").read_text()
    missing = [p.relative_to(PKG).as_posix() for p in sorted(PKG.rglob("*.py"))
               if p.name not in ("__init__.py", "__main__.py")
               and not any(n in doc for n in (p.relative_to(PKG).as_posix(), f"`{p.name}`", f"`{p.stem}`",
                                              f"`{p.stem}.py`"))]
    assert missing == []


def test_comments_name_no_machine_and_quote_no_local_figure():
    """Figures go stale on the next machine: they live in docs/BENCHMARKS.md ("Figures behind the code's
    rules"), and a comment says why in a line and points there. No comment or docstring names a CPU or
    quotes a figure measured "here"."""
    import io
    import re
    import tokenize

    local = re.compile(r"\b(Xeon|EPYC)\b|\d[\d.,]*\s*(x|ms|s|tok/s|%|GB|MB)\b[^\n]{0,12}\bhere\b|\bmeasured here\b")
    found = []
    for name, path in modules().items():
        src = path.read_text()
        texts = [t.string for t in tokenize.generate_tokens(io.StringIO(src).readline)
                 if t.type in (tokenize.COMMENT, tokenize.STRING)]
        found += [f"{name}: {m.group(0)}" for t in texts for m in local.finditer(t)]
    assert found == []


def python_in_scripts() -> dict[str, str]:
    """scripts/'s Python: .py files, files with a python shebang, and bash scripts' `<<'PY'` heredocs."""
    import re

    out = {}
    scripts = PKG.parent / "scripts"
    for path in sorted(scripts.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        name = path.relative_to(scripts).as_posix()
        text = path.read_text(errors="replace")
        if path.suffix == ".py" or text.startswith("#!/usr/bin/env python"):
            out[name] = text
        for i, block in enumerate(re.findall(r"<<\s*'?PY'?\n(.*?)\nPY\n", text, re.S)):
            out[f"{name} (heredoc {i + 1})"] = block
    return out


def test_the_scripts_import_what_the_package_has():
    """A module moved or a name renamed must not leave a script importing what no longer exists: the scripts
    (benchmarks, checks) run rarely, so a broken import would otherwise wait for the next person to run one."""
    import importlib
    import importlib.util

    broken = []
    for where, src in python_in_scripts().items():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "localspec":
                try:
                    mod = importlib.import_module(node.module)
                except ImportError as e:
                    broken.append(f"{where}: {node.module} ({e})")
                    continue
                broken += [f"{where}: {node.module}.{a.name}" for a in node.names
                           if not hasattr(mod, a.name) and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
    assert broken == []


def test_no_script_reaches_into_the_tests():
    """What scripts and tests share lives in scripts/harness/ (the tests reach it through pytest's
    `pythonpath`): a script that put tests/ on sys.path would run the tests' modules as a library."""
    reach = [where for where, src in python_in_scripts().items()
             if "sys.path" in src and ("tests" in src.split("sys.path", 1)[1].split("\n", 1)[0])]
    assert reach == []


def test_the_scripts_index_names_every_script():
    """scripts/README.md: one line per entry point, grouped by purpose."""
    scripts = PKG.parent / "scripts"
    index = (scripts / "README.md").read_text()
    entries = [p.name for p in sorted(scripts.iterdir()) if p.is_file() and p.name != "README.md"
               and p.name != "__init__.py"]
    assert [e for e in entries if f"`{e}`" not in index] == []


BELOW_THE_SERVER = ("localspec.serving", "localspec.engine", "localspec.decoding", "localspec.costs", "localspec.backend",
                    "localspec.session")


def test_nothing_below_the_server_imports_it_or_speaks_http():
    """server/ is HTTP only: the layers under it neither import it nor raise its ApiError; their errors
    are the project's own, mapped to statuses in server/apierrors.py."""
    g = graph()
    below = [n for n in g if n.startswith(BELOW_THE_SERVER)]
    assert [(n, m) for n in below for m in g[n] if m.startswith("localspec.server")] == []
    assert [n for n in below if "ApiError" in modules()[n].read_text()] == []


def test_the_tests_mirror_the_package():
    """tests/NAME/ holds the tests of localspec/NAME/; tests/ itself those of the top-level modules."""
    tests = PKG.parent / "tests"
    folders = [p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))]
    assert [f for f in folders if not (PKG / f / "__init__.py").exists()] == []


def test_the_architecture_page_has_a_row_per_folder():
    """Each package folder is a row of docs/ARCHITECTURE.md's table (`| \\`folder/\\` |`), and no row names a
    folder that is gone."""
    import re

    doc = (PKG.parent / "docs" / "ARCHITECTURE.md").read_text()
    rows = set(re.findall(r"^\| `([\w/]+/)` \|", doc, re.M))
    folders = {"localspec/"} | {p.parent.relative_to(PKG).as_posix() + "/" for p in PKG.rglob("__init__.py")
                                if p.parent != PKG}
    assert rows == folders


def test_no_python_hides_in_a_shell_script():
    """Every script's Python is a module a linter and an import reach, never a heredoc in a bash script."""
    assert [where for where in python_in_scripts() if "heredoc" in where] == []
