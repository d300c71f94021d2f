"""Wikipedia dumps in other languages (Bulgarian, German, Japanese, Macedonian), written here in the
MediaWiki export format (``<siteinfo><namespaces>`` as the dumps write them): localized file,
image and category links, image options, interlanguage links and behaviour switches leave 0
residue; a dump on one line reads like one with line breaks; splits, fetches and resume are exact.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from xml.sax.saxutils import escape

import pytest

import feedline
from conftest import shared
from feedline._core.record import Rejection
from feedline._sources.reader import Split
from feedline._sources.wikitext import markup_residue
from feedline._sources.wikixml import WikiXmlReader
from feedline._spec import SourceSpec
from feedline.testing import assert_resumes_exactly

NAMESPACES = {
    "bg": {-2: "Медия", -1: "Специални", 0: "", 1: "Беседа", 2: "Потребител", 4: "Уикипедия", 6: "Файл",
           10: "Шаблон", 14: "Категория", 100: "Портал"},
    "de": {-2: "Medium", -1: "Spezial", 0: "", 1: "Diskussion", 2: "Benutzer", 4: "Wikipedia", 6: "Datei",
           10: "Vorlage", 14: "Kategorie", 100: "Portal"},
    "ja": {-2: "メディア", -1: "特別", 0: "", 1: "ノート", 2: "利用者", 4: "Wikipedia", 6: "ファイル",
           10: "Template", 14: "Category", 100: "Portal"},
    # Macedonian is not in the built-in table: only the dump's siteinfo names its namespaces
    "mk": {-2: "Медиум", -1: "Специјална", 0: "", 1: "Разговор", 6: "Податотека", 10: "Шаблон",
           14: "Категорија"},
}

ARTICLES = {
    "bg": ("Григориански календар", """{{Инфобокс календар|име=Григориански календар|изображение=Cal.png}}
'''Григорианският календар''' е [[календар]]ът, въведен от [[Григорий XIII|папа Григорий XIII]] през [[1582]] г.
[[Файл:Gregory XIII.jpg|мини|200px|дясно|Папа Григорий XIII]]
[[Картинка:Calendar 1582.png|мини|Надпис под картинката]]
[[Изображение:Europe map.svg|250px|ляво|Карта на [[Европа]]]]
В [[България]] е приет през 1916 г.<ref>{{цитат уеб|url=http://x.bg|заглавие=Календар}}</ref>
__СЪДЪРЖАНИЕ__
== История ==
* Юлианският календар изостава с десет дни.
<gallery>
Файл:A.jpg|Галерия
</gallery>
Вижте и [[:Категория:Календари|категорията]].

[[Категория:Календари]]
[[Категория:Хронология]]

[[de:Gregorianischer Kalender]]
[[en:Gregorian calendar]]
[[ja:グレゴリオ暦]]
[[zh-min-nan:Gregorius-le̍k]]"""),
    "de": ("Gregorianischer Kalender", """[[Datei:Gregory XIII.jpg|mini|hochkant|Papst [[Gregor XIII.]]]]
[[Bild:Kalender.png|miniatur|links|150px|Ein Kalenderblatt]]
Der '''Gregorianische Kalender''' ist der weltweit gebräuchliche [[Kalender]].
__INHALTSVERZEICHNIS__
== Geschichte ==
Er wurde 1582 von Papst [[Gregor XIII.]] eingeführt.{{Belege fehlen}}
[[Kategorie:Kalender]]
[[Kategorie:Zeitrechnung]]
[[bg:Григориански календар]]
[[en:Gregorian calendar]]"""),
    "ja": ("グレゴリオ暦", """[[ファイル:Gregory XIII.jpg|サムネイル|200px|右|グレゴリウス13世]]
[[画像:Calendar.png|thumb|暦の図]]
'''グレゴリオ暦'''は、現在[[世界]]各国で用いられている[[暦法]]である。
__目次__
== 歴史 ==
[[1582年]]に[[ローマ教皇]][[グレゴリウス13世]]が制定した。{{要出典}}
[[Category:暦]]
[[カテゴリ:暦法]]
[[en:Gregorian calendar]]
[[bg:Григориански календар]]"""),
    "mk": ("Грегоријански календар", """'''Грегоријанскиот календар''' е [[календар]] воведен во 1582 година.
[[Податотека:Gregory XIII.jpg|мини|Папа Григориј XIII]]
[[Категорија:Календари]]
[[en:Gregorian calendar]]"""),
}
PROSE = {"bg": "Григорианският календар е календарът, въведен от папа Григорий XIII през 1582 г.",
         "de": "Der Gregorianische Kalender ist der weltweit gebräuchliche Kalender.",
         "ja": "グレゴリオ暦は、現在世界各国で用いられている暦法である。",
         "mk": "Грегоријанскиот календар е календар воведен во 1582 година."}
# What the issue saw survive on a Bulgarian dump, and its kin in the other languages.
LEFTOVERS = ["мини", "Категория:", "200px", "дясно", "Надпис", "Картинка", "Изображение", "Карта на", "Галерия",
             "Gregorianischer", "Calendar", "グレゴリオ暦", "Kategorie", "miniatur", "hochkant", "Kalenderblatt", "Datei",
             "サムネイル", "ファイル", "画像", "暦の図", "カテゴリ", "Category", "__", "Категорија", "Податотека",
             "Григориј"]


def _leftovers(lang: str, text: str) -> list[str]:
    """The words of :data:`LEFTOVERS` in ``text`` (but not those of the article's own prose)."""
    return [w for w in LEFTOVERS if w in text and w not in PROSE[lang]]


def _page(title: str, ns: int, page_id: int, text: str, redirect: str | None = None) -> str:
    red = f'    <redirect title="{escape(redirect)}" />\n' if redirect else ""
    return (f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{page_id}</id>\n{red}"
            f"    <revision>\n      <id>{page_id + 1000}</id>\n      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
            f'      <text bytes="{len(text.encode())}" xml:space="preserve">{escape(text)}</text>\n'
            f"    </revision>\n  </page>\n")


def dump(lang: str, *, copies: int = 1, siteinfo: bool = True, one_line: bool = False) -> bytes:
    """A MediaWiki export (0.11) of ``copies`` articles plus a category page, a file page and a redirect."""
    names = NAMESPACES[lang]
    ns_xml = "".join(f'      <namespace key="{k}" case="first-letter">{escape(v)}</namespace>\n' if v else
                     f'      <namespace key="{k}" case="first-letter" />\n' for k, v in names.items())
    head = (f'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" '
            f'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" version="0.11" xml:lang="{lang}">\n')
    if siteinfo:
        head += (f"  <siteinfo>\n    <sitename>Wikipedia</sitename>\n    <dbname>{lang}wiki</dbname>\n"
                 f"    <base>https://{lang}.wikipedia.org/wiki/</base>\n    <generator>MediaWiki 1.42.0-wmf.5</generator>\n"
                 f"    <case>first-letter</case>\n    <namespaces>\n{ns_xml}    </namespaces>\n  </siteinfo>\n")
    title, text = ARTICLES[lang]
    pages = [_page(f"{title} {i}" if i else title, 0, 10 + 3 * i, text) for i in range(copies)]
    pages.insert(1, _page(f"{names[14]}:Календари", 14, 5, "Категория за календари. [[Категория:Време]]"))
    pages.insert(1, _page(f"{names[6]}:Gregory XIII.jpg", 6, 6, "Портрет."))
    pages.append(_page(f"{title} (пренасочване)", 0, 7, "#ПРЕНАСОЧВАНЕ [[" + title + "]]", redirect=title))
    xml = (head + "".join(pages) + "</mediawiki>\n").encode()
    # one line: nothing between elements, the text's own line breaks as character references
    return re.sub(rb">\s+<", b"><", xml).replace(b"\n", b"&#10;") if one_line else xml


def _items(path: Path, split_bytes: int | None = None) -> list[tuple[int, int, dict | Rejection]]:
    """Every item of the dump, read whole or in byte ranges of ``split_bytes`` (as a split plan cuts it)."""
    reader = WikiXmlReader(SourceSpec(path=str(path)))
    size = path.stat().st_size
    step = split_bytes or size
    splits = [Split(0, str(path), s, min(s + step, size), size) for s in range(0, size, step)]
    return [(pos, nxt, rec) for sp in splits for pos, nxt, _line, rec in reader.read(sp, sp.start, 0)]


@pytest.mark.parametrize("lang", ["bg", "de", "ja", "mk"])
@pytest.mark.parametrize("one_line", [False, True], ids=["lines", "one-line"])
def test_localized_markup_leaves_no_residue(lang: str, one_line: bool, tmp_path: Path) -> None:
    path = tmp_path / f"{lang}wiki-pages-articles.xml"
    path.write_bytes(dump(lang, copies=2, one_line=one_line))
    assert one_line == (path.read_bytes().count(b"\n") == 0)
    recs = list(feedline.records({"sources": [str(path)]}))
    title = ARTICLES[lang][0]
    assert [r["title"] for r in recs] == [title, f"{title} 1"]  # no category, file or redirect page
    text = recs[0]["text"]
    assert text.startswith(PROSE[lang]), text
    assert {k: v for k, v in markup_residue(text).items() if v} == {}
    assert _leftovers(lang, text) == []
    if lang == "bg":
        assert "Вижте и категорията." in text and "Юлианският календар изостава с десет дни." in text


def test_siteinfo_names_namespaces_the_table_does_not_know(tmp_path: Path) -> None:
    """Macedonian's Категорија is known only from the dump's siteinfo: without it, it stays."""
    with_info, without = tmp_path / "a-pages-articles.xml", tmp_path / "b-pages-articles.xml"
    with_info.write_bytes(dump("mk"))
    without.write_bytes(dump("mk", siteinfo=False))
    assert "Категорија" not in next(iter(feedline.records({"sources": [str(with_info)]})))["text"]
    assert "Категорија:Календари" in next(iter(feedline.records({"sources": [str(without)]})))["text"]


@pytest.mark.parametrize("lang", ["bg", "de", "ja"])
def test_the_built_in_table_covers_dumps_without_siteinfo(lang: str, tmp_path: Path) -> None:
    path = tmp_path / "dump-pages-articles.xml"
    path.write_bytes(dump(lang, siteinfo=False))
    text = next(iter(feedline.records({"sources": [str(path)]})))["text"]
    assert text.startswith(PROSE[lang]) and _leftovers(lang, text) == []
    assert not any(markup_residue(text).values())


def test_one_line_dump_equals_the_line_layout(tmp_path: Path) -> None:
    lines, flat = tmp_path / "lines-pages-articles.xml", tmp_path / "flat-pages-articles.xml"
    lines.write_bytes(dump("bg", copies=5))
    flat.write_bytes(dump("bg", copies=5, one_line=True))
    a, b = _items(lines), _items(flat)
    assert len(a) == 5 and [r for _, _, r in a] == [r for _, _, r in b]
    # positions: the <page> line's start in one, the <page> tag in the other
    data, one = lines.read_bytes(), flat.read_bytes()
    assert [p for p, _, _ in a] == [m.start() for m in re.finditer("  <page>\n    <title>Григориански календар( \\d)?<".encode(), data)]
    assert [p for p, _, _ in b] == [m.start() for m in re.finditer("<page><title>Григориански календар( \\d)?<".encode(), one)]
    assert all(one[n - 7:n] == b"</page>" for _, n, _ in b)


@pytest.mark.parametrize("one_line", [False, True], ids=["lines", "one-line"])
def test_splits_and_fetches_are_exact(one_line: bool, tmp_path: Path) -> None:
    path = tmp_path / "bgwiki-pages-articles.xml"
    path.write_bytes(dump("bg", copies=12, one_line=one_line))
    whole = _items(path)
    for size in (700, 1500, 4096):  # byte ranges that cut pages (and the one line) anywhere
        assert _items(path, split_bytes=size) == whole
    reader = WikiXmlReader(SourceSpec(path=str(path)))
    keys = [p for p, _, _ in whole][::3]
    assert reader.fetch(str(path), keys) == {p: r for p, _, r in whole if p in keys}
    for p, n, _r in whole:  # reading resumes after any page
        rest = [(q, m, s) for q, m, _l, s in reader.read(Split(0, str(path)), n, 0)]
        assert rest == [x for x in whole if x[0] > p]


def test_one_line_dump_resumes_exactly(tmp_path: Path) -> None:
    path = tmp_path / "bgwiki-pages-articles.xml"
    path.write_bytes(dump("bg", copies=24, one_line=True))
    spec = {"sources": [str(path)], "tokenizer": str(shared("tokenizers", "bert-base-uncased")), "seed": 3,
            "shuffle": {"buffer": 4}, "task": {"kind": "mlm", "max_length": 32},
            "batching": {"strategy": "pad", "batch_size": 4}}
    assert assert_resumes_exactly(spec, every=2, check=2) >= 4


@pytest.mark.parametrize("one_line", [False, True], ids=["lines", "one-line"])
def test_a_broken_page_is_rejected_and_reading_goes_on(one_line: bool, tmp_path: Path) -> None:
    xml = dump("de", copies=4, one_line=one_line)
    broken = xml.replace(b"<title>Gregorianischer Kalender 2</title>", b"<title>Gregorianischer Kalender 2</titel>")
    path = tmp_path / "dewiki-pages-articles.xml"
    path.write_bytes(broken)
    items = _items(path)
    assert [r["title"] if isinstance(r, dict) else r.reason for _, _, r in items] == [
        "Gregorianischer Kalender", "Gregorianischer Kalender 1", "bad_xml", "Gregorianischer Kalender 3"]
    bad = items[2][2]
    assert isinstance(bad, Rejection) and "mismatched tag" in bad.detail and (bad.line is not None)
    def brief(got: list) -> list:
        return [(p, n, r.reason if isinstance(r, Rejection) else r) for p, n, r in got]

    assert brief(_items(path, split_bytes=900)) == brief(items)
    # a dump cut inside a page: the pages before it, then `truncated`
    path.write_bytes(xml[:xml.index(b"Gregorianischer Kalender 3") + 10])
    assert [r["title"] if isinstance(r, dict) else r.reason for _, _, r in _items(path)][-2:] == [
        "Gregorianischer Kalender 2", "truncated"]


def test_cirrus_dump_keeps_its_namespaces(tmp_path: Path) -> None:
    """CirrusSearch documents carry plain text and a numeric namespace in every language."""
    docs = [({"index": {"_type": "page", "_id": "10"}},
             {"namespace": 0, "namespace_text": "", "title": "Григориански календар",
              "text": PROSE["bg"], "category": ["Календари"], "language": "bg"}),
            ({"index": {"_type": "page", "_id": "5"}},
             {"namespace": 14, "namespace_text": "Категория", "title": "Календари", "text": "Категория.", "language": "bg"})]
    path = tmp_path / "bgwiki-20240101-cirrussearch-content.json"
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for pair in docs for x in pair), encoding="utf-8")
    recs = list(feedline.records({"sources": [{"path": str(path), "format": "cirrus"}]}))
    assert [(r["title"], r["namespace"], r["id"]) for r in recs] == [("Григориански календар", 0, "10")]
    assert not any(markup_residue(recs[0]["text"]).values())
    both = list(feedline.records({"sources": [{"path": str(path), "format": "cirrus", "namespaces": [0, 14]}]}))
    assert [r["namespace"] for r in both] == [0, 14]
