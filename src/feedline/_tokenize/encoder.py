"""The plain-id encoders behind a :class:`~feedline._tokenize.tokenizer.Tokenizer`.

An :class:`Encoder` turns a batch of texts into int32 id arrays: :class:`HfEncoder`
(``tokenizers``) or :class:`FastEncoder` (``fastokens``); :mod:`feedline._tokenize.backends`
chooses and verifies them. :class:`TokenizerLike` is what the backends need of a tokenizer
(kept here so the backends never import the tokenizer module that uses them).

    >>> HfEncoder(tokenizers.Tokenizer.from_file("gpt2/tokenizer.json")).encode_batch(["Hi"])  # doctest: +SKIP
    [array([17250], dtype=int32)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["Encoder", "FastEncoder", "HfEncoder", "TokenizerLike"]


class Encoder(Protocol):
    """Turns a batch of texts into int32 id arrays; ``name`` says which library does it now."""

    @property
    def name(self) -> str: ...

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[np.ndarray]: ...


class HfEncoder:
    """``tokenizers``' ``encode_batch_fast`` (Rust thread pool, GIL released)."""

    name = "hf"

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[np.ndarray]:
        if not texts:
            return []
        encs = self.backend.encode_batch_fast(list(texts), add_special_tokens=add_special_tokens)
        return [np.asarray(e.ids, dtype=np.int32) for e in encs]


class FastEncoder:
    """fastokens' flat batch call: one buffer of ids and one of offsets, no per-token objects."""

    name = "fastokens"

    def __init__(self, fast: Any) -> None:
        self.fast = fast

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[np.ndarray]:
        if not texts:
            return []
        ids, offsets = self.fast.encode_batch_flat(list(texts), add_special_tokens=add_special_tokens)
        flat = np.frombuffer(ids, dtype=np.uint32).astype(np.int32)
        bounds = np.frombuffer(offsets, dtype=np.uint64).astype(np.int64)
        return np.split(flat, bounds[1:-1])


class TokenizerLike(Protocol):
    """What the encoder backends need of a tokenizer."""

    name: str
    backend: Any
    encoder: Encoder

    def with_encoder(self, encoder: Encoder, request: str) -> Any: ...
