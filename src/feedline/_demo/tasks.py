"""Specs and models of the demo tasks beyond ``clm``, and the data they derive from plain text.

Every demo runs from the embedded corpus (or any text source given with ``--source``) with
nothing downloaded. Tasks that need more than text get it derived, deterministically, from the
first few thousand records and written once under the demo cache::

    classify    label = the first of LABEL_WORDS the paragraph contains ("other" if none)
    multilabel  labels = every KEYWORD the paragraph contains (ids, comma-separated, as GoEmotions)
    chat        user: "Explain: <first words>"  assistant: the paragraph (ChatML template in the spec)

A keyword classifier is learnable by a tiny model, so the loss visibly falls. The tokenizer
family follows the task: WordPiece (BERT tasks), unigram with sentinels (span), BPE (chat).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from feedline._demo.corpus import cache_dir, ensure_demo_assets
from feedline._tokenize.tokenizer import Tokenizer

__all__ = ["CHATML", "KEYWORDS", "LABEL_WORDS", "demo_tokenizer", "derived_source"]

LABEL_WORDS = ("exception", "class", "function", "string", "module")
KEYWORDS = ("class", "function", "string", "list", "exception", "module", "object", "value")
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
_ROWS = 4000


def demo_tokenizer(kind: str, vocab_size: int = 2048) -> str:
    """A ``wordpiece``/``unigram``/``bpe`` tokenizer trained once on the embedded corpus."""
    corpus, bpe = ensure_demo_assets()
    if kind == "bpe":
        return str(bpe)
    from feedline._tools.train_tokenizer import train_tokenizer

    out = cache_dir() / "demo" / f"tokenizer-{kind}-{vocab_size}"
    if not (out / "tokenizer.json").exists():
        tmp = out.with_name(f".{out.name}-{os.getpid()}")
        train_tokenizer([str(corpus)], str(tmp), kind=kind, vocab_size=vocab_size)
        try:
            os.replace(tmp, out)
        except OSError:  # another process won the race
            pass
    return str(out)


def _derive(kind: str, text: str) -> dict[str, Any] | None:
    low = text.lower()
    if kind == "classify":
        return {"text": text, "label": next((w for w in LABEL_WORDS if w in low), "other")}
    if kind == "multilabel":
        ids = [str(i) for i, w in enumerate(KEYWORDS) if w in low]
        return {"text": text, "labels": ",".join(ids)} if ids else None
    first = " ".join(text.split()[:8])
    return {"messages": [{"role": "user", "content": f"Explain: {first}"}, {"role": "assistant", "content": text}]}


def derived_source(kind: str, source: Any) -> dict[str, Any]:
    """A JSONL source with ``kind``'s fields, derived (once, cached) from a text source."""
    from feedline._records import records

    key = hashlib.sha256(json.dumps(source, sort_keys=True, default=str).encode()).hexdigest()[:12]
    path = cache_dir() / "demo" / f"derived-{kind}-{key}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}-{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            for rec in records({"sources": [source]}, limit=_ROWS):
                row = _derive(kind, rec["text"][:600])
                if row is not None:
                    f.write(json.dumps(row) + "\n")
        os.replace(tmp, path)
    return {"path": str(path), "text": "text" if kind != "chat" else None}


def _base(source: Any, tokenizer: str, task: dict[str, Any], batch_size: int) -> dict[str, Any]:
    return {"sources": [source], "tokenizer": tokenizer, "seed": 0, "epochs": None, "shuffle": {"buffer": 512},
            "task": task, "batching": {"strategy": "pad", "batch_size": batch_size}}


def mlm_spec(source: Any, tokenizer: str, seq_len: int, batch_size: int) -> dict[str, Any]:
    return _base(source, tokenizer, {"kind": "mlm", "max_length": seq_len}, batch_size)


def sop_spec(source: Any, tokenizer: str, seq_len: int, batch_size: int) -> dict[str, Any]:
    return _base(source, tokenizer, {"kind": "sop", "max_length": seq_len}, batch_size)


def span_spec(source: Any, tokenizer: str, seq_len: int, batch_size: int) -> dict[str, Any]:
    return _base(source, tokenizer, {"kind": "span", "max_length": seq_len}, batch_size)


def classify_spec(source: Any, tokenizer: str, seq_len: int, batch_size: int) -> dict[str, Any]:
    task = {"kind": "classify", "label": "label", "labels": [*LABEL_WORDS, "other"], "max_length": seq_len}
    return _base(derived_source("classify", source), tokenizer, task, batch_size)


def multilabel_spec(source: Any, tokenizer: str, seq_len: int, batch_size: int) -> dict[str, Any]:
    task = {"kind": "classify", "label": "labels", "multi_label": True, "num_labels": len(KEYWORDS),
            "label_type": "id", "label_separator": ",", "max_length": seq_len}
    return _base(derived_source("multilabel", source), tokenizer, task, batch_size)


def chat_spec(source: Any, tokenizer: str, seq_len: int, batch_size: int) -> dict[str, Any]:
    task = {"kind": "chat", "max_length": seq_len, "chat_template": CHATML, "truncation": "cut"}
    return _base(derived_source("chat", source), tokenizer, task, batch_size)


def bert(tok: Tokenizer, seq_len: int) -> Any:
    from feedline._demo.models_tasks import TinyBERT

    return TinyBERT(tok.vocab_size, max_len=max(seq_len, 64))


def bert_sop(tok: Tokenizer, seq_len: int) -> Any:
    from feedline._demo.models_tasks import TinyBERT

    return TinyBERT(tok.vocab_size, sop=True, max_len=max(seq_len, 64))


def t5(tok: Tokenizer, seq_len: int) -> Any:
    from feedline._demo.models_tasks import TinyT5

    return TinyT5(tok.vocab_size, max_len=max(2 * seq_len, 64))


def classifier(tok: Tokenizer, seq_len: int) -> Any:
    from feedline._demo.models_tasks import TinyClassifier

    return TinyClassifier(tok.vocab_size, len(LABEL_WORDS) + 1, max_len=max(seq_len, 64))


def multilabel_classifier(tok: Tokenizer, seq_len: int) -> Any:
    from feedline._demo.models_tasks import TinyClassifier

    return TinyClassifier(tok.vocab_size, len(KEYWORDS), max_len=max(seq_len, 64))


def chat_gpt(tok: Tokenizer, seq_len: int) -> Any:
    from feedline._demo.models import TinyGPT

    return TinyGPT(tok.vocab_size, max_len=max(seq_len, 64))

