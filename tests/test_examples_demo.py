"""``feedline demo --task ...``: every task's tiny model trains with falling loss on derived data."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from feedline._demo.run import DEMO_TASKS, run_demo
from feedline._demo.tasks import KEYWORDS, derived_source
from feedline.testing import collect
from heavy import lazy, needs

torch = lazy("torch")
pytestmark = needs("torch")


@pytest.fixture(autouse=True)
def _one_torch_thread():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_every_task_has_a_demo() -> None:
    assert set(DEMO_TASKS) == {"clm", "mlm", "span", "sop", "classify", "multilabel", "chat"}


@pytest.mark.parametrize("task", ["mlm", "sop", "span", "classify", "multilabel", "chat"])
@pytest.mark.slow
def test_demo_loss_falls(task: str) -> None:
    # 20 steps: the mean loss of the last 4 below that of the first 4 by 0.155 (multilabel) to 1.10 (span); at 40 by
    # 0.166 to 2.37 for twice the training
    out = io.StringIO()
    summary = run_demo(task=task, steps=20, seq_len=64, batch_size=8, in_process=True, out=out)
    assert summary.steps == 20
    assert summary.last_loss < summary.first_loss - 0.1, out.getvalue()[-2000:]
    assert "trained" in out.getvalue()


def test_derived_multilabel_rows_match_their_text() -> None:
    """The derived labels really are the keywords in each row's text (so the model can learn them)."""
    import json

    from feedline._demo.corpus import ensure_demo_assets

    src = derived_source("multilabel", str(ensure_demo_assets()[0]))
    rows = [json.loads(x) for x in Path(src["path"]).read_text(encoding="utf-8").splitlines()]
    assert len(rows) > 1000
    for row in rows:
        ids = {int(i) for i in row["labels"].split(",")}
        assert ids == {i for i, w in enumerate(KEYWORDS) if w in row["text"].lower()}


def test_demo_specs_batch_with_the_task_fields(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from feedline._demo.corpus import ensure_demo_assets
    from feedline._demo.tasks import demo_tokenizer

    corpus = str(ensure_demo_assets()[0])
    want = {"sop": "sentence_order_label", "span": "decoder_input_ids", "multilabel": "labels"}
    kinds = {"sop": "wordpiece", "span": "unigram", "multilabel": "wordpiece"}
    for task, field in want.items():
        spec = DEMO_TASKS[task].spec(corpus, demo_tokenizer(kinds[task]), 64, 4)
        import feedline

        batch = collect(feedline.Loader(spec), limit=1)[0]
        assert field in batch, (task, sorted(batch))
    assert batch["labels"].dtype.kind == "f" and batch["labels"].shape == (4, len(KEYWORDS))
