"""Batching strategies by name."""

from __future__ import annotations

import importlib

from feedline._batching.base import Batcher
from feedline._core.options import close_match
from feedline.errors import SpecError

__all__ = ["STRATEGIES", "batcher_class", "batcher_options"]

STRATEGIES: dict[str, str] = {
    "bucket": "feedline._batching.bucket:BucketBatcher",
    "concat": "feedline._batching.concat:ConcatBatcher",
    "pack": "feedline._batching.pack:PackBatcher",
    "pad": "feedline._batching.pad:PadBatcher",
}


def batcher_class(strategy: str) -> type[Batcher]:
    target = STRATEGIES.get(strategy)
    if target is None:
        raise SpecError(f"batching.strategy: {strategy!r} is not a strategy{close_match(strategy, sorted(STRATEGIES))} (strategies: {', '.join(sorted(STRATEGIES))})")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def batcher_options(strategy: str) -> type:
    return batcher_class(strategy).Options
