"""Command-line interface: ``python -m mlalab <command> ...``.

Each subcommand lives in its own module under ``mlalab/commands/`` and defines ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``; they are discovered here, so adding a command never
touches this file.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from . import __version__, commands


def _command_modules() -> list:
    """The command modules, and for one whose optional dependency is missing (plotly for ``report`` on a bare GPU
    machine) a stand-in that names it: the other commands still run."""
    mods = []
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        try:
            mods.append(importlib.import_module(f"{commands.__name__}.{info.name}"))
        except ModuleNotFoundError as e:
            if (e.name or "mlalab").partition(".")[0] == "mlalab":
                raise  # our own module missing is a bug, not an optional package
            mods.append(_missing_dependency(info.name, e))
    return sorted(mods, key=lambda m: getattr(m, "ORDER", 100))


def _missing_dependency(name: str, error: ModuleNotFoundError) -> argparse.Namespace:
    why = f"the {name!r} command needs the Python package {error.name!r}, which is not installed ({error})"

    def run(args: argparse.Namespace) -> int:
        raise RuntimeError(why)

    return argparse.Namespace(
        NAME=name, HELP=f"(unavailable: needs {error.name})", ORDER=1000, add_arguments=lambda p: None, run=run
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mlalab",
        description="mlalab: DeepSeek-R1 MLA decode workbench (reference, quantization accuracy, split-KV plans, "
        "kernels, timings).",
    )
    parser.add_argument("--version", action="version", version=f"mlalab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _command_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP))
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except (ValueError, TypeError, RuntimeError) as e:
        # User errors get one clear line, not a traceback.
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` etc.: stop quietly, like other command-line tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
