"""The HF Trainer recipe of docs/adapters.md under torchrun with two ranks against one `feedline serve`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from service_helpers import make_spec, start_server, stop, tokenizer_path, write_spec

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="the HF Trainer needs accelerate")

WORKER = textwrap.dedent("""
    import json, os, sys, time
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    import feedline
    from feedline.torch import TorchLoader, passthrough_collate

    torch.set_num_threads(1)
    address, out, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rank = int(os.environ["RANK"])

    class FeedlineTrainer(Trainer):
        def get_train_dataloader(self):
            return self.train_dataset.dataloader()

    def trainer(cls, loader, steps):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=48, n_embd=16, n_layer=1, n_head=2))
        args = TrainingArguments(output_dir=os.path.join(out, f"run{rank}"), max_steps=steps,
                                 per_device_train_batch_size=1, save_strategy="no", report_to=[], use_cpu=True,
                                 dataloader_pin_memory=False, disable_tqdm=True, logging_steps=1)
        return cls(model=model, args=args, train_dataset=loader, data_collator=passthrough_collate)

    loader = TorchLoader(address, prefetch=1)
    result = {"rank": rank, "world_size": loader.world_size}
    start = time.monotonic()
    try:
        trainer(Trainer, loader, 4).train()          # the plain recipe
        result["plain"] = "trained"
    except feedline.FeedlineError as e:
        result["plain"] = str(e)
    result["plain_s"] = time.monotonic() - start
    t = trainer(FeedlineTrainer, loader, 4)          # the documented fix, same loader
    t.train()
    result["fixed_steps"] = t.state.global_step
    result["state_step"] = loader.state_dict()["step"]
    loader.close()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
""")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_plain_trainer_under_torchrun_fails_fast_and_the_fix_trains(tmp_path: Path) -> None:
    import feedline

    tok = tokenizer_path(tmp_path)
    spec = make_spec(tmp_path, tok, docs=60, batch_size=4)
    proc, address = start_server(write_spec(tmp_path / "spec.json", spec), "--heartbeat", "0.2", "--timeout", "3")
    try:
        (tmp_path / "worker.py").write_text(WORKER)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(key, None)
        vocab = feedline.load_tokenizer(tok).vocab_size
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(tmp_path / "worker.py"), address, str(tmp_path), str(vocab)]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200)
        assert run.returncode == 0, run.stderr[-3000:]
    finally:
        stop(proc)
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        print(f"\nrank {rank}: plain Trainer refused after {result['plain_s']:.1f}s: {result['plain'][:90]}...")
        assert result["world_size"] == 2
        assert "get_train_dataloader" in result["plain"] and "DataLoaderDispatcher" in result["plain"]
        assert result["plain_s"] < 30
        assert result["fixed_steps"] == 4 and result["state_step"] == 4
