"""Helpers shared by commands: loading a spec argument (``-`` reads standard input)."""

from __future__ import annotations

import argparse

from feedline.spec import Spec, read_spec_file

__all__ = ["add_spec_argument", "load_spec"]


def add_spec_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="spec file (.yaml or .json), or - to read it from standard input")


def load_spec(arg: str) -> Spec:
    if arg == "-":
        return Spec.from_mapping(read_spec_file("-"))
    return Spec.load(arg)
