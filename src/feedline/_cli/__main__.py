"""``feedline`` entry point: discovers subcommands and maps errors to exit codes.

Each module in :mod:`feedline._cli.commands` defines ``NAME``, ``HELP``, ``EXAMPLE``,
``add_arguments(parser)`` and ``run(args) -> int``. Exit codes: 0 success, 2 bad usage
(argparse errors, :class:`~feedline.errors.SpecError`, missing extras), 1 any other failure,
printed as a one-line reason (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType

from feedline import __version__
from feedline.errors import FeedlineError, MissingDependency, SpecError

__all__ = ["main"]


def _commands() -> dict[str, ModuleType]:
    import feedline._cli.commands as pkg

    found = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        found[mod.NAME] = mod
    return dict(sorted(found.items()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="feedline",
        description="A streaming data loader for NLP training.",
        epilog="Run 'feedline COMMAND --help' for a command's options and an example.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("--version", action="version", version=f"feedline {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in _commands().items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP,
                           epilog=f"example:\n  {mod.EXAMPLE}", formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    debug = getattr(args, "debug", False)
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="feedline: %(message)s")
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("feedline: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except FeedlineError as e:
        if debug:
            raise
        print(f"feedline {args.command}: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, (SpecError, MissingDependency)) else 1


if __name__ == "__main__":
    sys.exit(main())
