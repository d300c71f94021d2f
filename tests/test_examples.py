"""Every example in examples/ runs in CI-sized form (tiny models, a few steps).

Examples run in this process through ``runpy`` (saving an interpreter and a torch import each);
the processes an example starts itself (the service, torchrun's ranks) are real. An example whose
optional dependency is missing is skipped with the reason; nothing else is.
"""

from __future__ import annotations

import importlib.util
import json
import runpy
import sys
from pathlib import Path

import pytest

import heavy

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

pytestmark = heavy.needs("torch")


def needs(*modules: str) -> None:
    for m in modules:
        if importlib.util.find_spec(m) is None:
            pytest.skip(f"example needs {m}, which is not installed")


@pytest.fixture
def run_example(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    import torch

    monkeypatch.syspath_prepend(str(EXAMPLES))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    def run(name: str, *args: str) -> list[dict[str, object]]:
        monkeypatch.setattr(sys, "argv", [name, *args])
        runpy.run_path(str(EXAMPLES / name), run_name="__main__")
        out = capsys.readouterr().out
        return [json.loads(line) for line in out.splitlines() if line.startswith('{"')]

    yield run
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_gpt_pretrain_packs_shards_and_resumes(run_example, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    needs("zstandard")
    small = ["--work", str(tmp_path), "--seq-len", "64", "--batch-size", "4", "--d-model", "32", "--layers", "1",
             "--checkpoint", str(tmp_path / "ckpt.pt"), "--save-every", "10", "--pack-window", "16"]
    first = run_example("gpt_pretrain.py", *small, "--steps", "20", "--lr", "1e-2")
    assert first[-1]["step"] == 20 and list(tmp_path.glob("shards/*.jsonl.zst"))
    assert first[-1]["loss"] < first[0]["loss"] - 0.5, first  # its point: the loss falls (step 1 vs 2-20)
    resumed = run_example("gpt_pretrain.py", *small, "--steps", "22")
    assert resumed[0]["step"] == 22  # continued from the checkpoint's loader state at step 20


@pytest.mark.slow
def test_t5_span(run_example) -> None:  # type: ignore[no-untyped-def]
    needs("transformers")
    out = run_example("t5_span.py", "--steps", "20", "--seq-len", "32", "--batch-size", "4", "--d-model", "32", "--layers", "1",
                      "--lr", "1e-2")
    assert out[-1]["step"] == 20 and out[-1]["inputs"] == [4, 32]
    assert out[-1]["loss"] < out[0]["loss"] - 0.5, out


@pytest.mark.slow
def test_goemotions_trainer_learns_then_batch_inference(run_example, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    needs("transformers", "accelerate")
    # 200 steps: the fewest that learn; 32 tokens a text (GoEmotions' are short): a fifth less CPU, and still dev
    # micro-F1 0.353 against the baseline's 0.270 (0.398 at 48; with a zero classifier bias it stays at the baseline)
    out = run_example("goemotions_trainer.py", "--work", str(tmp_path / "goe"), "--steps", "200", "--layers", "1",
                      "--seq-len", "32", "--eval-batches", "10")
    assert out[-1]["steps"] == 200
    assert 0.0 < out[-1]["baseline_micro_f1"] < 1.0  # the most frequent label alone, printed beside the F1
    # its point: the model learned more than the label priors (it stayed at the baseline with a zero classifier bias)
    assert out[-1]["dev_micro_f1"] > out[-1]["baseline_micro_f1"] + 0.05, out[-1]
    assert out[-1]["labels_predicted"] >= 3, out[-1]
    state = json.loads((tmp_path / "goe" / "model" / "loader_state.json").read_text())
    assert state["step"] == 200  # exact: the pass-through DataLoader does not read ahead
    preds = tmp_path / "preds.jsonl"
    res = run_example("batch_infer.py", "--model", str(tmp_path / "goe" / "model"), "--work", str(tmp_path / "inf"),
                      "--out", str(preds), "--limit", "2", "--batch-size", "64")
    rows = [json.loads(x) for x in preds.read_text().splitlines()]
    assert res[-1]["records"] == len(rows) == 128
    assert [r["key"] for r in rows] == sorted(r["key"] for r in rows)  # source order, joined by key
    assert all(r["text"] and isinstance(r["labels"], list) and r["labels"] for r in rows)  # never an empty prediction
    assert len({tuple(r["labels"]) for r in rows}) >= 2, rows[:5]  # not one label for every record


@pytest.mark.slow
def test_chat_sft(run_example, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    needs("jinja2")
    out = run_example("chat_sft.py", "--work", str(tmp_path), "--steps", "20", "--seq-len", "128", "--batch-size", "2",
                      "--d-model", "32", "--layers", "1", "--lr", "1e-2")
    assert out[-1]["step"] == 20 and 0 < out[-1]["assistant_share"] < 1
    assert out[-1]["loss"] < out[0]["loss"] - 0.5, out  # the loss on assistant tokens falls


@pytest.mark.slow
def test_plugin_task_runs_without_arguments(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr(sys, "argv", ["plugin_task.py"])
    runpy.run_path(str(EXAMPLES / "plugin_task.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "input_ids" in out and "labels" in out  # one batch of the plug-in task, shapes and dtypes
    shuffled, original = (line.split(": ", 1)[1].split() for line in out.splitlines()[-2:])
    assert sorted(shuffled) == sorted(original)  # the same words, in windows shuffled
    monkeypatch.setattr(sys, "argv", ["plugin_task.py", "only-one-argument"])
    with pytest.raises(SystemExit, match="usage: python examples/plugin_task.py"):
        runpy.run_path(str(EXAMPLES / "plugin_task.py"), run_name="__main__")


def test_gpu_check_without_cuda_says_what_to_pass(run_example) -> None:  # type: ignore[no-untyped-def]
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit, match="no CUDA device.*--device cpu"):
        run_example("gpu_check.py")


@pytest.mark.slow
@pytest.mark.xdist_group("jax")  # on the worker that imports jax for every JAX test (test_jax_loader.py)
def test_jax_flax(run_example, corpus: str) -> None:  # type: ignore[no-untyped-def]
    needs("jax", "flax", "optax")
    out = run_example("jax_flax.py", "--data", corpus, "--steps", "20", "--seq-len", "32", "--batch-size", "4", "--d-model", "32",
                      "--layers", "1", "--lr", "1e-2")
    assert out[-1]["step"] == 20
    assert out[-1]["loss"] < out[0]["loss"] - 0.5, out


def service_available() -> None:
    needs("zmq", "transformers")
    if importlib.util.find_spec("feedline._service.launch") is None:
        pytest.skip("the loader service (feedline.service) is not available yet")


def test_gpu_check_smoke_on_cpu(run_example, corpus: str) -> None:  # type: ignore[no-untyped-def]
    """The GPU check's measuring loop on the CPU, loader in-process (the BERT example covers the service)."""
    needs("transformers")
    out = run_example("gpu_check.py", "--data", corpus, "--device", "cpu", "--in-process", "--hidden", "32", "--layers", "1",
                      "--steps", "3", "--warmup", "1", "--batch-size", "4", "--seq-len", "32")
    report = out[-1]
    assert report["placement"] == "in-process" and report["steps"] == 2 and 0 <= report["data_wait_share"] <= 1
    assert report["tokens_per_s"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bert_mlm_sop_through_the_service_on_two_torchrun_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    """The launcher part in this process (it starts the service and torchrun, whose ranks print to the
    file descriptors that ``capfd`` reads): an interpreter and its imports (~1 CPU-s) spared."""
    service_available()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr(sys, "argv", ["bert_mlm_sop_service.py", "--steps", "3", "--seq-len", "64", "--batch-size", "4",
                                      "--hidden", "32", "--layers", "1"])
    try:
        runpy.run_path(str(EXAMPLES / "bert_mlm_sop_service.py"), run_name="__main__")
    except SystemExit as e:  # the example exits with torchrun's status where it is not 0
        assert not e.code, capfd.readouterr().err[-3000:]
    out = capfd.readouterr().out
    assert "done: 3 steps on 2 ranks; loader state at step 3" in out, out[-3000:]
    lines = [json.loads(x) for x in out.splitlines() if x.startswith('{"')]
    assert lines[-1]["rows_per_rank"] == 2


@pytest.mark.parametrize("name", ["batch_infer.py", "chat_sft.py", "goemotions_trainer.py", "gpt_pretrain.py"])
def test_help_shows_the_work_folder_default(name: str, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import re

    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    assert done.value.code == 0
    default = re.search(r'"--work", default="([^"]+)"', (EXAMPLES / name).read_text(encoding="utf-8"))
    assert default is not None
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert re.search(rf"--work WORK .*\(default: {re.escape(default.group(1))}\)", help_text), help_text
