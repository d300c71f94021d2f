"""Encode a very long text in pieces, cut where the tokenizer's pre-tokenization already splits.

A tokenizer encodes a text in memory proportional to it, many times over: ``tokenizers`` keeps
an alignment per byte and a token object per id, so one 20 MB record peaked at 2.7 GB. A text
longer than :data:`LONG_CHARS` is cut into pieces of about :data:`PIECE_CHARS` characters,
encoded a :data:`GROUP_CHARS` group at a time (ids kept as int32 only), and joined: memory is
bounded by the group, whatever the backend.

The ids equal those of the whole text: a cut is made only before a space that follows a
non-space and precedes a letter (where every BPE and WordPiece pre-tokenizer in use splits), and
only once encoding the :data:`WINDOW` characters on each side of it whole gives the ids of the two
halves joined. A tokenizer whose pieces never pass that check (one that does not pre-tokenize,
such as a SentencePiece model that keeps spaces inside pieces) encodes the text whole, as before.
Special tokens are added once, around the joined ids, as the tokenizer adds them to one text.

    >>> cutter = LongTexts(encode_flat)                              # doctest: +SKIP
    >>> flat, bounds = cutter.encode_flat([huge_text, "short"], False)  # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["GROUP_CHARS", "LONG_CHARS", "PIECE_CHARS", "WINDOW", "LongTexts"]

#: Texts longer than this many characters are encoded in pieces.
LONG_CHARS = 1 << 20
#: A piece holds about this many characters (from a cut to the next).
PIECE_CHARS = 1 << 16
#: Pieces are encoded this many characters at a time (the bound on the encoder's memory).
GROUP_CHARS = 1 << 19
#: Characters on each side of a cut encoded whole and in halves to check it.
WINDOW = 512
#: Candidate cuts tried near each target before the piece grows past it.
_TRIES = 4

_CUT = re.compile(r"(?<=\S) (?=[^\W\d_])")  # before " " + letter, after a non-space

EncodeFlat = Callable[[Sequence[str], bool], tuple[np.ndarray, np.ndarray]]


class LongTexts:
    """Encodes batches with ``encode_flat`` (ids of texts, see :func:`~feedline._tokenize.encoder.join_ids`),
    the long texts among them in pieces."""

    def __init__(self, encode_flat: EncodeFlat) -> None:
        self.encode = encode_flat
        self._affixes: tuple[np.ndarray, np.ndarray] | bool | None = False  # False: not probed yet

    def encode_flat(self, texts: Sequence[str], add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
        """The ids of ``texts`` as ``encode_flat`` gives them, each long text encoded in pieces."""
        parts: list[np.ndarray] = []
        lengths: list[int] = []
        run: list[str] = []

        def flush() -> None:
            if run:
                flat, bounds = self.encode(run, add_special_tokens)
                parts.append(flat)
                lengths.extend(np.diff(bounds).tolist())
                run.clear()

        for text in texts:
            if len(text) <= LONG_CHARS:
                run.append(text)
                continue
            flush()
            ids = self.encode_long(text, add_special_tokens)
            parts.append(ids)
            lengths.append(len(ids))
        flush()
        bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(np.asarray(lengths, dtype=np.int64), out=bounds[1:])
        flat = np.concatenate(parts).astype(np.int32, copy=False) if parts else np.zeros(0, dtype=np.int32)
        return flat, bounds

    def encode_long(self, text: str, add_special_tokens: bool) -> np.ndarray:
        """The ids of one text, in pieces where :meth:`cuts` finds places (else whole)."""
        affixes = self.affixes() if add_special_tokens else (np.zeros(0, np.int32), np.zeros(0, np.int32))
        cuts = self.cuts(text) if affixes is not None else []
        if not cuts or affixes is None:
            return self.encode([text], add_special_tokens)[0]
        out = [affixes[0]]
        group: list[str] = []
        size = 0
        for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
            group.append(text[a:b])
            size += b - a
            if size >= GROUP_CHARS:
                out.append(self.encode(group, False)[0])
                group, size = [], 0
        if group:
            out.append(self.encode(group, False)[0])
        out.append(affixes[1])
        return np.concatenate(out).astype(np.int32, copy=False)

    def cuts(self, text: str) -> list[int]:
        """Offsets to cut ``text`` at, about :data:`PIECE_CHARS` apart, each checked (see the module's doc);
        ``[]`` when the first targets find no cut the tokenizer keeps."""
        cuts: list[int] = []
        target = PIECE_CHARS
        misses = 0
        while target < len(text) - PIECE_CHARS // 2:
            found = [m.start() for _, m in zip(range(_TRIES), _CUT.finditer(text, target, target + PIECE_CHARS // 2))]
            lo = cuts[-1] if cuts else 0
            kept = self._first_kept(text, found, lo)
            if kept is None:
                misses += 1
                if not cuts and misses >= 2:
                    return []  # this tokenizer does not split there: encode whole
            else:
                cuts.append(kept)
            target = (kept if kept is not None else target) + PIECE_CHARS
        return cuts

    def _first_kept(self, text: str, found: list[int], lo: int) -> int | None:
        """The first of ``found`` where the window encodes the same whole and in halves."""
        if not found:
            return None
        windows: list[str] = []
        for i in found:
            a, b = max(lo, i - WINDOW), min(len(text), i + WINDOW)
            windows += [text[a:b], text[a:i], text[i:b]]
        flat, bounds = self.encode(windows, False)
        for k, i in enumerate(found):
            whole, left, right = (flat[bounds[j]:bounds[j + 1]] for j in range(3 * k, 3 * k + 3))
            if len(whole) == len(left) + len(right) and np.array_equal(whole, np.concatenate([left, right])):
                return i
        return None

    def affixes(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The ids the tokenizer adds before and after one text's (``None``: not a plain prefix and suffix)."""
        if self._affixes is False:
            plain = self.encode(["a"], False)[0]
            full = self.encode(["a"], True)[0]
            n = len(plain)
            at = next((k for k in range(len(full) - n + 1) if np.array_equal(full[k:k + n], plain)), None)
            self._affixes = None if at is None or n == 0 else (full[:at].copy(), full[at + n:].copy())
        return self._affixes  # type: ignore[return-value]
