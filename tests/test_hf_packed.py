"""Packed batches straight into a Hugging Face model: the loss equals the documents run one by one.

A tiny random ``LlamaForCausalLM`` (built from a config, nothing downloaded) reads TorchLoader's
packed batches with the recipe of docs/adapters.md; the reference runs every document piece
alone. sdpa and eager; flash-attention-2's reading of the flat layout is checked with HF's own
helper (no GPU here).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from conftest import shared
from feedline.errors import FeedlineError
from heavy import lazy, needs

torch = lazy("torch")
transformers = lazy("transformers")
hf = lazy("feedline._adapters.hf")
fltorch = lazy("feedline.torch")
pytestmark = needs("torch", "transformers")

ATTN = ["sdpa", "eager"]


def _spec(attention: str = "padding", **batching: Any) -> dict[str, Any]:
    return {"sources": [{"path": str(shared("prose", "c4_demo.jsonl"))}], "tokenizer": str(shared("tokenizers", "gpt2")),
            "seed": 1, "task": {"kind": "clm", "max_length": 40},
            "batching": {"strategy": "pack", "batch_size": 4, "max_length": 96, "attention": attention, **batching}}


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      initializer_range=0.2)
    base = LlamaForCausalLM(cfg).eval()
    out = {}
    for impl in ATTN:
        m = copy.deepcopy(base)
        m.set_attn_implementation(impl)
        out[impl] = m
    return out


def _batches(n: int = 2, **kw: Any) -> list[dict[str, Any]]:
    spec = kw.pop("spec", None) or _spec()
    with fltorch.TorchLoader(spec, **kw) as loader:
        return [b for _, b in zip(range(n), loader, strict=False)]


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    """Two packed batches as the batcher made them (``packed="keep"``)."""
    return _batches(2, packed="keep")


@pytest.fixture(scope="module")
def reference(models: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    return {impl: [_separate_loss(models[impl], b) for b in rows] for impl in ATTN}


def _hf_loss(model: Any, b: dict[str, Any]) -> float:
    """The recipe of docs/adapters.md."""
    with torch.no_grad():
        out = model(input_ids=b["input_ids"], labels=b["labels"], position_ids=b["position_ids"],
                    attention_mask=b.get("attention_mask"), use_cache=False)
    return float(out.loss)


def _separate_loss(model: Any, b: dict[str, Any]) -> float:
    """Mean next-token loss with every document piece run alone (HF's shift, -100 ignored)."""
    total, count = 0.0, 0
    ids, labels = b["input_ids"], b["labels"]
    for r, lens in enumerate(b["seq_lens"]):
        at = 0
        for n in lens[lens > 0].tolist():
            with torch.no_grad():
                logits = model(input_ids=ids[r:r + 1, at:at + n], use_cache=False).logits[0, :-1]
            target = labels[r, at + 1:at + n]
            keep = target != -100
            total += float(torch.nn.functional.cross_entropy(logits[keep], target[keep], reduction="sum"))
            count += int(keep.sum())
            at += n
    return total / count


def _check_real_packing(b: dict[str, Any]) -> None:
    docs = (b["seq_lens"] > 0).sum(dim=1)
    assert int(docs.max()) >= 3  # rows really hold several documents


@pytest.mark.parametrize("impl", ATTN)
@pytest.mark.slow
def test_default_torch_batches_give_the_per_document_loss(models: dict[str, Any], rows: list[dict[str, Any]],
                                                          reference: dict[str, list[float]], impl: str) -> None:
    got = _batches(2)  # TorchLoader's default path
    for b, raw, want in zip(got, rows, reference[impl], strict=True):
        _check_real_packing(b)
        assert torch.equal(b["input_ids"], raw["input_ids"])
        assert "attention_mask" not in b  # no 2-D mask: HF builds the block-causal mask from position_ids
        assert abs(_hf_loss(models[impl], b) - want) / want < 1e-4


@pytest.mark.parametrize("impl", ATTN)
def test_the_two_d_mask_mixes_documents(models: dict[str, Any], rows: list[dict[str, Any]],
                                        reference: dict[str, list[float]], impl: str) -> None:
    """The issue's failure: the loader's 2-D 1/0 mask turns HF's packed detection off."""
    assert rows[0]["attention_mask"].dim() == 2
    want = reference[impl][0]
    assert abs(_hf_loss(models[impl], rows[0]) - want) / want > 1e-3


@pytest.mark.parametrize("impl", ATTN)
@pytest.mark.slow
def test_four_d_additive_mask(models: dict[str, Any], rows: list[dict[str, Any]],
                              reference: dict[str, list[float]], impl: str) -> None:
    for raw, want in zip(rows, reference[impl], strict=True):
        b = hf.PackedLayout("mask4d")(raw)
        assert b["attention_mask"].shape == (4, 1, 96, 96) and b["attention_mask"].dtype == torch.float32
        assert abs(_hf_loss(models[impl], b) - want) / want < 1e-4


@pytest.mark.slow
def test_a_boolean_block_mask_becomes_additive_by_default(models: dict[str, Any]) -> None:
    """A [B, T, T] bool mask is what eager misreads; the default layout hands it over as 4-D additive."""
    b = _batches(1, spec=_spec("block_causal"))[0]
    assert b["attention_mask"].shape == (4, 1, 96, 96)
    for impl in ATTN:
        want = _separate_loss(models[impl], b)
        assert abs(_hf_loss(models[impl], b) - want) / want < 1e-4


@pytest.mark.parametrize("impl", ATTN)
@pytest.mark.slow
def test_flat_layout(models: dict[str, Any], rows: list[dict[str, Any]], reference: dict[str, list[float]],
                     impl: str) -> None:
    for raw, want in zip(rows, reference[impl], strict=True):
        b = hf.PackedLayout("flat")(raw)
        assert b["input_ids"].shape == (1, 4 * 96) and "attention_mask" not in b
        assert abs(_hf_loss(models[impl], b) - want) / want < 1e-4


def test_flat_layout_is_what_flash_attention_2_reads_as_documents(rows: list[dict[str, Any]]) -> None:
    """HF's FA2 path takes varlen offsets from flat position_ids; they must be feedline's documents
    (each padding token its own segment, which carries no loss)."""
    from transformers.modeling_flash_attention_utils import _is_packed_sequence, prepare_fa_kwargs_from_position_ids

    b = hf.PackedLayout("flat")(rows[0])
    assert _is_packed_sequence(b["position_ids"], 1)
    (cu, _), _ = prepare_fa_kwargs_from_position_ids(b["position_ids"])
    want = [0]
    for lens in rows[0]["seq_lens"]:
        row_start = want[-1]
        for n in lens[lens > 0].tolist():
            want.append(want[-1] + n)
        want.extend(range(want[-1] + 1, row_start + 96 + 1))  # padding: one-token segments
    assert cu.tolist() == want


def test_continuing_positions_are_refused_without_a_mask() -> None:
    spec = _spec(strategy="concat", reset_positions=False)
    with pytest.raises(FeedlineError, match="reset_positions"):
        _batches(1, spec=spec)
    b = _batches(1, spec=spec, packed="mask4d")[0]
    assert b["attention_mask"].dim() == 4


def test_padded_batches_pass_unchanged() -> None:
    spec = {**_spec(), "batching": {"strategy": "pad", "batch_size": 4}}
    b = _batches(1, spec=spec)[0]
    assert b["attention_mask"].dim() == 2 and "seq_lens" not in b
    assert np.array_equal(b["attention_mask"].numpy().sum(1) > 0, np.ones(4, bool))
