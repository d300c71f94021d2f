"""T5 span-corruption pre-training: noise spans become sentinels in the inputs and targets.

    python examples/t5_span.py                                   # small: 40 steps, ~2 CPU-minutes
    python examples/t5_span.py --data 'c4/*.json.gz' --tokenizer t5-base-dir --seq-len 512 \\
        --batch-size 128 --d-model 768 --layers 12 --steps 100000 --device cuda

The ``span`` task lays the documents end to end (EOS after each) and cuts them into raw pieces
sized so the corrupted inputs are exactly ``--seq-len`` tokens (T5's ``random_spans_helper``), replaces 15% of the tokens in spans of mean
length 3 with ``<extra_id_N>`` sentinels, and spells the spans out in ``labels``, with
``decoder_input_ids`` shifted right: the fields ``T5ForConditionalGeneration`` takes. Without
``--data``, the Wikipedia articles in ``../shared/data`` (or the demo corpus) are used; the
tokenizer defaults to T5's SentencePiece vocabulary with its 100 sentinels.

Default run on the shared 2-core machine at load ~4: 1:17 wall, 80 CPU-seconds, peak RSS 1.07 GB;
the loss (mean since the previous line) falls from 10.98 (step 1) to 9.67 (steps 2-20) and 9.18
(21-40). (At load 11-17 the first 20 steps alone took 11 minutes and 98 CPU-seconds.)
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from _data import HelpFormatter, demo_corpus, run, shared, tokenizer

import feedline
from feedline.torch import TorchLoader


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--data", help="any source (default: ../shared/data Wikipedia articles, else the demo corpus)")
    p.add_argument("--tokenizer", help="default: T5 from ../shared/data, else a unigram with sentinels trained here")
    p.add_argument("--epochs", type=int, default=1, help="passes over the data (training stops at --steps or here)")
    p.add_argument("--shuffle-buffer", type=int, default=8, help="documents in the shuffle buffer (articles are long)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seq-len", type=int, default=128, help="encoder input length after corruption")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    from transformers import T5Config, T5ForConditionalGeneration

    data = args.data or str(shared("prose", "wiki_demo.txt") or demo_corpus())
    tok_path = args.tokenizer or tokenizer("t5", "unigram")
    spec = {"sources": [{"path": data}], "tokenizer": tok_path, "seed": 7, "epochs": args.epochs,
            "shuffle": {"buffer": args.shuffle_buffer},
            "task": {"kind": "span", "max_length": args.seq_len},
            "batching": {"strategy": "pad", "batch_size": args.batch_size}}
    tok = feedline.load_tokenizer(tok_path)
    torch.manual_seed(0)
    config = T5Config(vocab_size=tok.vocab_size, d_model=args.d_model, d_kv=max(16, args.d_model // 4),
                      d_ff=4 * args.d_model, num_layers=args.layers, num_heads=4, pad_token_id=tok.pad_id or 0,
                      decoder_start_token_id=tok.pad_id or 0)
    device = torch.device(args.device)
    model = T5ForConditionalGeneration(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = TorchLoader(spec, device=device if device.type == "cuda" else None)
    start, losses = time.perf_counter(), []
    for step, batch in enumerate(loader, start=1):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    decoder_input_ids=batch["decoder_input_ids"], labels=batch["labels"])
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
        if step == 1 or step % 20 == 0 or step == args.steps:  # loss: the mean since the last line
            print(json.dumps({"step": step, "loss": round(sum(losses) / len(losses), 4), "inputs": list(batch["input_ids"].shape),
                              "targets": list(batch["labels"].shape), "seconds": round(time.perf_counter() - start, 1)}),
                  flush=True)
            losses.clear()
        if step >= args.steps:
            break
    loader.close()


if __name__ == "__main__":
    run(main)
