"""Public test helpers: exact-resume conformance and small corpora.

    >>> from feedline.testing import assert_resumes_exactly
    >>> assert_resumes_exactly(spec)                      # doctest: +SKIP

:func:`assert_resumes_exactly` runs the whole stream once, then restores a fresh loader from
the state saved at many points (the start, every ``every``-th step, each step where an epoch
changes, the last step) after a JSON round trip, and checks that every following batch is
bit-identical. Use it on custom tasks and batchers too.

:func:`assert_stage_resumes` does the same one level down, for any single stage (a recipe whose
``iter()`` gives a :class:`~feedline._core.dataset.DatasetIterator`, or a factory of iterators)::

    >>> assert_stage_resumes(FileSource(spec, 0, seed=0, shuffle_splits=True, epochs=2))  # doctest: +SKIP
"""

from feedline._testing import (
    assert_batches_equal,
    assert_resumes_exactly,
    assert_stage_resumes,
    collect,
    make_corpus,
    same_shape,
    state_shape,
)

__all__ = ["assert_batches_equal", "assert_resumes_exactly", "assert_stage_resumes", "collect", "make_corpus", "same_shape", "state_shape"]
