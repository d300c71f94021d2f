"""``IterableDataset.to_loader``: a dataset's recipe as a :class:`~feedline.Loader` spec.

``map``, ``filter`` and column methods become the spec's record transforms (run in-process);
the other methods have no spec counterpart and are refused. Before the loader is built, the
first row (as the dataset yields it, after its functions) is checked for the ``text`` field, so
a wrong field is one :class:`~feedline.errors.RecordError` naming it and the fields the rows
have, with or without ``map``/``filter`` (not a ``KeyError`` from the task).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from feedline._core.record import get_path
from feedline.errors import RecordError, SpecError

__all__ = ["check_text_field", "to_loader"]


def to_loader(ds: Any, tokenizer: str | None, task: Mapping[str, Any] | str | None,
              batching: Mapping[str, Any] | None, *, text: str | None, rank: int, world_size: int,
              **spec: Any) -> Any:
    """See :meth:`feedline.IterableDataset.to_loader`."""
    from feedline._hf_datasets.roots import FileRoot
    from feedline._loader import Loader

    if getattr(ds.root, "native", True) is False:
        raise SpecError(f"to_loader: load_dataset({ds.root.builder!r}) with {dict(ds.root.options)} reads as datasets' "
                        "builder does, which no spec source expresses; give the Loader a spec (docs/sources.md: "
                        "unit: paragraph | file for text) or drop these options")
    if not isinstance(ds.root, FileRoot):
        raise SpecError("to_loader: an interleaved dataset has no spec; give the Loader a spec with several "
                        "sources and mix weights instead")
    transforms = []
    for op in ds.ops:
        if op.row_fn is None:
            raise SpecError(f"to_loader: {op.kind}() has no counterpart in a spec; the loader takes map, filter "
                            "and column methods (one row in, at most one out) and a shuffle called first")
        transforms.append({"filter" if op.kind == "filter" else "map": _record_fn(op)})
    check_text_field(ds, text)
    full: dict[str, Any] = {**ds.root.spec(ds.epoch), **spec}
    full["sources"] = [{**s, "text": text} for s in full["sources"]]
    if transforms:  # the rows reach the functions as datasets gives them; the text field is read after
        if text not in (None, "text"):
            transforms.append({"map": _text_from(text)})
        full["transforms"] = transforms
        full["sources"] = [{**s, "text": None} for s in full["sources"]]
    if tokenizer is not None:
        full["tokenizer"] = tokenizer
    if task is not None:
        full["task"] = {"kind": task} if isinstance(task, str) else dict(task)
    if batching is not None:
        full["batching"] = dict(batching)
    return Loader(full, rank=rank, world_size=world_size)


def check_text_field(ds: Any, text: str | None) -> None:
    """Refuse, in one line, a ``text`` field the dataset's first row lacks (nothing to check for ``None``)."""
    if text is None:
        return
    it = iter(ds.stage())
    try:
        first = it.take(1)
    finally:
        it.close()
    if not first:
        return  # no row: the loader says so
    row = first[0].data
    try:
        get_path(row, text)
        return
    except KeyError:
        pass
    path = ds.root.files[first[0].key[0]] if first[0].key[0] < len(ds.root.files) else ""
    have = ", ".join(sorted(row)[:12]) or "no fields"
    strings = sorted((k for k in row if isinstance(row[k], str) and row[k].strip()), key=lambda k: -len(row[k]))
    hint = f"to_loader(text={strings[0]!r})" if strings else "to_loader(text='field')"  # the longest text first
    raise RecordError(f"to_loader: the rows have no field {text!r}; they have: {have}; pass text= naming the "
                      f"field holding the text, e.g. {hint} (text=None keeps rows whole, for chat)",
                      path=path, reason="missing_field")


def _record_fn(op: Any) -> Callable[[dict[str, Any]], Any]:
    fn = op.row_fn
    assert fn is not None

    def one(record: dict[str, Any]) -> Any:
        rows = fn([record], 0)
        return bool(rows) if op.kind == "filter" else rows[0]

    one.__qualname__ = op.describe  # what the spec hashes
    one.__module__ = "feedline.load_dataset"
    return one


def _text_from(field: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def text(record: dict[str, Any]) -> dict[str, Any]:
        try:
            return {**record, "text": get_path(record, field)}
        except KeyError:
            have = ", ".join(sorted(record)[:12]) or "no fields"
            raise RecordError(f"no field {field!r} in this row; it has: {have}; pass to_loader(text=...) naming "
                              "the field holding the text", reason="missing_field") from None

    text.__qualname__ = f"text_from({field!r})"
    text.__module__ = "feedline.load_dataset"
    return text
