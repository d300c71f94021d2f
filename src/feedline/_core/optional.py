"""Optional dependencies: import one, or fail with the extra that installs it."""

from __future__ import annotations

import importlib

from feedline.errors import MissingDependency

__all__ = ["require"]


def require(module: str, extra: str) -> object:
    """Import an optional module or raise :class:`MissingDependency` naming the extra.

    Example:
        >>> np = require("numpy", "core")
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise MissingDependency(
            f"{module!r} is not installed; install it with: pip install 'feedline[{extra}]'"
        ) from e
