"""Real data from ../shared/data: counts against independent counts, Wikipedia markup residue."""

from __future__ import annotations

import bz2
import csv
import gzip
import json
import re
from pathlib import Path

import pytest
import zstandard

from feedline._records import records
from feedline._sources.source import FileSource
from feedline._sources.wikitext import markup_residue
from feedline._spec import SourceSpec

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is absent")


def _all(spec: dict[str, object]) -> list[dict[str, object]]:
    return list(records(spec))


def test_c4_jsonl_count_matches_line_count() -> None:
    p = DATA / "prose" / "c4_demo.jsonl"
    assert len(_all({"sources": [str(p)]})) == sum(1 for ln in p.read_bytes().splitlines() if ln.strip())


def test_pile_zstd_shards_keep_meta_and_report_the_list_text() -> None:
    pile = DATA / "prose" / "pile"
    expected = 0
    for f in sorted(pile.glob("*.jsonl.zst")):
        with zstandard.ZstdDecompressor().stream_reader(f.open("rb")) as r:
            expected += sum(1 for ln in r.read().splitlines() if isinstance(json.loads(ln)["text"], str))
    src = FileSource(SourceSpec(path=str(pile)), 0, seed=0, shuffle_splits=False, epochs=1)
    it = iter(src)
    recs = list(it)
    assert len(recs) == expected
    assert it.rejections.counts == {"not_string": 1}  # lm_dataformat's test document holds a list
    first = next(r for r in recs if "pile_set_name" in r.data.get("meta", {}))
    assert isinstance(first.data["meta"]["pile_set_name"], str)


@pytest.mark.slow
def test_kjv_gzip_lines() -> None:
    p = DATA / "prose" / "kjv_bible_verses.txt.gz"
    with gzip.open(p, "rb") as f:
        expected = sum(1 for ln in f if ln.strip())
    assert len(_all({"sources": [str(p)]})) == expected


@pytest.mark.slow
def test_goemotions_tsv_without_header_matches_the_published_count() -> None:
    p = DATA / "classification" / "goemotions" / "train.tsv"
    recs = _all({"sources": [{"path": str(p), "columns": ["text", "labels", "id"], "header": False}]})
    assert len(recs) == 43410  # the dataset card's train size
    assert sum(1 for r in recs if "," in str(r["labels"])) == 7102


@pytest.mark.slow
def test_banking77_quoted_multiline_rows_match_the_csv_module() -> None:
    p = DATA / "classification" / "banking77" / "train.tsv"
    with p.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    recs = _all({"sources": [str(p)]})
    assert [(r["text"], r["label"]) for r in recs] == [(r["text"], r["label"]) for r in rows]
    assert any("\n" in r["text"] for r in recs)


def test_chat_json_array_and_sharegpt_layouts_are_kept() -> None:
    kto = _all({"sources": [{"path": str(DATA / "chat" / "llama_factory" / "kto_en_demo.json"), "text": None}]})
    assert kto and all("messages" in r and "label" in r for r in kto)
    tools = _all({"sources": [{"path": str(DATA / "chat" / "llama_factory" / "glaive_toolcall_en_demo.json"), "text": None}]})
    assert tools and all("conversations" in r for r in tools)


def test_cirrus_bulk_pairs_from_the_real_schema(tmp_path: Path) -> None:
    fixture = json.loads((DATA / "prose" / "cirrus_format" / "cirrussearch_sendData-request-defaults.expected.json").read_text())
    pairs = fixture["data"]
    docs = [d["doc"] for d in pairs[1::2]]
    lines = []
    for i, doc in enumerate(docs):  # the dump layout: index action, then the document
        lines += [{"index": {"_type": "page", "_id": str(100 + i)}}, doc]
    lines += [{"index": {"_id": "999"}}, {**docs[0], "namespace": 2, "title": "User page"}]
    p = tmp_path / "enwiki-20240101-cirrussearch-content.json.gz"
    p.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode()))
    recs = _all({"sources": [str(p)]})
    assert [r["title"] for r in recs] == [d["title"] for d in docs if d["namespace"] == 0]
    assert recs[0]["text"] == docs[0]["text"] and recs[0]["id"] == "100" and recs[0]["namespace"] == 0
    src = FileSource(SourceSpec(path=str(p)), 0, seed=0, shuffle_splits=False, epochs=1)
    first = next(iter(src))
    assert src.fetch([first.key])[first.key]["title"] == recs[0]["title"]


def _wiki_pages(p: Path) -> list[tuple[str, int, bool]]:
    text = bz2.decompress(p.read_bytes()).decode()
    out = []
    for page in re.findall(r"<page>.*?</page>", text, re.DOTALL):
        title = re.search(r"<title>(.*?)</title>", page).group(1)  # type: ignore[union-attr]
        ns = int(re.search(r"<ns>(\d+)</ns>", page).group(1))  # type: ignore[union-attr]
        out.append((title, ns, "<redirect" in page))
    return out


def test_wikipedia_xml_articles_have_no_markup_residue() -> None:
    p = DATA / "prose" / "wikipedia_xml" / "enwiki-table-markup.xml.bz2"
    expected = [t for t, ns, redirect in _wiki_pages(p) if ns == 0 and not redirect]
    recs = _all({"sources": [str(p)]})
    assert [r["title"] for r in recs] == expected
    residue = {k: 0 for k in markup_residue("")}
    for r in recs:
        for k, v in markup_residue(str(r["text"])).items():
            residue[k] += v
    assert residue == {k: 0 for k in residue}, residue
    assert sum(len(str(r["text"])) for r in recs) > 50_000  # text survives cleaning
    assert "Weimar Republic" in str(recs[0]["text"])


def test_wikipedia_xml_plain_dump_splits_and_fetches(tmp_path: Path) -> None:
    p = DATA / "prose" / "wikipedia_xml" / "enwiki-table-markup.xml.bz2"
    plain = tmp_path / "enwiki-pages-articles.xml"
    plain.write_bytes(bz2.decompress(p.read_bytes()))
    src = FileSource(SourceSpec(path=str(plain), split_bytes=1 << 16), 0, seed=0, shuffle_splits=True, epochs=1)
    recs = list(src)
    assert len(src.splits) > 2
    assert sorted(r.data["title"] for r in recs) == sorted(t for t, ns, red in _wiki_pages(p) if ns == 0 and not red)
    assert src.fetch([recs[2].key])[recs[2].key]["title"] == recs[2].data["title"]
