"""``feedline inspect``: the first batches of a spec, decoded, with loss-carrying tokens highlighted."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from feedline._cli._common import add_spec_argument, load_spec

NAME = "inspect"
HELP = "show the first batches of a spec: shapes, dtypes, and decoded rows with loss tokens highlighted"
EXAMPLE = "feedline inspect spec.yaml -n 2 --rows 3      (or: cat spec.yaml | feedline inspect - --json)"

_ON, _OFF = "\x1b[1;32m", "\x1b[0m"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_spec_argument(p)
    p.add_argument("-n", "--batches", type=int, default=1, help="batches to show (default: 1)")
    p.add_argument("--rows", type=int, default=2, help="rows of each batch to decode (default: 2)")
    p.add_argument("--rank", type=int, default=0, help="rank whose slice to show (default: 0)")
    p.add_argument("--world-size", type=int, default=1, help="number of ranks (default: 1)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("--color", action=argparse.BooleanOptionalAction, default=None,
                   help="highlight loss tokens with colour (default: on a terminal); otherwise they are shown [[like this]]")


def _render(tok: Any, ids: np.ndarray, loss: np.ndarray | None, color: bool) -> str:
    """Decode ``ids`` once, marking the runs where ``loss`` is true.

    Each run's text is cut from the decoding of the whole prefix up to its end (decoding runs
    apart would drop the spaces WordPiece and SentencePiece put between them): ``a [MASK] b``
    stays ``a [[[MASK]]] b``, never ``a[[[MASK]]]b``.
    """
    tokens = ids.tolist()
    if not tokens:
        return ""
    flags = [bool(x) for x in loss.tolist()] if loss is not None else [False] * len(tokens)
    bounds = [i for i in range(1, len(tokens)) if flags[i] != flags[i - 1]] + [len(tokens)]
    parts: list[str] = []
    done, start = "", 0
    for end in bounds:
        text = tok.decode(tokens[:end])
        piece = text[len(done):] if text.startswith(done) else " " + tok.decode(tokens[start:end])
        if flags[start]:
            lead = piece[:len(piece) - len(piece.lstrip())]
            piece = lead + (f"{_ON}{piece.lstrip()}{_OFF}" if color else f"[[{piece.lstrip()}]]")
        parts.append(piece)
        done, start = text, end
    return "".join(parts)


def describe_batch(batch: dict[str, np.ndarray], tok: Any, rows: int, pad_id: int, color: bool, *,
                   label_names: list[str] | None = None) -> dict[str, Any]:
    """Shapes, dtypes and decoded rows of one batch.

    ``label_names`` marks ``labels`` as a multi-hot vector per row (multi-label classification):
    each row shows the names of its labels, not tokens.
    """
    ids = batch.get("input_ids")
    labels = batch.get("labels")
    mask = batch.get("attention_mask")
    out: dict[str, Any] = {"fields": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in batch.items()}, "rows": []}
    if ids is None or tok is None:
        return out
    for r in range(min(rows, ids.shape[0])):
        real = mask[r].astype(bool) if mask is not None and mask.shape == ids.shape else np.ones(ids.shape[1], bool)
        row_ids = ids[r][real]
        row: dict[str, Any] = {"tokens": int(real.sum())}
        if labels is not None and labels.shape == ids.shape:
            loss = (labels[r] != -100)[real]
            row["loss_tokens"] = int(loss.sum())
            row["text"] = _render(tok, row_ids, loss, color)
        else:
            row["text"] = tok.decode(row_ids)
            if labels is not None and label_names is not None:
                on = np.flatnonzero(labels[r] > 0.5).tolist()
                row["labels"] = [label_names[i] if i < len(label_names) else i for i in on]
            elif labels is not None and labels.ndim == 2:
                lab = labels[r][labels[r] != -100]
                row["loss_tokens"] = int(lab.size)
                row["target"] = tok.decode(lab[lab >= 0])
            elif labels is not None:
                row["label"] = labels[r].tolist()
        for k, v in batch.items():
            if k not in ("input_ids", "labels", "attention_mask") and v.ndim == 1:
                row[k] = v[r].item()
        out["rows"].append(row)
    return out


def run(args: argparse.Namespace) -> int:
    from feedline._loader import Loader

    spec = load_spec(args.spec)
    color = sys.stdout.isatty() if args.color is None else args.color
    loader = Loader(spec, rank=args.rank, world_size=args.world_size, prefetch=1)
    tok = loader.pipeline.tokenizer
    task = loader.pipeline.task
    names = list(getattr(task, "vocab", {})) if "labels" in getattr(task, "vector_fields", ()) else None
    report = []
    try:
        for i, batch in enumerate(loader):
            report.append(describe_batch(batch, tok, args.rows, task.pad_values["input_ids"], color, label_names=names))
            if i + 1 >= args.batches:
                break
    finally:
        loader.close()
    if args.json:
        print(json.dumps({"spec_hash": spec.hash(), "task": spec.task.kind, "batches": report}, indent=2))
        return 0
    print(f"spec {spec.hash()}  task {spec.task.kind}  strategy {spec.batching.strategy}  rank {args.rank}/{args.world_size}")
    for i, b in enumerate(report):
        print(f"\nbatch {i}:")
        for k, f in b["fields"].items():
            print(f"  {k:<22} {f['dtype']:<8} {tuple(f['shape'])}")
        for r, row in enumerate(b["rows"]):
            extra = {k: v for k, v in row.items() if k not in ("text", "tokens", "loss_tokens", "target")}
            print(f"  row {r}: {row['tokens']} tokens, {row.get('loss_tokens', 0)} with loss {extra or ''}")
            print("    " + row["text"].replace("\n", "\n    "))
            if "target" in row:
                print("    target: " + row["target"])
    if not report:
        print("(the spec yields no batches)")
    return 0
