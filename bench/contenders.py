"""The contenders: one function each, feeding a :class:`~common.Meter` the tokens each batch delivers.

Every contender runs in its own fresh process (see ``throughput.measure``), reads the same JSONL
corpus with the same tokenizer, and is configured the way its own documentation recommends:

- ``raw``: ``tokenizers.Tokenizer.encode_batch_fast`` on texts already in memory, 1,000 texts a
  call, issued from one thread ahead of the consumer (each call fans out over every core on
  Rayon; one calling thread measured faster than two or four), ids never converted to Python:
  the CPU's limit for tokenization alone (no reading, no batching).
- ``feedline``: ``feedline.Loader(spec)`` in the consumer's process.
- ``feedline-window100``: the same with ``batching.window: 100`` (the packer's first window is what
  the first batch waits for; 1,000 is the default).
- ``feedline-hf``: the same with ``tokenizer: {backend: hf}``: the ``tokenizers`` encoder alone
  (``auto`` picks fastokens for GPT-2 and the word cache for BERT).
- ``feedline-service``: ``feedline serve`` in a child process and ``feedline.Loader("tcp://...")``
  in the consumer's process (time to first batch includes starting the server).
- ``hf-stream``: ``datasets`` streaming ``load_dataset("json")`` + batched ``map`` tokenization
  + ``group_texts`` (the ``run_clm.py``/``run_mlm.py`` recipe) + torch ``DataLoader``
  (``num_workers`` = cores) + ``DataCollatorForLanguageModeling``.
- ``hf-offline``: the same recipe without streaming (``map`` with ``num_proc`` = cores writes
  Arrow caches first): the usual offline preprocessing, for time to first batch.
- ``ray-data``: ``ray.data.read_json`` + ``map_batches`` (tokenize + group) + ``iter_batches`` on a
  local instance with all cores.
- ``litdata``: ``litdata.optimize`` (tokenize into chunk files, the LitGPT recipe) then
  ``StreamingDataset`` + ``TokensLoader`` + ``StreamingDataLoader``; conversion is counted.

Tokens delivered are real tokens (``attention_mask`` ones) in the batches the consumer receives.
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from common import BERT, GPT2, Meter, StopRun, corpus_files, prose_corpus, short_corpus

CORES = os.cpu_count() or 1
RAW_THREADS = 1  # one calling thread beat two and four in bench/tuning.py (each call already uses every core)
RAW_TEXT_MB = 64  # the raw encoder's texts in memory (~16 M GPT-2 tokens: a minute of encoding at its rate)


@dataclass(frozen=True)
class Workload:
    """What every contender produces: ``task`` rows of ``length`` tokens, ``batch_size`` rows a batch."""

    task: str  # clm | mlm
    length: int
    batch_size: int
    corpus: str = "prose"  # prose (documents, ~4 KB) | short (records of ~150 characters)

    @property
    def tokenizer_dir(self) -> Path:
        return GPT2 if self.task == "clm" else BERT

    @property
    def name(self) -> str:
        return f"{self.task}-{self.length}" + ("-short" if self.corpus == "short" else "")

    def make_corpus(self, mb: float) -> Path:
        """The workload's corpus of ``mb`` megabytes (cached under ``/tmp/feedline-bench``)."""
        return short_corpus(mb) if self.corpus == "short" else prose_corpus(mb)


WORKLOADS = {
    "clm-1024": Workload("clm", 1024, 16),
    "clm-1024-short": Workload("clm", 1024, 16, corpus="short"),
    "clm-2048": Workload("clm", 2048, 8),
    "mlm-128": Workload("mlm", 128, 64),
}


def feedline_spec(corpus: Path, w: Workload, window: int | None = None, backend: str = "auto") -> dict[str, Any]:
    """The feedline spec of a workload: packed CLM rows (default window, or ``window``), or padded MLM rows."""
    task: dict[str, Any] = ({"kind": "clm", "max_length": w.length} if w.task == "clm"
                            else {"kind": "mlm", "max_length": w.length, "mlm_probability": 0.15})
    batching: dict[str, Any] = {"strategy": "pack" if w.task == "clm" else "pad", "batch_size": w.batch_size}
    if window and w.task == "clm":
        batching["window"] = window
    tokenizer = str(w.tokenizer_dir / "tokenizer.json")
    return {"sources": [{"path": str(corpus), "format": "jsonl"}],
            "tokenizer": tokenizer if backend == "auto" else {"path": tokenizer, "backend": backend},
            "task": task, "batching": batching, "seed": 0}


def real_tokens(mask: Any) -> int:
    return int(np.asarray(mask).sum())


# ------------------------------------------------------------------------------- raw limit
def raw(corpus: Path, w: Workload, meter: Meter) -> None:
    import concurrent.futures as cf
    import json

    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(w.tokenizer_dir / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    texts: list[str] = []
    size = 0
    for path in corpus_files(corpus):  # the first RAW_TEXT_MB: minutes of encoding at its rate
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                texts.append(json.loads(line)["text"])
                size += len(line)
                if size >= RAW_TEXT_MB << 20:
                    break
        if size >= RAW_TEXT_MB << 20:
            break
    chunks = [texts[i:i + 1000] for i in range(0, len(texts), 1000)]

    def count(chunk: list[str]) -> int:  # len() is native: the ids never become Python objects
        return sum(len(e) for e in tok.encode_batch_fast(chunk, add_special_tokens=False))

    meter.extra["note"] = f"texts in memory; encode_batch_fast(1,000 texts) from {RAW_THREADS} thread, Rayon on {CORES} cores"
    meter.start()
    pool = cf.ThreadPoolExecutor(RAW_THREADS)  # the consumer never waits for a call to be issued
    try:
        inflight: list[cf.Future[int]] = []
        for chunk in chunks:  # a bounded number of calls ahead of the consumer, like a prefetch
            inflight.append(pool.submit(count, chunk))
            if len(inflight) > 4:
                meter.batch(inflight.pop(0).result())
        for fut in inflight:
            meter.batch(fut.result())
    finally:  # when the meter stops the run: drop the queued calls (~10 s of encoding nobody counts)
        pool.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------------------------- feedline
def feedline_inprocess(corpus: Path, w: Workload, meter: Meter, window: int | None = None,
                       backend: str = "auto") -> None:
    import feedline  # its own lazy imports (tokenizers, the task) count as startup

    meter.start()
    with feedline.Loader(feedline_spec(corpus, w, window, backend)) as loader:
        for batch in loader:
            meter.batch(real_tokens(batch["attention_mask"]))


def feedline_service(corpus: Path, w: Workload, meter: Meter) -> None:
    import feedline
    from feedline._service.launch import serve_process

    meter.start()
    with serve_process(feedline_spec(corpus, w)) as address:
        meter.extra["server_ready_s"] = _since(meter)
        loader = feedline.Loader(address)
        try:
            for batch in loader:
                meter.batch(real_tokens(batch["attention_mask"]))
        finally:
            loader.close()


def _since(meter: Meter) -> float:
    import time

    return time.perf_counter() - meter.t0


# ------------------------------------------------------------------------------- Hugging Face
def _hf_imports() -> None:
    """Import what the HF recipes use, before the clock starts (imports are not startup work)."""
    import datasets  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401


def _hf_recipe(w: Workload) -> tuple[Any, Callable[..., Any], Callable[..., Any], Any]:
    """Tokenizer, tokenize and group_texts functions, and the collator of HF's run_clm/run_mlm scripts."""
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    tok = AutoTokenizer.from_pretrained(str(w.tokenizer_dir))
    mlm = w.task == "mlm"

    def tokenize(examples: dict[str, list[Any]]) -> Any:
        return tok(examples["text"], return_special_tokens_mask=mlm)

    def group_texts(examples: dict[str, list[Any]]) -> dict[str, list[Any]]:
        concatenated = {k: list(itertools.chain(*examples[k])) for k in examples}  # as run_clm.py
        total = (len(concatenated["input_ids"]) // w.length) * w.length
        return {k: [t[i:i + w.length] for i in range(0, total, w.length)] for k, t in concatenated.items()}

    if not mlm and tok.eos_token is None:  # the gpt2 directory holds no special-tokens map
        tok.eos_token = "<|endoftext|>"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    collator = DataCollatorForLanguageModeling(tok, mlm=mlm, mlm_probability=0.15)
    return tok, tokenize, group_texts, collator


def hf_stream(corpus: Path, w: Workload, meter: Meter) -> None:
    import torch
    from datasets import load_dataset

    _hf_imports()
    meter.start()
    _tok, tokenize, group_texts, collator = _hf_recipe(w)
    ds = load_dataset("json", data_files=corpus_files(corpus), split="train", streaming=True)
    ds = ds.map(tokenize, batched=True, remove_columns=["text"]).map(group_texts, batched=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=w.batch_size, num_workers=CORES, collate_fn=collator)
    meter.extra["config"] = f"streaming, map(batched) + group_texts, DataLoader(num_workers={CORES})"
    for batch in loader:
        meter.batch(real_tokens(batch["attention_mask"]))


def hf_offline(corpus: Path, w: Workload, meter: Meter) -> None:
    import time

    import torch
    from datasets import load_dataset

    _hf_imports()
    cache = tempfile.mkdtemp(prefix="feedline-bench-hf-")
    try:
        meter.start()
        _tok, tokenize, group_texts, collator = _hf_recipe(w)
        ds = load_dataset("json", data_files=corpus_files(corpus), split="train", cache_dir=cache)
        t_loaded = time.perf_counter()
        ds = ds.map(tokenize, batched=True, num_proc=CORES, remove_columns=["text"])
        ds = ds.map(group_texts, batched=True, num_proc=CORES)
        meter.extra["arrow_convert_s"] = t_loaded - meter.t0
        meter.extra["map_s"] = time.perf_counter() - t_loaded
        loader = torch.utils.data.DataLoader(ds, batch_size=w.batch_size, num_workers=CORES, collate_fn=collator, shuffle=True)
        for batch in loader:
            meter.batch(real_tokens(batch["attention_mask"]))
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# ------------------------------------------------------------------------------- Ray Data
@functools.lru_cache(maxsize=2)
def _hf_fast_tokenizer(path: str) -> Any:
    """One tokenizer per Ray worker process (workers are reused across tasks)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=path)


def ray_data(corpus: Path, w: Workload, meter: Meter) -> None:
    import ray
    import ray.data
    import transformers  # noqa: F401

    meter.start()
    ray.init(num_cpus=CORES, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        tok_path = str(w.tokenizer_dir / "tokenizer.json")
        length = w.length

        def tokenize(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            ids = _hf_fast_tokenizer(tok_path)(list(batch["text"]))["input_ids"]
            flat = np.fromiter((t for doc in ids for t in doc), dtype=np.int32)
            n = len(flat) // length
            return {"input_ids": flat[: n * length].reshape(n, length)}

        ds = ray.data.read_json(corpus_files(corpus))
        ds = ds.map_batches(tokenize, batch_size=1000)
        meter.extra["config"] = "read_json + map_batches(tasks; an actor pool of all cores deadlocks the read) + iter_batches"
        for batch in ds.iter_batches(batch_size=w.batch_size, batch_format="numpy"):
            meter.batch(batch["input_ids"].size)
    finally:
        ray.shutdown()


# ------------------------------------------------------------------------------- LitData
def _litdata_tokenize(args: tuple[str, str]) -> Iterator[Any]:
    """LitGPT's prepare step: yield one token tensor (with EOS) per document of one file."""
    import json

    import tokenizers
    import torch

    path, tok_path = args
    tok = tokenizers.Tokenizer.from_file(tok_path)
    eos = tok.token_to_id("<|endoftext|>")
    with open(path, encoding="utf-8") as f:
        while True:
            lines = [line for _, line in zip(range(1000), f, strict=False)]
            if not lines:
                return
            for enc in tok.encode_batch_fast([json.loads(line)["text"] for line in lines]):
                yield torch.tensor([*enc.ids, eos], dtype=torch.int32)


def litdata(corpus: Path, w: Workload, meter: Meter) -> None:
    import time

    import torch  # noqa: F401
    try:
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader, optimize
    except ImportError as e:  # the report says why, not a traceback (see docs/benchmarks.md)
        raise SystemExit(f"not installed ({e}); its wheel requires a CUDA build of torch, so the bench set-up leaves "
                         "it out: pip install --no-deps litdata lightning-utilities boto3") from None

    tmp = tempfile.mkdtemp(prefix="feedline-bench-litdata-")
    out = os.path.join(tmp, "optimized")
    try:
        meter.start()
        tok_path = str(w.tokenizer_dir / "tokenizer.json")
        optimize(fn=_litdata_tokenize, inputs=[(f, tok_path) for f in corpus_files(corpus)], output_dir=out,
                 chunk_bytes="64MB", item_loader=TokensLoader(), num_workers=CORES, mode="overwrite")
        meter.extra["convert_s"] = time.perf_counter() - meter.t0
        ds = StreamingDataset(out, item_loader=TokensLoader(block_size=w.length), shuffle=False)
        loader = StreamingDataLoader(ds, batch_size=w.batch_size, num_workers=CORES)
        meter.extra["config"] = f"optimize(num_workers={CORES}) + StreamingDataset(TokensLoader) + StreamingDataLoader"
        for batch in loader:
            meter.batch(batch.numel())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


CONTENDERS: dict[str, Callable[[Path, Workload, Meter], None]] = {
    "raw": raw,
    "feedline": feedline_inprocess,
    "feedline-window100": functools.partial(feedline_inprocess, window=100),
    "feedline-hf": functools.partial(feedline_inprocess, backend="hf"),
    "feedline-service": feedline_service,
    "hf-stream": hf_stream,
    "hf-offline": hf_offline,
    "ray-data": ray_data,
    "litdata": litdata,
}

LABELS = {
    "raw": "raw tokenizers encode_batch_fast (limit)",
    "feedline": "feedline in-process",
    "feedline-window100": "feedline in-process, pack window 100",
    "feedline-hf": "feedline in-process, backend: hf (tokenizers alone)",
    "feedline-service": "feedline serve -> client process",
    "hf-stream": "HF datasets streaming + DataLoader",
    "hf-offline": "HF datasets map (offline) + DataLoader",
    "ray-data": "Ray Data read_json + map_batches",
    "litdata": "LitData optimize + StreamingDataLoader",
}


def run(name: str, corpus: Path, w: Workload, meter: Meter) -> dict[str, Any]:
    """Run one contender in this process until its corpus or the meter's budget runs out."""
    try:
        CONTENDERS[name](corpus, w, meter)
    except StopRun:
        pass
    return meter.finish()
