"""The public surface is deliberate: a sorted __all__ whose names all exist."""

from __future__ import annotations

import feedline
from feedline import errors


def test_all_is_sorted_and_importable() -> None:
    assert feedline.__all__ == sorted(feedline.__all__)
    for name in feedline.__all__:
        assert hasattr(feedline, name), name


def test_every_error_derives_from_the_root() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, feedline.FeedlineError), name
