"""Train a tokenizer with the ``tokenizers`` trainers, with special tokens suited to the model family.

Families:

=========  ==========================  =============================================
kind       model family                special tokens
=========  ==========================  =============================================
bpe        GPT (byte-level BPE)        ``<|endoftext|>`` (bos = eos = pad)
wordpiece  BERT (lower-cased)          ``[PAD] [UNK] [CLS] [SEP] [MASK]``
unigram    T5 (SentencePiece-style)    ``<pad> </s> <unk>`` + ``<extra_id_N>`` sentinels
=========  ==========================  =============================================

Inputs are anything a spec source accepts (text, JSONL, compressed, globs), or ``word<TAB>count``
TSV files as ``feedline count-tokens`` writes (each word is fed ``count`` times)::

    >>> tok = train_tokenizer(["corpus.jsonl"], "out/", kind="bpe", vocab_size=8000)  # doctest: +SKIP

The output directory gets ``tokenizer.json`` and a ``tokenizer_config.json`` naming the roles,
so :func:`feedline.load_tokenizer` (and ``transformers.AutoTokenizer``) load it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from feedline._tokenize.tokenizer import Tokenizer
from feedline._tools.progress import enabled, track
from feedline.errors import SourceError, SpecError

__all__ = ["FAMILIES", "train_tokenizer"]

Kind = Literal["bpe", "wordpiece", "unigram"]
FAMILIES: tuple[str, ...] = ("bpe", "wordpiece", "unigram")
_REPEAT_CHUNK = 4096


def _texts(inputs: Sequence[str], text_field: str) -> Iterator[str]:
    from feedline._records import records

    plain = [p for p in inputs if not p.endswith((".tsv", ".tsv.gz", ".tsv.zst"))]
    counts = [p for p in inputs if p not in plain]
    for path in counts:
        yield from _from_counts(path)
    if plain:
        spec = {"sources": [{"path": p, "text": text_field} for p in plain], "task": {"kind": "clm"}}
        for rec in records(spec):
            yield rec["text"]


def _from_counts(path: str) -> Iterator[str]:
    from feedline._sources.files import open_binary

    with open_binary(path) as f:
        for n, raw in enumerate(f, 1):
            parts = raw.decode("utf-8", errors="replace").rstrip("\r\n").split("\t")
            if len(parts) != 2 or not parts[1].strip().isdigit():
                raise SourceError(f"{path}:{n}: expected 'word<TAB>count', got {raw[:60]!r}")
            word, count = parts[0], int(parts[1])
            while count > 0:
                k = min(count, _REPEAT_CHUNK)
                yield (" " + word) * k
                count -= k


def _build(kind: str, vocab_size: int, min_frequency: int, lowercase: bool, sentinels: int) -> tuple[RustTokenizer, Any, dict[str, Any]]:
    trainer: Any
    if kind == "bpe":
        tok = RustTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        if lowercase:
            tok.normalizer = normalizers.Lowercase()
        special = ["<|endoftext|>"]
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=enabled())
        cfg = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": None, "pad_token": None}
        return tok, trainer, cfg
    if kind == "wordpiece":
        tok = RustTokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=special, show_progress=enabled())
        cfg = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
               "mask_token": "[MASK]", "bos_token": None, "eos_token": None}
        return tok, trainer, cfg
    if kind == "unigram":
        tok = RustTokenizer(models.Unigram())
        tok.normalizer = normalizers.Sequence([normalizers.NFKC()] + ([normalizers.Lowercase()] if lowercase else []))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        special = ["<pad>", "</s>", "<unk>"]
        trainer = trainers.UnigramTrainer(vocab_size=max(vocab_size - sentinels, len(special) + 1), special_tokens=special,
                                          unk_token="<unk>", show_progress=enabled())
        cfg = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>", "bos_token": None}
        return tok, trainer, cfg
    raise SpecError(f"kind: {kind!r} is not a tokenizer family; choose one of {', '.join(FAMILIES)}")


def train_tokenizer(inputs: Sequence[str], output: str, *, kind: str = "bpe", vocab_size: int = 32000,
                    min_frequency: int = 2, lowercase: bool | None = None, sentinels: int | None = None,
                    text_field: str = "text") -> Tokenizer:
    """Train a tokenizer on ``inputs`` and save it under ``output`` (a directory).

    Args:
        inputs: paths, globs or directories (any source format), or ``word<TAB>count`` TSV files.
        output: directory to write ``tokenizer.json`` and ``tokenizer_config.json`` into.
        kind: ``bpe`` (GPT), ``wordpiece`` (BERT) or ``unigram`` (T5).
        vocab_size: target vocabulary size, special tokens included.
        min_frequency: minimum pair/word frequency (bpe, wordpiece).
        lowercase: lower-case text first (default: only for wordpiece).
        sentinels: ``<extra_id_N>`` tokens to add (unigram only; default 100, as T5).
        text_field: field holding the text in JSONL inputs.
    """
    if vocab_size < 64:
        raise SpecError(f"vocab_size: {vocab_size} is too small; use at least 64")
    lowercase = (kind == "wordpiece") if lowercase is None else lowercase
    n_sentinels = (100 if kind == "unigram" else 0) if sentinels is None else sentinels
    if n_sentinels and kind != "unigram":
        raise SpecError("sentinels are for the unigram (T5) family only")
    tok, trainer, cfg = _build(kind, vocab_size, min_frequency, lowercase, n_sentinels)
    tok.train_from_iterator(track(_texts(list(inputs), text_field), "reading"), trainer=trainer)
    if kind == "wordpiece":
        cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    if kind == "unigram":
        eos = tok.token_to_id("</s>")
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", eos)])
        if n_sentinels:
            # T5 convention: <extra_id_0> has the highest id.
            tok.add_special_tokens([f"<extra_id_{i}>" for i in reversed(range(n_sentinels))])
            cfg["additional_special_tokens"] = [f"<extra_id_{i}>" for i in range(n_sentinels)]
    if tok.get_vocab_size() <= len(cfg):
        raise SourceError("the inputs hold too little text to train a tokenizer")
    os.makedirs(output, exist_ok=True)
    tok.save(os.path.join(output, "tokenizer.json"))
    config = {k: v for k, v in cfg.items() if v is not None}
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["model_max_length"] = 1 << 30
    with open(os.path.join(output, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    return Tokenizer(tok, output, cfg)
