"""``feedline.load_dataset`` in torch's ``DataLoader``: a ``torch.utils.data.IterableDataset`` whose
batches equal ``datasets``' for the same call, in-process and in real worker processes (each
worker reading its own share of the files, as ``datasets`` shares them), and resumable in-process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import feedline
from conftest import shared
from feedline._hf_datasets import IterableDataset
from heavy import lazy, needs
from hf_compare import typed

datasets = lazy("datasets")
torch = lazy("torch")
torchdata = lazy("torch.utils.data")

# On one xdist worker with the other load_dataset modules (--dist loadgroup otherwise spreads the tests over
# every worker): datasets' builders and their imports (pandas for CSV) and the module data are set up once.
# torch warns of more workers than this machine's 2 cores; feedline warns of more workers than files (tested apart)
pytestmark = [needs("datasets", "torch"), pytest.mark.xdist_group("load_dataset"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create"),
              pytest.mark.filterwarnings("ignore:Too many dataloader workers")]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """C4 in five JSON Lines files of uneven sizes; C4 with numbers, booleans and id lists as Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("torch")
    lines = shared("prose", "c4_demo.jsonl").read_text().splitlines()
    parts = []
    for i, (a, b) in enumerate([(0, 40), (40, 100), (100, 150), (150, 220), (220, 300)]):
        p = d / f"c4-{i}.jsonl"
        p.write_text("\n".join(lines[a:b]) + "\n")
        parts.append(str(p))
    rows = [{"text": json.loads(x)["text"], "label": i % 7, "score": i / 3, "ok": i % 2 == 0, "ids": [i, i + 1, i % 5]}
            for i, x in enumerate(lines)]
    pq_path = d / "c4.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pq_path, row_group_size=41)
    return {"jsonl": parts, "parquet": str(pq_path)}


def both(builder: str, files: Any, **kw: Any) -> tuple[Any, Any]:
    return (feedline.load_dataset(builder, data_files=files, split="train", **kw),
            datasets.load_dataset(builder, data_files=files, split="train", streaming=True, **kw))


def texts(batch: dict[str, Any]) -> list[str]:
    """A collate_fn as people write them: the rows' texts, uppercased."""
    return [r["text"].upper() for r in batch]  # type: ignore[index]


def cases(data: dict[str, Any]) -> list[tuple[str, Any, dict[str, Any]]]:
    return [("json", data["jsonl"], {}), ("parquet", data["parquet"], {}),
            ("csv", str(shared("classification", "banking77", "train.tsv")), {"sep": "\t"}),
            ("text", str(shared("prose", "botchan.txt")), {})]


@pytest.mark.parametrize("case", range(4))
@pytest.mark.slow
def test_dataloader_batches_equal_datasets(data: dict[str, Any], case: int) -> None:
    builder, files, kw = cases(data)[case]
    ds, hf = both(builder, files, **kw)
    assert isinstance(ds, torch.utils.data.IterableDataset) and isinstance(ds, IterableDataset)
    for fmt in (None, "torch"):
        a, b = ds.with_format(fmt), hf.with_format(fmt)
        got = list(torchdata.DataLoader(a, batch_size=8))
        assert got and typed(got) == typed(list(torchdata.DataLoader(b, batch_size=8))), (builder, fmt)
        if builder != "parquet" or fmt is None:  # datasets' torch rows of a list column are tensors, texts() fits any
            assert list(torchdata.DataLoader(a, batch_size=8, collate_fn=texts)) == list(torchdata.DataLoader(b, batch_size=8,
                                                                                            collate_fn=texts))


def test_torch_format_gives_tensors_that_default_collate_stacks(data: dict[str, Any]) -> None:
    ds = feedline.load_dataset("parquet", data_files=data["parquet"], split="train").with_format("torch")
    row = next(iter(ds))
    assert row["label"].dtype == torch.int64 and row["score"].dtype == torch.float32 and row["ok"].dtype == torch.bool
    assert row["ids"].tolist() == [0, 1, 0] and isinstance(row["text"], str)
    batch = next(iter(torchdata.DataLoader(ds, batch_size=8)))
    assert batch["ids"].shape == (8, 3) and batch["label"].shape == (8,) and len(batch["text"]) == 8
    assert typed(batch) == typed(torchdata.default_collate([r for r, _ in zip(ds, range(8), strict=False)]))


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.slow
def test_workers_read_their_own_files_as_datasets_does(data: dict[str, Any], workers: int) -> None:
    ds, hf = both("json", data["jsonl"])
    got = list(torchdata.DataLoader(ds, batch_size=8, num_workers=workers))
    assert typed(got) == typed(list(torchdata.DataLoader(hf, batch_size=8, num_workers=workers)))
    # the same rows as one process reads, none twice, none lost
    assert Counter(t for b in got for t in b["text"]) == Counter(r["text"] for r in ds)
    assert sum(len(b["text"]) for b in got) == 300
    # methods: per worker, as datasets (take/skip counts split among the workers, indices per worker)
    def chain(d: Any) -> Any:
        d = d.filter(lambda r: len(r["text"]) % 3 != 0).map(lambda r, i: {"i": i, "n": len(r["text"])},
                                                             with_indices=True)
        return d.skip(7).take(150).with_format("torch")
    got = list(torchdata.DataLoader(chain(ds), batch_size=8, num_workers=workers))
    assert typed(got) == typed(list(torchdata.DataLoader(chain(hf), batch_size=8, num_workers=workers)))


@pytest.mark.slow  # a subprocess importing torch, datasets and 3 workers
def test_more_workers_than_files_matches_datasets_and_warns(data: dict[str, Any]) -> None:
    ds, hf = both("json", data["jsonl"][:2])
    got = list(torchdata.DataLoader(ds, batch_size=8, num_workers=3))
    assert typed(got) == typed(list(torchdata.DataLoader(hf, batch_size=8, num_workers=3)))
    assert sum(len(b["text"]) for b in got) == 100
    # the warning, as a user's script shows it (pytest keeps a worker's warnings to itself)
    script = ("import feedline, sys; from torch.utils.data import DataLoader\n"
              "ds = feedline.load_dataset('json', data_files=sys.argv[1:], split='train')\n"
              "print(sum(len(b['text']) for b in DataLoader(ds, batch_size=8, num_workers=3)))\n")
    out = subprocess.run([sys.executable, "-W", "ignore:This DataLoader", "-c", script, *data["jsonl"][:2]],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["100"], out.stderr
    assert "Too many dataloader workers: 3 (max is dataset.n_shards=2): each worker reads its own data files, " \
           "so 1 worker(s) yield nothing (as with datasets)" in out.stderr


@pytest.mark.slow
def test_interleave_in_workers_draws_as_datasets(data: dict[str, Any]) -> None:
    mine = feedline.interleave_datasets([both("json", data["jsonl"][:3])[0], both("json", data["jsonl"][3:])[0]],
                                        probabilities=[0.3, 0.7], seed=3, stopping_strategy="all_exhausted")
    theirs = datasets.interleave_datasets([both("json", data["jsonl"][:3])[1], both("json", data["jsonl"][3:])[1]],
                                          probabilities=[0.3, 0.7], seed=3, stopping_strategy="all_exhausted")
    got = list(torchdata.DataLoader(mine, batch_size=8, num_workers=2))
    assert typed(got) == typed(list(torchdata.DataLoader(theirs, batch_size=8, num_workers=2)))


def test_dataloader_in_process_resumes_from_the_state_dict(data: dict[str, Any], tmp_path: Path) -> None:
    def make() -> Any:
        return feedline.load_dataset("json", data_files=data["jsonl"], split="train").shuffle(seed=1, buffer_size=64)
    full = list(torchdata.DataLoader(make(), batch_size=8))
    ds = make()
    loader = iter(torchdata.DataLoader(ds, batch_size=8))
    head = [next(loader) for _ in range(13)]                            # 104 rows: inside the second file
    (tmp_path / "state.json").write_text(json.dumps(ds.state_dict()))
    resumed = make()
    resumed.load_state_dict(json.loads((tmp_path / "state.json").read_text()))
    assert typed(head + list(torchdata.DataLoader(resumed, batch_size=8))) == typed(full)


@pytest.mark.slow
def test_a_torch_dataset_where_torch_is_a_plain_one_where_it_is_not(data: dict[str, Any]) -> None:
    assert isinstance(feedline.load_dataset("json", data_files=data["jsonl"], split="train"),
                      torch.utils.data.IterableDataset)
    script = ("import sys; sys.modules['torch'] = None\n"                 # torch cannot be imported
              "import feedline\n"
              "ds = feedline.load_dataset('json', data_files=sys.argv[1:], split='train')\n"
              "print(type(ds).__name__, sum(1 for _ in ds.take(120)), 'torch' in sys.modules and bool(sys.modules['torch']))\n")
    out = subprocess.run([sys.executable, "-c", script, *data["jsonl"]], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["IterableDataset", "120", "False"], out.stderr


def test_a_dataset_pickles_as_its_root_and_calls(data: dict[str, Any]) -> None:
    import pickle

    import record_transforms as rt

    ds = feedline.load_dataset("json", data_files=data["jsonl"], split="train").shuffle(seed=2, buffer_size=30)
    other = feedline.load_dataset("parquet", data_files=data["parquet"], split="train").select_columns(["text"])
    mixed = feedline.interleave_datasets([ds.map(rt.tagged).filter(rt.short), other], seed=5,
                                         probabilities=[0.5, 0.5]).skip(3).take(150).with_format("torch")
    rows = list(mixed)
    it = iter(mixed)
    head = [next(it) for _ in range(40)]
    it.close()
    assert typed(list(pickle.loads(pickle.dumps(mixed)))) == typed(rows)   # as iter(): from the start
    mixed.load_state_dict(json.loads(json.dumps(mixed.state_dict())))
    back = pickle.loads(pickle.dumps(mixed))                                # a loaded state travels too
    assert typed(head + list(back)) == typed(rows)


@pytest.mark.slow  # each forkserver worker imports torch: 20-60 s on 2 busy cores
def test_forkserver_workers_unpickle_the_dataset(data: dict[str, Any], tmp_path: Path) -> None:
    """A user's script under forkserver (Python 3.14's default; spawn pickles the same way). It
    preloads torch in the fork server, as such a script would: the two workers fork with torch and
    the script already imported instead of importing them each (the dataset is still unpickled in
    each worker: the fork server never sees it)."""
    import record_transforms as rt

    script = tmp_path / "train.py"
    script.write_text(
        "import sys, feedline, torch\n"
        "def short(row):\n    return len(row['text']) < 2000\n"
        "def tag(row):\n    return {'n': len(row['text'])}\n"
        "if __name__ == '__main__':\n"
        "    torch.multiprocessing.set_forkserver_preload(['torch'])\n"
        "    ds = feedline.load_dataset('json', data_files=sys.argv[2:], split='train').filter(short).map(tag)\n"
        "    dl = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2,\n"
        "                                     multiprocessing_context=sys.argv[1])\n"
        "    got = sorted(int(n) for b in dl for n in b['n'])\n"
        "    print(got == sorted(r['n'] for r in ds), len(got))\n")
    out = subprocess.run([sys.executable, "-W", "ignore:This DataLoader", str(script), "forkserver", *data["jsonl"]],
                         capture_output=True, text=True, timeout=240)
    kept = sum(1 for r in feedline.load_dataset("json", data_files=data["jsonl"], split="train") if rt.short(r))
    assert out.returncode == 0 and out.stdout.split() == ["True", str(kept)], out.stderr[-2000:]
