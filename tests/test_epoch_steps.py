"""``feedline.epoch_steps``: the exact global steps of an epoch, equal to what a real loader yields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import feedline
from conftest import shared
from feedline._cli.__main__ import main
from feedline.errors import SpecError

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# fixtures, tokenizers and first-use imports are set up once, not once a worker.
pytestmark = pytest.mark.xdist_group("epoch_steps")


def _spec(strategy: str, tok: str, **over: Any) -> dict[str, Any]:
    batching = {"strategy": strategy, "batch_size": 8, **over.pop("batching", {})}
    return {"sources": [{"path": str(shared("prose", "c4_demo.jsonl"))}], "tokenizer": tok, "seed": 5,
            "shuffle": {"buffer": 64}, "task": {"kind": "clm", "max_length": 128}, "batching": batching, **over}


def _batches(spec: dict[str, Any], world_size: int = 1) -> int:
    with feedline.Loader(spec, rank=world_size - 1, world_size=world_size) as loader:
        return sum(1 for _ in loader)


@pytest.mark.parametrize(("strategy", "remainder"), [("pad", "drop"), ("pad", "keep"), ("pack", "drop"), ("pack", "pad")])
@pytest.mark.slow
def test_one_epoch_counts_what_a_loader_yields(gpt2_path: str, strategy: str, remainder: str) -> None:
    spec = _spec(strategy, gpt2_path, batching={"remainder": remainder})
    steps = feedline.epoch_steps(spec)
    assert steps == _batches(spec) == _batches(spec, world_size=2)  # global steps: the same for every world size
    assert steps > 30  # 300 documents, long ones split (clm overflow) or packed: neither is the record count


def test_several_epochs_run_on_without_a_break(tmp_path: Path, gpt2_path: str) -> None:
    docs = tmp_path / "ten.jsonl"
    docs.write_text("".join(json.dumps({"text": f"short document {i}"}) + "\n" for i in range(10)))
    spec = {"sources": [str(docs)], "tokenizer": gpt2_path, "task": {"kind": "clm", "max_length": 16},
            "batching": {"strategy": "pad", "batch_size": 4}, "epochs": 3}
    assert feedline.epoch_steps(spec) == 2  # 10 rows: 2 steps, the short one dropped
    assert feedline.epoch_steps(spec, epochs=None) == _batches(spec) == 7  # 30 rows: not 3 x 2
    with pytest.raises(SpecError, match=r"epochs: null makes an endless stream.*epochs=N"):
        feedline.epoch_steps({**spec, "epochs": None}, epochs=None)


@pytest.mark.slow
def test_partitions_count_as_they_compose(gpt2_path: str) -> None:
    spec = _spec("pack", gpt2_path, partitions=2, parallel="threads")
    assert feedline.epoch_steps(spec) == _batches(spec)


@pytest.mark.slow
def test_len_of_a_loader_points_to_epoch_steps(gpt2_path: str) -> None:
    with feedline.Loader(_spec("pad", gpt2_path)) as loader:
        with pytest.raises(TypeError, match=r"InProcessLoader has no len\(\).*feedline\.epoch_steps\(spec\)"):
            len(loader)
        assert loader  # truth does not ask for a length
        assert len(list(zip(range(3), loader, strict=False))) == 3


@pytest.mark.slow
def test_scan_steps_prints_the_count(gpt2_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "spec.json"
    spec = _spec("pad", gpt2_path, epochs=2)
    path.write_text(json.dumps(spec))
    assert main(["scan", str(path), "--steps", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == feedline.epoch_steps(spec) and out["run_steps"] == _batches(spec) and out["run_epochs"] == 2
    assert main(["scan", str(path), "--steps"]) == 0
    assert f"global steps: {out['steps']} per epoch, {out['run_steps']} in all 2 epochs" in capsys.readouterr().out


@pytest.mark.slow
def test_a_one_cycle_schedule_sized_by_epoch_steps_ends_with_the_epoch(gpt2_path: str) -> None:
    torch = pytest.importorskip("torch")
    from feedline.torch import TorchLoader

    spec = _spec("pack", gpt2_path)
    total = feedline.epoch_steps(spec)
    weight = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([weight], lr=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=total)  # raises if stepped past total
    seen = 0
    for batch in TorchLoader(spec):
        (weight * batch["input_ids"].float().mean()).backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        seen += 1
    assert seen == total and sched.last_epoch == total
    with pytest.raises(ValueError, match="Tried to step"):
        sched.step()  # one step more than the epoch had


def test_len_of_a_torch_loader_and_its_dataloader_points_to_epoch_steps(gpt2_path: str) -> None:
    torch = pytest.importorskip("torch")
    from feedline.torch import TorchLoader

    loader = TorchLoader(_spec("pad", gpt2_path))
    for sized in (loader, torch.utils.data.DataLoader(loader, batch_size=None), loader.dataloader()):
        with pytest.raises(TypeError, match=r"TorchLoader has no len\(\).*feedline\.epoch_steps\(spec\)"):
            len(sized)
    assert loader and next(iter(loader))["input_ids"].shape[0] == 8
