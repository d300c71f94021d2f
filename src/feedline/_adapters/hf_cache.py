"""A warning, once, when packed batches run through a Hugging Face model with its cache on.

HF finds the documents of a packed row from ``position_ids`` only when there is no attention mask
*and no cache*; a model whose config says ``use_cache=True`` (GPT-2's and Llama's default) makes an
empty cache on every forward call, training included, so the documents of a row attend to each
other and the loss is wrong without any error. The HF ``Trainer`` calls ``model(**batch)``, so only
the config decides there. :func:`watch_cache` hooks the model's next forward call that carries
``position_ids``: when that call runs with no mask and its cache on, it logs one line naming the
fix, then the hook removes itself (nothing runs on later calls)::

    watch_cache(model)      # TorchLoader does this at its first packed batch (model= or the Trainer's)
    model(input_ids=b["input_ids"], position_ids=b["position_ids"])             # warns once
    model(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False)   # would not
"""

from __future__ import annotations

import logging
import sys
import weakref
from typing import Any

__all__ = ["trainer_model", "watch_cache"]

log = logging.getLogger("feedline.torch")

_watched: weakref.WeakSet[Any] = weakref.WeakSet()   # models hooked once already (one warning per model)


def watch_cache(model: Any) -> None:
    """Warn once if ``model``'s next forward call with ``position_ids`` (a packed batch) runs with no
    attention mask and its cache on; a model without ``config.use_cache`` (not HF) is left alone."""
    inner = getattr(model, "module", model) if not hasattr(model, "config") else model   # DDP wraps the model
    if not hasattr(getattr(inner, "config", None), "use_cache") or inner in _watched:
        return
    _watched.add(inner)

    def check(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if kwargs.get("position_ids") is None:
            return   # not a packed batch's call (a generate() step, an eval without positions): wait for one
        handle.remove()
        use = kwargs.get("use_cache")
        if use is None:
            use = getattr(module.config, "use_cache", False)
        if use and kwargs.get("attention_mask") is None and kwargs.get("past_key_values") is None:
            log.warning("packed batches reach %s with its cache on (config.use_cache=True), so Hugging Face "
                        "ignores where documents start and each attends to the documents before it in its row; pass "
                        "use_cache=False to the model call, or set model.config.use_cache = False (docs/adapters.md)",
                        type(module).__name__)

    handle = inner.register_forward_pre_hook(check, with_kwargs=True)


def trainer_model(depth: int = 60) -> Any:
    """The model of the Hugging Face ``Trainer`` whose training loop is iterating the caller, else ``None``."""
    frame = sys._getframe(1)
    for _ in range(depth):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if owner is not None and any(c.__name__ == "Trainer" and c.__module__ == "transformers.trainer"
                                     for c in type(owner).__mro__):
            return getattr(owner, "model", None)
    return None
