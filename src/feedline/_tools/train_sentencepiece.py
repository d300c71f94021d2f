"""Train a SentencePiece model (``.model`` + ``.vocab``) with the ``sentencepiece`` library.

``feedline train-tokenizer ... --format sentencepiece`` lands here. Families:

=========  =====================  ======================================================
kind       layout                 ids
=========  =====================  ======================================================
unigram    T5 (``spiece.model``)  ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, no bos; ``<extra_id_N>``
                                  sentinels appended last, ``<extra_id_0>`` the highest id
bpe        LLaMA                  ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, byte fallback
           (``tokenizer.model``)
=========  =====================  ======================================================

Inputs are either all ``word<TAB>count`` TSV files (``feedline count-tokens`` output; passed to
SentencePiece as ``input_format=tsv``, so counts are weights, never repeated text), or anything a
spec source reads (each non-blank line of each record is one sentence)::

    >>> train_sentencepiece(["counts.tsv"], "spm/", kind="unigram", vocab_size=32000)  # doctest: +SKIP
    PosixPath('spm/spiece.model')

Why SentencePiece for these: its Unigram trainer works on weighted words and trains on a 715k-word
TSV with 2.8x less CPU than the ``tokenizers`` Unigram trainer (which needs the counts expanded to text);
see docs/tokenizers.md for the measurements.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from feedline._tools.progress import enabled, track
from feedline.errors import MissingDependency, SourceError, SpecError

__all__ = ["SPM_FAMILIES", "train_sentencepiece"]

_log = logging.getLogger("feedline")

SPM_FAMILIES: dict[str, dict[str, Any]] = {
    "unigram": {"file": "spiece", "pad_id": 0, "eos_id": 1, "unk_id": 2, "bos_id": -1, "pad_piece": "<pad>",
                "eos_piece": "</s>", "unk_piece": "<unk>", "byte_fallback": False,
                "config": {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}},
    "bpe": {"file": "tokenizer", "pad_id": -1, "unk_id": 0, "bos_id": 1, "eos_id": 2, "unk_piece": "<unk>",
            "bos_piece": "<s>", "eos_piece": "</s>", "byte_fallback": True,
            "config": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}},
}
_TSV = (".tsv", ".tsv.gz", ".tsv.zst")


def _sentences(inputs: Sequence[str], text_field: str) -> Iterator[str]:
    from feedline._records import records

    spec = {"sources": [{"path": p, "text": text_field} for p in inputs], "task": {"kind": "clm"}}
    for rec in records(spec):
        for line in rec["text"].splitlines():
            if line.strip():
                yield line


def _plain_tsv(path: str, tmp: str) -> str:
    """A TSV SentencePiece can read: checked ``word<TAB>count`` lines, decompressed if needed."""
    from feedline._sources.files import open_binary

    if path.endswith(".tsv"):
        out, f_out = path, None
    else:
        fd, out = tempfile.mkstemp(suffix=".tsv", dir=tmp)
        f_out = os.fdopen(fd, "wb")
    with open_binary(path) as f:
        for n, raw in enumerate(f, 1):
            parts = raw.rstrip(b"\r\n").split(b"\t")
            if len(parts) != 2 or not parts[1].strip().isdigit():
                raise SourceError(f"{path}:{n}: expected 'word<TAB>count', got {raw[:60]!r}")
            if f_out is not None:
                f_out.write(raw)
    if f_out is not None:
        f_out.close()
    return out


def train_sentencepiece(inputs: Sequence[str], output: str, *, kind: str = "unigram", vocab_size: int = 32000,
                        lowercase: bool = False, sentinels: int | None = None, text_field: str = "text",
                        tokenizer_json: bool = False, character_coverage: float = 0.9995,
                        max_sentences: int = 10_000_000, threads: int | None = None) -> Path:
    """Train ``kind`` (``unigram`` or ``bpe``) on ``inputs``; write ``.model``/``.vocab`` under ``output``.

    Args:
        inputs: ``word<TAB>count`` TSV files, or paths/globs/directories of any source format.
        output: directory for ``spiece.model`` (unigram) or ``tokenizer.model`` (bpe), its ``.vocab``
            and ``tokenizer_config.json``.
        vocab_size: vocabulary size, special tokens and sentinels included.
        lowercase: lower-case text first (NFKC is always applied).
        sentinels: ``<extra_id_N>`` tokens appended (default 100 for unigram, 0 for bpe).
        tokenizer_json: also write ``tokenizer.json`` (unigram only; converted with ``tokenizers``).
        character_coverage: share of characters covered by the alphabet (1.0 for small alphabets).
        max_sentences: sentences sampled from text inputs (SentencePiece's ``input_sentence_size``).
        threads: trainer threads (default: all cores).

    Returns:
        The path of the ``.model`` file.
    """
    try:
        import sentencepiece as spm
    except ImportError as e:
        raise MissingDependency("--format sentencepiece needs sentencepiece: pip install 'feedline[hf]'") from e
    if kind not in SPM_FAMILIES:
        raise SpecError(f"kind: {kind!r} cannot be trained with sentencepiece; choose unigram or bpe "
                        "(wordpiece: use --format tokenizers)")
    family = SPM_FAMILIES[kind]
    n_sentinels = (100 if kind == "unigram" else 0) if sentinels is None else sentinels
    if vocab_size - n_sentinels < 64:
        raise SpecError(f"vocab_size: {vocab_size} leaves {vocab_size - n_sentinels} pieces after {n_sentinels} "
                        "sentinels; use a larger vocabulary or fewer --sentinels")
    tsv = [p for p in inputs if p.endswith(_TSV)]
    if tsv and len(tsv) != len(inputs):
        raise SpecError("mix of word-count TSV and text inputs; train from one kind (merge counts with "
                        "'feedline count-tokens a.tsv corpus/ -o all.tsv')")
    os.makedirs(output, exist_ok=True)
    prefix = os.path.join(output, family["file"])
    options: dict[str, Any] = {k: v for k, v in family.items() if k not in ("file", "config")}
    options.update(model_prefix=prefix, model_type=kind, vocab_size=vocab_size - n_sentinels,
                   character_coverage=character_coverage, num_threads=threads or os.cpu_count() or 1,
                   normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
                   hard_vocab_limit=False, minloglevel=0 if enabled() else 2)
    with tempfile.TemporaryDirectory(prefix="feedline-spm-") as tmp:
        try:
            if tsv:
                spm.SentencePieceTrainer.train(input=",".join(_plain_tsv(p, tmp) for p in tsv), input_format="tsv",
                                               **options)
            else:
                spm.SentencePieceTrainer.train(sentence_iterator=track(_sentences(inputs, text_field), "reading",
                                                                       unit="lines"),
                                               input_sentence_size=max_sentences, shuffle_input_sentence=True,
                                               max_sentence_length=1 << 16, **options)
        except RuntimeError as e:
            raise SourceError(f"sentencepiece training failed: {e}") from e
    model = Path(prefix + ".model")
    if n_sentinels:
        _append_sentinels(model, n_sentinels)
    got = piece_count(model)
    if got < vocab_size:
        _log.warning("%s holds %d pieces, not the %d asked: the corpus has too few distinct pieces for that "
                     "vocabulary (train on more text, or ask for --vocab-size %d)", model, got, vocab_size, got)
    config: dict[str, Any] = dict(family["config"])
    if n_sentinels:
        config["additional_special_tokens"] = [f"<extra_id_{i}>" for i in range(n_sentinels)]
    config["model_max_length"] = 1 << 30
    if tokenizer_json:
        _write_tokenizer_json(model, kind, output)
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(os.path.join(output, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    return model


def piece_count(model: str | os.PathLike[str]) -> int:
    """The number of pieces (ids) in a SentencePiece ``.model``, sentinels included."""
    import sentencepiece as spm

    return int(spm.SentencePieceProcessor(model_file=str(model)).get_piece_size())


def _append_sentinels(model: Path, n: int) -> None:
    """Append ``<extra_id_{n-1}> .. <extra_id_0>`` as user-defined pieces (T5: extra_id_0 has the highest id)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString(model.read_bytes())
    for i in reversed(range(n)):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = f"<extra_id_{i}>", 0.0, pb.ModelProto.SentencePiece.USER_DEFINED  # type: ignore[attr-defined]
    model.write_bytes(proto.SerializeToString())
    with open(model.with_suffix(".vocab"), "a", encoding="utf-8") as f:
        for i in reversed(range(n)):
            f.write(f"<extra_id_{i}>\t0\n")


def _write_tokenizer_json(model: Path, kind: str, output: str) -> None:
    """``tokenizer.json`` for a Unigram model (converted by ``tokenizers``; encodes as SentencePiece does)."""
    if kind != "unigram":
        raise SpecError("--tokenizer-json converts unigram models only; load a bpe .model directly "
                        "(feedline.load_tokenizer('DIR/tokenizer.model')) or with transformers' LlamaTokenizerFast")
    from feedline._tokenize.load import load_tokenizer

    tok = load_tokenizer(str(model))
    tok.backend.save(os.path.join(output, "tokenizer.json"))
