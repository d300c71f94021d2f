"""Offline chat packing: JSONL conversations -> packed rows (Arrow, Parquet, JSONL or msgpack), one file per input.

    >>> report = pack("chats/", "packed/", "Qwen/Qwen2.5-0.5B", 4096)      # doctest: +SKIP
    >>> report["rows"], round(report["efficiency"], 4)                  # doctest: +SKIP
    (5120, 0.9981)

Each input file is streamed through the ``chat`` task (the conversation in ``messages``,
``conversation`` or ``conversations``; rendered with the tokenizer's chat template; labels on
assistant tokens only) and the ``pack`` batcher (online best-fit-decreasing, so memory holds one
window of conversations, never a whole file). Files are packed in parallel, one process per file
up to ``workers`` (default: all cores). Each output row holds, without padding:

* ``input_ids``: the packed conversations, at most ``max_length`` tokens;
* ``labels``: -100 except on assistant tokens, and -100 on each conversation's first token;
* ``position_ids``: restarting at 0 for each conversation;
* ``seq_lens``: the length of each conversation in the row (``cu_seqlens`` = 0 + their cumsum).

Arrow output opens with ``datasets.Dataset.from_file``, Parquet with
``datasets.load_dataset("parquet", data_files=...)``. Output is atomic
(:class:`~feedline._tools.output.AtomicOutput`): files are renamed into place when every input is
packed; an output that is an input is refused, and existing output needs ``overwrite=True``.
"""

from __future__ import annotations

import concurrent.futures as cf
import glob
import multiprocessing
import os
from collections.abc import Mapping
from typing import Any

from feedline._batching.base import FillStats
from feedline._core.report import rejected_along
from feedline._pipeline import GlobalStream, Pipeline
from feedline._tools.output import AtomicOutput
from feedline._tools.progress import track
from feedline._tools.writers import FORMATS, Format, RowWriter
from feedline.errors import SourceError, SpecError

__all__ = ["input_files", "pack", "pack_file"]

_INPUT_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".jsonl.bz2", ".jsonl.xz", ".json")


def input_files(path: str) -> list[str]:
    """The ``.jsonl`` files of a folder (sorted), or the one file given.

    Raises:
        SourceError: when the path does not exist or the folder holds no JSONL file.
    """
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise SourceError(f"{path}: no such file or folder; give a .jsonl file or a folder of them")
    found = sorted(f for f in glob.glob(os.path.join(path, "*")) if f.endswith(_INPUT_SUFFIXES) and os.path.isfile(f))
    if not found:
        raise SourceError(f"{path}: the folder holds no .jsonl files (looked for {', '.join(_INPUT_SUFFIXES)})")
    return found


def _stem(path: str) -> str:
    name = os.path.basename(path)
    for suffix in sorted(_INPUT_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def pack_file(input_path: str, output_path: str, tokenizer: str, max_length: int, fmt: Format = "arrow", *,
              window: int = 1000, task: Mapping[str, Any] | None = None, workers: int = 1) -> dict[str, Any]:
    """Pack one JSONL file of conversations into ``output_path``; returns its report.

    Args:
        input_path: a JSONL file (any codec).
        output_path: the file to write.
        tokenizer: a tokenizer path or hub name with a chat template.
        max_length: tokens per packed row (also the chat task's ``max_length``).
        fmt: output format.
        window: the packer's window (see :class:`~feedline._batching.pack.PackOptions`).
        task: extra ``chat`` task options (``system``, ``truncation``, ``chat_template``...).
        workers: tokenizing threads for this file.
    """
    spec = {
        "sources": [{"path": input_path, "text": None}],
        "tokenizer": tokenizer,
        "task": {"kind": "chat", **(task or {}), "max_length": max_length},
        "batching": {"strategy": "pack", "batch_size": 256, "remainder": "keep", "max_length": max_length,
                     "window": window},
        "workers": workers,
    }
    it = iter(GlobalStream(Pipeline(spec)))
    try:
        with RowWriter(output_path, fmt) as writer:
            for _step, batch, _state in track(it, f"pack {os.path.basename(input_path)}", unit="batches"):
                ids, labels, pos, lens = batch["input_ids"], batch["labels"], batch["position_ids"], batch["seq_lens"]
                for r in range(len(ids)):
                    n = int(lens[r].sum())
                    if n:
                        writer.write({"input_ids": ids[r, :n], "labels": labels[r, :n], "position_ids": pos[r, :n],
                                      "seq_lens": lens[r][lens[r] > 0]})
        stats: FillStats = getattr(it.it, "stats")  # noqa: B009 - the pack batcher's iterator
        rejected = rejected_along(getattr(it.it, "parent", None))  # the task's and its sources'
    finally:
        it.close()
    return {"input": input_path, "output": output_path, "rows": writer.rows, "conversations": stats.documents,
            "tokens": stats.tokens, "efficiency": stats.tokens / (writer.rows * max_length) if writer.rows else 0.0,
            "rejected": rejected}


def _quiet_worker() -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per file already uses every core


def pack(input_path: str, output: str, tokenizer: str, max_length: int, fmt: Format = "arrow", *,
         workers: int | None = None, window: int = 1000, task: Mapping[str, Any] | None = None,
         overwrite: bool = False) -> dict[str, Any]:
    """Pack every input file into its own output file, files in parallel; returns a summary report.

    ``output`` is a folder (created) receiving ``<input stem>.<format>`` per input; for a single
    input file, an ``output`` ending in the format's suffix is the output file itself.

    Raises:
        SpecError: for a bad format or length, an output that is an input, or existing output
            without ``overwrite``; SourceError for missing inputs.
    """
    if fmt not in FORMATS:
        raise SpecError(f"format {fmt!r} is not supported; choose one of {', '.join(FORMATS)}")
    if max_length < 2:
        raise SpecError(f"max_length {max_length} must be >= 2")
    files = input_files(input_path)
    if len(files) == 1 and output.endswith(FORMATS[fmt]) and not os.path.isdir(output):
        out = AtomicOutput(os.path.dirname(os.path.abspath(output)), overwrite=overwrite,
                           files=[os.path.basename(output)], inputs=files, what="pack")
        names = [os.path.basename(output)]
    else:
        names = [_stem(f) + FORMATS[fmt] for f in files]
        if len(set(names)) != len(names):
            raise SpecError(f"{input_path}: several inputs share a name stem; their outputs would collide")
        out = AtomicOutput(output, overwrite=overwrite, inputs=files, what="pack", patterns=(f"*{FORMATS[fmt]}",))
    with out:
        targets = [out.temp(n) for n in names]
        procs = max(1, min(len(files), workers or os.cpu_count() or 1))
        if procs == 1:
            reports = [pack_file(f, t, tokenizer, max_length, fmt, window=window, task=task, workers=workers or 0)
                       for f, t in zip(files, targets)]
        else:
            ctx = multiprocessing.get_context("spawn")
            with cf.ProcessPoolExecutor(procs, mp_context=ctx, initializer=_quiet_worker) as pool:
                futures = [pool.submit(pack_file, f, t, tokenizer, max_length, fmt, window=window, task=task, workers=1)
                           for f, t in zip(files, targets)]
                reports = [f.result() for f in futures]
        out.publish(names)
    for r, n in zip(reports, names):
        r["output"] = os.path.join(out.directory, n)
    rows = sum(r["rows"] for r in reports)
    tokens = sum(r["tokens"] for r in reports)
    rejected: dict[str, int] = {}
    for r in reports:
        for k, v in r["rejected"].items():
            rejected[k] = rejected.get(k, 0) + v
    return {"files": reports, "rows": rows, "tokens": tokens, "conversations": sum(r["conversations"] for r in reports),
            "efficiency": tokens / (rows * max_length) if rows else 0.0, "rejected": rejected, "processes": procs}
