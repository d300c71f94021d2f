"""The word cache: ``tokenizers``' own ids for each distinct word, memoized (``backend: wordcache``).

Some tokenizers always split text at whitespace before their model runs, and normalize it one
character at a time: BERT's WordPiece family (``BertNormalizer`` + ``BertPreTokenizer``), and any
tokenizer built from the normalizers and pre-tokenizers in :data:`NORMALIZERS` and
:data:`PRE_TOKENIZERS`. For them a whitespace-separated word encodes to the same ids wherever it
occurs, so a text's ids are its words' ids, in order. :class:`WordCacheEncoder` splits each text
with ``str.split()``, looks every word up in a dictionary, and asks ``tokenizers`` only for the
words it has not seen (one batched call per chunk, on the same ``tokenizers.Tokenizer``). Natural
text repeats its words. Measured with BERT on 2 cores (CPU s per million tokens; ``tokenizers``
alone: 2.3): 0.3 once the words are known (text seen before, or a vocabulary that fits the cache);
1.3 on a first pass over 6.3 M characters of distinct real text (77 K distinct words, 14 % of
words missing); 2.4 in the worst case, a cache far too small for the text's vocabulary (4 K words
for 77 K: 86 % missing), where the splitting and lookups are paid on top of ``tokenizers``.

The ids always come from ``tokenizers``; what the cache relies on is that splitting at
whitespace never changes them. A text where that could fail is encoded whole by ``tokenizers``:

* it holds a character Python's ``str.split`` treats as whitespace and the tokenizer may not
  (:data:`SPLIT_ONLY_IN_PYTHON`: vertical tab, form feed, the information separators, NEL;
  ``BertNormalizer`` deletes them, so ``a\\x0bb`` is one word to BERT);
* it holds the text of an added token (``[MASK]``): ``tokenizers`` matches those in the raw text
  before anything else, across word boundaries (``[`` and ``MASK`` are separate words);
* ``add_special_tokens=True`` (the post-processor frames the whole text).

Tokenizers outside that shape (BPE byte-level, Metaspace, ``Precompiled``, added tokens matched
after normalization, BPE dropout) are refused by :func:`wordcache_refusal`; for the others the
verification of :mod:`feedline._tokenize.check` and the data checks of
:class:`~feedline._tokenize.backends.VerifiedEncoder` still apply, as for fastokens.

    >>> enc = WordCacheEncoder(tokenizers.Tokenizer.from_file("bert/tokenizer.json"))  # doctest: +SKIP
    >>> enc.encode_batch(["Hello world!"])                                             # doctest: +SKIP
    [array([7592, 2088,  999], dtype=int32)]
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice
from typing import Any

import numpy as np

from feedline._tokenize.encoder import FlatEncoder

__all__ = ["CACHE_WORDS", "NORMALIZERS", "PRE_TOKENIZERS", "SPLIT_ONLY_IN_PYTHON", "WordCacheEncoder",
           "wordcache_refusal"]

#: Normalizers that map text one character (or one base character and its marks) at a time.
NORMALIZERS = frozenset({"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents"})
#: Pre-tokenizers that split inside whitespace-separated words only, by the characters there.
PRE_TOKENIZERS = frozenset({"BertPreTokenizer", "WhitespaceSplit", "Whitespace", "Punctuation", "Digits"})
#: The pre-tokenizers among those that split at every (Unicode) whitespace character.
WHITESPACE_SPLITTERS = frozenset({"BertPreTokenizer", "WhitespaceSplit", "Whitespace"})
#: Characters ``str.split()`` splits at that are not Unicode White_Space, or that ``BertNormalizer``
#: deletes as control characters: a text holding one goes to ``tokenizers`` whole.
SPLIT_ONLY_IN_PYTHON = ("\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85")
#: Words kept at most, in two generations of half as many: when the young one is full it becomes the
#: old one (the previous old one is dropped), and a word found only in the old one moves back to the
#: young one, so the words in use stay. Full of random 3-12 letter words it holds ~46 MB.
CACHE_WORDS = 1 << 18


def _components(node: Mapping[str, Any] | None, key: str) -> list[str]:
    """The types of a normalizer or pre-tokenizer, a ``Sequence`` unrolled."""
    if node is None:
        return []
    if node.get("type") == "Sequence":
        return [t for child in node.get(key, []) for t in _components(child, key)]
    return [str(node.get("type"))]


def wordcache_refusal(tokenizer_json: str | Mapping[str, Any]) -> str | None:
    """Why the word cache cannot encode for this tokenizer (``None``: it can).

        >>> wordcache_refusal({"normalizer": None, "pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE"}})
        'its pre-tokenizer ByteLevel may depend on what surrounds a word'
    """
    cfg = json.loads(tokenizer_json) if isinstance(tokenizer_json, str) else tokenizer_json
    normalizers = _components(cfg.get("normalizer"), "normalizers")
    pre = _components(cfg.get("pre_tokenizer"), "pretokenizers")
    odd = [t for t in normalizers if t not in NORMALIZERS]
    if odd:
        return f"its normalizer {odd[0]} may depend on what surrounds a word"
    odd = [t for t in pre if t not in PRE_TOKENIZERS]
    if odd:
        return f"its pre-tokenizer {odd[0]} may depend on what surrounds a word"
    if not WHITESPACE_SPLITTERS & set(pre):
        return "its pre-tokenizer does not split at whitespace"
    model = cfg.get("model") or {}
    if model.get("dropout"):
        return "its BPE model has dropout (random merges)"
    late = [t.get("content") for t in cfg.get("added_tokens") or [] if t.get("normalized")]
    if late:
        return f"its added token {late[0]!r} is matched after normalization"
    return None


class WordCacheEncoder(FlatEncoder):
    """``tokenizers``' ids per distinct whitespace-separated word, memoized (see the module docstring).

    Args:
        backend: the ``tokenizers.Tokenizer`` (padding and truncation off, as feedline loads it).
        added: the contents of its added tokens (a text holding one is encoded whole).
    """

    name = "wordcache"

    def __init__(self, backend: Any, added: Iterable[str] | None = None) -> None:
        self.backend = backend
        if added is None:
            added = (t.content for t in backend.get_added_tokens_decoder().values())
        contents = sorted({a for a in added if a}, key=len, reverse=True)
        self._firsts = tuple(sorted({a[0] for a in contents}))
        self._added = re.compile("|".join(map(re.escape, contents))) if contents else None
        self._cache: dict[str, bytes] = {}   # the young generation (every lookup)
        self._old: dict[str, bytes] = {}     # the old one (looked up on a young miss)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Words in the cache."""
        return len(self._cache) + len(self._old)

    def clear(self) -> None:
        """Forget every word (the next texts pay for their misses again)."""
        with self._lock:
            self._cache, self._old = {}, {}

    def _whole(self, text: str) -> bool:
        """Whether ``text`` must go to ``tokenizers`` whole."""
        if any(c in text for c in SPLIT_ONLY_IN_PYTHON):
            return True
        return self._added is not None and any(c in text for c in self._firsts) and self._added.search(text) is not None

    def _encode_flat(self, texts: Sequence[str], add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
        whole = [i for i, t in enumerate(texts) if add_special_tokens or self._whole(t)]
        if whole:
            skip = set(whole)
            words = [[] if i in skip else t.split() for i, t in enumerate(texts)]
        else:
            words = [t.split() for t in texts]
        get = self._cache.get
        rows = [list(map(get, ws)) for ws in words]
        if any(None in r for r in rows):
            self._fill(words, rows)
        per = [b"".join(r) for r in rows]  # type: ignore[arg-type]  # every None is filled now
        if whole:
            for i, e in zip(whole, self.backend.encode_batch_fast([texts[i] for i in whole],
                                                                   add_special_tokens=add_special_tokens), strict=True):
                per[i] = np.asarray(e.ids, dtype=np.int32).tobytes()
        bounds = np.zeros(len(per) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, per), dtype=np.int64, count=len(per)), out=bounds[1:])
        bounds //= 4
        return np.frombuffer(bytearray().join(per), dtype=np.int32), bounds

    def _fill(self, words: list[list[str]], rows: list[list[bytes | None]]) -> None:
        """Fill ``rows`` in place: the young generation's misses from the old one, the rest from one
        batched ``tokenizers`` call; both go into the young generation."""
        missing = {w for ws, r in zip(words, rows, strict=True) if None in r
                   for w, v in zip(ws, r, strict=True) if v is None}
        old = self._old
        fresh = {w: old[w] for w in missing if w in old}
        new = [w for w in missing if w not in fresh]
        if new:
            encs = self.backend.encode_batch_fast(new, add_special_tokens=False)
            fresh.update((w, np.asarray(e.ids, dtype=np.int32).tobytes()) for w, e in zip(new, encs, strict=True))
        for ws, r in zip(words, rows, strict=True):
            if None in r:
                r[:] = [fresh[w] if v is None else v for w, v in zip(ws, r, strict=True)]
        half = max(1, CACHE_WORDS // 2)
        with self._lock:
            young = self._cache
            if len(young) + len(fresh) > half:   # a new generation (lookups running keep the dicts they hold)
                self._old, young = young, {}
                self._cache = young
            young.update(fresh if len(fresh) <= half else islice(fresh.items(), half))
