"""GPU check: does the loader keep a GPU fed? Train a BERT-base-size MLM fed by the service on the same machine.

    python examples/gpu_check.py                          # CUDA: BERT-base (110M), 300 steps
    python examples/gpu_check.py --device cpu --hidden 64 --layers 2 --batch-size 16 --steps 40   # plumbing, on a CPU

``feedline serve`` runs in a child process (its own cores); the trainer reads through
``TorchLoader(address, device="cuda")``, which copies each next batch on a side stream while
the current step runs. After each optimizer step the trainer synchronises the GPU, so the time
then spent inside ``next(batches)`` is time the GPU sat idle for want of data. The report is
one JSON line: ``data_wait_share`` (target: under 0.01), tokens/s (real tokens, padding
excluded), step time, and the model size. Mixed precision (bf16 autocast) is used on CUDA.
Without CUDA it stops at once and prints the CPU line above; that line, measured on the shared
2-core machine at load ~4: 38 s wall, 60 CPU-seconds, peak RSS 1.28 GB, data wait 0.07 %.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from _data import HelpFormatter, demo_corpus, run, shared, tokenizer

import feedline
from feedline.torch import TorchLoader


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--data", help="any source (default: ../shared/data Wikipedia articles, else the demo corpus)")
    p.add_argument("--tokenizer", help="default: bert-base-uncased from ../shared/data, else a WordPiece trained here")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20, help="steps excluded from the figures (compilation, allocator)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--device", default="cuda")
    p.add_argument("--in-process", action="store_true", help="run the loader in this process instead of a service")
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("gpu_check.py measures a GPU's wait for data, and this machine has no CUDA device: run it on a GPU "
                 "node, or pass --device cpu --hidden 64 --layers 2 --batch-size 16 --steps 40 to try the plumbing here")
    from transformers import BertConfig, BertForMaskedLM

    device = torch.device(args.device)
    data = args.data or str(shared("prose", "wiki_demo.txt") or demo_corpus())
    tok_path = args.tokenizer or tokenizer("bert-base-uncased", "wordpiece")
    spec = {"sources": [{"path": data}], "tokenizer": tok_path, "seed": 0, "epochs": None, "shuffle": {"buffer": 16},
            "task": {"kind": "mlm", "max_length": args.seq_len},
            "batching": {"strategy": "pad", "batch_size": args.batch_size, "pad_to": "max_length"}}
    config = BertConfig(vocab_size=feedline.load_tokenizer(tok_path).vocab_size, hidden_size=args.hidden,
                        num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
                        intermediate_size=4 * args.hidden, max_position_embeddings=max(512, args.seq_len))
    torch.manual_seed(0)
    model = BertForMaskedLM(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def run(source: object) -> dict[str, object]:
        loader = TorchLoader(source, device=device if device.type == "cuda" else None, prefetch=2)
        it = iter(loader)
        wait = tokens = 0.0
        start = 0.0
        for step in range(1, args.steps + 1):
            if step == args.warmup + 1:
                sync(device)
                start, wait, tokens = time.perf_counter(), 0.0, 0.0
            t0 = time.perf_counter()
            batch = next(it)
            wait += time.perf_counter() - t0
            with autocast:
                loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             token_type_ids=batch.get("token_type_ids"), labels=batch["labels"]).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync(device)  # from here until the next batch arrives, the device is idle
            tokens += float(batch["attention_mask"].sum())
        total = time.perf_counter() - start
        loader.close()
        measured = args.steps - args.warmup
        return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "placement": "in-process" if args.in_process else "service", "parameters": sum(x.numel() for x in model.parameters()),
                "steps": measured, "step_ms": round(1000 * total / measured, 2), "data_wait_share": round(wait / total, 5),
                "tokens_per_s": round(tokens / total), "last_loss": round(loss.item(), 4)}

    if args.in_process:
        report = run(spec)
    else:
        from feedline.service import serve_process

        with serve_process(spec) as address:
            report = run(address)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    run(main)
