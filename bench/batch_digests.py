"""Digests of the first batches of many specs, and of a resumed continuation: compare two checkouts.

    PYTHONPATH=/path/to/main/src python bench/batch_digests.py --out /tmp/a.json
    PYTHONPATH=$PWD/src          python bench/batch_digests.py --out /tmp/b.json --compare /tmp/a.json

For each spec (CLM packed short records and documents, shuffled, framed per piece, truncated,
split at 64, block-causal masks, a text + JSONL mixture, pad / concat / bucket, MLM (split, truncated, packed, whole-word, exact, pairs), and the three
pre-tokenized layouts, chat on OASST and glaive tool calls with Qwen2.5), hashes the first ``--batches`` batches (every field's dtype, shape and
bytes), the state after steps 1, 5, ``--resume-at`` and the last, and checks that a loader resumed
from the state at ``--resume-at`` gives the same batches. ``--compare`` prints which specs differ
from another run's file (exit 1 if any): the check that a change to the data path keeps batches
and states bit-identical. Corpora are real text (``../shared/data``) written under
``/tmp/feedline-bench`` by ``common.py``/``pretokenized.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BERT, DATA, GPT2, prose_corpus, require_data, short_corpus


def clm(**kw: Any) -> dict[str, Any]:
    return {"kind": "clm", "max_length": 1024, **kw}


def specs() -> dict[str, dict[str, Any]]:
    from pretokenized import build

    SHORT, PROSE, pt = str(short_corpus(8)), str(prose_corpus(8)), build(5)
    gpt2 = {"path": str(GPT2 / "tokenizer.json"), "backend": "hf"}
    bert = str(BERT / "tokenizer.json")
    qwen = str(DATA / "tokenizers" / "qwen2.5")
    oasst = DATA / "chat" / "oasst" / "en_100_top_threads.messages.jsonl"
    glaive = DATA / "chat" / "llama_factory" / "glaive_toolcall_en_demo.json"
    flat = {"path": str(pt["flat"]), "format": "flat", "tokens": {"dtype": "uint16", "eos": 50256}}
    return {
        "short-pack": dict(sources=[{"path": SHORT, "format": "jsonl"}], tokenizer=gpt2, task=clm(), batching={"strategy": "pack", "batch_size": 16}),
        "short-pack-fast": dict(sources=[{"path": SHORT, "format": "jsonl"}], tokenizer={**gpt2, "backend": "auto"}, task=clm(), batching={"strategy": "pack", "batch_size": 16}),
        "prose-pack-shuf": dict(sources=[{"path": PROSE, "format": "jsonl"}], tokenizer=gpt2, task=clm(), shuffle={"buffer": 500}, batching={"strategy": "pack", "batch_size": 8}),
        "prose-piece-trunc": dict(sources=[{"path": PROSE, "format": "jsonl"}], tokenizer=gpt2, task=clm(max_length=128, frame="piece", bos=True), batching={"strategy": "pack", "batch_size": 8, "max_docs_per_row": 8, "overflow": "truncate", "attention": "block_diagonal", "window": 64}),
        "prose-split64": dict(sources=[{"path": PROSE, "format": "jsonl"}], tokenizer=gpt2, task=clm(max_length=None), batching={"strategy": "pack", "batch_size": 8, "max_length": 64, "window": 100, "first_window": 10, "open_bins": 4}),
        "prose-trunc-task": dict(sources=[{"path": PROSE, "format": "jsonl"}], tokenizer=gpt2, task=clm(max_length=200, overflow="truncate", eos=False), batching={"strategy": "pack", "batch_size": 8, "max_length": 512, "attention": "block_causal", "mask_first_token": False}),
        "mix-text": dict(sources=[{"path": str(DATA / "prose" / "botchan.txt"), "weight": 0.3}, {"path": SHORT, "format": "jsonl", "weight": 0.7}], tokenizer=gpt2, task=clm(max_length=256), batching={"strategy": "pack", "batch_size": 8, "window": 50, "first_window": 8, "open_bins": 4}, epochs=2),
        "short-pad": dict(sources=[{"path": SHORT, "format": "jsonl"}], tokenizer=gpt2, task=clm(max_length=64), batching={"strategy": "pad", "batch_size": 16}),
        "short-concat": dict(sources=[{"path": SHORT, "format": "jsonl"}], tokenizer=gpt2, task=clm(), batching={"strategy": "concat", "batch_size": 4}),
        "short-bucket": dict(sources=[{"path": SHORT, "format": "jsonl"}], tokenizer=gpt2, task=clm(max_length=128), batching={"strategy": "bucket", "batch_size": 16}),
        "mlm-pad": dict(sources=[{"path": SHORT, "format": "jsonl"}], tokenizer=str(BERT / "tokenizer.json"), task={"kind": "mlm", "max_length": 128}, batching={"strategy": "pad", "batch_size": 16}),
        "mlm-prose": dict(sources=[{"path": PROSE, "format": "jsonl"}], tokenizer=bert, task={"kind": "mlm", "max_length": 128}, batching={"strategy": "pad", "batch_size": 64}),
        "mlm-prose-shuf-pack": dict(sources=[{"path": PROSE, "format": "jsonl"}], tokenizer=bert, task={"kind": "mlm", "max_length": 128, "mlm_probability": 0.3}, shuffle={"buffer": 200}, batching={"strategy": "pack", "batch_size": 8, "max_length": 256}),
        "mlm-trunc-bucket": dict(sources=[{"path": PROSE, "format": "jsonl"}], tokenizer=bert, task={"kind": "mlm", "max_length": 96, "overflow": "truncate"}, batching={"strategy": "bucket", "batch_size": 16}),
        "mlm-wwm-exact": dict(sources=[{"path": PROSE, "format": "jsonl"}], tokenizer=bert, task={"kind": "mlm", "max_length": 64, "whole_word_mask": True, "masking": "exact", "max_predictions": 10}, batching={"strategy": "pad", "batch_size": 16}),
        "mlm-pair": dict(sources=[{"path": SHORT, "format": "jsonl"}], tokenizer=bert, task={"kind": "mlm", "max_length": 48, "text_pair": "text", "max_predictions": 6}, batching={"strategy": "pad", "batch_size": 16}),
        "pt-parquet": dict(sources=[{"path": str(pt["parquet"]), "format": "tokens"}], task=clm(), batching={"strategy": "pack", "batch_size": 16}),
        "pt-parquet-shuf": dict(sources=[{"path": str(pt["parquet"]), "format": "tokens"}], task=clm(max_length=512), shuffle={"buffer": 300}, batching={"strategy": "pack", "batch_size": 16}),
        "pt-megatron": dict(sources=[{"path": str(pt["megatron"])}], task=clm(), batching={"strategy": "pack", "batch_size": 16}),
        "pt-flat": dict(sources=[flat], task=clm(), batching={"strategy": "pack", "batch_size": 16}),
        "pt-flat-concat": dict(sources=[flat], task=clm(), batching={"strategy": "concat", "batch_size": 16}),
        "chat-oasst": dict(sources=[{"path": str(oasst), "text": None}], tokenizer=qwen, task={"kind": "chat", "max_length": 1024},
                           shuffle={"buffer": 32}, batching={"strategy": "pad", "batch_size": 8}),
        "chat-glaive-pack": dict(sources=[{"path": str(glaive), "text": None}], tokenizer=qwen, task={"kind": "chat", "max_length": 2048},
                                 batching={"strategy": "pack", "batch_size": 4, "max_length": 4096}),
    }


def digest(batch: dict[str, np.ndarray]) -> str:
    m = hashlib.sha256()
    for k in sorted(batch):
        a = np.ascontiguousarray(batch[k])
        m.update(f"{k}{a.dtype}{a.shape}".encode())
        m.update(a.tobytes())
    return m.hexdigest()[:16]


def run(spec: dict[str, Any], n: int, k: int) -> dict[str, Any]:
    import feedline

    hs, states = [], {}
    with feedline.Loader(spec) as ld:
        for i, b in enumerate(ld):
            hs.append(digest(b))
            if i + 1 in (1, 5, k, n):
                states[str(i + 1)] = hashlib.sha256(json.dumps(ld.state_dict(), sort_keys=True).encode()).hexdigest()[:16]
                if i + 1 == k:
                    resume_from = ld.state_dict()
            if i + 1 >= n:
                break
    resumed = []
    if len(hs) > k:
        with feedline.Loader(spec, state=resume_from) as ld:
            for b in ld:
                resumed.append(digest(b))
                if len(resumed) >= len(hs) - k:
                    break
    return {"batches": hs, "states": states, "resumed_equal": resumed == hs[k:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", help="another run's --out file")
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--resume-at", type=int, default=23)
    ap.add_argument("names", nargs="*", help="specs to run (default: all)")
    args = ap.parse_args(argv)
    require_data()
    all_specs = specs()
    out = {}
    for name in args.names or list(all_specs):
        t0 = time.perf_counter()
        out[name] = run({"seed": 7, **all_specs[name]}, args.batches, args.resume_at)
        print(f"{name}: {len(out[name]['batches'])} batches, resume {'exact' if out[name]['resumed_equal'] else 'DIFFERS'}, "
              f"{time.perf_counter() - t0:.1f} s")
    Path(args.out).write_text(json.dumps(out, indent=1))
    bad = [name for name, r in out.items() if not r["resumed_equal"]]
    if args.compare:
        other = json.loads(Path(args.compare).read_text())
        bad += [name for name in out if name in other and other[name] != out[name]]
        print("identical to", args.compare, "" if not bad else f"except: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
