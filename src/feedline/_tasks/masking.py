"""Dynamic MLM masking shared by ``mlm`` and ``sop``: choose tokens, then 80% [MASK] / 10% random / 10% kept.

One call masks one sequence with its own per-sample generator, so a sequence gets a new mask
every epoch (RoBERTa's dynamic masking) yet the same mask on a resume::

    masker = Masker(MaskingOptions(), tokenizer)
    input_ids, labels = masker(ids, task.rng(record, sub))

Selection (``masking``):

* ``bernoulli`` (default, as Hugging Face ``DataCollatorForLanguageModeling``): every candidate
  token is chosen independently with ``mlm_probability``; the count is Binomial.
* ``exact`` (as Google BERT ``create_masked_lm_predictions``): exactly
  ``min(max_predictions, max(1, round(len(ids) * mlm_probability)))`` tokens, the length
  counting [CLS]/[SEP]; groups are taken in random order and one that would overshoot is skipped.

Candidates are all tokens except the tokenizer's special ids (``[CLS]``, ``[SEP]``, ``[PAD]``,
``[MASK]``, ``[UNK]``, BOS/EOS and every added special token): a special token is never chosen
and never labelled. With ``whole_word_mask`` the unit of choice is a word (the tokenizer's
pre-tokenizer word, so ``##`` pieces join their word as in Google BERT) and every token of a
chosen word is masked.

:meth:`Masker.mask_rows` masks many sequences at once, given their generators' keys
(:func:`feedline._core.rng.sample_keys`), with exactly the output of one :meth:`Masker.__call__`
per sequence: it reads the same raw words of each sequence's generator and applies them to the
whole chunk as arrays (rows it cannot do that way, rare, go through :meth:`Masker.__call__`).

Replacement keeps the 80/10/10 split in every mode. Deliberate differences from the references:

* whole-word masking keeps the 80/10/10 split (Hugging Face v5 forces 100% [MASK]);
* random replacements are drawn uniformly from the *non-special* vocabulary (Hugging Face and
  Google BERT draw from the whole vocabulary, special and added tokens included; fairseq also
  excludes specials), so a random replacement never plants a [SEP] or [PAD] in the input;
* one uniform draw per token splits mask/random/keep (same distribution as Hugging Face's two
  Bernoulli draws).

``max_predictions`` caps the chosen tokens (whole words in WWM) in both modes: when more were
chosen, groups are kept in random order while they fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from feedline._core.rng import philox_raw, sample_generator
from feedline._tokenize.tokenizer import Tokenizer
from feedline.errors import SpecError

__all__ = ["Masker", "MaskingOptions"]


@dataclass(frozen=True, kw_only=True)
class MaskingOptions:
    """How tokens are chosen and replaced; shared by the ``mlm`` and ``sop`` task options.

    Attributes:
        mlm_probability: fraction of candidate tokens (or words) chosen.
        mask_replace_prob: of the chosen tokens, the fraction replaced by ``[MASK]``.
        random_replace_prob: of the chosen tokens, the fraction replaced by a random token.
        whole_word_mask: choose whole words; all tokens of a chosen word are masked.
        max_predictions: at most this many chosen tokens per sequence (BERT: 20 at 128).
        masking: ``bernoulli`` (independent per token) or ``exact`` (BERT's fixed count).
    """

    mlm_probability: float = 0.15
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1
    whole_word_mask: bool = False
    max_predictions: int | None = None
    masking: Literal["bernoulli", "exact"] = "bernoulli"

    def __post_init__(self) -> None:
        if not 0.0 <= self.mlm_probability <= 1.0:
            raise SpecError(f"task.mlm_probability: {self.mlm_probability} must be in [0, 1]")
        if self.mask_replace_prob < 0 or self.random_replace_prob < 0 or self.mask_replace_prob + self.random_replace_prob > 1:
            raise SpecError(
                f"task.mask_replace_prob + task.random_replace_prob: {self.mask_replace_prob} + {self.random_replace_prob} "
                "must be non-negative and sum to at most 1 (the rest of the chosen tokens is kept unchanged)"
            )
        if self.max_predictions is not None and self.max_predictions < 1:
            raise SpecError(f"task.max_predictions: {self.max_predictions} must be >= 1, or null for no cap")


class Masker:
    """Applies :class:`MaskingOptions` to token sequences of one tokenizer."""

    def __init__(self, options: MaskingOptions, tok: Tokenizer) -> None:
        self.options = options
        self.mask_id = tok.special("mask")
        self.special = tok.all_special_ids
        #: Random replacements come from the non-special vocabulary.
        self.pool = np.setdiff1d(np.arange(tok.vocab_size, dtype=np.int32), self.special)

    def candidates(self, ids: np.ndarray) -> np.ndarray:
        """Positions that may be chosen (not a special token)."""
        return ~np.isin(ids, self.special)

    def __call__(self, ids: np.ndarray, rng: np.random.Generator, words: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Mask one sequence; returns ``(input_ids, labels)`` with ``labels`` -100 where not chosen.

        Args:
            ids: token ids (int32), special tokens included.
            rng: the sequence's own generator.
            words: word index per token (any integers; equal neighbours form one word), for
                whole-word masking. Ignored unless ``whole_word_mask``.
        """
        opts = self.options
        ids = np.asarray(ids, dtype=np.int32)
        n = len(ids)
        cand = self.candidates(ids)
        # Group candidate tokens into units of choice: words, or single tokens.
        if opts.whole_word_mask and words is not None:
            prev_cand = np.concatenate([[False], cand[:-1]])
            prev_word = np.concatenate([[-1], words[:-1]])
            starts = cand & ~(prev_cand & (words == prev_word))
        else:
            starts = cand.copy()
        group = np.cumsum(starts) - 1  # group index of each candidate token
        n_groups = int(starts.sum())
        if n_groups == 0:
            return ids.copy(), np.full(n, -100, dtype=np.int32)
        sizes = np.bincount(group[cand], minlength=n_groups)
        if opts.masking == "exact":
            budget = max(1, round(n * opts.mlm_probability))
            if opts.max_predictions is not None:
                budget = min(budget, opts.max_predictions)
            chosen = self._fill(rng.permutation(n_groups), sizes, budget, n_groups)
        else:
            chosen = rng.random(n_groups) < opts.mlm_probability
            if opts.max_predictions is not None and sizes[chosen].sum() > opts.max_predictions:
                order = rng.permutation(np.flatnonzero(chosen))
                chosen = self._fill(order, sizes, opts.max_predictions, n_groups)
        sel = np.zeros(n, dtype=bool)
        sel[cand] = chosen[group[cand]]
        labels = np.where(sel, ids, -100).astype(np.int32)
        out = ids.copy()
        r = rng.random(n)
        to_mask = sel & (r < opts.mask_replace_prob)
        to_random = sel & ~to_mask & (r < opts.mask_replace_prob + opts.random_replace_prob)
        out[to_mask] = self.mask_id
        k = int(to_random.sum())
        if k:
            out[to_random] = self.pool[rng.integers(0, len(self.pool), k)]
        return out, labels

    def mask_rows(self, rows: list[np.ndarray], keys: np.ndarray,
                  words: list[np.ndarray | None] | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Mask many sequences; row ``i`` gives exactly ``self(rows[i], sample_generator(keys[i]), words[i])``.

        Args:
            rows: token ids per sequence (int32), special tokens included.
            keys: ``[len(rows), 2]`` generator keys (:func:`feedline._core.rng.sample_keys`).
            words: word index per token of each row (whole-word masking only).
        """
        offs = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in rows], out=offs[1:])
        flat = np.concatenate(rows).astype(np.int32, copy=False) if rows else np.zeros(0, np.int32)
        out, labels = self.mask_flat(flat, offs, keys, words)
        return [(out[a:b], labels[a:b]) for a, b in zip(offs[:-1].tolist(), offs[1:].tolist(), strict=True)]

    def mask_flat(self, flat: np.ndarray, offs: np.ndarray, keys: np.ndarray,
                  words: Sequence[np.ndarray | None] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`mask_rows` of rows laid end to end: row ``i`` is ``flat[offs[i]:offs[i + 1]]``.

        Returns ``(input_ids, labels)`` laid out the same way.
        """
        opts = self.options
        n_rows = len(offs) - 1
        if opts.whole_word_mask or opts.masking != "bernoulli" or opts.max_predictions is not None:
            ws = words if words is not None else [None] * n_rows
            parts = [self(flat[offs[i]:offs[i + 1]], sample_generator(keys[i]), ws[i]) for i in range(n_rows)]
            if not parts:
                return flat.copy(), np.full(len(flat), -100, dtype=np.int32)
            return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        # Per row, the generator's words are consumed as in __call__: one double per candidate
        # (chosen?), one per token (mask/random/keep), then 32-bit draws for random replacements.
        lens = np.diff(offs)
        cand = ~np.isin(flat, self.special)
        ccum = np.zeros(len(flat) + 1, dtype=np.int64)
        np.cumsum(cand, out=ccum[1:])
        n_cand = ccum[offs[1:]] - ccum[offs[:-1]]
        # Spare words for the 32-bit draws: about twice the expected random replacements, plus 8.
        spare = (np.ceil(lens * (opts.mlm_probability * opts.random_replace_prob)) + 4).astype(np.int64)
        counts = np.where(n_cand > 0, n_cand + lens + spare, 0)
        base = np.zeros(n_rows + 1, dtype=np.int64)
        np.cumsum(counts, out=base[1:])
        raw = philox_raw(keys, counts)
        row_of = np.repeat(np.arange(n_rows), lens)
        ci = np.flatnonzero(cand)
        crow = row_of[ci]
        u = _doubles(raw[base[crow] + (ccum[ci] - ccum[offs[crow]])])
        si = ci[u < opts.mlm_probability]  # chosen tokens
        srow = row_of[si]
        r = _doubles(raw[base[srow] + n_cand[srow] + (si - offs[srow])])
        out = flat.astype(np.int32)
        labels = np.full(len(flat), -100, dtype=np.int32)
        labels[si] = flat[si]
        to_mask = r < opts.mask_replace_prob
        out[si[to_mask]] = self.mask_id
        ri = si[~to_mask & (r < opts.mask_replace_prob + opts.random_replace_prob)]
        if len(ri):
            rrow = row_of[ri]
            q = np.arange(len(ri)) - np.searchsorted(rrow, rrow, side="left")  # the draw's index in its row
            word = raw[base[rrow] + n_cand[rrow] + lens[rrow] + q // 2]
            u32 = np.where(q % 2 == 0, word & np.uint64(0xFFFFFFFF), word >> np.uint64(32))
            # numpy's bounded 32-bit draw (Lemire): m = u32 * n, value m >> 32, redrawn while
            # (m mod 2**32) < (2**32 - n) mod n; a redraw or too few spare words: exact path.
            n_pool = len(self.pool)
            m = u32 * np.uint64(n_pool)
            redraw = (m & np.uint64(0xFFFFFFFF)) < np.uint64(((1 << 32) - n_pool) % n_pool)
            out[ri] = self.pool[(m >> np.uint64(32)).astype(np.int64)]
            for i in np.unique(rrow[redraw | (q // 2 >= spare[rrow])]).tolist():
                a, b = int(offs[i]), int(offs[i + 1])
                out[a:b], labels[a:b] = self(flat[a:b], sample_generator(keys[i]))
        return out, labels

    @staticmethod
    def _fill(order: np.ndarray, sizes: np.ndarray, budget: int, n_groups: int) -> np.ndarray:
        """Take groups in ``order`` while they fit in ``budget`` tokens (skipping ones that do not)."""
        chosen = np.zeros(n_groups, dtype=bool)
        total = 0
        for g in order:
            if total >= budget:
                break
            if total + sizes[g] <= budget:
                chosen[g] = True
                total += int(sizes[g])
        return chosen


def _doubles(words: np.ndarray) -> np.ndarray:
    """numpy's ``random()`` of raw 64-bit words: the top 53 bits over 2**53."""
    return (words >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
