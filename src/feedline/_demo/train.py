"""The demo's training loop: a live progress line with loss, tokens/s and the data-wait share.

The *data-wait share* is the fraction of wall time the trainer spent blocked on the loader
(time inside ``next(batches)``); with the loader in its own process it should stay near zero.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

__all__ = ["TrainSummary", "train"]


@dataclass(frozen=True)
class TrainSummary:
    """What a demo run did."""

    steps: int
    tokens: int
    seconds: float
    wait_seconds: float
    first_loss: float
    last_loss: float
    params: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def wait_share(self) -> float:
        return self.wait_seconds / self.seconds if self.seconds else 0.0

    def describe(self) -> str:
        return (f"trained {self.params:,}-parameter model for {self.steps} steps in {self.seconds:.1f}s: "
                f"loss {self.first_loss:.3f} -> {self.last_loss:.3f}, {self.tokens:,} tokens "
                f"({self.tokens_per_s:,.0f} tokens/s), trainer waited for data {100 * self.wait_share:.1f}% of the time")


def train(model: Any, batches: Iterable[Mapping[str, np.ndarray]], *, steps: int, lr: float = 3e-3,
          out: TextIO | None = None, on_step: Callable[[int, float], None] | None = None) -> TrainSummary:
    """Train ``model`` (returns a loss from a batch dict) for up to ``steps`` steps."""
    import os

    import torch

    # The loader (a service process, or the in-process thread) tokenizes on the other cores.
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    from feedline._tools.progress import enabled

    out = out or sys.stderr
    tty = out.isatty() and enabled()  # a live line on a terminal (off with --no-progress: ten lines instead)
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    params = sum(p.numel() for p in model.parameters())
    losses: list[float] = []
    tokens = 0
    wait = 0.0
    it = iter(batches)
    start = time.perf_counter()
    step = 0
    while step < steps:
        t0 = time.perf_counter()
        batch = next(it, None)
        wait += time.perf_counter() - t0
        if batch is None:
            break
        tb = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
        loss = model(tb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        losses.append(float(loss.detach()))
        tokens += int(batch["attention_mask"].sum()) if "attention_mask" in batch else int(batch["input_ids"].size)
        if on_step:
            on_step(step, losses[-1])
        elapsed = time.perf_counter() - start
        if tty or step % max(1, steps // 10) == 0 or step == steps:
            avg = float(np.mean(losses[-20:]))
            bar = "#" * int(30 * step / steps)
            line = (f"step {step:>5}/{steps} [{bar:<30}] loss {avg:6.3f}  "
                    f"{tokens / elapsed:>9,.0f} tok/s  data wait {100 * wait / elapsed:4.1f}%")
            print(("\r" + line) if tty else line, end="" if tty else "\n", file=out, flush=True)
    if tty:
        print(file=out)
    k = max(1, min(20, len(losses) // 5))
    return TrainSummary(steps=step, tokens=tokens, seconds=time.perf_counter() - start, wait_seconds=wait,
                        first_loss=float(np.mean(losses[:k])) if losses else float("nan"),
                        last_loss=float(np.mean(losses[-k:])) if losses else float("nan"), params=params)
