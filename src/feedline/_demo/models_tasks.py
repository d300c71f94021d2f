"""Tiny torch models for the non-GPT demo tasks: BERT (mlm, sop), T5-style (span), classifier heads.

Like :class:`~feedline._demo.models.TinyGPT`, each takes a batch dict with Hugging Face field
names and returns the loss, so :func:`feedline._demo.train.train` drives them all::

    mlm         TinyBERT             masked-token loss on labels != -100
    sop         TinyBERT(sop=True)   masked-token loss + 2-way sentence-order loss on [CLS]
    span        TinyT5               encoder-decoder; loss on the spelled-out spans (labels)
    classify    TinyClassifier       cross-entropy on a 0-D class id per row
    multilabel  TinyClassifier       BCE-with-logits on a float multi-hot row
    chat        TinyGPT              next-token loss on assistant tokens only (labels -100 elsewhere)

A few hundred thousand parameters each; a few hundred steps on a CPU show the loss falling.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["Encoder", "TinyBERT", "TinyClassifier", "TinyT5"]


def _init(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


class Encoder(nn.Module):
    """Token + position (+ segment) embeddings and a bidirectional pre-norm Transformer encoder."""

    def __init__(self, vocab_size: int, d: int = 128, layers: int = 2, heads: int = 4, ff: int = 256, max_len: int = 512) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d)
        self.pos = nn.Embedding(max_len, d)
        self.seg = nn.Embedding(2, d)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=True, activation="gelu")
        self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(d)

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        ids = batch["input_ids"].long()
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))[None]
        if "token_type_ids" in batch:
            x = x + self.seg(batch["token_type_ids"].long().clamp(0, 1))
        pad = batch["attention_mask"] == 0 if "attention_mask" in batch else None
        return self.ln(self.layers(x, src_key_padding_mask=pad))  # type: ignore[no-any-return]


class TinyBERT(nn.Module):
    """BERT-style MLM (tied output embedding); with ``sop=True`` also the sentence-order head."""

    def __init__(self, vocab_size: int, *, sop: bool = False, d: int = 128, layers: int = 2, max_len: int = 512) -> None:
        super().__init__()
        self.encoder = Encoder(vocab_size, d, layers, max_len=max_len)
        self.transform = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d))
        self.sop = nn.Linear(d, 2) if sop else None
        self.apply(_init)

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        h = self.encoder(batch)
        labels = batch["labels"].long()
        keep = labels != -100
        logits = self.transform(h[keep]) @ self.encoder.tok.weight.T  # only masked positions
        loss = F.cross_entropy(logits, labels[keep]) if keep.any() else h.sum() * 0.0
        if self.sop is not None:
            loss = loss + F.cross_entropy(self.sop(h[:, 0]), batch["sentence_order_label"].long().reshape(-1))
        return loss


class TinyT5(nn.Module):
    """A T5-style encoder-decoder: the encoder reads the corrupted input, the decoder spells the spans."""

    def __init__(self, vocab_size: int, d: int = 128, layers: int = 2, heads: int = 4, ff: int = 256, max_len: int = 512) -> None:
        super().__init__()
        self.encoder = Encoder(vocab_size, d, layers, heads, ff, max_len)
        layer = nn.TransformerDecoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=True, activation="gelu")
        self.decoder = nn.TransformerDecoder(layer, layers)
        self.ln = nn.LayerNorm(d)
        self.apply(_init)

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        memory = self.encoder({k: batch[k] for k in ("input_ids", "attention_mask") if k in batch})
        dec = batch["decoder_input_ids"].long()
        t = dec.shape[1]
        emb = self.encoder.tok(dec) + self.encoder.pos(torch.arange(t, device=dec.device))[None]
        causal = nn.Transformer.generate_square_subsequent_mask(t, device=dec.device)
        pad = batch["attention_mask"] == 0 if "attention_mask" in batch else None
        h = self.ln(self.decoder(emb, memory, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=pad))
        logits = h @ self.encoder.tok.weight.T
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].long().reshape(-1), ignore_index=-100)


class TinyClassifier(nn.Module):
    """Encoder + mean pooling + linear head: cross-entropy for class ids, BCE for multi-hot labels."""

    def __init__(self, vocab_size: int, num_labels: int, d: int = 128, layers: int = 2, max_len: int = 512) -> None:
        super().__init__()
        self.encoder = Encoder(vocab_size, d, layers, max_len=max_len)
        self.head = nn.Linear(d, num_labels)
        self.apply(_init)

    def logits(self, batch: dict[str, Any]) -> torch.Tensor:
        h = self.encoder(batch)
        mask = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
        return self.head((h * mask).sum(1) / mask.sum(1).clamp(min=1.0))  # type: ignore[no-any-return]

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        logits = self.logits(batch)
        labels = batch["labels"]
        if labels.is_floating_point():  # multi-hot
            return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
        return F.cross_entropy(logits, labels.long().reshape(-1))
