"""Row-for-row comparison with ``datasets`` (values and types) and the resume check the load_dataset tests share."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import numpy as np


def typed(x: Any) -> Any:
    """A value with its types spelled out, so equality compares types too (1 != 1.0, np.int64 != int)."""
    if isinstance(x, dict):
        return {k: typed(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [type(x).__name__, [typed(v) for v in x]]
    if isinstance(x, np.ndarray):
        return ["ndarray", str(x.dtype), x.shape, [typed(v) for v in x.tolist()] if x.dtype == object else x.tolist()]
    if type(x).__module__ == "torch":
        return ["tensor", str(x.dtype), list(x.shape), x.tolist()]
    return [type(x).__name__, x]


def check(make: Callable[[], Any], hf: Any, *, cuts: int = 3) -> list[Any]:
    """Equal to datasets' rows (values and types); resumed from a JSON state at random rows, it continues exactly."""
    expected = list(hf)
    got = list(make())
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert typed(a) == typed(b), f"row {i}: {a!r:.300} != {b!r:.300}"
    rng = random.Random(len(expected))
    for cut in sorted(rng.sample(range(1, len(expected)), min(cuts, len(expected) - 1))) if len(expected) > 1 else []:
        ds = make()
        it, head = iter(ds), []
        for _ in range(cut):
            head.append(next(it))
        state = json.loads(json.dumps(ds.state_dict()))
        it.close()
        resumed = make()
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert typed(head + rest) == typed(got), f"resumed at row {cut}"
    return expected
