"""Where the examples find data and tokenizers when none is given on the command line.

The project's real test data (``../shared/data`` beside the repository) is used when present;
otherwise each example falls back to something that needs no download: the demo corpus built
from Python's own documentation, and tokenizers trained on it with
``feedline.tools.train_tokenizer`` (cached under ``$FEEDLINE_CACHE``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def shared(*parts: str) -> Path | None:
    """A path under ``../shared/data``, or ``None`` when it is not there."""
    p = SHARED_DATA.joinpath(*parts)
    return p if p.exists() else None


def demo_corpus() -> Path:
    """The embedded demo corpus (JSONL, ``{"text": ...}`` per paragraph)."""
    from feedline.demo.corpus import ensure_demo_assets

    return ensure_demo_assets()[0]


def trained_tokenizer(kind: str, vocab_size: int = 2048) -> str:
    """A ``bpe``/``wordpiece``/``unigram`` tokenizer trained once on the demo corpus."""
    from feedline.demo.corpus import cache_dir
    from feedline.tools.train_tokenizer import train_tokenizer

    out = cache_dir() / "examples" / f"tokenizer-{kind}-{vocab_size}"
    if not (out / "tokenizer.json").exists():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        train_tokenizer([str(demo_corpus())], str(tmp), kind=kind, vocab_size=vocab_size)
        try:
            os.replace(tmp, out)
        except OSError:  # another process won the race
            pass
    return str(out)


def tokenizer(name: str, fallback_kind: str) -> str:
    """A real tokenizer from ``../shared/data/tokenizers/<name>``, else a trained one of ``fallback_kind``."""
    real = shared("tokenizers", name)
    return str(real) if real is not None else trained_tokenizer(fallback_kind)


def write_json(path: str | os.PathLike[str], data: object) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
