"""A thin wrapper over a Rust ``tokenizers.Tokenizer``: special ids and batched encoding.

    >>> tok = Tokenizer.from_file("tokenizer.json")          # doctest: +SKIP
    >>> ids = tok.encode_batch(["Hello world!"])[0]          # doctest: +SKIP

``encode_batch`` gives plain ids through ``encoder``: ``tokenizers``' ``encode_batch_fast`` (Rust
thread pool, GIL released), or a verified faster backend (:mod:`feedline._tokenize.backends`,
:meth:`with_encoder`). ``encode_batch_offsets`` and ``backend`` always use ``tokenizers``, for
tasks that need character offsets or word ids (whole-word masking, chat masks). Padding and truncation baked into a ``tokenizer.json`` are turned off: feedline pads
and truncates itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import tokenizers

from feedline._tokenize import longtext
from feedline._tokenize.encoder import Encoder, HfEncoder, join_ids, split_ids
from feedline.errors import TokenizerError

__all__ = ["Tokenizer"]

# Token strings that conventionally play each role, in order of preference.
_ROLE_CANDIDATES: dict[str, tuple[str, ...]] = {
    "bos": ("<s>", "<|begin_of_text|>", "<bos>", "[CLS]", "<|endoftext|>"),
    "eos": ("</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>", "[SEP]", "<|im_end|>"),
    "pad": ("<pad>", "[PAD]", "<|pad|>", "<|endoftext|>"),
    "unk": ("<unk>", "[UNK]", "<|unk|>"),
    "cls": ("[CLS]", "<s>", "<cls>"),
    "sep": ("[SEP]", "</s>", "<sep>"),
    "mask": ("[MASK]", "<mask>", "<|mask|>"),
}


class Tokenizer:
    """A loaded tokenizer with its special-token roles resolved.

    Args:
        backend: the ``tokenizers.Tokenizer``.
        name: where it came from (for messages).
        config: the ``tokenizer_config.json`` contents when available (roles, chat template).
    """

    def __init__(self, backend: tokenizers.Tokenizer, name: str, config: Mapping[str, Any] | None = None) -> None:
        backend.no_padding()
        backend.no_truncation()
        self.backend = backend
        self.name = name
        self.config: dict[str, Any] = dict(config or {})
        self.specials: dict[str, int | None] = {role: self._resolve(role) for role in _ROLE_CANDIDATES}
        #: What encodes plain ids, and the backend that was asked for (``hf``, ``auto``, ``fastokens``,
        #: ``wordcache``, ``sentencepiece``).
        self.encoder: Encoder = HfEncoder(backend)
        self.backend_request = "hf"
        self._source: tuple[str, int] | None = None  # (file read, vocabulary size then): source_file
        self._spm: tuple[bytes, int] | None = None  # (.model bytes, vocabulary size then): sentencepiece_model

    def with_encoder(self, encoder: Encoder, request: str) -> Tokenizer:
        """A copy sharing everything but the plain-id ``encoder`` (see :func:`~feedline._tokenize.backends.with_backend`)."""
        view = object.__new__(Tokenizer)
        view.__dict__.update(self.__dict__)
        view.encoder, view.backend_request = encoder, request
        return view

    @classmethod
    def from_file(cls, path: str, config: Mapping[str, Any] | None = None) -> Tokenizer:
        try:
            tok = cls(tokenizers.Tokenizer.from_file(path), path, config)
        except Exception as e:  # the Rust side raises a bare Exception
            raise TokenizerError(f"{path}: not a readable tokenizer.json ({e})") from e
        tok._source = (path, tok.backend.get_vocab_size(with_added_tokens=True))
        return tok

    @property
    def source_file(self) -> str | None:
        """The ``tokenizer.json`` this was read from (:meth:`from_file`) while the backend still is
        what it says (padding and truncation aside, which feedline turns off; no token added since),
        else ``None``. The backend check reads it instead of serialising the backend, which holds
        the GIL for 0.05-0.3 s."""
        if self._source is None:
            return None
        path, size = self._source
        return path if self.backend.get_vocab_size(with_added_tokens=True) == size else None

    @classmethod
    def from_sentencepiece(cls, backend: tokenizers.Tokenizer, proto: bytes, name: str,
                           config: Mapping[str, Any] | None = None) -> Tokenizer:
        """A tokenizer converted from a SentencePiece ``.model`` (``proto``: its bytes), which the
        ``sentencepiece`` backend encodes with."""
        tok = cls(backend, name, config)
        tok._spm = (proto, tok.backend.get_vocab_size(with_added_tokens=True))
        return tok

    @property
    def sentencepiece_model(self) -> bytes | None:
        """The ``.model`` bytes this was converted from while the backend still encodes its pieces
        (no token added since), else ``None``."""
        if self._spm is None:
            return None
        proto, size = self._spm
        return proto if self.backend.get_vocab_size(with_added_tokens=True) == size else None

    def _resolve(self, role: str) -> int | None:
        configured = self.config.get(f"{role}_token")
        if isinstance(configured, dict):
            configured = configured.get("content")
        if isinstance(configured, str):
            i = self.backend.token_to_id(configured)
            if i is not None:
                return int(i)
        if role in ("bos", "eos", "pad", "unk") and f"{role}_token" in self.config and configured is None:
            return None  # explicitly absent (e.g. Qwen has no bos)
        for cand in _ROLE_CANDIDATES[role]:
            i = self.backend.token_to_id(cand)
            if i is not None:
                return int(i)
        return None

    # ----------------------------------------------------------------- roles
    def special(self, role: str) -> int:
        """The id of a special-token role (``bos``, ``eos``, ``pad``, ``cls``, ``sep``, ``mask``, ``unk``)."""
        i = self.specials.get(role)
        if i is None:
            raise TokenizerError(f"tokenizer {self.name!r} has no {role} token; add one or pick a task that does not need it")
        return i

    @property
    def eos_id(self) -> int | None:
        return self.specials["eos"]

    @property
    def bos_id(self) -> int | None:
        return self.specials["bos"]

    @property
    def pad_id(self) -> int:
        """The padding id: the pad token, else eos, else 0."""
        for role in ("pad", "eos"):
            if self.specials[role] is not None:
                return int(self.specials[role])  # type: ignore[arg-type]
        return 0

    @cached_property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    @cached_property
    def all_special_ids(self) -> np.ndarray:
        """Ids of every special or added-special token (never masked, never a random replacement target)."""
        ids = {i for i in self.specials.values() if i is not None}
        for tid, tok in self.backend.get_added_tokens_decoder().items():
            if tok.special:
                ids.add(int(tid))
        return np.array(sorted(ids), dtype=np.int32)

    # ----------------------------------------------------------------- encoding
    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = False) -> list[np.ndarray]:
        """Token ids (int32) of each text, encoded in one GIL-free batch call (a text over
        :data:`~feedline._tokenize.longtext.LONG_CHARS` in bounded pieces, same ids)."""
        if any(len(t) > longtext.LONG_CHARS for t in texts):
            return split_ids(*self.encode_batch_flat(texts, add_special_tokens=add_special_tokens))
        return self.encoder.encode_batch(texts, add_special_tokens)

    def encode_batch_flat(self, texts: Sequence[str], *, add_special_tokens: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The ids of every text in one int32 array and ``len(texts) + 1`` int64 bounds: text ``i`` is
        ``flat[bounds[i]:bounds[i + 1]]``. Same ids as :meth:`encode_batch`, without an array per text.

            >>> flat, bounds = tok.encode_batch_flat(["Hello", "world"])   # doctest: +SKIP
        """
        if any(len(t) > longtext.LONG_CHARS for t in texts):
            return longtext.LongTexts(self._encode_flat).encode_flat(texts, add_special_tokens)
        return self._encode_flat(texts, add_special_tokens)

    def _encode_flat(self, texts: Sequence[str], add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
        encode_flat = getattr(self.encoder, "encode_flat", None)
        if encode_flat is None:  # an encoder from before encode_flat
            return join_ids(self.encoder.encode_batch(texts, add_special_tokens))
        return encode_flat(texts, add_special_tokens)  # type: ignore[no-any-return]

    def encode_batch_offsets(self, texts: Sequence[str], *, add_special_tokens: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
        """Token ids and ``[n, 2]`` character offsets of each text (slower: offsets are computed)."""
        encs = self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [(np.asarray(e.ids, dtype=np.int32), np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2)) for e in encs]

    def encode(self, text: str, *, add_special_tokens: bool = False) -> np.ndarray:
        return self.encode_batch([text], add_special_tokens=add_special_tokens)[0]

    def decode(self, ids: Sequence[int] | np.ndarray, *, skip_special_tokens: bool = False) -> str:
        return str(self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens))

    def id_to_token(self, i: int) -> str:
        return str(self.backend.id_to_token(int(i)))

    # ----------------------------------------------------------------- transformers
    @cached_property
    def special_tokens_map(self) -> dict[str, str]:
        """``{"bos_token": "<s>", ...}`` for each special token set: the ``special_tokens_map`` of :attr:`hf`,
        which chat templates are rendered with, without building a ``transformers`` tokenizer for it."""
        found = ((role, self.specials[role]) for role in ("bos", "eos", "pad", "unk", "cls", "sep", "mask"))
        return {f"{role}_token": str(self.backend.id_to_token(i)) for role, i in found if i is not None}

    @cached_property
    def hf(self) -> Any:
        """A ``transformers`` fast tokenizer over the same backend (0.2-1.6 s to build for a large vocabulary)."""
        try:
            from transformers import PreTrainedTokenizerFast
        except ImportError as e:
            raise TokenizerError("chat templates need transformers: pip install 'feedline[hf]'") from e
        template = self.config.get("chat_template")
        tok = PreTrainedTokenizerFast(tokenizer_object=self.backend, **self.special_tokens_map)
        if template:
            tok.chat_template = template
        return tok

    def to_json(self) -> str:
        """The backend's full JSON (for shipping the tokenizer to a worker)."""
        return str(self.backend.to_str())

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size})"

    def __getstate__(self) -> dict[str, Any]:
        return {"json": self.to_json(), "name": self.name, "config": json.dumps(self.config, default=str),
                "backend": self.backend_request, "spm": self._spm}

    def __setstate__(self, st: dict[str, Any]) -> None:
        self.__init__(tokenizers.Tokenizer.from_str(st["json"]), st["name"], json.loads(st["config"]))  # type: ignore[misc]
        self._spm = st.get("spm")
        if st.get("backend", "hf") != "hf":  # re-verified here (a Ray worker checks its own first chunks)
            from feedline._tokenize.backends import with_backend

            view = with_backend(self, st["backend"])
            self.encoder, self.backend_request = view.encoder, view.backend_request
