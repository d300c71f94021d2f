"""The resume state a loader hands out: small, JSON, versioned, tied to its spec.

    {"version": 1, "spec_hash": "3f2a...", "step": 120, "world_size": 4,
     "pipeline": {...nested stage states...}}

The walkers at the end (:func:`find_rejected`, :func:`mixture_shares`, :func:`epochs_in`) read
figures out of a nested pipeline state for ``Loader.stats()``, the service's stats and tests.

``step`` counts global steps delivered. The pipeline state is the same for every rank, so a
state saved by any rank resumes every rank, with any world size (elastic resume).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from feedline.errors import StateError

__all__ = ["STATE_VERSION", "check_state", "epochs_in", "find_rejected", "make_state", "mixture_shares", "state_json"]

STATE_VERSION = 1


def make_state(spec_hash: str, global_state: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    return {"version": STATE_VERSION, "spec_hash": spec_hash, "step": global_state["step"],
            "world_size": world_size, "pipeline": global_state["pipeline"]}


def state_json(spec_hash: str, global_state: Mapping[str, Any], world_size: int) -> str:
    """:func:`make_state` as compact JSON (what the service sends with each batch)."""
    return json.dumps(make_state(spec_hash, global_state, world_size), separators=(",", ":"))


def check_state(state: Any, spec_hash: str) -> dict[str, Any]:
    """Validate a resume state against the spec; returns the global stream state.

    Raises:
        StateError: malformed, another version, or saved under another spec.
    """
    if isinstance(state, (str, bytes)):
        try:
            state = json.loads(state)
        except json.JSONDecodeError as e:
            raise StateError(f"resume state is not valid JSON ({e})") from e
    if not isinstance(state, Mapping):
        raise StateError(f"resume state must be a mapping from Loader.state_dict(), got {type(state).__name__}")
    version = state.get("version")
    if version != STATE_VERSION:
        raise StateError(f"resume state has version {version!r}; this feedline reads version {STATE_VERSION}")
    if state.get("spec_hash") != spec_hash:
        raise StateError(
            f"resume state was saved under spec {state.get('spec_hash')!r} but this spec hashes to {spec_hash!r}; "
            "resume with the same spec (seed, sources, task and batching must match)"
        )
    try:
        return {"step": int(state["step"]), "pipeline": state["pipeline"]}
    except (KeyError, TypeError, ValueError) as e:
        raise StateError(f"resume state lacks {e}") from e


# ---------------------------------------------------------------- walkers over a nested pipeline state
def find_rejected(state: Any, into: dict[str, int]) -> None:
    """Sum every ``rejected: {reason: n}`` table found in a nested pipeline state."""
    if isinstance(state, Mapping):
        for k, v in state.items():
            if k == "rejected" and isinstance(v, Mapping):
                for reason, n in v.items():
                    if isinstance(n, int):
                        into[str(reason)] = into.get(str(reason), 0) + n
            else:
                find_rejected(v, into)
    elif isinstance(state, list):
        for v in state:
            find_rejected(v, into)


def mixture_shares(state: Any) -> list[float] | None:
    """Realised share of records drawn from each source (from the mixture's ``counts``)."""
    if isinstance(state, Mapping):
        counts = state.get("counts")
        if isinstance(counts, list) and "sources" in state and all(isinstance(c, int) for c in counts):
            total = sum(counts)
            return [round(c / total, 4) for c in counts] if total else None
        for v in state.values():
            found = mixture_shares(v)
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
