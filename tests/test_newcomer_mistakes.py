"""The mistakes a new user makes first: each is a typed error naming the key path (and, from a file,
its line), a did-you-mean where one is close, and what is allowed; the JSON Schema agrees with the loader."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import feedline
from feedline._cli.commands.spec import registries
from feedline._sources.cache import ObjectCache
from feedline._sources.reader import FORMATS
from feedline._spec.reference import json_schema
from feedline.errors import SpecError, StateError

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# fixtures, tokenizers and first-use imports are set up once, not once a worker.
pytestmark = pytest.mark.xdist_group("newcomer_mistakes")

ROOT = Path(__file__).resolve().parents[1]


def _spec(**over: object) -> dict[str, object]:
    return {"sources": [{"path": "corpus/*.jsonl"}], "tokenizer": "tok.json", "task": {"kind": "clm", "max_length": 64},
            "batching": {"strategy": "pad", "batch_size": 8}, **over}


def _src(**over: object) -> dict[str, object]:
    return _spec(sources=[{"path": "corpus/*.jsonl", **over}])


# (spec, the start of the message, what else it must say)
MISTAKES = [
    (_spec(seeed=1), "seeed: unknown key; did you mean 'seed'?", "allowed: batching"),
    (_src(formt="jsonl"), "sources[0].formt: unknown key; did you mean 'format'?", "split_bytes"),
    (_src(format="jsnl"), "sources[0].format: 'jsnl' is not a format; did you mean 'jsonl'?", "formats: auto,"),
    (_src(weight=0), "sources[0].weight: 0", "must be > 0"),
    (_src(weight="2"), "sources[0].weight: expected a number, got '2'", ""),
    (_src(cache={"dri": "/tmp/c"}), "sources[0].cache.dri: unknown key; did you mean 'dir'?", "allowed: dir, max_bytes"),
    (_src(cache={"dir": "/tmp/c", "max_bytes": 0}), "sources[0].cache.max_bytes: 0 must be >= 1", ""),
    (_src(cache={"dir": "/tmp/c", "max_bytes": "1GB"}), "sources[0].cache.max_bytes: expected an integer", ""),
    (_src(hf="x"), "sources[0]: a source needs exactly one of 'path', 'hf' or 'iterable'", ""),
    (_spec(tokenizer={"path": "t.json", "backnd": "hf"}), "tokenizer.backnd: unknown key; did you mean 'backend'?",
     "allowed: backend, path"),
    (_spec(shuffle={"bufer": 10}), "shuffle.bufer: unknown key; did you mean 'buffer'?", "allowed: buffer, shards"),
    (_spec(shuffle="100"), "shuffle: expected a buffer size (shuffle: 10000)", "false/null (off)"),
    (_spec(mix={"stoping": "cycle"}), "mix.stoping: unknown key; did you mean 'stopping'?", ""),
    (_spec(transforms=[{"mapp": "json:loads"}]), "transforms[0].mapp: unknown key; did you mean 'map'?", "filter, map"),
    (_spec(transforms=[{"map": "json:loads", "filter": "json:loads"}]), "transforms[0]: a transform is one of", ""),
    (_spec(transforms=[{"map": 3}]), "transforms[0].map: expected an import path", ""),
    (_spec(transforms=[{"map": "nopkg_xyz.mod:f"}]), "transforms[0].map: cannot import 'nopkg_xyz.mod'", "PYTHONPATH"),
    (_spec(parallel={"placment": "threads"}), "parallel.placment: unknown key; did you mean 'placement'?", "prefetch"),
    (_spec(parallel="thread"), "parallel.placement: 'thread' is not allowed; did you mean 'threads'?", "'processes'"),
    (_spec(partitions="2"), "partitions: expected an integer, got '2'", ""),
    (_spec(seed="1"), "seed: expected an integer, got '1'", ""),
    (_spec(sources=3), "sources: expected a list of sources, a path or a mapping", ""),
    (_spec(sources=[["a.jsonl"]]), "sources[0]: expected a path or a mapping such as {path: corpus.jsonl", ""),
    (_spec(mix="cycle"), "mix: expected a mapping of options (stopping), got str 'cycle'", ""),
    (_src(cache="/tmp/c"), "sources[0].cache: expected a mapping of options (dir, max_bytes)", ""),
    (_spec(task=["clm"]), "task: expected a kind (task: clm) or a mapping", "got list"),
    (_spec(task={"kind": "clm", "max_lenght": 3}), "task.max_lenght: unknown key; did you mean 'max_length'?",
     "allowed with kind 'clm': kind, max_length"),
    (_spec(batching=4), "batching: expected a mapping such as {strategy: pad, batch_size: 32}", "got int 4"),
    (_spec(batching={"strategy": "pad", "batch_sise": 3}), "batching.batch_sise: unknown key; did you mean 'batch_size'?",
     "strategy, batch_size, remainder"),
    (_spec(batching={"strategy": "pad", "batch_size": "32"}), "batching.batch_size: expected an integer, got '32'", ""),
]


@pytest.mark.parametrize(("spec", "start", "also"), MISTAKES, ids=[m[1].split(":")[0] for m in MISTAKES])
def test_a_mistake_names_its_key_path_and_the_fix(spec: dict[str, object], start: str, also: str) -> None:
    with pytest.raises(SpecError) as e:
        feedline.Spec.load(spec)
    assert str(e.value).startswith(start), str(e.value)
    assert also in str(e.value)


def test_a_pathlib_path_is_a_source(tmp_path: Path) -> None:
    spec = feedline.Spec.load(_spec(sources=[tmp_path / "a.jsonl"]))
    assert spec.sources[0].path == str(tmp_path / "a.jsonl")
    assert feedline.Spec.load(_spec(sources=tmp_path / "a.jsonl")).hash() == spec.hash()


@pytest.mark.slow
def test_a_spec_file_error_names_the_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "train.yaml"
    f.write_text("sources:\n  - path: corpus/a.jsonl\n    formt: jsonl\ntask: {kind: clm}\n")
    with pytest.raises(SpecError, match=re.escape(f"{f}:3: sources[0].formt: unknown key; did you mean 'format'?")):
        feedline.Spec.load(f)
    f.write_text("source: corpus/a.jsonl\ntask:\n  kind: clm\n  max_lenght: 3\n")
    with pytest.raises(SpecError, match=re.escape(f"{f}:4: task.max_lenght")):
        feedline.Spec.load(f)
    f.write_text("source: corpus/a.jsonl\ntask: clm\nbatching: {batch_size: 8}\npartitions: 0\n")
    with pytest.raises(SpecError, match=re.escape(f"{f}:4: partitions: 0 must be a positive integer")):
        feedline.Spec.load(f)
    out = subprocess.run([sys.executable, "-m", "feedline", "spec", "--check", str(f)], capture_output=True, text=True)
    assert out.returncode == 2 and f"{f}:4: partitions: 0 must be a positive integer" in out.stderr


def test_a_cache_folder_that_cannot_be_made_is_a_spec_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(SpecError, match=r"cache\.dir: cannot create the cache folder .*file/cache.*to a folder this "
                                        r"process can write"):
        ObjectCache(tmp_path / "file" / "cache", 1 << 20)


def test_a_moved_corpus_written_absolute_is_told_to_write_paths_relative_to_root(tmp_path: Path, corpus: str,
                                                                                 small_tokenizer: str) -> None:
    spec = {"sources": [{"path": corpus}], "tokenizer": small_tokenizer, "task": {"kind": "clm", "max_length": 32},
            "batching": {"strategy": "pad", "batch_size": 4}}
    loader = feedline.Loader(spec)
    next(iter(loader))
    state = loader.state_dict()
    moved = tmp_path / "moved"
    Path(corpus).rename(moved)
    with pytest.raises(StateError, match="written relative to root: and root: names its new place"):
        feedline.Loader({**spec, "sources": [{"path": str(moved)}]}, state=state)


def test_a_root_that_is_not_there_is_named_with_the_spec_field(tmp_path: Path, corpus: str, small_tokenizer: str) -> None:
    """root: naming a missing folder says so (it said the joined source path had no files)."""
    from feedline._sources.scan import scan

    spec = {"root": str(tmp_path / "nowhere"), "sources": ["corpus/*.jsonl"], "tokenizer": small_tokenizer,
            "task": {"kind": "clm", "max_length": 32}, "batching": {"strategy": "pad", "batch_size": 4}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError, match=re.escape(f"root: {tmp_path / 'nowhere'} does not exist; sources[0] "
                                                  "(corpus/*.jsonl) is read relative to it: set the spec's root:")):
        next(iter(feedline.Loader(str(tmp_path / "spec.yaml"))))
    (tmp_path / "afile").write_text("")
    with pytest.raises(SpecError, match=r"root: .*afile is not a folder"):
        scan(feedline.Spec.load({**spec, "root": str(tmp_path / "afile")}))
    assert next(iter(feedline.Loader({**spec, "root": str(Path(corpus).parent)})))  # the right root reads


def test_a_missing_relative_tokenizer_path_names_where_it_was_looked_for(tmp_path: Path, corpus: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative tokenizer: path missing under the spec's folder names that path; an org/name-like
    one names it too beside the hub's answer (it was a bare hub error)."""
    from feedline.errors import TokenizerError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = tmp_path / "run"
    run.mkdir()
    base = {"sources": [corpus], "task": {"kind": "clm", "max_length": 32}, "batching": {"strategy": "pad", "batch_size": 4}}
    for written, says in [("tok/tokenizer.json", "no such file or folder: "), ("./spiece.model", "no such file or folder: "),
                          ("tokenizers/gpt2", "not a local folder (")]:
        (run / "spec.yaml").write_text(yaml.safe_dump({**base, "tokenizer": written}))
        with pytest.raises(TokenizerError) as e:
            next(iter(feedline.Loader(str(run / "spec.yaml"))))
        where = str(run / Path(written))
        assert str(e.value).startswith(f"tokenizer: {written}: {says}{where}"), str(e.value)
        assert "read from the spec's root:, else the spec file's folder" in str(e.value)


# ------------------------------------------------------------------ the JSON Schema agrees with the loader
@pytest.fixture(scope="module")
def validator():  # type: ignore[no-untyped-def]
    jsonschema = pytest.importorskip("jsonschema")
    return jsonschema.Draft202012Validator(json_schema(*registries(), sorted(FORMATS)))


@pytest.mark.parametrize("spec", [
    _spec(parallel="processes", partitions=2), _spec(parallel={"placement": "threads", "prefetch": 2}),
    _spec(parallel=None, mix=None, transforms=None),
    _spec(transforms=[{"filter": "json:loads"}, {"map": "os.path:basename"}]),
    _src(format="jsonl", cache={"dir": "/tmp/c", "max_bytes": 1 << 30}),
    _spec(task={"kind": "json.decoder:JSONDecoder", "anything": 1}, batching={"batch_size": 1}),
])
def test_schema_accepts_the_shorthands_the_loader_accepts(validator, spec: dict[str, object]) -> None:  # type: ignore[no-untyped-def]
    assert [e.message for e in validator.iter_errors(spec)] == []
    if not (isinstance(spec["task"], dict) and ":" in str(spec["task"]["kind"])):
        feedline.Spec.load(spec)


@pytest.mark.parametrize("bad", [m[0] for m in MISTAKES if m[1].split(":")[0] not in (
    "transforms[0].map", "sources[0]")] + [  # an import that fails, a cross-key rule: the loader's alone
    _spec(sources=[]), _spec(epochs=0), _spec(shuffle={"buffer": -1}), _spec(batching={"batch_size": 0}),
    _spec(transforms=[{}]), _spec(transforms=[{"map": "no_colon"}]), _spec(task="clmm"),
    _spec(batching={"strategy": "pak", "batch_size": 3}), _spec(parallel={"num_cpus": 0}),
])
def test_schema_refuses_what_the_loader_refuses(validator, bad: dict[str, object]) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError):
        feedline.Spec.load(bad)
    assert list(validator.iter_errors(bad)), "the schema accepts a spec the loader refuses"


def _doc_specs() -> list[tuple[str, dict[str, object]]]:
    keys = set(json_schema(*registries())["properties"])
    out = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```ya?ml\n(.*?)```", doc.read_text(encoding="utf-8"), re.S):
            data = yaml.safe_load(block)
            if isinstance(data, dict) and data and set(data) <= keys:
                out.append((doc.name, data if "source" in data or "sources" in data else {**_spec(), **data}))
    return out


def test_schema_accepts_every_spec_in_the_docs(validator) -> None:  # type: ignore[no-untyped-def]
    specs = _doc_specs()
    assert len(specs) >= 5
    bad = {f"{name}: {json.dumps(s)[:80]}": [e.message for e in validator.iter_errors(s)] for name, s in specs}
    assert {k: v for k, v in bad.items() if v} == {}


# ------------------------------------------------------------------ load_dataset habits gone wrong
def test_load_dataset_mistakes_name_the_fix(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(5)))
    t0 = time.monotonic()
    with pytest.raises(SpecError, match=r"load_dataset\('jsonl'\): not a packaged builder; did you mean 'json'\?"):
        feedline.load_dataset("jsonl", data_files=str(f), split="train")
    assert time.monotonic() - t0 < 5  # refused here, not after retries against the hub
    with pytest.raises(SpecError, match=r"split 'tran' not found; did you mean 'train'\?.*give \{split: paths\}"):
        feedline.load_dataset("json", data_files=str(f), split="tran")

    def boom(row: dict[str, object]) -> dict[str, object]:
        raise KeyError("title")

    with pytest.raises(KeyError) as e:  # the function's own exception, as datasets raises it ...
        list(feedline.load_dataset("json", data_files=str(f), split="train").skip(2).map(boom))
    if sys.version_info >= (3, 11):  # ... told where (exception notes)
        assert any("boom" in n and "row 0 of its input" in n for n in e.value.__notes__)


def test_spec_check_checks_the_streams_overrides_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from feedline._cli.commands import spec as spec_command

    f = tmp_path / "serve.yaml"
    f.write_text("sources: [a.jsonl]\ntask: clm\nstreams:\n  validation: {sources: [b.jsonl], epochs: 1}\n")
    assert spec_command.run(argparse.Namespace(check=str(f), schema=False, markdown=False, no_data=True)) == 0
    out = capsys.readouterr().out
    assert "valid;" in out and "streams validation" in out
    f.write_text("sources: [a.jsonl]\ntask: clm\nstreams:\n  validation: {sourcs: [b.jsonl]}\n")
    with pytest.raises(SpecError, match="streams.validation: sourcs: unknown key; did you mean 'sources'"):
        spec_command.run(argparse.Namespace(check=str(f), schema=False, markdown=False, no_data=True))


def test_interleave_refuses_columns_of_different_types_as_datasets_does(tmp_path: Path) -> None:
    (tmp_path / "s.jsonl").write_text('{"x": "a", "y": 1}\n{"x": "b", "y": 2}\n')
    (tmp_path / "i.jsonl").write_text('{"x": 1}\n{"x": 2}\n')
    (tmp_path / "n.jsonl").write_text('{"x": null, "z": true}\n')
    a, b, n = (feedline.load_dataset("json", data_files=str(tmp_path / f), split="train")
               for f in ("s.jsonl", "i.jsonl", "n.jsonl"))
    with pytest.raises(SpecError, match=r"column 'x' is Value\('string'\) in datasets\[0\] but Value\('int64'\) in "
                                        r"datasets\[1\].*cast one"):
        feedline.interleave_datasets([a, b])
    rows = list(feedline.interleave_datasets([a, n]))  # a null column and missing ones align (None), as datasets
    assert rows[:2] == [{"x": "a", "y": 1, "z": None}, {"x": None, "y": None, "z": True}]
