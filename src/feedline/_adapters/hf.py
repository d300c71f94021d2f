"""Packed batches in the form Hugging Face models read as separate documents.

feedline's packed rows (``pack``/``concat``) carry a 2-D 1/0 ``attention_mask`` (or a ``[B, T, T]``
block mask), ``position_ids`` that restart at each document, and ``seq_lens``/``cu_seqlens``.
Given to an HF model as they are, the 2-D mask turns off HF's packed-sequence detection (its
documents then attend to each other) and eager attention misreads a boolean block mask. So
:class:`PackedLayout` rewrites packed batches (batches without ``seq_lens`` pass unchanged)::

    mode           attention_mask in the batch        HF attention that gives per-document loss
    position_ids   none (a 3-D block mask: 4-D)       sdpa, eager, flex: block-causal mask built from
                   (default)                          position_ids; flash-attention-2: see "flat"
    mask4d         [B, 1, T, T] additive float        sdpa, eager (0 = attend, dtype min = masked)
    flat           none; rows joined into [1, B*T]    sdpa, eager, and flash-attention-2 (varlen from
                                                      position_ids, which HF does only for batch size 1)
    keep           as the batcher made it             models that read cu_seqlens themselves

then ``model(input_ids=b["input_ids"], labels=b["labels"], position_ids=b["position_ids"],
attention_mask=b.get("attention_mask"), use_cache=False)`` computes each document's loss as if
it ran alone (``use_cache=False``: with a cache HF skips packed detection).

    >>> import torch
    >>> b = {"input_ids": torch.tensor([[5, 6, 7, 8, 0]]), "position_ids": torch.tensor([[0, 1, 0, 1, 0]]),
    ...      "attention_mask": torch.tensor([[1, 1, 1, 1, 0]]), "seq_lens": torch.tensor([[2, 2]])}
    >>> sorted(PackedLayout()(b))
    ['input_ids', 'position_ids', 'seq_lens']
    >>> PackedLayout("mask4d")(b)["attention_mask"][0, 0, 2].tolist()    # token 2 sees itself only
    [-3.4028234663852886e+38, -3.4028234663852886e+38, 0.0, -3.4028234663852886e+38, -3.4028234663852886e+38]

``position_ids`` and ``flat`` need positions that restart at each document (the batchers'
``reset_positions: true``, the default); with continuing positions use ``mask4d``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch

from feedline.errors import FeedlineError, SpecError

__all__ = ["PackedLayout", "PackedMode", "additive_mask"]

PackedMode = Literal["position_ids", "mask4d", "flat", "keep"]
_MODES = ("position_ids", "mask4d", "flat", "keep")


def _segments(batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(segment id per token, real-token mask)``: ids count documents from 0; padding is ``-1``."""
    seq_lens = batch["seq_lens"].to(torch.int64)
    t = batch["input_ids"].shape[1]
    ends = seq_lens.cumsum(dim=1)  # [B, D]
    pos = torch.arange(t, device=ends.device).expand(ends.shape[0], t).contiguous()
    seg = torch.searchsorted(ends, pos, right=True)
    real = pos < ends[:, -1:]
    return torch.where(real, seg, torch.full_like(seg, -1)), real


def additive_mask(batch: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A ``[B, 1, T, T]`` additive mask: 0 where a token may attend, ``finfo(dtype).min`` elsewhere.

    From the batch's ``[B, T, T]`` block mask when it has one, else block-causal from
    ``seq_lens``. Padding tokens attend to themselves only (no row is all masked).
    """
    mask = batch.get("attention_mask")
    t = batch["input_ids"].shape[1]
    if mask is not None and mask.dim() == 3:
        allowed = mask.to(torch.bool)
        real = allowed.any(dim=2)
    else:
        seg, real = _segments(batch)
        causal = torch.ones(t, t, dtype=torch.bool, device=seg.device).tril()
        allowed = (seg[:, :, None] == seg[:, None, :]) & real[:, :, None] & causal
    eye = torch.eye(t, dtype=torch.bool, device=allowed.device)
    allowed = allowed | (eye & ~real[:, :, None])
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    out.masked_fill_(~allowed, torch.finfo(dtype).min)
    return out[:, None]


class PackedLayout:
    """Rewrites packed batches for Hugging Face models (see the module docstring).

    Args:
        mode: ``position_ids`` (default), ``mask4d``, ``flat`` or ``keep``.
        mask_dtype: dtype of the ``mask4d`` additive mask; use the model's (sdpa needs them equal).
    """

    def __init__(self, mode: PackedMode = "position_ids", mask_dtype: torch.dtype = torch.float32) -> None:
        if mode not in _MODES:
            raise SpecError(f"packed: {mode!r} is not one of {', '.join(_MODES)}")
        self.mode = mode
        self.mask_dtype = mask_dtype
        self._checked = False  # positions verified on the first packed batch (a property of the spec)

    def __repr__(self) -> str:
        return f"PackedLayout({self.mode!r}, mask_dtype={self.mask_dtype})"

    def __call__(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(batch)
        if self.mode == "keep" or "seq_lens" not in batch or "position_ids" not in batch:
            return out
        mask = batch.get("attention_mask")
        if self.mode == "mask4d" or (self.mode == "position_ids" and mask is not None and mask.dim() == 3):
            out["attention_mask"] = additive_mask(batch, self.mask_dtype)
            return out
        self._check_positions(batch)
        if mask is not None and mask.dim() == 3:
            raise FeedlineError("packed='flat' cannot carry a [B, T, T] block mask; use batching.attention: padding "
                                "(position_ids then describe the documents) or packed='mask4d'")
        out.pop("attention_mask", None)
        if self.mode == "flat":
            return _flatten(out)
        return out

    def _check_positions(self, batch: Mapping[str, torch.Tensor]) -> None:
        """Once per loader: position_ids must restart at every document (HF finds documents by them)."""
        if self._checked:
            return
        seg, real = _segments(batch)
        pos = batch["position_ids"].to(torch.int64)
        starts = real & torch.cat([torch.ones_like(seg[:, :1], dtype=torch.bool), seg[:, 1:] != seg[:, :-1]], dim=1)
        expect = torch.arange(pos.shape[1], device=pos.device) - torch.cummax(
            torch.where(starts, torch.arange(pos.shape[1], device=pos.device), torch.zeros_like(pos)), dim=1).values
        if not bool(((pos == expect) | ~real).all()):
            raise FeedlineError(
                f"packed={self.mode!r}: position_ids do not restart at each document, so a Hugging Face model cannot "
                "tell the documents apart; set batching.reset_positions: true, or use TorchLoader(..., packed='mask4d')"
            )
        self._checked = True


def _flatten(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rows joined into one ``[1, B*T]`` row; each row's first label becomes -100 (as before joining,
    where no token predicted it), so the loss is unchanged."""
    b, t = batch["input_ids"].shape[:2]
    out = dict(batch)
    for name, v in batch.items():
        if name in ("seq_lens", "cu_seqlens") or v.dim() < 2 or v.shape[:2] != (b, t):
            continue
        if name == "labels":
            v = v.clone()
            v[:, 0] = -100
        out[name] = v.reshape(1, b * t, *v.shape[2:])
    return out
