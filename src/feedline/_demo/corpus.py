"""The embedded default corpus: built at first use from text that ships with Python itself.

``pydoc_data.topics`` (the Python reference's help topics, ~460 KB of English prose and code)
is split into paragraphs and written as JSONL under ``~/.cache/feedline/demo`` (or
``$FEEDLINE_CACHE``), with a byte-level BPE tokenizer trained on it by
:func:`feedline._tools.train_tokenizer.train_tokenizer`. Nothing is downloaded.

    >>> corpus, tokenizer = ensure_demo_assets()          # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["cache_dir", "ensure_demo_assets"]

VOCAB_SIZE = 2048


def cache_dir() -> Path:
    """``$FEEDLINE_CACHE`` or ``~/.cache/feedline``."""
    return Path(os.environ.get("FEEDLINE_CACHE") or Path.home() / ".cache" / "feedline")


def _paragraphs() -> list[str]:
    from pydoc_data import topics

    out = []
    for _name, text in sorted(topics.topics.items()):
        for para in text.split("\n\n"):
            para = " ".join(line.strip() for line in para.splitlines()).strip()
            if len(para) >= 40 and not set(para) <= set("*=-~ "):
                out.append(para)
    return out


def ensure_demo_assets(directory: Path | None = None) -> tuple[Path, Path]:
    """Build (once) and return ``(corpus.jsonl, tokenizer directory)``."""
    d = (directory or cache_dir()) / "demo"
    corpus = d / "corpus.jsonl"
    tok_dir = d / f"tokenizer-bpe-{VOCAB_SIZE}"
    if not corpus.exists():   # each builder writes a file of its own and renames it in: two at once both finish
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".corpus-", suffix=".tmp", dir=d)
        try:
            with open(fd, "w", encoding="utf-8") as f:
                for p in _paragraphs():
                    f.write(json.dumps({"text": p}) + "\n")
            os.replace(tmp, corpus)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    if not (tok_dir / "tokenizer.json").exists():
        from feedline._tools.train_tokenizer import train_tokenizer

        tmp_dir = Path(tempfile.mkdtemp(prefix=".tok-", dir=d))
        try:
            train_tokenizer([str(corpus)], str(tmp_dir), kind="bpe", vocab_size=VOCAB_SIZE)
            os.replace(tmp_dir, tok_dir)
        except OSError:  # another builder won the race: its tokenizer is the same
            if not (tok_dir / "tokenizer.json").exists():
                raise
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return corpus, tok_dir
