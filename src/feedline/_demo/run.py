"""``feedline demo``: a loader feeding a tiny model's training on the embedded corpus.

The task table :data:`DEMO_TASKS` maps a task name to the spec it streams and the model it
trains; ``--source``/``--tokenizer`` replace the embedded corpus and tokenizer with anything a
spec accepts.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

from feedline._demo import tasks as _tasks
from feedline._demo.corpus import ensure_demo_assets
from feedline._demo.train import TrainSummary, train
from feedline._tokenize.tokenizer import Tokenizer

__all__ = ["DEMO_TASKS", "DemoTask", "run_demo"]


@dataclass(frozen=True)
class DemoTask:
    """A demo: ``spec(source, tokenizer, seq_len, batch_size)`` and ``model(tokenizer, seq_len)``."""

    spec: Callable[[Any, str, int, int], dict[str, Any]]
    model: Callable[[Tokenizer, int], Any]
    lr: float = 3e-3
    tokenizer_kind: str = "bpe"  # family of the embedded tokenizer: bpe, wordpiece or unigram


def _clm_spec(source: Any, tokenizer: str, seq_len: int, batch_size: int) -> dict[str, Any]:
    return {"sources": [source], "tokenizer": tokenizer, "seed": 0, "epochs": None, "shuffle": {"buffer": 512},
            "task": {"kind": "clm", "max_length": seq_len}, "batching": {"strategy": "pad", "batch_size": batch_size}}


def _gpt(tok: Tokenizer, seq_len: int) -> Any:
    from feedline._demo.models import TinyGPT

    return TinyGPT(tok.vocab_size, max_len=max(seq_len, 64))


DEMO_TASKS: dict[str, DemoTask] = {
    "clm": DemoTask(spec=_clm_spec, model=_gpt),
    "mlm": DemoTask(spec=_tasks.mlm_spec, model=_tasks.bert, lr=1e-3, tokenizer_kind="wordpiece"),
    "sop": DemoTask(spec=_tasks.sop_spec, model=_tasks.bert_sop, lr=1e-3, tokenizer_kind="wordpiece"),
    "span": DemoTask(spec=_tasks.span_spec, model=_tasks.t5, lr=1e-3, tokenizer_kind="unigram"),
    "classify": DemoTask(spec=_tasks.classify_spec, model=_tasks.classifier, lr=1e-3, tokenizer_kind="wordpiece"),
    "multilabel": DemoTask(spec=_tasks.multilabel_spec, model=_tasks.multilabel_classifier, lr=1e-3, tokenizer_kind="wordpiece"),
    "chat": DemoTask(spec=_tasks.chat_spec, model=_tasks.chat_gpt),
}


@contextmanager
def _batches(spec: dict[str, Any], in_process: bool, out: TextIO) -> Iterator[Any]:
    """The demo's batches: from a ``feedline serve`` child process (default) or in-process."""
    from feedline._loader import Loader

    if in_process:
        print("loader: in-process", file=out)
        with Loader(spec) as loader:
            yield loader
        return
    from feedline._service.launch import serve_process

    with serve_process(spec) as address:
        print(f"loader: `feedline serve` process on {address}; the trainer connects as rank 0 of 1", file=out)
        loader = Loader(address, rank=0, world_size=1)
        try:
            yield loader
        finally:
            loader.close()


def run_demo(*, task: str = "clm", steps: int = 300, source: Any = None, tokenizer: str | None = None,
             seq_len: int = 128, batch_size: int = 16, in_process: bool = False, out: TextIO | None = None) -> TrainSummary:
    """Run the demo and return its summary (also printed)."""
    from feedline._tokenize.load import load_tokenizer
    from feedline.errors import SpecError

    out = out or sys.stderr
    if task not in DEMO_TASKS:
        raise SpecError(f"--task: {task!r} has no demo; choose one of {', '.join(sorted(DEMO_TASKS))}")
    demo = DEMO_TASKS[task]
    if source is None or tokenizer is None:
        corpus, tok_dir = ensure_demo_assets()
        source = source or str(corpus)
        tokenizer = tokenizer or (str(tok_dir) if demo.tokenizer_kind == "bpe" else _tasks.demo_tokenizer(demo.tokenizer_kind))
    spec = demo.spec(source, tokenizer, seq_len, batch_size)
    tok = load_tokenizer(tokenizer)
    model = demo.model(tok, seq_len)
    print(f"feedline demo: task {task}, source {source}, tokenizer {tokenizer}", file=out)
    with _batches(spec, in_process, out) as batches:
        summary = train(model, batches, steps=steps, lr=demo.lr, out=out)
    print(summary.describe(), file=out)
    return summary
