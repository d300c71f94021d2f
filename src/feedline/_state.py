"""The resume state a loader hands out: small, JSON, versioned, tied to its spec.

    {"version": 1, "spec_hash": "3f2a...", "step": 120, "world_size": 4,
     "pipeline": {...nested stage states...}}

Tables of buffered keys (shuffle buffer, packed rows) are packed integer columns that carry their
own format version (``{"packed": 1, ...}``, :mod:`feedline._core.packed`); the JSON lists that
earlier states hold in their place still load, so the state version stays 1.

The walkers at the end (:func:`find_rejected`, :func:`mixture_shares`, :func:`epochs_in`) read
figures out of a nested pipeline state for ``Loader.stats()``, the service's stats and tests.

``step`` counts global steps delivered. The pipeline state is the same for every rank, so a
state saved by any rank resumes every rank, with any world size (elastic resume).

A state may come from anywhere (a checkpoint file, a network peer), so :func:`check_state`
validates it strictly before anything uses it: JSON values only, integers non-negative and below
2**63, floats finite, at most :data:`MAX_DEPTH` levels of nesting and :data:`MAX_NODES` values.

    >>> check_state({"version": 1, "spec_hash": "h", "step": -1, "pipeline": {}}, "h")
    Traceback (most recent call last):
    ...
    feedline.errors.StateError: resume state: step must be a non-negative integer, got -1
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from feedline._core.report import FILTERED, sum_rejected
from feedline.errors import StateError

__all__ = ["MAX_DEPTH", "MAX_NODES", "ROW_DEALT", "STATE_VERSION", "check_state", "epochs_in", "filtered_in", "find_rejected", "make_state",
           "mixture_shares", "parse_state_json", "partitions_in", "refuse_row_dealt", "state_json"]

STATE_VERSION = 1
#: Why a composed state without ``turn`` is refused (partitions took turns after 0.1.0's first cut).
ROW_DEALT = ("partitions: this state was written when every step took batch_size / K rows of each partition "
             "(feedline before partitions took turns); that is another stream: resume it with the feedline that "
             "wrote it, or start this run from its beginning")
MAX_DEPTH = 64            # real states nest about 7 levels deep
MAX_NODES = 4_000_000     # values in one state (a 100k-record shuffle buffer holds ~400k)
_MAX_INT = 2**63 - 1


def make_state(spec_hash: str, global_state: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    return {"version": STATE_VERSION, "spec_hash": spec_hash, "step": global_state["step"],
            "world_size": world_size, "pipeline": global_state["pipeline"]}


def state_json(spec_hash: str, global_state: Mapping[str, Any], world_size: int) -> str:
    """:func:`make_state` as compact JSON (what the service sends with each batch)."""
    return json.dumps(make_state(spec_hash, global_state, world_size), separators=(",", ":"))


def check_state(state: Any, spec_hash: str | tuple[str, ...], partitions: int | None = None) -> dict[str, Any]:
    """Validate a resume state against the spec; returns the global stream state.

    ``spec_hash`` is the spec's hash, or the hashes its states may carry
    (:meth:`~feedline._spec.spec.Spec.accepted_hashes`, the current one first).
    ``partitions`` (the spec's) names the cause when a state of another spec holds another number.

    Raises:
        StateError: malformed, another version, or saved under another spec.
    """
    if isinstance(state, (str, bytes)):
        state = parse_state_json(state)
    if not isinstance(state, Mapping):
        raise StateError(f"resume state must be a mapping from Loader.state_dict(), got {type(state).__name__}")
    version = state.get("version")
    if version != STATE_VERSION:
        raise StateError(f"resume state has version {version!r}; this feedline reads version {STATE_VERSION}")
    accepted = (spec_hash,) if isinstance(spec_hash, str) else tuple(spec_hash)
    if state.get("spec_hash") not in accepted:
        saved = partitions_in(state.get("pipeline"))
        if partitions is not None and saved != partitions:
            raise StateError(
                f"resume state was saved with partitions: {saved} but this spec has partitions: {partitions}; another "
                f"number of partitions is another stream (like another seed): resume with partitions: {saved}, or start afresh"
            )
        raise StateError(
            f"resume state was saved under spec {state.get('spec_hash')!r} but this spec hashes to {accepted[0]!r}; "
            "resume with the same spec (seed, sources, task and batching must match; paths are hashed as "
            "written, so a moved corpus resumes when its paths are written relative to root: and root: names "
            "its new place)"
        )
    for key in ("step", "pipeline"):
        if key not in state:
            raise StateError(f"resume state lacks {key!r}; pass a state from Loader.state_dict()")
    step = state["step"]
    if not _is_int(step):
        raise StateError(f"resume state: step must be a non-negative integer, got {step!r:.40}")
    world_size = state.get("world_size", 1)
    if not _is_int(world_size) or world_size < 1:
        raise StateError(f"resume state: world_size must be a positive integer, got {world_size!r:.40}")
    _check_values(state["pipeline"])
    refuse_row_dealt(state["pipeline"])
    return {"step": step, "pipeline": state["pipeline"]}


def refuse_row_dealt(pipeline: Any) -> None:
    """Raise :data:`ROW_DEALT` for a composed state of the row-dealing partitions (no ``turn``)."""
    if isinstance(pipeline, Mapping) and {"partitions", "ended", "carry"} <= pipeline.keys() and "turn" not in pipeline:
        raise StateError(ROW_DEALT)


def parse_state_json(text: str | bytes) -> Any:
    """``json.loads`` for states: refuses NaN/Infinity and nesting too deep to parse.

    Raises:
        StateError: not valid JSON, a non-finite number, or nested beyond the parser's limit.
    """
    def no_constants(name: str) -> Any:
        raise StateError(f"resume state holds {name}; states hold only finite numbers")

    try:
        return json.loads(text, parse_constant=no_constants)
    except json.JSONDecodeError as e:
        raise StateError(f"resume state is not valid JSON ({e})") from e
    except RecursionError:
        raise StateError(f"resume state is nested too deeply (states nest at most {MAX_DEPTH} levels)") from None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= _MAX_INT


def _check_values(root: Any) -> None:
    """Walk a state without recursion: JSON types, integers in range, finite floats, bounded shape."""
    stack: list[tuple[Any, int, str]] = [(root, 1, "pipeline")]
    nodes = 0
    while stack:
        value, depth, path = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise StateError(f"resume state holds more than {MAX_NODES} values; it is not a feedline state")
        if depth > MAX_DEPTH:
            raise StateError(f"resume state is nested deeper than {MAX_DEPTH} levels at {path:.80}")
        if isinstance(value, Mapping):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise StateError(f"resume state: key {k!r:.40} at {path:.80} is not a string")
                stack.append((v, depth + 1, f"{path}.{k}"))
        elif isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1, f"{path}[{i}]") for i, v in enumerate(value))
        elif isinstance(value, bool) or value is None or isinstance(value, str):
            continue
        elif isinstance(value, int):
            if not _is_int(value):
                raise StateError(f"resume state: {path:.80} = {value!r:.40} is not a non-negative 64-bit integer")
        elif isinstance(value, float):
            if not math.isfinite(value) or value < 0:
                raise StateError(f"resume state: {path:.80} = {value!r} is not a finite non-negative number")
        else:
            raise StateError(f"resume state: {path:.80} holds a {type(value).__name__}, not a JSON value")


# ---------------------------------------------------------------- walkers over a nested pipeline state
def filtered_in(state: Any) -> int:
    """Records dropped by ``filter`` transforms so far (their ``rejected`` reason ``filtered``; not rejections).

        >>> filtered_in({"parent": {"rejected": {"filtered": 3}, "parent": {"sources": [{"rejected": {"empty": 1}}]}}})
        3
    """
    return sum_rejected(state).get(FILTERED, 0)


def partitions_in(pipeline: Any) -> int:
    """The number of partitions a global stream's pipeline state composes (1 without the composing stage)."""
    if isinstance(pipeline, Mapping) and isinstance(pipeline.get("partitions"), list) and "carry" in pipeline:
        return len(pipeline["partitions"])
    return 1


def find_rejected(state: Any, into: dict[str, int]) -> None:
    """Sum every ``rejected: {reason: n}`` table found in a nested pipeline state into ``into``
    (records dropped by filters are not rejections: see :func:`filtered_in`)."""
    sum_rejected(state, into)
    into.pop(FILTERED, None)


def mixture_shares(state: Any) -> list[float] | None:
    """Realised share of records drawn from each source (from the mixture's ``counts``, summed over
    the partitions of a partitioned stream).

        >>> mixture_shares({"partitions": [{"counts": [3, 1], "sources": []}, {"counts": [1, 3], "sources": []}],
        ...                 "ended": [False, False], "carry": []})
        [0.5, 0.5]
    """
    if isinstance(state, Mapping) and partitions_in(state) > 1:
        parts = [c for c in (_mixture_counts(p) for p in state["partitions"]) if c is not None]
        counts = [sum(col) for col in zip(*parts, strict=True)] if parts else None
    else:
        counts = _mixture_counts(state)
    total = sum(counts or ())
    return [round(c / total, 4) for c in counts] if counts and total else None


def _mixture_counts(state: Any) -> list[int] | None:
    if isinstance(state, Mapping):
        counts = state.get("counts")
        if isinstance(counts, list) and "sources" in state and all(isinstance(c, int) for c in counts):
            return counts
        for v in state.values():
            found = _mixture_counts(v)
            if found is not None:
                return found
    return None


def epochs_in(state: Any) -> list[int]:
    """Every ``epoch`` value in a nested pipeline state, in walk order (what changes at an epoch edge)."""
    found: list[int] = []
    if isinstance(state, Mapping):
        for k, v in state.items():
            if k == "epoch" and isinstance(v, int):
                found.append(v)
            else:
                found.extend(epochs_in(v))
    elif isinstance(state, list):
        for v in state:
            found.extend(epochs_in(v))
    return found
