"""`localspec` command line: noun subcommands, `localspec "prompt"` as a shortcut for `run`.

Each command module exposes `register(subparsers)`; its handlers take the parsed args and return
an exit code. Text goes to stdout, stats and errors to stderr. A `LocalspecError` becomes one
line `error: ...` and a non-zero exit; nothing prints a traceback at a user.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .errors import LocalspecError

COMMAND_MODULES = [
    "localspec.commands.run",
    "localspec.commands.models",
    "localspec.commands.chat",
    "localspec.commands.bench",
    "localspec.commands.tune",
    "localspec.commands.serve",
]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and a hint, exit 2 (argparse's own code)
        sys.stderr.write(f"error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="localspec", description=__doc__.splitlines()[0])
    from . import __version__

    parser.add_argument("--version", action="version", version=f"localspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _known_commands(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # `localspec "prompt"` and `echo hi | localspec` mean `localspec run ...`
    if not argv and sys.stdin is not None and not sys.stdin.isatty():
        argv = ["run"]
    if argv and argv[0] not in _known_commands(parser) and argv[0] not in ("-h", "--help", "--version"):
        argv = ["run", *argv]
    if not argv:
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LocalspecError as e:
        sys.stderr.write(f"error: {e}\n")
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        return 130
    except BrokenPipeError:  # `localspec run ... | head`: stop quietly
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except OSError as e:  # a disk or permission problem nobody wrapped: still one line with a next step
        where = f" ({e.filename})" if e.filename else ""
        sys.stderr.write(f"error: {e.strerror or e}{where}; check that path, or set LOCALSPEC_HOME to a writable "
                         "directory\n")
        return 1
    except Exception as e:  # a bug: one line, and how to see the rest
        if os.environ.get("LOCALSPEC_DEBUG"):
            raise
        sys.stderr.write(f"error: internal error {type(e).__name__}: {e}; rerun with LOCALSPEC_DEBUG=1 for the "
                         "traceback and report it\n")
        return 70


if __name__ == "__main__":
    raise SystemExit(main())
