"""The plain-id encoders behind a :class:`~feedline._tokenize.tokenizer.Tokenizer`.

An :class:`Encoder` turns a batch of texts into int32 id arrays: :class:`HfEncoder`
(``tokenizers``), :class:`FastEncoder` (``fastokens``) or :class:`SentencePieceEncoder`
(``sentencepiece`` itself, for ``.model`` files); :mod:`feedline._tokenize.backends` chooses
and verifies them. :class:`TokenizerLike` is what the backends need of a tokenizer
(kept here so the backends never import the tokenizer module that uses them).

    >>> HfEncoder(tokenizers.Tokenizer.from_file("gpt2/tokenizer.json")).encode_batch(["Hi"])  # doctest: +SKIP
    [array([17250], dtype=int32)]
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from feedline._core.cores import pool_threads

__all__ = ["Encoder", "FastEncoder", "FlatEncoder", "HfEncoder", "SentencePieceEncoder", "TokenizerLike", "join_ids",
           "split_ids"]


_UINT32 = array("I").itemsize == 4  # C unsigned int is 32 bits (every mainstream platform)


def join_ids(ids: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Id arrays as one flat int32 array and ``n + 1`` int64 bounds (text ``i`` is ``flat[b[i]:b[i + 1]]``).

        >>> flat, bounds = join_ids([np.array([5, 6]), np.array([7])]); flat.tolist(), bounds.tolist()
        ([5, 6, 7], [0, 2, 3])
    """
    bounds = np.zeros(len(ids) + 1, dtype=np.int64)
    if ids:
        np.cumsum(np.fromiter((len(a) for a in ids), dtype=np.int64, count=len(ids)), out=bounds[1:])
    flat = np.concatenate(ids).astype(np.int32, copy=False) if ids else np.zeros(0, dtype=np.int32)
    return flat, bounds


def split_ids(flat: np.ndarray, bounds: np.ndarray) -> list[np.ndarray]:
    """The per-text arrays of :func:`join_ids`' output."""
    return np.split(flat, bounds[1:-1]) if len(bounds) > 1 else []


class Encoder(Protocol):
    """Turns a batch of texts into int32 id arrays; ``name`` says which library does it now."""

    @property
    def name(self) -> str: ...

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[np.ndarray]: ...

    def encode_flat(self, texts: Sequence[str], add_special_tokens: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The ids of every text in one int32 array plus ``len(texts) + 1`` bounds (see :func:`join_ids`)."""
        ...


class HfEncoder:
    """``tokenizers``' ``encode_batch_fast`` (Rust thread pool, GIL released)."""

    name = "hf"

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[np.ndarray]:
        if not texts:
            return []
        encs = self.backend.encode_batch_fast(list(texts), add_special_tokens=add_special_tokens)
        if _UINT32:
            # ``Encoding.ids`` is a list of Python ints; ``array("I", ...)`` reads it with one unsigned
            # conversion per item, a third of ``np.asarray(ids, np.int32)``'s cost (ids are < 2**31,
            # so the bytes are the same int32 values).
            return [np.frombuffer(array("I", e.ids), dtype=np.int32) for e in encs]
        return [np.asarray(e.ids, dtype=np.int32) for e in encs]

    def encode_flat(self, texts: Sequence[str], add_special_tokens: bool = False) -> tuple[np.ndarray, np.ndarray]:
        return join_ids(self.encode_batch(texts, add_special_tokens))


class FlatEncoder:
    """An encoder whose own layout is flat (:meth:`encode_flat`); :meth:`encode_batch` splits it."""

    name = "flat"

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[np.ndarray]:
        if not texts:
            return []
        return split_ids(*self.encode_flat(texts, add_special_tokens))

    def encode_flat(self, texts: Sequence[str], add_special_tokens: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The ids of every text in one int32 array plus ``len(texts) + 1`` int64 bounds."""
        if not texts:
            return np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64)
        return self._encode_flat(texts, add_special_tokens)

    def _encode_flat(self, texts: Sequence[str], add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError


class FastEncoder(FlatEncoder):
    """fastokens' flat batch call: one buffer of ids and one of offsets, no per-token objects."""

    name = "fastokens"

    def __init__(self, fast: Any) -> None:
        self.fast = fast

    def _encode_flat(self, texts: Sequence[str], add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
        ids, offsets = self.fast.encode_batch_flat(list(texts), add_special_tokens=add_special_tokens)
        return np.frombuffer(ids, dtype=np.uint32).astype(np.int32), np.frombuffer(offsets, dtype=np.uint64).astype(np.int64)


class SentencePieceEncoder(FlatEncoder):
    """``sentencepiece``'s own batch ``encode`` of a ``.model`` (its C++ thread pool): its ids by
    construction, where the converted ``tokenizers`` pipeline (:mod:`feedline._tokenize.spm`)
    differs on rare texts (combining marks it drops instead of ``<unk>``, lattice ties).

    ``add_special_tokens=True`` adds what the converted pipeline adds: the BOS piece in front when
    the model has one (Llama, Mistral), else its EOS piece at the end (T5). Text that spells a
    control piece (``</s>``) is encoded as characters, as sentencepiece does.

    Args:
        proto: the serialized ``ModelProto`` (the ``.model`` file's bytes).
        threads: sentencepiece's threads per call (default: :func:`~feedline._core.cores.pool_threads`
            at each call: every usable core, or a partition worker's share, or 1 where
            ``TOKENIZERS_PARALLELISM`` turns pools off).

    Raises:
        ImportError: ``sentencepiece`` is not installed.
        RuntimeError: ``sentencepiece`` cannot load ``proto``.
    """

    name = "sentencepiece"

    def __init__(self, proto: bytes, threads: int | None = None) -> None:
        import sentencepiece

        self.sp = sentencepiece.SentencePieceProcessor()
        self.sp.LoadFromSerializedProto(proto)
        self.add_bos = self.sp.bos_id() >= 0
        self.add_eos = not self.add_bos and self.sp.eos_id() >= 0
        self.threads = threads

    def _encode_flat(self, texts: Sequence[str], add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
        lists = self.sp.encode(list(texts), out_type=int, num_threads=self.threads or pool_threads(),
                               add_bos=add_special_tokens and self.add_bos, add_eos=add_special_tokens and self.add_eos)
        bounds = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum(np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists)), out=bounds[1:])
        flat = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int32, count=int(bounds[-1]))
        return flat, bounds


class TokenizerLike(Protocol):
    """What the encoder backends need of a tokenizer."""

    name: str
    backend: Any
    encoder: Encoder

    @property
    def source_file(self) -> str | None: ...

    def with_encoder(self, encoder: Encoder, request: str) -> Any: ...
