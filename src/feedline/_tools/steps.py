"""The exact number of global steps a spec yields: for ``max_steps`` and LR schedules.

    >>> feedline.epoch_steps("train.yaml")                     # doctest: +SKIP
    1234
    >>> feedline.epoch_steps("train.yaml", epochs=3)           # the whole run of a 3-epoch spec  # doctest: +SKIP
    3703

A stream has no length known up front (records are rejected, filtered, split into several
examples, packed several to a row), so the steps are counted by running the pipeline once, as a
loader would, without a model: reading, transforms, shuffling, tokenization, the task and the
batcher included, and the remainder rule applied. The count is of *global* steps: each rank
receives one slice of every step, so it is the same for every world size. Partitions run where
``parallel`` says (it never changes a batch). ``feedline scan --steps`` prints the same figure.

Epochs follow one another without a break: the batcher fills a step with the end of one epoch
and the start of the next, so ``epochs=3`` may give one or two steps more than three times one
epoch (``remainder: drop`` drops one short step at the end of the run, not one per epoch).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from feedline._pipeline import GlobalStream, Pipeline
from feedline._spec import Spec
from feedline.errors import SpecError

__all__ = ["epoch_steps"]


def epoch_steps(spec: Spec | Mapping[str, Any] | str | os.PathLike[str], *, epochs: int | None = 1) -> int:
    """The global steps ``spec`` yields over ``epochs`` epochs (default one; ``None``: the spec's own ``epochs``).

    Runs the pipeline once in this process (the time of one epoch's reading, tokenizing and
    batching, without the training). The result equals the number of batches ``feedline.Loader``
    (any rank, any world size) yields for the spec with ``epochs`` set so.

    Raises:
        SpecError: the stream is endless (``epochs: null`` with ``epochs=None``, or ``epochs`` < 1);
            or, as the run would, the only step of a small corpus is dropped (``remainder: drop``).
    """
    loaded = Spec.load(spec)
    n = loaded.epochs if epochs is None else epochs
    if n is None:
        raise SpecError("epochs: null makes an endless stream, which has no length; count one epoch with "
                        "epoch_steps(spec) (epochs=1) and multiply, or pass epochs=N")
    if n < 1:
        raise SpecError(f"epochs={n!r}: count at least one epoch")
    it = iter(GlobalStream(Pipeline(loaded.replace(epochs=n))))
    steps = 0
    try:
        while True:
            try:
                it.next_compact()  # a full packed step is not laid out: only counted
            except StopIteration:
                return steps
            steps += 1
    finally:
        it.close()
