"""The label vocabulary of a ``classify`` spec, without a loader (a corpus tool).

    >>> label_vocabulary("spec.yaml")                    # doctest: +SKIP
    ['negative', 'neutral', 'positive']

Names come from ``task.labels`` when given, else from ``task.label_vocab`` when that file
exists, else from one unshuffled pass over the spec's sources (written to ``label_vocab`` when
set). The ``classify`` task resolves its vocabulary the same way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from feedline._pipeline import OnePass
from feedline._spec import Spec
from feedline._tasks.classify import ClassifyOptions, label_names
from feedline.errors import SpecError

__all__ = ["label_vocabulary"]


def label_vocabulary(spec: Spec | Mapping[str, Any] | str | os.PathLike[str]) -> list[str]:
    """The label names of a ``classify`` spec, in id order."""
    spec = Spec.load(spec)
    opts = spec.task.options
    if not isinstance(opts, ClassifyOptions):
        raise SpecError(f"label_vocabulary needs a classify spec; this one has task {spec.task.kind!r}")
    return label_names(opts, OnePass(spec))
