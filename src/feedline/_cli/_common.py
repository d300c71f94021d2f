"""Helpers shared by commands: loading a spec argument (``-`` reads standard input)."""

from __future__ import annotations

import argparse

from feedline._spec import Spec, read_spec_file

__all__ = ["add_progress_argument", "add_spec_argument", "counted", "load_spec", "setup_progress"]


def add_spec_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="spec file (.yaml or .json), or - to read it from standard input")


def load_spec(arg: str) -> Spec:
    if arg == "-":
        return Spec.from_mapping(read_spec_file("-"))
    return Spec.load(arg)


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a progress bar (default: when standard error is a terminal)")


def setup_progress(args: argparse.Namespace) -> None:
    """Turn progress bars on or off for this command from ``--progress/--no-progress``."""
    from feedline._tools.progress import configure

    configure(getattr(args, "progress", None))


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """A count with its noun in the right number: ``1 arrow file``, ``2 arrow files``, ``1 process``."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
