"""Training through TorchLoader: loss falls, the HF Trainer runs (torchrun: test_service_trainer.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import feedline
from conftest import SHARED_DATA
from heavy import lazy, needs

torch = lazy("torch")
fltorch = lazy("feedline.torch")
pytestmark = needs("torch")


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Any:
    """Tiny models run fastest single-threaded; on a busy 2-core machine, extra threads only spin."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def text_source(corpus: str) -> tuple[dict[str, Any], str]:
    """Real prose when ../shared/data is present, else the generated corpus (so the test always runs)."""
    real = SHARED_DATA / "prose" / "c4_demo.jsonl"
    if real.exists():
        return {"path": str(real)}, "real C4 documents"
    return {"path": corpus}, "generated corpus"


@pytest.mark.slow
def test_tiny_model_loss_falls_over_100_steps(corpus: str, small_tokenizer: str) -> None:
    from feedline._demo.models import TinyGPT

    source, what = text_source(corpus)
    spec = {"sources": [source], "tokenizer": small_tokenizer, "seed": 0, "epochs": None, "shuffle": {"buffer": 64},
            "task": {"kind": "clm", "max_length": 64}, "batching": {"strategy": "pad", "batch_size": 8}}
    torch.manual_seed(0)
    loader = fltorch.TorchLoader(spec)
    model = TinyGPT(feedline.load_tokenizer(small_tokenizer).vocab_size, d=64, layers=1, heads=2, ff=128, max_len=64)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for batch in loader:
        loss = model(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if len(losses) == 100:
            break
    loader.close()
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    assert len(losses) == 100
    assert last < first - 0.5, f"loss on {what} did not fall: {first:.3f} -> {last:.3f}"


# torchrun: the in-process slices of two ranks in lockstep are checked in test_service_trainer.py, in the one
# torchrun launch that also runs the HF Trainer against the service (each launch: ~7 CPU-s of interpreters and imports)


@pytest.mark.parametrize("dataloader", ["trainer", "passthrough"])
@pytest.mark.slow
def test_hf_trainer_runs_10_steps_from_torchloader(tmp_path: Path, corpus: str, small_tokenizer: str, dataloader: str) -> None:
    """As given (the Trainer's own DataLoader) and through ``get_train_dataloader`` returning ``loader.dataloader()``."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="the HF Trainer needs accelerate")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class FeedlineTrainer(Trainer):
        def get_train_dataloader(self) -> Any:
            return self.train_dataset.dataloader()

    spec = {"sources": [{"path": corpus}], "tokenizer": small_tokenizer, "seed": 2, "epochs": None,
            "task": {"kind": "clm", "max_length": 32}, "batching": {"strategy": "pad", "batch_size": 4}}
    vocab = feedline.load_tokenizer(small_tokenizer).vocab_size
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=32, n_embd=32, n_layer=1, n_head=2))
    loader = fltorch.TorchLoader(spec)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=10, per_device_train_batch_size=1,
                             learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[],
                             use_cpu=True, dataloader_pin_memory=False, disable_tqdm=True)
    cls = Trainer if dataloader == "trainer" else FeedlineTrainer
    trainer = cls(model=model, args=args, train_dataset=loader, data_collator=fltorch.passthrough_collate)
    result = trainer.train()
    loader.close()
    assert trainer.state.global_step == 10
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 10 and all(np.isfinite(losses))
    assert np.isfinite(result.training_loss)
    # accelerate's DataLoader wrapper looks one batch ahead; the pass-through DataLoader does not,
    # so its state is exactly the 10 batches trained on (what a checkpoint callback should save)
    assert loader.step == (11 if dataloader == "trainer" else 10)
