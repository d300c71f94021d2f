"""s3:// sources against a real S3-compatible server (moto's) started here, through a misbehaving proxy."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import feedline
from feedline.errors import SourceError
from heavy import needs
from s3_server import S3Fixture

pytestmark = needs("s3fs", "moto")

BUCKET = "feedline-test-corpus"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Fixture]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    fx = S3Fixture()
    fx.client().create_bucket(Bucket=BUCKET)
    yield fx
    fx.close()


@pytest.fixture(autouse=True)
def _aws_env(s3: S3Fixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """The standard variables every AWS client reads; no instance metadata lookups."""
    import s3fs

    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    s3fs.S3FileSystem.clear_instance_cache()  # credentials are read when a filesystem is made
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def _docs(n: int, tag: str) -> bytes:
    return "".join(json.dumps({"text": f"{tag} document {i}: " + "several words of text " * (1 + i % 9)}) + "\n"
                   for i in range(n)).encode()


def _put(s3: S3Fixture, key: str, body: bytes) -> str:
    s3.client().put_object(Bucket=BUCKET, Key=key, Body=body)
    return f"s3://{BUCKET}/{key}"


def _texts(spec: dict[str, object]) -> list[str]:
    return [r["text"] for r in feedline.records(spec)]


@pytest.mark.slow
def test_records_from_s3_equal_the_same_files_on_disk(s3: S3Fixture, tmp_path: Path) -> None:
    import zstandard

    plain, packed = _docs(300, "plain"), zstandard.ZstdCompressor().compress(_docs(200, "zstd"))
    for name, body in (("a.jsonl", plain), ("b.jsonl.zst", packed)):
        _put(s3, f"same/{name}", body)
        (tmp_path / name).write_bytes(body)
    assert _texts({"sources": [f"s3://{BUCKET}/same/"]}) == _texts({"sources": [str(tmp_path)]})


@pytest.mark.slow
def test_a_prefix_of_2500_objects_is_listed_in_pages(s3: S3Fixture) -> None:
    """More keys than a page holds (1,000), the last page part full: every key, sorted, in one pass."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]  # the server's own store: 2,500 PUTs would take a minute
    for i in range(2_500):
        backend.put_object(BUCKET, f"many/{i:05d}.jsonl", b'{"text": "one"}\n')
    before = len(s3.requests)
    spec = {"sources": [f"s3://{BUCKET}/many/"], "tokenizer": None}
    from feedline._sources.files import expand

    files = expand(spec["sources"][0])  # type: ignore[index]
    assert len(files) == 2_500 and files[0] == f"s3://{BUCKET}/many/00000.jsonl" and files == sorted(files)
    lists = [p for m, p, _ in s3.requests[before:] if "list-type=2" in p]
    assert len(lists) == 3  # 1,000 keys a page, one pass


@pytest.mark.slow
def test_dropped_connections_and_503s_are_retried_without_loss(s3: S3Fixture) -> None:
    body = _docs(2000, "flaky")
    url = _put(s3, "flaky/c.jsonl", body)
    key = f"/{BUCKET}/flaky/c.jsonl"
    s3.fail[key] = 2   # two 503 SlowDown answers
    s3.cut[key] = 2    # two bodies cut in half, connection dropped
    got = _texts({"sources": [url]})
    assert got == [json.loads(x)["text"] for x in body.splitlines()]
    assert len(s3.gets(key)) >= 5 and s3.fail[key] == s3.cut[key] == 0  # every fault was met, and survived


@pytest.mark.slow
def test_a_resume_starts_mid_object_with_a_ranged_request(s3: S3Fixture, small_tokenizer: str) -> None:
    url = _put(s3, "resume/big.jsonl", _docs(3000, "resume"))
    key = f"/{BUCKET}/resume/big.jsonl"
    spec = {"sources": [url], "tokenizer": small_tokenizer, "task": {"kind": "clm", "max_length": 64},
            "batching": {"strategy": "pack", "batch_size": 8}}
    loader = feedline.Loader(spec, prefetch=1)
    it = iter(loader)
    for _ in range(40):
        next(it)
    state = loader.state_dict()
    rest = [b["input_ids"].tolist() for b in it]
    loader.close()
    pos = _find(state["pipeline"], "pos")
    assert rest and pos > 0
    before = len(s3.gets(key))
    again = feedline.Loader(spec, state=state)
    assert [b["input_ids"].tolist() for b in again] == rest
    starts = [int(r.removeprefix("bytes=").split("-")[0]) for r in s3.gets(key)[before:] if r]
    assert pos in starts  # reading went on from the saved byte offset, not from the start of the object


@pytest.mark.slow
def test_a_server_that_ignores_range_is_named_on_resume(s3: S3Fixture, small_tokenizer: str) -> None:
    """A resume from an endpoint that answers every ranged GET with the whole object says the server
    ignored the range request (it said the file changed since the state was saved)."""
    url = _put(s3, "norange/big.jsonl", _docs(3000, "norange"))
    spec = {"sources": [url], "tokenizer": small_tokenizer, "task": {"kind": "clm", "max_length": 64},
            "batching": {"strategy": "pack", "batch_size": 8}}
    with feedline.Loader(spec, prefetch=1) as loader:
        it = iter(loader)
        for _ in range(40):
            next(it)
        state = loader.state_dict()
    s3.ignore_range.add(f"/{BUCKET}/norange/big.jsonl")
    try:
        with pytest.raises(SourceError) as e, feedline.Loader(spec, state=state) as again:
            list(again)
    finally:
        s3.ignore_range.clear()
    assert str(e.value).startswith(f"{url}: the server ignored the range request (asked for bytes ")
    assert "changed" not in str(e.value) and "AWS_ENDPOINT_URL_S3" in str(e.value)


def _find(state: object, key: str) -> int:
    """The first integer under ``key`` in a nested state (the source's byte position)."""
    if isinstance(state, dict) and isinstance(state.get(key), int):
        return int(state[key])
    for v in state.values() if isinstance(state, dict) else state if isinstance(state, list) else ():
        try:
            return _find(v, key)
        except KeyError:
            pass
    raise KeyError(key)


def test_credentials_come_from_the_standard_config_files(s3: S3Fixture, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import s3fs

    url = _put(s3, "creds/a.jsonl", _docs(5, "creds"))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(SourceError, match=r"no credentials.*AWS_ACCESS_KEY_ID.*~/.aws/credentials"):
        _texts({"sources": [url]})
    creds = tmp_path / "credentials"
    creds.write_text("[training]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_PROFILE", "training")
    s3fs.S3FileSystem.clear_instance_cache()
    assert len(_texts({"sources": [url]})) == 5


@pytest.mark.slow
def test_the_local_cache_serves_later_epochs_within_its_bound(s3: S3Fixture, tmp_path: Path) -> None:
    bodies = {f"cached/{i}.jsonl": _docs(400 + i, f"cache{i}") for i in range(3)}
    for k, b in bodies.items():
        _put(s3, k, b)
    size = max(len(b) for b in bodies.values())
    cache = {"dir": str(tmp_path / "cache"), "max_bytes": 2 * size + 10}  # room for two of the three
    spec = {"sources": [{"path": f"s3://{BUCKET}/cached/", "cache": cache}], "epochs": 2}
    direct = _texts({**spec, "sources": [{"path": f"s3://{BUCKET}/cached/"}]})
    before = {k: len(s3.gets(f"/{BUCKET}/{k}")) for k in bodies}
    assert _texts(spec) == direct  # the same records, whichever copy they come from
    fetched = {k: len(s3.gets(f"/{BUCKET}/{k}")) - before[k] for k in bodies}
    assert sorted(fetched.values()) == [1, 1, 2]  # epoch 2 read the two copies made first from disk
    kept = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    assert 1 <= len(kept) <= 2 and sum(p.stat().st_size for p in kept) <= cache["max_bytes"]
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]  # no partial copies left
    # a changed object is fetched again, never served stale
    _put(s3, "cached/0.jsonl", _docs(10, "changed"))
    assert "changed document 0: several words of text " in _texts({**spec, "epochs": 1})


def test_the_cache_is_not_part_of_the_stream_identity() -> None:
    a = feedline.Spec.load({"sources": [{"path": "s3://b/x/"}], "task": "clm", "batching": {"batch_size": 2}})
    b = feedline.Spec.load({"sources": [{"path": "s3://b/x/", "cache": {"dir": "/tmp/c"}}], "task": "clm",
                            "batching": {"batch_size": 2}})
    assert a.hash() == b.hash() and b.sources[0].cache is not None and b.sources[0].cache.max_bytes == 20 << 30


@pytest.mark.slow
def test_cache_on_files_it_never_copies_is_said_once_naming_the_source(
        s3: S3Fixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """cache: on local files or Parquet objects (read by ranged requests) copies nothing: one warning
    per source names it and why, the records are the same; a hub or iterable source refuses it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from feedline._sources import source

    monkeypatch.setattr(source, "_told_uncached", set())
    (tmp_path / "local.jsonl").write_bytes(_docs(20, "local"))
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(30)]}), buf)
    url = _put(s3, "columns/part-0.parquet", buf.getvalue())
    cache = {"dir": str(tmp_path / "cache")}
    spec = {"sources": [{"path": str(tmp_path / "local.jsonl"), "cache": cache}, {"path": url, "cache": cache}],
            "mix": {"stopping": "concat"}}
    with caplog.at_level(logging.WARNING, logger="feedline"):
        assert len(_texts(spec)) == 50 and len(_texts(spec)) == 50
    said = [r.getMessage() for r in caplog.records if "cache: does nothing" in r.getMessage()]
    assert len(said) == 2, said
    assert said[0].startswith(f"sources[0] ({tmp_path / 'local.jsonl'}): cache: does nothing for 1 local file(s)")
    assert said[1].startswith(f"sources[1] ({url}): cache: does nothing for 1 Parquet object(s)")
    assert all("Remove cache: from this source" in m for m in said)
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())
    with pytest.raises(feedline.SpecError, match=r"cache: is for files at URLs.*hf:.*remove cache: from it"):
        feedline.Spec.load({"sources": [{"hf": "some/dataset", "cache": cache}]})


@pytest.mark.slow
def test_a_missing_bucket_is_named_with_what_to_check(s3: S3Fixture) -> None:
    """A bucket the server does not hold: its name, the endpoint asked, and the three things to check
    (it said only "cannot list (The specified bucket does not exist)")."""
    for url in ("s3://no-such-bucket-here/corpus/", "s3://no-such-bucket-here/corpus/a.jsonl"):
        with pytest.raises(SourceError) as e:
            _texts({"sources": [url]})
        assert str(e.value).startswith(f"{url}: bucket 'no-such-bucket-here' does not exist at {s3.endpoint}; ")
        assert all(w in str(e.value) for w in ("bucket's name", "AWS_ENDPOINT_URL_S3", "credentials"))


@pytest.mark.slow
def test_an_interrupted_copy_leaves_nothing(s3: S3Fixture, tmp_path: Path) -> None:
    from feedline._sources.cache import ObjectCache
    from feedline._sources.remote import open_url

    url = _put(s3, "partial/a.jsonl", _docs(500, "partial"))
    cache = ObjectCache(tmp_path / "c", 1 << 30)
    with cache.open(url, lambda: open_url(url)) as f:
        f.read(100)
    assert list((tmp_path / "c").iterdir()) == []
    with cache.open(url, lambda: open_url(url)) as f:
        data = f.read()
    with cache.open(url, lambda: open_url(url)) as f:
        assert isinstance(f, io.BufferedReader) and f.read() == data and cache.hits == 1
