"""A small GPT that respects packed rows, shared by the GPT and chat examples.

Packed rows hold several documents; ``position_ids`` restart at 0 where each begins. The model
derives a document id per token from those restarts and lets a token attend only to earlier
tokens of its own document (block-causal attention), so nothing leaks across documents.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def block_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """``[B, 1, T, T]`` boolean mask: causal, and within the same document (positions restart at 0)."""
    doc = torch.cumsum((position_ids == 0).int(), dim=1)
    t = position_ids.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=position_ids.device).tril()
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(h.transpose(1, 2).reshape(b, t, d))
        return x + self.ff(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only LM; ``forward(batch)`` returns the mean next-token loss over ``labels != -100``."""

    def __init__(self, vocab_size: int, d: int = 128, layers: int = 2, heads: int = 4, max_len: int = 1024) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d)
        self.pos = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        nn.init.normal_(self.tok.weight, std=0.02)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"]
        pos = batch.get("position_ids")
        if pos is None:
            pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        mask = block_causal_mask(pos)
        x = self.tok(ids) + self.pos(pos)
        for block in self.blocks:
            x = block(x, mask)
        hidden = self.ln(x)[:, :-1]
        labels = batch["labels"][:, 1:]
        keep = labels != -100  # project only the positions that carry loss (chat: assistant tokens)
        logits = hidden[keep] @ self.tok.weight.T
        return F.cross_entropy(logits, labels[keep])


def batch_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Real tokens in a batch: from the 2-D attention_mask, or (packed rows, which reach a model
    without one) from the documents' lengths ``seq_lens``."""
    m = batch.get("attention_mask")
    if m is not None and m.dim() == 2:
        return int(m.sum())
    if "seq_lens" in batch:
        return int(batch["seq_lens"].sum())
    return int(batch["input_ids"].numel())
