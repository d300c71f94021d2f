"""Golden values: draws, masks and batches at fixed seeds, stored as constants.

Masking and every other random choice are pure functions of counter-based Philox generators
(:mod:`feedline._core.rng`), and :meth:`~feedline._tasks.masking.Masker.mask_rows` re-implements
how numpy's ``Generator`` turns raw words into doubles and bounded integers. A saved state resumes
bit-exactly only while those draws, the tokenizers' ids and our own code stay the same: a release
of numpy or tokenizers (or a change of ours) that alters them must fail here, not silently change
the batches a resumed run sees. The versions these constants were checked with are listed in
docs/architecture.md ("Determinism across releases"); if one of these tests fails after an
upgrade, the batches changed: do not just update the constants.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import pytest

import feedline
from conftest import shared
from feedline._core.rng import (
    mix64,
    mix64_array,
    permutation,
    philox_raw,
    sample_generator,
    sample_keys,
    sample_rng,
    uniform,
)
from feedline._tasks.masking import Masker, MaskingOptions
from feedline._tokenize.tokenizer import Tokenizer

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# fixtures, tokenizers and first-use imports are set up once, not once a worker.
pytestmark = pytest.mark.xdist_group("golden")

KEYS = [[8300742390234377914, 16385007620055249013], [8982006246418096033, 6038296735632975053]]


def test_counter_based_draws_are_the_stored_ones() -> None:
    assert mix64(1, 2, 3) == 5246500226706903259 and mix64(2**64 - 1, -5) == 1811755765778643834
    assert int(mix64_array(1, 1, np.array([2]), 3)[0]) == 5246500226706903259
    assert uniform(1234, 7, 42) == 0.7330243401327307
    g = sample_rng(1234, 0, (0, 3, 1024))
    assert g.random(3).tolist() == [0.41674021365761327, 0.27817304979569846, 0.7676861648120353]   # 53-bit doubles
    assert g.integers(0, 30000, 5).tolist() == [625, 7493, 9397, 26078, 11304]                     # bounded draws
    assert g.permutation(8).tolist() == [3, 2, 7, 0, 4, 5, 1, 6]
    keys = sample_keys(1234, np.array([0, 1]), np.array([[0, 3, 1024], [2, 5, 7]]), np.array([0, 1]), stream=2)
    assert keys.tolist() == KEYS
    assert philox_raw(keys, np.array([2, 3])).tolist() == [8998906399622756335, 1348637330777304625,
                                                            17497143169084526478, 5498455246359671149,
                                                            9842101120625953592]
    assert permutation(10, 5, 6) == [0, 3, 6, 7, 1, 8, 9, 4, 5, 2]


IDS = [101, 1996, 4248, 2829, 4419, 14523, 2058, 1996, 13971, 3899, 2379, 1996, 2314, 9299, 2012, 6440, 1010, 4895,
       8671, 2666, 3567, 6321, 1012, 102]
_ = -100
MASKS = {   # options -> (input_ids, labels) of IDS masked with the generator of KEYS[0]
    "bernoulli": (dict(mlm_probability=0.3),
                  [101, 1996, 103, 2829, 4419, 103, 2058, 1996, 13971, 26618, 2379, 1996, 2314, 9299, 23637, 6440, 1010,
                   4895, 8671, 103, 103, 6321, 1012, 102],
                  [_, _, 4248, _, _, 14523, _, _, _, 3899, _, _, _, _, 2012, _, _, 4895, _, 2666, 3567, 6321, _, _]),
    "exact": (dict(masking="exact", mlm_probability=0.3),
              [101, 1996, 4248, 2829, 4419, 103, 2058, 103, 103, 103, 2379, 10288, 2314, 103, 2012, 6440, 1010, 4895,
               8671, 2666, 9447, 6321, 1012, 102],
              [_, _, _, _, _, 14523, _, 1996, 13971, 3899, _, 1996, _, 9299, _, _, _, _, _, _, 3567, _, _, _]),
    "capped": (dict(mlm_probability=0.5, max_predictions=4),
               [101, 1996, 4248, 2829, 4419, 103, 2058, 1996, 103, 3899, 2379, 103, 2314, 9299, 2012, 6440, 1010, 103,
                8671, 2666, 3567, 6321, 1012, 102],
               [_, _, _, _, _, 14523, _, _, 13971, _, _, 1996, _, _, _, _, _, 4895, _, _, _, _, _, _]),
}


@pytest.fixture(scope="module")
def bert() -> Tokenizer:
    return Tokenizer.from_file(str(shared("tokenizers", "bert-base-uncased", "tokenizer.json")))


@pytest.mark.parametrize("case", sorted(MASKS))
def test_mlm_masks_are_the_stored_ones(bert: Tokenizer, case: str) -> None:
    options, want_ids, want_labels = MASKS[case]
    ids = bert.encode("The quick brown fox jumps over the lazy dog near the riverbank at dawn, unbelievably.",
                      add_special_tokens=True)
    assert ids.tolist() == IDS   # the tokenizer's ids first
    masker = Masker(MaskingOptions(**options), bert)
    got_ids, got_labels = masker(ids, sample_generator(np.array(KEYS[0], dtype=np.uint64)))
    assert (got_ids.tolist(), got_labels.tolist()) == (want_ids, want_labels)
    # the batched path reads the same raw words itself: same masks, row for row
    [(rows_ids, rows_labels)] = masker.mask_rows([ids], np.array([KEYS[0]], dtype=np.uint64))
    assert (rows_ids.tolist(), rows_labels.tolist()) == (want_ids, want_labels)


def digest(batches: list[dict[str, np.ndarray]]) -> str:
    h = hashlib.sha256()
    for b in batches:
        for name in sorted(b):
            a = np.ascontiguousarray(b[name])
            h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
            h.update(a.tobytes())
    return h.hexdigest()[:16]


# task -> (tokenizer, task and batching of the spec, digest of its first three batches)
BATCHES: dict[str, tuple[str, dict[str, Any], dict[str, Any], str]] = {
    "clm": ("gpt2", {"kind": "clm", "max_length": 64}, {"strategy": "pack", "batch_size": 4}, "e0deaa4b22ce3153"),
    "mlm": ("bert-base-uncased", {"kind": "mlm", "max_length": 64}, {"strategy": "pad", "batch_size": 4},
            "d7a0547e627d347b"),
    "mlm_wwm": ("bert-base-uncased", {"kind": "mlm", "max_length": 64, "whole_word_mask": True},
                {"strategy": "pad", "batch_size": 4}, "4fddb4249f78f3b1"),
    "span": ("t5", {"kind": "span", "max_length": 64}, {"strategy": "pad", "batch_size": 4}, "fb5c4b69c7d705f8"),
}


@pytest.mark.parametrize("task", sorted(BATCHES))
def test_batches_of_real_text_and_tokenizers_are_the_stored_ones(task: str) -> None:
    tokenizer, task_spec, batching, want = BATCHES[task]
    spec = {"sources": [{"path": str(shared("prose", "c4_demo.jsonl"))}], "seed": 11, "shuffle": {"buffer": 64},
            "tokenizer": str(shared("tokenizers", tokenizer)), "task": task_spec, "batching": batching}
    loader = feedline.Loader(spec)
    it = iter(loader)
    got = [next(it) for _ in range(3)]
    assert digest(got) == want, f"{task} batches changed: {json.dumps({k: v[0, :8].tolist() for k, v in got[0].items()})}"
