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


def _commands(only: str | None = None) -> dict[str, ModuleType]:
    """The command modules by ``NAME``: all of them, or only the one named ``only`` where a module of
    that name (``count-tokens`` in ``count_tokens``) holds it. A command run imports its own
    module alone (not the service's, ~0.2 s, for ``feedline scan``); help and unknown names list all."""
    import feedline._cli.commands as pkg

    names = [info.name for info in pkgutil.iter_modules(pkg.__path__) if not info.name.startswith("_")]
    if only is not None and only.replace("-", "_") in names:
        mod = importlib.import_module(f"{pkg.__name__}.{only.replace('-', '_')}")
        if only == mod.NAME:
            return {only: mod}
    found = {}
    for name in names:
        mod = importlib.import_module(f"{pkg.__name__}.{name}")
        found[mod.NAME] = mod
    return dict(sorted(found.items()))


def _named_command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (the top level's options,
    ``--debug`` and ``--version``, take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command`` alone where it names one."""
    parser = argparse.ArgumentParser(
        prog="feedline",
        description="A streaming data loader for NLP training.",
        epilog="Run 'feedline COMMAND --help' for a command's options and an example.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("--version", action="version", version=f"feedline {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in _commands(command).items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP,
                           epilog=f"example:\n  {mod.EXAMPLE}", formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(_named_command(sys.argv[1:] if argv is None else argv))
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
