"""The spec reference (docs/spec.md, the JSON Schema), unknown-key messages, and portable resume."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import feedline
from feedline._cli.commands.spec import registries
from feedline._spec.reference import json_schema, markdown, undocumented
from feedline.errors import SpecError, StateError
from feedline.service import serve_process

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# fixtures, tokenizers and first-use imports are set up once, not once a worker.
pytestmark = pytest.mark.xdist_group("spec_reference")

DOC = Path(__file__).resolve().parents[1] / "docs" / "spec.md"


def test_docs_spec_md_is_generated_from_the_dataclasses() -> None:
    tasks, batchers = registries()
    assert DOC.read_text(encoding="utf-8") == markdown(tasks, batchers), (
        "docs/spec.md is out of date: regenerate it with `python -m feedline spec > docs/spec.md`")


def test_every_spec_field_has_a_description() -> None:
    tasks, batchers = registries()
    assert undocumented(tasks, batchers) == [], "add these fields to their class's 'Attributes:' docstring section"


def test_reference_names_every_key_with_its_default() -> None:
    tasks, batchers = registries()
    text = markdown(tasks, batchers)
    for key, default in [("epochs", "`1`"), ("remainder", "`drop`"), ("buffer", "`10000`"), ("window", "`1000`"),
                         ("stopping", "`all_exhausted`"), ("mlm_probability", "`0.15`")]:
        assert any(line.startswith(f"| `{key}` |") and default in line for line in text.splitlines()), key


@pytest.fixture(scope="module")
def validator():  # type: ignore[no-untyped-def]
    jsonschema = pytest.importorskip("jsonschema")
    schema = json_schema(*registries())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _spec(**over: object) -> dict[str, object]:
    return {"sources": [{"path": "corpus/*.jsonl"}], "tokenizer": "tok.json", "task": {"kind": "clm", "max_length": 64},
            "batching": {"strategy": "pack", "batch_size": 8}, **over}


@pytest.mark.parametrize("spec", [
    _spec(),
    {k: v for k, v in _spec(source="a.txt").items() if k != "sources"},
    _spec(task="mlm", batching={"batch_size": 4}),
    _spec(task={"kind": "span", "noise_density": 0.15, "max_length": 128}, shuffle=1000, epochs=None),
    _spec(tokenizer={"path": "t.model", "backend": "hf"}, engine="ray", root="s3://bucket/corpus",
          batching={"strategy": "bucket", "batch_size": 4, "remainder": "keep"}),
])
def test_schema_accepts_valid_specs(validator, spec: dict[str, object]) -> None:  # type: ignore[no-untyped-def]
    Spec = feedline.Spec
    errors = [e.message for e in validator.iter_errors(spec)]
    assert errors == []
    if isinstance(spec["task"], dict) and spec["task"].get("kind") == "span":
        return  # span needs a tokenizer with sentinels to load; the schema is what is checked here
    Spec.load(spec)  # the schema accepts what the loader accepts


@pytest.mark.parametrize("bad", [
    _spec(batching={"strategy": "pad", "batch_sise": 8}),
    _spec(task={"kind": "mlm", "max_lenght": 8}),
    _spec(batching={"strategy": "pad", "window": 8}),   # a pack option under pad
    _spec(epochs="two"),
    _spec(shufle=100),
])
def test_schema_refuses_what_the_loader_refuses(validator, bad: dict[str, object]) -> None:  # type: ignore[no-untyped-def]
    assert list(validator.iter_errors(bad))
    with pytest.raises(SpecError):
        feedline.Spec.load(bad)


def test_unknown_key_gets_did_you_mean_and_the_whole_section() -> None:
    with pytest.raises(SpecError) as e:
        feedline.Spec.load(_spec(batching={"strategy": "pack", "batch_sise": 8}))
    msg = str(e.value)
    assert "did you mean 'batch_size'?" in msg
    for key in ("strategy", "batch_size", "remainder", "window"):
        assert key in msg
    with pytest.raises(SpecError, match=r"task.max_lenght: .*did you mean 'max_length'.*kind"):
        feedline.Spec.load(_spec(task={"kind": "mlm", "max_lenght": 8}))


@pytest.mark.slow
def test_cli_spec_schema_and_check(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "feedline", "spec", "--schema"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["title"] == "feedline spec"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_spec(batching={"batch_sise": 3})))
    r = subprocess.run([sys.executable, "-m", "feedline", "spec", "--check", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and "did you mean 'batch_size'" in r.stderr


# ---------------------------------------------------------------- portable resume
def _write_run(where: Path, corpus: str, tok: str) -> Path:
    shutil.copytree(corpus, where / "corpus", dirs_exist_ok=True)
    spec = {"seed": 3, "sources": [{"path": "corpus/*.jsonl"}], "tokenizer": tok, "shuffle": {"buffer": 16},
            "task": {"kind": "clm", "max_length": 32}, "batching": {"strategy": "pack", "batch_size": 4}}
    (where / "spec.yaml").write_text(yaml.safe_dump(spec))
    return where / "spec.yaml"


def test_file_and_mapping_hash_alike(tmp_path: Path, corpus: str, small_tokenizer: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = _write_run(tmp_path / "run", corpus, small_tokenizer)
    monkeypatch.chdir(tmp_path / "run")
    as_file = feedline.Spec.load(str(path))
    as_dict = feedline.Spec.load(yaml.safe_load(path.read_text()))
    dotted = feedline.Spec.load({**yaml.safe_load(path.read_text()), "sources": [{"path": "./corpus/../corpus/*.jsonl"}]})
    assert as_file.hash() == as_dict.hash() == dotted.hash()
    other = feedline.Spec.load({**yaml.safe_load(path.read_text()), "seed": 4})
    assert other.hash() != as_file.hash()
    # absolute paths written in both: the file's folder does not make them relative
    absolute = {**yaml.safe_load(path.read_text()), "sources": [{"path": str(path.parent / "corpus" / "*.jsonl")}]}
    (path.parent / "abs.yaml").write_text(yaml.safe_dump(absolute))
    assert feedline.Spec.load(str(path.parent / "abs.yaml")).hash() == feedline.Spec.load(absolute).hash()


def test_a_moved_corpus_resumes_exactly(tmp_path: Path, corpus: str, small_tokenizer: str) -> None:
    first = _write_run(tmp_path / "a", corpus, small_tokenizer)
    loader = feedline.Loader(str(first))
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = loader.state_dict()
    rest = [b["input_ids"].tolist() for b in it]
    loader.close()
    assert rest
    moved = tmp_path / "b" / "mnt"
    moved.mkdir(parents=True)
    shutil.move(str(tmp_path / "a"), str(moved / "run"))
    # the spec file moved with its corpus: relative paths, same hash
    again = feedline.Loader(str(moved / "run" / "spec.yaml"), state=state)
    assert [b["input_ids"].tolist() for b in again] == rest
    # a mapping whose root names the new place resumes too; another corpus is refused
    data = yaml.safe_load((moved / "run" / "spec.yaml").read_text())
    again = feedline.Loader({**data, "root": str(moved / "run")}, state=state)
    assert [b["input_ids"].tolist() for b in again] == rest
    with pytest.raises(StateError, match="root"):
        feedline.Loader({**data, "root": str(moved / "run"), "sources": [{"path": "corpus/0*.jsonl"}]}, state=state)


def test_states_of_the_earlier_hash_still_resume(tmp_path: Path, corpus: str, small_tokenizer: str) -> None:
    path = _write_run(tmp_path / "run", corpus, small_tokenizer)
    spec = feedline.Spec.load(str(path))
    current, legacy = spec.accepted_hashes()
    assert current != legacy  # the earlier hash covered the resolved absolute path
    loader = feedline.Loader(spec)
    it = iter(loader)
    next(it)
    state = {**loader.state_dict(), "spec_hash": legacy}
    rest = [b["input_ids"].tolist() for b in it]
    loader.close()
    assert [b["input_ids"].tolist() for b in feedline.Loader(spec, state=state)] == rest


@pytest.mark.slow
def test_serve_process_reads_a_mappings_relative_paths_from_the_working_directory(
        tmp_path: Path, corpus: str, small_tokenizer: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = _write_run(tmp_path / "run", corpus, small_tokenizer)
    monkeypatch.chdir(tmp_path / "run")
    data = yaml.safe_load(path.read_text())
    local = [b["input_ids"].tolist() for b in feedline.Loader(data)]
    with serve_process(data, args=["--heartbeat", "0.5"]) as address:
        remote = feedline.Loader(address, spec=data)
        try:
            assert [b["input_ids"].tolist() for b in remote] == local
        finally:
            remote.close()
