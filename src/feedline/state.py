"""The resume state a loader hands out: small, JSON, versioned, tied to its spec.

    {"version": 1, "spec_hash": "3f2a...", "step": 120, "world_size": 4,
     "pipeline": {...nested stage states...}}

``step`` counts global steps delivered. The pipeline state is the same for every rank, so a
state saved by any rank resumes every rank, with any world size (elastic resume).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from feedline.errors import StateError

__all__ = ["STATE_VERSION", "check_state", "make_state", "state_json"]

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
