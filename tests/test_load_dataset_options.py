"""``datasets``' builder options in ``feedline.load_dataset`` (text ``sample_by``, ``keep_linebreaks``,
``encoding``; csv ``na_filter``, ``skiprows`` and the other ``pandas.read_csv`` options; json
``field``): the rows equal ``datasets.load_dataset(..., streaming=True)``'s, values and types, on
real files, and resume exactly from JSON states, in DataLoader workers and through a shuffle.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

import feedline
from conftest import shared
from feedline.errors import SourceError, SpecError
from heavy import lazy, needs
from hf_compare import check, typed

datasets = lazy("datasets")

# On one xdist worker with the other load_dataset modules (--dist loadgroup otherwise spreads the tests over
# every worker): datasets' builders and their imports (pandas for CSV) and the module data are set up once.
pytestmark = [needs("datasets"), pytest.mark.xdist_group("load_dataset")]


def same(builder: str, files: Any, cuts: int = 3, **kw: Any) -> list[Any]:
    """Rows equal datasets' (values and types), and a resume at random rows continues exactly."""
    return check(lambda: feedline.load_dataset(builder, data_files=files, split="train", **kw),
                 datasets.load_dataset(builder, data_files=files, split="train", streaming=True, **kw), cuts=cuts)


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Real prose: Botchan (BOM, CRLF, paragraphs), KJV verses gzip'd, the Bible re-encoded as Latin-1
    and a file of every line ending and run of blank lines."""
    d = tmp_path_factory.mktemp("texts")
    verses = gzip.decompress(shared("prose", "kjv_bible_verses.txt.gz").read_bytes()).decode()[:60_000]
    (d / "latin1.txt").write_bytes(("Café, naïve — " + verses.replace("—", "-")).encode("latin-1", "replace"))
    (d / "verses.txt.gz").write_bytes(gzip.compress(verses.encode()))
    (d / "endings.txt").write_bytes(b"a\r\n\r\nb\rc\n\n\n\nd\n\n\ne\n  \n\nf\n\n")
    return {"botchan": str(shared("prose", "botchan.txt")), "latin1": str(d / "latin1.txt"),
            "gz": str(d / "verses.txt.gz"), "endings": str(d / "endings.txt")}


@pytest.mark.parametrize("options", [{"sample_by": "line", "keep_linebreaks": True}, {"sample_by": "paragraph"},
                                     {"sample_by": "document"}, {"sample_by": "paragraph", "keep_linebreaks": True}])
@pytest.mark.slow
def test_text_sample_by_and_keep_linebreaks_equal_datasets(texts: dict[str, str], options: dict[str, Any]) -> None:
    for name in ("botchan", "gz", "endings"):
        rows = same("text", texts[name], **options)
        assert rows, name
    if options["sample_by"] == "paragraph":  # the KJV's chapters are blank-line separated
        assert len(same("text", [texts["gz"], texts["endings"]], **options)) > 30


def test_text_encoding_equals_datasets(texts: dict[str, str]) -> None:
    rows = same("text", texts["latin1"], encoding="latin-1")
    assert rows[0]["text"].startswith("Café, naïve")
    same("text", texts["latin1"], encoding="latin-1", sample_by="paragraph")
    with pytest.raises(SourceError, match=r"latin1.txt: not utf-8 text .*pass the files' encoding="):
        list(feedline.load_dataset("text", data_files=texts["latin1"], split="train", sample_by="paragraph"))
    doc = feedline.load_dataset("text", data_files=texts["latin1"], split="train", sample_by="document",
                                encoding_errors="replace")
    assert next(iter(doc))["text"].startswith("Caf\ufffd")


@pytest.fixture(scope="module")
def csvs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """GoEmotions (TSV, no header) and banking77 rows as CSV with a preamble, comments and NA-like cells."""
    d = tmp_path_factory.mktemp("csvs")
    lines = shared("classification", "banking77", "train.tsv").read_text().splitlines()[:400]
    out = ["exported 2026-11-28", "# by hand", "text,label,score,note"]
    for i, line in enumerate(x for x in lines[1:] if "\t" in x):
        text, label = line.rsplit("\t", 1)
        score = "" if i % 7 == 0 else "NA" if i % 11 == 0 else str(i / 4)
        note = "null" if i % 5 == 0 else "n/a" if i % 13 == 0 else f"note {i}"
        out.append(f'"{text.replace(chr(34), chr(34) * 2)}",{label},{score},{note}')
    (d / "banking.csv").write_text("\n".join(out) + "\n")
    return {"banking": str(d / "banking.csv"), "go": str(shared("classification", "goemotions", "dev.tsv")),
            "rows": len(out) - 3}


@pytest.mark.parametrize("options", [
    {"skiprows": 2},
    {"skiprows": 2, "na_filter": False},
    {"skiprows": [0, 1], "na_values": ["n/a"], "keep_default_na": False},
    {"comment": "#", "skiprows": 1, "usecols": ["text", "score"], "nrows": 150},
    {"skiprows": 3, "column_names": ["t", "l", "s", "n"], "na_filter": False},
])
def test_csv_pandas_options_equal_datasets(csvs: dict[str, Any], options: dict[str, Any]) -> None:
    rows = same("csv", csvs["banking"], **options)
    assert len(rows) == (150 if "nrows" in options else csvs["rows"]) > 100


@pytest.mark.slow
def test_tsv_without_header_with_skiprows_and_na_filter_equals_datasets(csvs: dict[str, Any]) -> None:
    rows = same("csv", csvs["go"], sep="\t", column_names=["text", "labels", "id"], skiprows=5, na_filter=False)
    assert list(rows[0]) == ["text", "labels", "id"] and len(rows) > 5000


def test_json_field_equals_datasets(tmp_path: Path) -> None:
    rows = [json.loads(x) for x in shared("prose", "c4_demo.jsonl").read_text().splitlines()[:120]]
    for i, r in enumerate(rows):
        r.update({"n": i, "score": i / 3 if i % 2 else i, "tags": [i, i + 1][: i % 3]})
    path = tmp_path / "c4.json"
    path.write_text(json.dumps({"version": "1.0", "data": rows}))
    got = same("json", str(path), field="data")
    assert len(got) == 120 and isinstance(got[1]["score"], float)
    with pytest.raises(SourceError, match=r"field='rows' is not a key of the document \(it has: data, version\)"):
        list(feedline.load_dataset("json", data_files=str(path), split="train", field="rows"))


@pytest.mark.slow
def test_options_in_workers_shuffle_and_refusals(texts: dict[str, str], tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    files = [texts["botchan"], texts["endings"], texts["gz"]]
    mine = feedline.load_dataset("text", data_files=files, split="train", sample_by="paragraph")
    theirs = datasets.load_dataset("text", data_files=files, split="train", streaming=True, sample_by="paragraph")
    got = list(torch.utils.data.DataLoader(mine, batch_size=8, num_workers=2))
    assert typed(got) == typed(list(torch.utils.data.DataLoader(theirs, batch_size=8, num_workers=2)))
    # a shuffle buffer over these rows restores by re-reading them (fetch)
    def make() -> Any:
        return feedline.load_dataset("text", data_files=files, split="train", keep_linebreaks=True).shuffle(
            seed=3, buffer_size=40)
    full = list(make())
    lines = feedline.load_dataset("text", data_files=files, split="train", keep_linebreaks=True)
    assert sorted(r["text"] for r in full) == sorted(r["text"] for r in lines) and full != list(lines)
    ds = make()
    it = iter(ds)
    head = [next(it) for _ in range(4501)]   # into the third file
    state = json.loads(json.dumps(ds.state_dict()))
    it.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + list(resumed) == full
    with pytest.raises(SpecError, match=r"sample_by: 'sentence' is not one of 'line', 'paragraph', 'document'"):
        feedline.load_dataset("text", data_files=files, sample_by="sentence")
    with pytest.raises(SpecError, match=r"unsupported options \['chunk_size'\]; the text builder takes sample_by"):
        feedline.load_dataset("text", data_files=files, sample_by="document", chunk_size=3)
    with pytest.raises(SpecError, match=r"to_loader: load_dataset\('text'\) with \{'sample_by': 'paragraph'\}"):
        mine.to_loader()
    # the reader's defaults spelt out keep feedline's own reader (and its states)
    plain = feedline.load_dataset("text", data_files=files, split="train", sample_by="line", keep_linebreaks=False,
                                  encoding="utf-8")
    assert plain.fingerprint == feedline.load_dataset("text", data_files=files, split="train").fingerprint
