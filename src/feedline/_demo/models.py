"""Tiny torch models for the demo (a few hundred thousand parameters; CPU-friendly).

Each model takes a batch dict (torch tensors with Hugging Face field names) and returns the
loss, so the training loop is the same for every task.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["TinyGPT", "causal_lm_loss"]


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token loss with unshifted labels (-100 ignored), as HF causal LMs compute it."""
    shift_logits = logits[:, :-1].reshape(-1, logits.shape[-1])
    shift_labels = labels[:, 1:].reshape(-1).long()
    return nn.functional.cross_entropy(shift_logits, shift_labels, ignore_index=-100)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, ff: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.GELU(), nn.Linear(ff, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.ff(self.ln2(x))


class TinyGPT(nn.Module):
    """A 2-layer GPT with tied embeddings; ``position_ids`` (packed rows) are honoured when present."""

    def __init__(self, vocab_size: int, d: int = 128, layers: int = 2, heads: int = 4, ff: int = 256, max_len: int = 2048) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d)
        self.pos = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads, ff) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        ids = batch["input_ids"].long()
        t = ids.shape[1]
        pos = batch.get("position_ids")
        pos = pos.long() if pos is not None else torch.arange(t, device=ids.device)[None, :].expand_as(ids)
        x = self.tok(ids) + self.pos(pos)
        mask = torch.triu(torch.full((t, t), float("-inf"), device=ids.device), diagonal=1)
        for b in self.blocks:
            x = b(x, mask)
        logits = self.ln(x) @ self.tok.weight.T
        return causal_lm_loss(logits, batch["labels"])
