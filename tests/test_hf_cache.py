"""Packed batches into a Hugging Face model with its cache on: one warning line naming the fix.

A tiny random GPT-2 (built from a config, nothing downloaded; ``use_cache=True`` as GPT-2's
default) reads TorchLoader's packed batches (GPT-2 tokenizer, C4 documents). With the cache on
the documents of a row attend to each other (the loss differs from ``use_cache=False``'s); the
adapter says so once, for a model passed as ``model=`` and for the HF ``Trainer``'s own model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import shared
from heavy import lazy, needs

torch = lazy("torch")
transformers = lazy("transformers")
fltorch = lazy("feedline.torch")
pytestmark = needs("torch", "transformers")

SPEC = {"sources": [{"path": str(shared("prose", "c4_demo.jsonl"))}], "tokenizer": str(shared("tokenizers", "gpt2")),
        "seed": 1, "task": {"kind": "clm", "max_length": 40}, "epochs": None,
        "batching": {"strategy": "pack", "batch_size": 4, "max_length": 96}}
PAD_SPEC = {**SPEC, "batching": {"strategy": "pad", "batch_size": 4}}


def _gpt2(**config: Any) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=128, n_embd=32, n_layer=2, n_head=2,
                                      bos_token_id=0, eos_token_id=0, **config))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "use_cache" in r.getMessage()]


def _run(model: Any, spec: dict[str, Any], n: int = 3, **call: Any) -> list[float]:
    losses = []
    with fltorch.TorchLoader(spec, model=model) as loader:
        for _, b in zip(range(n), loader, strict=False):
            with torch.no_grad():
                losses.append(float(model(input_ids=b["input_ids"], labels=b["labels"], position_ids=b.get("position_ids"),
                                          attention_mask=b.get("attention_mask"), **call).loss))
    return losses


def test_a_model_with_its_cache_on_is_warned_once_and_really_mixes_documents(caplog: pytest.LogCaptureFixture) -> None:
    model = _gpt2().eval()
    assert model.config.use_cache
    with caplog.at_level("WARNING", logger="feedline.torch"):
        cached = _run(model, SPEC)
        _run(model, SPEC)   # a second loader on the same model: still one line
    told = _warnings(caplog)
    assert len(told) == 1 and "GPT2LMHeadModel" in told[0] and "use_cache=False" in told[0], told
    assert "\n" not in told[0]
    assert cached != _run(model, SPEC, use_cache=False)   # what it warns of: the cache changes the loss


@pytest.mark.parametrize("how", ["call", "config", "padded"])
def test_no_warning_without_the_cache_or_without_packing(how: str, caplog: pytest.LogCaptureFixture) -> None:
    model = _gpt2(use_cache=how != "config").eval()
    with caplog.at_level("WARNING", logger="feedline.torch"):
        _run(model, PAD_SPEC if how == "padded" else SPEC, **({"use_cache": False} if how == "call" else {}))
    assert _warnings(caplog) == []


@pytest.mark.slow
@pytest.mark.parametrize("use_cache", [True, False])
def test_the_hf_trainers_model_is_found_and_warned_about(tmp_path: Path, use_cache: bool,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The recipe of docs/recipes.md, without ``model=``: the Trainer calls ``model(**batch)``, so the config
    decides, which transformers 5's Trainer sets from ``TrainingArguments.use_cache`` (default ``False``)."""
    pytest.importorskip("accelerate", reason="the HF Trainer needs accelerate")
    from transformers import Trainer, TrainingArguments

    class FeedlineTrainer(Trainer):
        def get_train_dataloader(self) -> Any:
            return self.train_dataset.dataloader()

    loader = fltorch.TorchLoader(SPEC)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=1,
                             learning_rate=1e-3, save_strategy="no", report_to=[], use_cpu=True,
                             dataloader_pin_memory=False, disable_tqdm=True)
    if hasattr(args, "use_cache"):   # transformers 5: the Trainer overwrites the config's with it
        args.use_cache = use_cache
    with caplog.at_level("WARNING", logger="feedline.torch"):
        FeedlineTrainer(model=_gpt2(use_cache=use_cache), args=args, train_dataset=loader,
                        data_collator=fltorch.passthrough_collate).train()
    loader.close()
    assert len(_warnings(caplog)) == (1 if use_cache else 0), _warnings(caplog)
