"""Record transforms named by import path in the tests' specs (``record_transforms:short``)."""

from __future__ import annotations

from typing import Any


def short(rec: dict[str, Any]) -> bool:
    """Keep documents under 2,000 characters (about 60 % of the C4 sample)."""
    return len(rec["text"]) < 2000


def tagged(rec: dict[str, Any]) -> dict[str, Any]:
    """Prefix the text with its length bucket (a pure function of the record)."""
    return {**rec, "text": f"[{len(rec['text']) // 500}] {rec['text']}"}


def fails_on_the_seventh(rec: dict[str, Any]) -> bool:
    if rec["text"].startswith("A couple rediscover each other"):  # line 7 of c4_demo.jsonl
        raise ValueError("cannot classify this one")
    return True


def not_a_dict(rec: dict[str, Any]) -> Any:
    return rec["text"]
