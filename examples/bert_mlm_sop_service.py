"""BERT pre-training (MLM + sentence-order prediction) from a Wikipedia dump, through the loader service, on two torchrun ranks.

    python examples/bert_mlm_sop_service.py                       # small: 60 steps, ~1-2 minutes
    python examples/bert_mlm_sop_service.py --data enwiki-latest-pages-articles.xml.bz2 \\
        --tokenizer bert-base-uncased --seq-len 512 --batch-size 256 --hidden 768 --layers 12 \\
        --nproc 8 --steps 100000 --backend nccl

One process runs ``feedline serve`` (reading the dump, segmenting sentences, building SOP pairs
and masks); ``torchrun`` starts ``--nproc`` trainer ranks that each receive their slice of every
global batch over ZeroMQ (``TorchLoader(address)``: rank and world size from torchrun's
environment) and train a ``BertForPreTraining`` under DDP, with ``sentence_order_label`` fed to
the two-way sequence head. This is Sabertooth/ALBERT-style SOP pre-training without a
preprocessing pass. Without ``--data``, the 5-page Wikipedia export in ``../shared/data`` is
used (or the demo corpus when that is absent), repeated until ``--steps``.

Measured on the shared 2-core machine at load ~5 with ``--steps 100``: 2:45 wall, 164
CPU-seconds over the server, torchrun and two ranks (113 user + 51 sys), peak RSS 1.17 GB (the
largest process); the MLM+SOP loss (mean since the previous line) falls from 11.05 (step 1) to
7.59 (steps 51-60, reached 96 s into training) and then levels off (7.38 at 91-100): hence the
default of 60 steps.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from _data import HelpFormatter, demo_corpus, run, shared, tokenizer


def build_spec(args: argparse.Namespace) -> dict[str, object]:
    data = args.data or str(shared("prose", "wikipedia_xml", "enwiki-table-markup.xml.bz2") or demo_corpus())
    # the buffer holds whole pages; the 5-page sample needs a small one (a full dump: thousands)
    buffer = args.shuffle_buffer if args.shuffle_buffer is not None else (1000 if args.data else 4)
    epochs = args.epochs if args.epochs is not None else (1 if args.data else None)  # the sample: ~10 steps a pass
    return {"sources": [{"path": data}], "tokenizer": args.tokenizer, "seed": 42, "epochs": epochs,
            "shuffle": {"buffer": buffer},
            "task": {"kind": "sop", "max_length": args.seq_len, "mlm_probability": 0.15},
            "batching": {"strategy": "pad", "batch_size": args.batch_size, "pad_to_multiple_of": 8}}


def launch(args: argparse.Namespace) -> int:
    """Start the service, then torchrun the trainer ranks against it."""
    from feedline.service import serve_process

    spec = build_spec(args)
    with serve_process(spec) as address:
        print(f"feedline serve on {address}; starting {args.nproc} trainer ranks", flush=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.nproc),
               __file__, *sys.argv[1:], "--tokenizer", args.tokenizer, "--worker", address]
        return subprocess.run(cmd).returncode


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from transformers import BertConfig, BertForPreTraining

    import feedline
    from feedline.torch import TorchLoader

    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if args.backend == "nccl" else "cpu")
    torch.manual_seed(0)
    vocab = feedline.load_tokenizer(args.tokenizer).vocab_size
    config = BertConfig(vocab_size=vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                        num_attention_heads=max(1, args.hidden // 64), intermediate_size=4 * args.hidden,
                        max_position_embeddings=max(512, args.seq_len))
    model = BertForPreTraining(config).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    loader = TorchLoader(args.worker, device=device if device.type == "cuda" else None)  # rank from torchrun
    start, losses = time.perf_counter(), []
    for step, batch in enumerate(loader, start=1):
        out = ddp(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                  token_type_ids=batch["token_type_ids"], labels=batch["labels"],
                  next_sentence_label=batch["sentence_order_label"])
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
        if rank == 0 and (step == 1 or step % 10 == 0 or step == args.steps):  # loss: the mean since the last line
            print(json.dumps({"step": step, "loss": round(sum(losses) / len(losses), 4), "rows_per_rank": len(batch["input_ids"]),
                              "seconds": round(time.perf_counter() - start, 1)}), flush=True)
            losses.clear()
        if step >= args.steps:
            break
    state = loader.state_dict()  # identical on every rank: save it with the checkpoint
    if rank == 0:
        print(f"done: {step} steps on {dist.get_world_size()} ranks; loader state at step {state['step']}", flush=True)
    loader.close()
    dist.barrier()   # every rank done with its collectives, then DDP's reducer lets go of the group before it
    del ddp, opt     # goes: a group freed with the reducer at exit can deadlock a rank (gloo joins its threads holding the GIL)
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--data", help="a Wikipedia dump (pages-articles .xml.bz2, cirrussearch .json.gz) or any source")
    p.add_argument("--tokenizer", help="default: bert-base-uncased from ../shared/data, else a WordPiece trained here")
    p.add_argument("--shuffle-buffer", type=int, help="records (pages) in the shuffle buffer (default: 1000; 4 for the sample)")
    p.add_argument("--epochs", type=int, help="passes over the data (training stops at --steps or here; "
                                              "default: 1 with --data, the sample repeats)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16, help="global rows per step")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--nproc", type=int, default=2, help="trainer ranks")
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--worker", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.tokenizer = args.tokenizer or tokenizer("bert-base-uncased", "wordpiece")
    if args.worker:
        worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    run(main)
