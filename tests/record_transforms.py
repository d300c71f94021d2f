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


def drops_text(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k != "text"}


def text_to_int(rec: dict[str, Any]) -> dict[str, Any]:
    return {**rec, "text": len(rec["text"])}


def array_filter(rec: dict[str, Any]) -> Any:
    import numpy as np

    return np.array([len(rec["text"]) < 2000, True])


def empties_or_grows(rec: dict[str, Any]) -> dict[str, Any]:
    """Empties the text of about one record in ten and makes about one in ten 60,000 bytes long."""
    import zlib

    bucket = zlib.crc32(rec["text"].encode()) % 10
    return {**rec, "text": "" if bucket == 0 else "grown " * 10_000 if bucket == 1 else rec["text"]}
