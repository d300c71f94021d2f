"""assert_stage_resumes on every stage: each format family, Mixture, ShuffleBuffer, TaskMap with
each task, each batcher, GlobalStream, RankSlice and Prefetch, restored at every step."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from conftest import shared
from feedline._batching.planner import RankSlice
from feedline._core.prefetch import Prefetch
from feedline._pipeline import GlobalStream, Pipeline
from feedline._sources.source import FileSource
from feedline._spec import SourceSpec
from feedline.testing import assert_stage_resumes, make_corpus, same_shape, state_shape


def _docs(n: int) -> list[dict[str, Any]]:
    return [{"text": f"document {i} " + "word " * (i % 7), "label": i % 3, "id": i} for i in range(n)]


def _write_format(tmp: Path, fmt: str) -> dict[str, Any]:
    docs = _docs(7)
    if fmt == "jsonl":
        (tmp / "a.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs) + "{bad\n")
        (tmp / "b.jsonl.gz").write_bytes(__import__("gzip").compress(b'{"text": "second file"}\n', mtime=0))
        return {"path": str(tmp)}
    if fmt == "json":
        (tmp / "a.json").write_text(json.dumps(docs))
        return {"path": str(tmp / "a.json")}
    if fmt == "text":
        (tmp / "a.txt").write_text("".join(d["text"] + "\n\n" for d in docs))
        return {"path": str(tmp / "a.txt"), "unit": "paragraph"}
    if fmt == "bert":
        (tmp / "a.txt").write_text("".join(d["text"] + ".\nSecond.\n\n" for d in docs))
        return {"path": str(tmp / "a.txt"), "format": "bert"}
    if fmt in ("csv", "tsv"):
        sep = "," if fmt == "csv" else "\t"
        (tmp / f"a.{fmt}").write_text(f"text{sep}label\n" + "".join(f"{d['text']}{sep}{d['label']}\n" for d in docs))
        return {"path": str(tmp / f"a.{fmt}")}
    if fmt in ("parquet", "arrow"):
        import pyarrow as pa

        table = pa.table({"text": [d["text"] for d in docs], "label": [d["label"] for d in docs]})
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, tmp / "a.parquet", row_group_size=3)
        else:
            with pa.ipc.new_file(str(tmp / "a.arrow"), table.schema) as w:
                w.write_table(table)
        return {"path": str(tmp / f"a.{fmt}")}
    if fmt == "cirrus":
        lines = []
        for d in docs:
            lines += [{"index": {"_type": "page", "_id": str(d["id"])}}, {"namespace": 0, "title": f"T{d['id']}", "text": d["text"]}]
        (tmp / "w-cirrussearch-content.json").write_text("".join(json.dumps(x) + "\n" for x in lines))
        return {"path": str(tmp / "w-cirrussearch-content.json"), "format": "cirrus"}
    if fmt == "wikixml":
        pages = "".join(f"  <page>\n    <title>T{d['id']}</title>\n    <ns>0</ns>\n    <id>{d['id']}</id>\n"
                        f"    <revision><text>'''{d['text']}''' [[link|text]].</text></revision>\n  </page>\n" for d in docs)
        (tmp / "dump.xml").write_text(f"<mediawiki>\n{pages}</mediawiki>\n")
        return {"path": str(tmp / "dump.xml")}
    raise AssertionError(fmt)


FORMATS = ["arrow", "bert", "cirrus", "csv", "json", "jsonl", "parquet", "text", "tsv", "wikixml"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_file_source_of_every_format_family_resumes_at_every_step_across_epochs(fmt: str, tmp_path: Path) -> None:
    spec = SourceSpec(**_write_format(tmp_path, fmt))  # type: ignore[arg-type]
    src = FileSource(spec, 0, seed=5, shuffle_splits=True, epochs=2)
    assert assert_stage_resumes(src) >= 10


def _pipeline(tmp: Path, task: dict[str, Any] | None = None, tokenizer: str = "", strategy: str = "pad",
              source: dict[str, Any] | None = None, **extra: Any) -> Pipeline:
    if source is None:
        make_corpus(tmp / "c", files=2, docs=5, max_words=40)
        source = {"path": str(tmp / "c")}
    spec: dict[str, Any] = {"sources": [source, {**source, "weight": 0.5}], "seed": 9, "epochs": 2,
                            "shuffle": {"buffer": 4}, "workers": 1,
                            "batching": {"strategy": strategy, "batch_size": 4, "remainder": "keep"}}
    if tokenizer:
        spec.update(tokenizer=tokenizer, task=task or {"kind": "clm", "max_length": 32})
    spec.update(extra)
    return Pipeline(spec)


def test_mixture_and_shuffle_buffer_resume_at_every_step(tmp_path: Path) -> None:
    p = _pipeline(tmp_path)
    assert assert_stage_resumes(p.mixture) >= 20
    assert assert_stage_resumes(p.records()) >= 20


TASKS = {
    "clm": ("gpt2", {"kind": "clm", "max_length": 24}),
    "mlm": ("bert-base-uncased", {"kind": "mlm", "max_length": 24}),
    "sop": ("bert-base-uncased", {"kind": "sop", "max_length": 32, "segmenter": "lines"}),
    "span": ("t5", {"kind": "span", "max_length": 32}),
    "classify": ("bert-base-uncased", {"kind": "classify", "max_length": 16, "labels": ["0", "1", "2"]}),
    "chat": ("qwen2.5", {"kind": "chat", "max_length": 256}),
    "infer": ("bert-base-uncased", {"kind": "infer", "max_length": 16}),
}


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.slow
def test_task_map_with_every_task_resumes_at_every_step(name: str, tmp_path: Path) -> None:
    tok, task = TASKS[name]
    source = None
    if name == "chat":
        rows = shared("chat", "oasst", "en_100_top_threads.messages.jsonl").read_text().splitlines()[:6]
        (tmp_path / "chat.jsonl").write_text("\n".join(rows) + "\n")
        source = {"path": str(tmp_path / "chat.jsonl"), "text": None}
    elif name == "classify":
        (tmp_path / "l.jsonl").write_text("".join(json.dumps({**d, "label": str(d["label"])}) + "\n" for d in _docs(9)))
        source = {"path": str(tmp_path / "l.jsonl")}
    extra: dict[str, Any] = {"shuffle": None, "epochs": 1} if name == "infer" else {}
    if name == "infer":
        make_corpus(tmp_path / "c", files=2, docs=6, max_words=60)
        source = {"path": str(tmp_path / "c")}
    p = _pipeline(tmp_path, task, str(shared("tokenizers", tok)), source=source, **extra)
    assert assert_stage_resumes(p.examples(), check=2, every=3) >= 3


@pytest.mark.parametrize("strategy", ["pad", "bucket", "pack", "concat"])
@pytest.mark.slow
def test_every_batcher_and_the_stream_stages_resume_at_every_step(strategy: str, tmp_path: Path, small_tokenizer: str) -> None:
    p = _pipeline(tmp_path, {"kind": "clm", "max_length": 16}, small_tokenizer, strategy)
    assert assert_stage_resumes(p.batches(), check=2) >= 5
    if strategy == "pack":
        assert assert_stage_resumes(GlobalStream(p, 2), check=2, every=2) >= 3
        assert assert_stage_resumes(lambda: RankSlice(iter(GlobalStream(p, 2)), 1, 2), check=2, every=2) >= 3
        assert assert_stage_resumes(lambda: Prefetch(iter(GlobalStream(p, 2)), 2), check=2, every=2) >= 3


class _Drifting:
    """A stage whose state gains a key after its first element: the helper must refuse it."""

    def __init__(self) -> None:
        self.i = 0

    def __iter__(self) -> _Drifting:
        return _Drifting()

    def __next__(self) -> int:
        if self.i >= 3:
            raise StopIteration
        self.i += 1
        return self.i

    def get_state(self) -> dict[str, Any]:
        return {"i": self.i, **({"extra": {"x": "y"}} if self.i else {})}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.i = state["i"]

    def close(self) -> None:
        pass


def test_the_helper_catches_a_changing_shape_and_a_wrong_restore() -> None:
    with pytest.raises(AssertionError, match="shape changed after step 1"):
        assert_stage_resumes(_Drifting())

    class OffByOne(_Drifting):
        def __iter__(self) -> OffByOne:
            return OffByOne()

        def get_state(self) -> dict[str, Any]:
            return {"i": self.i}

        def set_state(self, state: Mapping[str, Any]) -> None:
            self.i = state["i"] + 1 if state["i"] else 0

    with pytest.raises(AssertionError, match="after set_state"):
        assert_stage_resumes(OffByOne())
    assert same_shape(state_shape({"rejected": {}, "pos": None}), state_shape({"rejected": {"bad": 1}, "pos": 7}))
    assert not same_shape(state_shape({"buffer": []}), state_shape({"buffer": 3}))
