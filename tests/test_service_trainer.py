"""Two ranks in torchrun's environment: in-process slices in lockstep (docs/adapters.md, "torchrun /
DDP"), then the HF Trainer recipe of docs/adapters.md against one `feedline serve`.

The ranks are forked by one launcher after it imported torch, transformers and feedline, with the
variables torchrun gives each rank (RANK, WORLD_SIZE, MASTER_ADDR, ...): a torchrun launch starts an
interpreter for itself and one per rank, each importing torch (and the ranks transformers), ~9 CPU-s
more. feedline sees only the environment and the process group; torchrun itself is run by
test_examples.py (the BERT example) and test_recipes.py (the page's serve + torchrun recipe)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heavy import needs
from service_helpers import make_spec, start_server, stop, tokenizer_path, write_spec

pytestmark = [needs("torch", "transformers"), needs("accelerate", reason="the HF Trainer needs accelerate")]

LAUNCHER = textwrap.dedent("""
    import json, os, signal, socket, sys, time
    import numpy as np
    import torch
    import torch.distributed as dist
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    import feedline
    from feedline.torch import TorchLoader, passthrough_collate

    torch.set_num_threads(1)
    address, out, vocab, spec_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]


    def rank_main():
        rank = int(os.environ["RANK"])

        # 1. in-process: each rank runs the pipeline and keeps its slice, in lockstep
        dist.init_process_group("gloo")                   # the Trainer below takes this group as it is
        loader = TorchLoader(spec_path, int64=False)      # rank and world size from torchrun's environment
        assert (loader.rank, loader.world_size) == (dist.get_rank(), dist.get_world_size())
        batches = []
        for batch in loader:
            flag = torch.ones(1)
            dist.all_reduce(flag)                      # a DDP-style collective every step: a rank that
            batches.append({k: v.numpy() for k, v in batch.items()})   # stopped early would hang the other
        steps = torch.tensor([len(batches)])
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)
        np.savez(f"{out}/slices{rank}.npz", **{f"{i}:{k}": v for i, b in enumerate(batches) for k, v in b.items()})
        with open(f"{out}/slices{rank}.json", "w") as f:
            json.dump({"steps": len(batches), "max_steps": int(steps), "state_step": loader.state_dict()["step"]}, f)

        # 2. the HF Trainer against the service: the plain recipe refused, the documented fix trained

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
        # The rank ends here without unwinding. The Trainers' DDP reducers hold the gloo group; freeing the last of
        # them (this function's locals at its return, or the interpreter's exit) runs the group's destructor with the
        # GIL held, and where gloo's thread is then freeing a finished all_gather's tensors it waits for the GIL: a
        # deadlock inside torch (py-spy: ~ProcessGroupGloo under the Reducer's dealloc, gloo's runLoop in
        # gil_scoped_acquire; the test's timeout failed it in two timed runs, the second after a gc.collect() here).
        dist.barrier()   # neither rank leaves while the other may still need it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


    # torchrun's part: a rendezvous port, then each rank in its own process with torchrun's variables
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = {}
    for rank in range(2):
        pid = os.fork()
        if pid == 0:   # the rank: it exits as a torchrun rank does (its exception, a traceback and status 1)
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(rank),
                              WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", ROLE_WORLD_SIZE="2",
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            rank_main()
            sys.exit(0)
        ranks[pid] = rank
    failed = []
    while ranks:
        pid, status = os.wait()
        if os.waitstatus_to_exitcode(status) != 0:
            failed.append(ranks[pid])
            for other in ranks:        # as torchrun does: a failed rank stops the others (they would hang)
                if other != pid:
                    os.kill(other, signal.SIGKILL)
        del ranks[pid]
    sys.exit(f"ranks {failed} failed" if failed else 0)
""")


def load_rank(out: Path, rank: int) -> tuple[dict[str, Any], list[dict[str, np.ndarray]]]:
    info = json.loads((out / f"slices{rank}.json").read_text())
    arrays = np.load(out / f"slices{rank}.npz")
    batches: list[dict[str, np.ndarray]] = [{} for _ in range(info["steps"])]
    for name in arrays.files:
        i, field = name.split(":")
        batches[int(i)][field] = arrays[name]
    return info, batches


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_torchrun_ranks_get_their_slices_in_lockstep_and_the_plain_trainer_fails_fast_where_the_fix_trains(
        tmp_path: Path, corpus: str, small_tokenizer: str) -> None:
    import feedline
    from feedline.testing import assert_batches_equal, collect

    local = {"sources": [{"path": corpus}], "tokenizer": small_tokenizer, "seed": 1, "shuffle": {"buffer": 20},
             "task": {"kind": "clm", "max_length": 40}, "batching": {"strategy": "pad", "batch_size": 6}}
    local_path = write_spec(tmp_path / "local.json", local)
    tok = tokenizer_path(tmp_path)
    spec = make_spec(tmp_path, tok, docs=60, batch_size=4)
    proc, address = start_server(write_spec(tmp_path / "spec.json", spec), "--heartbeat", "0.2", "--timeout", "3")
    try:
        (tmp_path / "launch.py").write_text(LAUNCHER)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(key, None)
        vocab = feedline.load_tokenizer(tok).vocab_size
        cmd = [sys.executable, str(tmp_path / "launch.py"), address, str(tmp_path), str(vocab), local_path]
        launch = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)   # its ranks too are in its process group
        try:
            _, err = launch.communicate(timeout=200)
        finally:
            if launch.poll() is None or launch.returncode != 0:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(launch.pid, signal.SIGKILL)
                launch.wait()
        assert launch.returncode == 0, err[-3000:]
    finally:
        stop(proc)
    # 1. in-process: each rank's batches are its slice of the global ones, and both ranks stopped together
    glob = collect(feedline.Loader(local))
    infos, slices = [], []
    for rank in range(2):
        info, got = load_rank(tmp_path, rank)
        infos.append(info)
        slices.append(got)
        assert_batches_equal(collect(feedline.Loader(local, rank=rank, world_size=2)), got, where=f"rank {rank}")
    assert infos[0]["steps"] == infos[1]["steps"] == infos[0]["max_steps"] == len(glob) > 3
    assert infos[0]["state_step"] == infos[1]["state_step"] == len(glob)
    for g, a, b in zip(glob, *slices, strict=True):  # together the two slices are exactly each global batch's rows
        rows = sorted(map(tuple, np.concatenate([a["input_ids"], b["input_ids"]]).tolist()))
        assert rows == sorted(map(tuple, g["input_ids"].tolist()))
    # 2. the Trainer through the service
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        print(f"\nrank {rank}: plain Trainer refused after {result['plain_s']:.1f}s: {result['plain'][:90]}...")
        assert result["world_size"] == 2
        assert "get_train_dataloader" in result["plain"] and "DataLoaderDispatcher" in result["plain"]
        assert result["plain_s"] < 30
        assert result["fixed_steps"] == 4 and result["state_step"] == 4
