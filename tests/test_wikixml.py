"""Wikipedia XML on a real 206-page dump: no markup residue, pages cleaned in parallel processes
give the same records, exact resume.

``tests/data/enwiki-206-pages.xml.bz2`` is gensim's test dump (the first pages of an English
Wikipedia ``pages-articles1`` file: 206 pages, 100 redirects, 106 articles; CC BY-SA, see
``tests/data/README.md``).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

import feedline
from conftest import shared
from feedline._sources import wikixml
from feedline._sources.wikitext import RESIDUE_PATTERNS, markup_residue, wikitext_to_text
from feedline.testing import assert_resumes_exactly

DUMP = str(Path(__file__).parent / "data" / "enwiki-206-pages.xml.bz2")

# Every kind of markup the cleaner must remove, by the name RESIDUE_PATTERNS gives it.
CHECKED = {"[[", "]]", "{{", "}}", "{|", "|}", "|-", "table cell", "''", "<ref>", "<tag>", "file:", "thumb|",
           "interlanguage", "&entity;", "==", "__SWITCH__"}


@pytest.fixture(scope="module")
def articles() -> list[dict]:
    return list(feedline.records({"sources": [DUMP]}))


def test_the_residue_patterns_are_the_listed_ones() -> None:
    assert set(RESIDUE_PATTERNS) == CHECKED


@pytest.mark.slow
def test_no_markup_residue_in_106_real_articles(articles: list[dict]) -> None:
    assert len(articles) == 106
    residue = {k: 0 for k in CHECKED}
    dirty = set()
    for r in articles:
        for k, v in markup_residue(r["text"]).items():
            residue[k] += v
            if v:
                dirty.add(r["title"])
    assert residue == {k: 0 for k in CHECKED}, (residue, sorted(dirty))
    assert sum(len(r["text"]) for r in articles) > 2_500_000  # the prose survives
    by_title = {r["title"]: r["text"] for r in articles}
    # prose the previous (parse-tree) cleaner lost after a template it misread, and captions it kept
    assert "The Alaska Permanent Fund is a constitutionally authorized appropriation" in by_title["Alaska"]
    assert "Front row (left to right)" not in by_title["Animal Farm"]  # a [[File:...]] caption with links
    assert "Bicyclo[1.1.0]butane" not in by_title["Alkane"]  # an [[Image:...]] caption with brackets


def test_no_markup_residue_in_the_table_pages() -> None:
    recs = list(feedline.records({"sources": [str(shared("prose", "wikipedia_xml", "enwiki-table-markup.xml.bz2"))]}))
    assert len(recs) == 5 and all(not any(markup_residue(r["text"]).values()) for r in recs)


@pytest.mark.parametrize(("wikitext", "text"), [
    ("a<ref name=x>note {{cite|y}}</ref> b<ref name=x/> c\n<references />", "a b c"),
    ("{{Infobox|a={{nested|b}}|c=[[d]]}}Text {{{param}}}.", "Text."),
    ('{| class="wikitable"\n|-\n! H\n|-\n| x || y\n{|\n| inner\n|}\n|}\nAfter.', "After."),
    ("[[File:A.jpg|thumb|upright|A [[map]] [of] it]]Text.[[Category:X]][[de:Paris]][[zh-min-nan:Paris]]", "Text."),
    ("<gallery>\nA.jpg|caption\n</gallery>Start <blockquote>quoted ''words''</blockquote>.", "Start quoted words."),
    ("'''''Both''''' [[Paris (France)|]] [[bus]]es [http://x.org label] <span style=a>kept</span>&nbsp;&amp;",
     "Both Paris buses label kept &"),
    ("== Heading ==\n* item\n# step\n__NOTOC__\n<!-- hidden -->Line<br/>next", "Heading\nitem\nstep\n\nLine\nnext"),
    ("Unclosed {{template and text", "Unclosed template and text"),
])
def test_constructs(wikitext: str, text: str) -> None:
    assert wikitext_to_text(wikitext) == text


def _warm_pool(workers: int) -> None:
    pool = wikixml._shared_pool(workers)
    assert pool is not None
    deadline = time.monotonic() + 120
    while pool.ready() is None:
        if pool.failed is not None or time.monotonic() > deadline:
            pytest.skip(f"no parse processes here: {pool.failed}")
        time.sleep(0.05)


@pytest.mark.slow
def test_parse_processes_give_the_same_records(articles: list[dict], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEEDLINE_PARSE_WORKERS", "2")
    _warm_pool(2)
    parser = wikixml.PageParser(DUMP, True, (0,))
    assert parser.workers == 2
    got = list(feedline.records({"sources": [DUMP]}))
    assert got == articles
    # and the pool did the work: a reader over the raw pages submits groups to it
    import bz2

    with bz2.open(DUMP) as f:
        pages = re.findall(rb"<page>.*?</page>", f.read(), re.DOTALL)[:40]
    items = [it for i, p in enumerate(pages) for it in parser.push(i, i + 1, i, i, p)] + list(parser.flush())
    assert parser.pooled >= 4 and [it[3]["title"] for it in items] == [r["title"] for r in articles[:len(items)]]


@pytest.mark.slow
def test_in_thread_parsing(articles: list[dict], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEEDLINE_PARSE_WORKERS", "0")
    assert list(feedline.records({"sources": [DUMP]})) == articles


@pytest.mark.slow
def test_resumes_exactly_with_parse_processes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import bz2

    monkeypatch.setenv("FEEDLINE_PARSE_WORKERS", "2")
    _warm_pool(2)
    with bz2.open(DUMP) as f:
        xml = f.read()
    cut = [m.start() for m in re.finditer(rb"  <page>", xml)][80]  # the first 80 pages (16 articles), plain
    plain = tmp_path / "enwiki-pages-articles.xml"
    plain.write_bytes(xml[:cut] + b"</mediawiki>\n")
    spec = {"sources": [str(plain)], "tokenizer": str(shared("tokenizers", "bert-base-uncased")), "seed": 2,
            "shuffle": {"buffer": 4}, "task": {"kind": "mlm", "max_length": 128},
            "batching": {"strategy": "pad", "batch_size": 32}}
    assert assert_resumes_exactly(spec, every=3, check=2, limit=12) >= 4
