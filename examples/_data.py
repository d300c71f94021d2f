"""Where the examples find data and tokenizers when none is given on the command line.

The project's real test data (``../shared/data`` beside the repository) is used when present;
otherwise each example falls back to something that needs no download: the demo corpus built
from Python's own documentation, and tokenizers trained on it with
``feedline.tools.train_tokenizer`` (cached under ``$FEEDLINE_CACHE``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The module docstring as written, and each option's default after its help (``--help``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def shared(*parts: str) -> Path | None:
    """A path under ``../shared/data``, or ``None`` when it is not there."""
    p = SHARED_DATA.joinpath(*parts)
    return p if p.exists() else None


def demo_corpus() -> Path:
    """The embedded demo corpus (JSONL, ``{"text": ...}`` per paragraph)."""
    from feedline.tools import ensure_demo_assets

    return ensure_demo_assets()[0]


def trained_tokenizer(kind: str, vocab_size: int = 2048) -> str:
    """A ``bpe``/``wordpiece``/``unigram`` tokenizer trained once on the demo corpus."""
    from feedline.tools import train_tokenizer

    out = demo_corpus().parent / "examples" / f"tokenizer-{kind}-{vocab_size}"
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


KEYWORDS = ("class", "function", "string", "list", "exception", "module", "object", "value")


def keyword_label_tsv(out: str | os.PathLike[str], rows: int = 4000) -> tuple[str, list[str]]:
    """A GoEmotions-layout TSV (``text \\t ids \\t id``, no header) labelled by keywords present.

    The stand-in multi-label dataset when the real GoEmotions files are absent: each demo
    paragraph is labelled with every keyword of :data:`KEYWORDS` it contains (``27`` style ids,
    comma-separated), so a classifier has something learnable. Returns the path and label names.
    """
    import csv

    path = Path(out)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        n = 0
        with open(demo_corpus(), encoding="utf-8") as src, open(path, "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f, delimiter="\t")
            for line in src:
                text = json.loads(line)["text"][:400]
                ids = [str(i) for i, k in enumerate(KEYWORDS) if k in text.lower()]
                if ids:
                    w.writerow([text, ",".join(ids), f"demo{n}"])
                    n += 1
                    if n >= rows:
                        break
    return str(path), list(KEYWORDS)


def run(main: Callable[[], object]) -> None:
    """Run an example's ``main``; a feedline error (a missing data path, a wrong tokenizer path, a
    bad option) or a model that cannot be loaded (``OSError`` from ``from_pretrained``) ends it with
    its message and the hint to see ``--help``, not a traceback."""
    from feedline import FeedlineError

    try:
        code = main()
    except (FeedlineError, OSError) as err:
        name = Path(sys.argv[0]).name
        sys.exit(f"{name}: {type(err).__name__}: {err}\n(see: python examples/{name} --help for what to pass)")
    if isinstance(code, int) and code:
        sys.exit(code)
