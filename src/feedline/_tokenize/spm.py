"""SentencePiece ``.model`` files as Rust ``tokenizers`` pipelines that encode like sentencepiece.

A ``.model`` file is a ``ModelProto`` (protobuf): the pieces with their scores and types, the
trainer spec (algorithm, byte fallback, special ids) and the normalizer spec. It is read here
with a small wire-format reader (no protobuf or sentencepiece package needed) and turned into
the ``tokenizers`` components that reproduce ``SentencePieceProcessor.encode``::

    normalizer      Precompiled(charsmap)              the trained normalization (nmt_nfkc, ...)
                    " {2,}" -> " ", strip " " at ends  remove_extra_whitespaces
                    Prepend("▁")                       add_dummy_prefix
    pre-tokenizer   Metaspace: " " -> "▁"              escape_whitespaces; split before each "▁" only
                                                       when no piece has an inner "▁" (exact, and words
                                                       are cached), not for Mistral's "▁▁" pieces
    model           Unigram(scores) | BPE(merges)      BPE merges ranked by the merged piece's score
    added tokens    control, unknown, user-defined     matched in the raw text; control ones special

    >>> backend, roles, _ = convert("tokenizer.model")   # doctest: +SKIP
    >>> roles                                             # doctest: +SKIP
    {'bos_token': '<s>', 'eos_token': '</s>', 'pad_token': None, 'unk_token': '<unk>'}

Differences from sentencepiece, deliberate and shared with the official ``tokenizer.json`` of
Llama-2 and Mistral: text that spells a control piece (``<s>``, ``</s>``, ``[INST]``) encodes to
that piece's id (sentencepiece encodes the characters), so chat templates work; and text after
a control or user-defined piece starts with its own dummy prefix ``▁`` (sentencepiece adds one
only at the start of the text). Ties: BPE merges of equal score are ranked by piece id instead
of position in the text, and a Unigram lattice tie between two segmentations of equal total
score (``'.......'`` as ``'......' '.'`` or ``'.' '......'``) may break the other way. On the
real prose of ``../shared/data/prose`` (5,364 documents, 0.5 M tokens per model) the Mistral
BPE model encodes identically to sentencepiece and T5's Unigram model differs in one document,
by such a tie (``python bench/bench_spm.py``).

BOS/EOS (``add_special_tokens=True``): a model with a BOS piece (Llama, Mistral, Gemma) gets it
in front, one without (T5) gets its EOS piece at the end, as ``transformers``' Llama and T5
tokenizers do; ``sentencepiece.encode`` adds neither unless asked (``add_bos``/``add_eos``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as RustTokenizer
from tokenizers.models import BPE, Unigram

from feedline.errors import TokenizerError

__all__ = ["SpmModel", "convert", "read_model"]

_SPACE = "\u2581"  # "▁", sentencepiece's escaped space
# SentencePiece.Type and TrainerSpec.ModelType values (sentencepiece_model.proto)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNIGRAM, BPE_TYPE, WORD, CHAR = 1, 2, 3, 4
_MODEL_NAMES = {UNIGRAM: "unigram", BPE_TYPE: "bpe", WORD: "word", CHAR: "char"}


@dataclass(frozen=True, kw_only=True)
class SpmModel:
    """The fields of a ``ModelProto`` that decide how text is encoded (proto defaults filled in)."""

    pieces: list[tuple[str, float, int]]  # (piece, score, type)
    model_type: int = UNIGRAM
    byte_fallback: bool = False
    treat_whitespace_as_suffix: bool = False
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = -1
    normalizer: str = ""
    precompiled_charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True

    @property
    def algorithm(self) -> str:
        return _MODEL_NAMES.get(self.model_type, str(self.model_type))

    def role(self, i: int) -> str | None:
        return self.pieces[i][0] if 0 <= i < len(self.pieces) else None


# --------------------------------------------------------------------------- protobuf wire format
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """``(field number, wire type, value)`` of a message; length-delimited values as bytes."""
    out: list[tuple[int, int, Any]] = []
    pos = 0
    val: int | bytes
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            val, pos = _varint(buf, pos)
        elif wire == 1:
            val, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            val, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            val, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire} (field {num})")
        if pos > len(buf):
            raise ValueError(f"field {num} runs past the end of the message")
        out.append((num, wire, val))
    return out


def _int32(v: int) -> int:
    """A proto ``int32`` (negative values are 10-byte varints)."""
    v &= 0xFFFFFFFFFFFFFFFF
    return v - (1 << 64) if v >= 1 << 63 else v


def read_model(data: bytes) -> SpmModel:
    """Parse a serialized ``ModelProto``.

    Raises:
        ValueError: the bytes are not a SentencePiece model.
    """
    pieces: list[tuple[str, float, int]] = []
    trainer: dict[str, Any] = {}
    norm: dict[str, Any] = {}
    for num, wire, val in _fields(data):
        if num == 1 and wire == 2:
            piece, score, kind = "", 0.0, NORMAL
            for n, w, v in _fields(val):
                if n == 1 and w == 2:
                    piece = v.decode("utf-8")
                elif n == 2 and w == 5:
                    score = struct.unpack("<f", v)[0]
                elif n == 3 and w == 0:
                    kind = v
            pieces.append((piece, score, kind))
        elif num == 2 and wire == 2:
            names = {3: "model_type", 24: "treat_whitespace_as_suffix", 35: "byte_fallback",
                     40: "unk_id", 41: "bos_id", 42: "eos_id", 43: "pad_id"}
            for n, w, v in _fields(val):
                if n in names and w == 0:
                    trainer[names[n]] = _int32(v) if n >= 40 else (bool(v) if n in (24, 35) else v)
        elif num == 3 and wire == 2:
            for n, w, v in _fields(val):
                if n == 1 and w == 2:
                    norm["normalizer"] = v.decode("utf-8")
                elif n == 2 and w == 2:
                    norm["precompiled_charsmap"] = bytes(v)
                elif n in (3, 4, 5) and w == 0:
                    norm[{3: "add_dummy_prefix", 4: "remove_extra_whitespaces", 5: "escape_whitespaces"}[n]] = bool(v)
    if not pieces:
        raise ValueError("no pieces: not a SentencePiece model")
    return SpmModel(pieces=pieces, **trainer, **norm)


# --------------------------------------------------------------------------- conversion
def _bpe_merges(pieces: list[tuple[str, float, int]]) -> list[tuple[str, str]]:
    """Every split ``(a, b)`` of a normal piece into two normal pieces, best merged score first.

    sentencepiece merges, at each step, the adjacent pair whose concatenation is the piece with
    the highest score; ranking the merges by that score (then piece id) reproduces it.
    """
    ids = {p: i for i, (p, _, t) in enumerate(pieces) if t == NORMAL}
    ranked: list[tuple[float, int, int, tuple[str, str]]] = []
    for piece, pid in ids.items():
        score = pieces[pid][1]
        for k in range(1, len(piece)):
            a, b = piece[:k], piece[k:]
            if a in ids and b in ids:
                ranked.append((-score, pid, ids[a], (a, b)))
    ranked.sort()
    return [m for *_, m in ranked]


def convert(path: str) -> tuple[RustTokenizer, dict[str, Any], bytes]:
    """The ``tokenizers.Tokenizer`` for a ``.model`` file, its special-token roles and the file's
    bytes (for the ``sentencepiece`` backend).

    Raises:
        TokenizerError: unreadable file, or a model kind that cannot be reproduced exactly.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
        m = read_model(data)
    except (OSError, ValueError, UnicodeDecodeError, struct.error) as e:
        raise TokenizerError(f"{path}: not a readable SentencePiece model ({e})") from e
    if m.model_type not in (UNIGRAM, BPE_TYPE):
        raise TokenizerError(
            f"{path}: SentencePiece {m.algorithm} models are not supported (only unigram and bpe); "
            "convert it to a tokenizer.json with transformers and pass that")
    if m.treat_whitespace_as_suffix or (m.add_dummy_prefix and not m.escape_whitespaces):
        raise TokenizerError(
            f"{path}: treat_whitespace_as_suffix / unescaped whitespace cannot be reproduced exactly; "
            "convert it to a tokenizer.json with transformers and pass that")
    vocab = [(p, s) for p, s, _ in m.pieces]
    model: Unigram | BPE
    if m.model_type == UNIGRAM:
        model = Unigram(vocab, unk_id=m.unk_id, byte_fallback=m.byte_fallback)
    else:
        unk = m.role(m.unk_id)
        model = BPE({p: i for i, (p, _) in enumerate(vocab)}, _bpe_merges(m.pieces), unk_token=unk,
                    fuse_unk=True, byte_fallback=m.byte_fallback, dropout=None)
    tok = RustTokenizer(model)
    steps: list[normalizers.Normalizer] = []
    if m.precompiled_charsmap:
        steps.append(normalizers.Precompiled(m.precompiled_charsmap))
    if m.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex(r"\A | \z"), "")]
    if m.add_dummy_prefix:
        steps.append(normalizers.Prepend(_SPACE))
    if steps:
        tok.normalizer = normalizers.Sequence(steps)
    if m.escape_whitespaces:
        # spaces become "▁" here (10-15% faster than a Replace normalizer); splitting before each
        # "▁" is exact when no piece has an inner "▁" (then words are cached), else not done
        split = not any(_SPACE in p[1:] for p, _, t in m.pieces if t == NORMAL)
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_SPACE, prepend_scheme="never", split=split)
    dec: list[decoders.Decoder] = [decoders.Replace(_SPACE, " ")]
    if m.byte_fallback:
        dec += [decoders.ByteFallback()]
    dec += [decoders.Fuse()]
    if m.add_dummy_prefix:
        dec += [decoders.Strip(" ", 1, 0)]
    tok.decoder = decoders.Sequence(dec)
    tok.add_tokens([AddedToken(p, normalized=False, special=t != USER_DEFINED)
                    for p, _, t in m.pieces if t in (UNKNOWN, CONTROL, USER_DEFINED)])
    bos, eos = m.role(m.bos_id), m.role(m.eos_id)
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, m.bos_id)])
    elif eos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, m.eos_id)])
    roles = {"bos_token": bos, "eos_token": eos, "pad_token": m.role(m.pad_id), "unk_token": m.role(m.unk_id)}
    return tok, roles, data
