"""Shared helpers of the benchmark scripts: corpora, meters, tables, JSON results and plots.

    >>> corpus = prose_corpus(100)              # doctest: +SKIP
    >>> meter = Meter(); meter.batch(4096)      # doctest: +SKIP

Corpora are real text (C4 web documents and Wikipedia articles from ``../shared/data/prose``)
repeated until they reach the requested size, written as JSONL files of at most 64 MB under
``/tmp/feedline-bench`` (never committed). Repetition is said in every table: the tokenizer sees
the same words again, which helps every contender's word cache equally.
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    import psutil
except ImportError:  # a bare GPU node (bench/gpu_node.py): process-tree meters unavailable, the rest works
    psutil = None

ROOT = Path(__file__).resolve().parents[1]
# FEEDLINE_BENCH_DATA: the real data elsewhere (bench/gpu_node.py --data-root sets it for its child processes)
DATA = Path(os.environ.get("FEEDLINE_BENCH_DATA") or ROOT.parent / "shared" / "data")
CORPORA = Path(os.environ.get("FEEDLINE_BENCH_DIR", "/tmp/feedline-bench"))
# Where results and plots go: outside the checkout unless FEEDLINE_BENCH_OUT=commit (bench/run.py
# --update), so a trial run never overwrites the committed bench/results and docs/img.
_OUT = os.environ.get("FEEDLINE_BENCH_OUT", "")
COMMITTED = _OUT == "commit"
RESULTS = ROOT / "bench" / "results" if COMMITTED else Path(_OUT or CORPORA / "results")
IMG = ROOT / "docs" / "img" if COMMITTED else RESULTS / "img"
GPT2 = DATA / "tokenizers" / "gpt2"
BERT = DATA / "tokenizers" / "bert-base-uncased"
FILE_MB = 64
CORPUS_NOTE = ("real text (300 C4 documents + 30 Wikipedia articles from ../shared/data/prose) "
               "repeated to size, shuffled per repetition")
SHORT_NOTE = ("real short records (KJV verses + C4/Wikipedia text cut at sentence ends into 100-400 characters; "
              "~145 characters, ~35 GPT-2 tokens on average) repeated to size, shuffled per repetition")


def require_data() -> None:
    if not (DATA / "prose" / "c4_demo.jsonl").exists():
        sys.exit(f"bench: the real data directory {DATA} is missing (see ../shared/data/README.md)")


# ------------------------------------------------------------------------------- corpora
def _documents() -> list[str]:
    docs = [json.loads(line)["text"] for line in (DATA / "prose" / "c4_demo.jsonl").open(encoding="utf-8")]
    docs += [line.strip() for line in (DATA / "prose" / "wiki_demo.txt").open(encoding="utf-8") if line.strip()]
    return docs


def prose_corpus(mb: float, files: int | None = None) -> Path:
    """A directory of JSONL files holding ``mb`` megabytes of repeated real text (cached)."""
    return _write_corpus("prose", _documents(), mb, files)


def _write_corpus(name: str, docs: list[str], mb: float, files: int | None) -> Path:
    """``files`` JSONL files (cached) holding ``mb`` megabytes of ``docs``, reshuffled and repeated."""
    require_data()
    files = files or max(2, -(-int(mb) // FILE_MB))
    out = CORPORA / f"{name}-{mb:g}mb-{files}f"
    done = out / ".complete"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs]
    per_file = int(mb * (1 << 20) / files)
    rng = random.Random(0)
    for f in range(files):
        written = 0
        with (out / f"part-{f:03d}.jsonl").open("w", encoding="utf-8") as fh:
            while written < per_file:
                rng.shuffle(lines)
                for line in lines:
                    fh.write(line)
                    written += len(line.encode("utf-8"))
                    if written >= per_file:
                        break
    done.touch()
    return out


def _short_paragraphs() -> list[str]:
    """Real short records (~150 characters, ~40 GPT-2 tokens): KJV verses, and C4/Wikipedia text cut at
    sentence ends into paragraphs of 100-200 characters."""
    import gzip
    import re

    out = []
    with gzip.open(DATA / "prose" / "kjv_bible_verses.txt.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            m = re.match(r"\s+\d+ (.+)", line)
            if m:
                out.append(m.group(1).strip())
    for doc in _documents():
        cur = ""
        for sentence in re.split(r"(?<=[.!?])\s+", doc):
            cur = f"{cur} {sentence}".strip()
            if len(cur) >= 100:
                out.append(cur[:400])
                cur = ""
    return out


def short_corpus(mb: float, files: int | None = None) -> Path:
    """Like :func:`prose_corpus`, of short records (~150 characters): the per-record overhead workload."""
    return _write_corpus("short", _short_paragraphs(), mb, files)


def corpus_files(corpus: Path) -> list[str]:
    return sorted(str(p) for p in corpus.glob("*.jsonl"))


def corpus_bytes(corpus: Path) -> int:
    return sum(os.path.getsize(p) for p in corpus_files(corpus))


# ------------------------------------------------------------------------------- process tree
def tree(pid: int | None = None) -> list[psutil.Process]:
    p = psutil.Process(pid)
    try:
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return [p]


def tree_cpu(pid: int | None = None) -> float:
    """CPU seconds (user + system) of a process, its live descendants and their reaped children."""
    total = 0.0
    for p in tree(pid):
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def tree_rss(pid: int | None = None) -> int:
    total = 0
    for p in tree(pid):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


class RssSampler:
    """Samples the summed RSS of a process tree every ``interval`` seconds; ``peak`` in bytes."""

    def __init__(self, pid: int | None = None, interval: float = 0.05) -> None:
        self.pid, self.interval, self.peak = pid, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, tree_rss(self.pid))
            except psutil.Error:
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# ------------------------------------------------------------------------------- meter
class StopRun(Exception):
    """Raised by :meth:`Meter.batch` when the run's budget (batches, tokens or seconds) is spent."""


class Meter:
    """Counts what reaches the consumer. Call :meth:`start` before building the pipeline.

    ``max_seconds`` counts delivery time after the first batch, so slow starters get the same
    steady window. ``first_batch_s`` is from :meth:`start` to the first batch; the steady rate excludes it
    (tokens after the first batch over the wall time after it). CPU seconds of the process tree
    are sampled every half second of delivery, after the first batch.
    """

    def __init__(self, *, max_batches: int | None = None, max_tokens: int | None = None,
                 max_seconds: float | None = None) -> None:
        self.max_batches, self.max_tokens, self.max_seconds = max_batches, max_tokens, max_seconds
        self.batches = self.tokens = 0
        self.t0 = self.t_first = self.t_end = 0.0
        self.cpu0 = self.cpu_first = self.cpu_last = 0.0
        self.t_cpu = 0.0
        self.tokens_first = self.tokens_last = 0
        self.extra: dict[str, Any] = {}

    def start(self) -> None:
        self.t0, self.cpu0 = time.perf_counter(), tree_cpu()

    def batch(self, tokens: int) -> None:
        now = time.perf_counter()
        self.batches += 1
        self.tokens += int(tokens)
        self.t_end = now
        stop = bool((self.max_batches and self.batches >= self.max_batches)
                    or (self.max_tokens and self.tokens >= self.max_tokens)
                    or (self.max_seconds and self.batches > 1 and now - self.t_first >= self.max_seconds))
        if self.batches == 1:
            self.t_first, self.cpu_first, self.t_cpu, self.tokens_first = now, tree_cpu(), now, self.tokens
        elif stop or now - self.t_cpu >= 0.5:  # sampled: workers and daemons may be gone at the end
            self.cpu_last, self.t_cpu, self.tokens_last = tree_cpu(), now, self.tokens
        if stop:
            raise StopRun

    def finish(self) -> dict[str, Any]:
        steady_s = self.t_end - self.t_first
        steady_tokens = self.tokens - self.tokens_first
        cpu_tokens = self.tokens_last - self.tokens_first
        return {
            "batches": self.batches, "tokens": self.tokens,
            "first_batch_s": self.t_first - self.t0 if self.batches else None,
            "total_s": self.t_end - self.t0,
            "tokens_per_s": steady_tokens / steady_s if steady_s > 0 else None,
            "e2e_tokens_per_s": self.tokens / (self.t_end - self.t0) if self.t_end > self.t0 else None,
            "cpu_s_per_mtok": (self.cpu_last - self.cpu_first) / cpu_tokens * 1e6 if cpu_tokens > 0 else None,
            **self.extra,
        }


# ------------------------------------------------------------------------------- reporting
def machine() -> dict[str, Any]:
    """Where the figures were taken."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for mod in ("feedline", "tokenizers", "datasets", "transformers", "torch", "ray", "litdata", "numpy"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            versions[mod] = None
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1) if psutil else None,
            "python": platform.python_version(), "os": platform.platform(), "load_avg_1m": os.getloadavg()[0],
            "versions": versions, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def fmt(v: Any, spec: str = ",.0f") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def short(v: float | None) -> str:
    """``1.12M``, ``581k``, ``0.83``: a bar label."""
    if v is None:
        return "n/a"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.2f}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.0f}k"
    return f"{v:.3g}"


def add_note(row: dict[str, Any], text: str) -> None:
    """Add ``text`` to a result row's note, after what the note already says."""
    row["note"] = f"{row['note']}; {text}" if row.get("note") else text


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """A Markdown table of ``rows``; ``columns`` are ``(key, header, format spec)``."""
    head = "| " + " | ".join(h for _k, h, _f in columns) + " |"
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"
    body = ["| " + " | ".join(fmt(r.get(k), f) for k, _h, f in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def save_json(name: str, payload: Mapping[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


def load_json(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def bar_plot(name: str, labels: Sequence[str], values: Sequence[float | None], *, title: str, xlabel: str,
             highlight: Iterable[str] = (), note: str = "", log: bool = False,
             second: tuple[str, str, Sequence[float | None]] | None = None) -> Path:
    """A horizontal bar chart saved as ``docs/img/<name>.png``.

    ``second`` is ``(legend of values, legend of second, second values)``: a thinner, lighter
    bar under each main one (e.g. end-to-end beside steady rates).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    hl = set(highlight)
    rev = list(labels)[::-1]
    ys = list(range(len(rev)))
    colors = ["#d62728" if lbl in hl else "#1f77b4" for lbl in rev]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(labels) + 1.6))
    height = 0.4 if second else 0.8
    main_y = [y + (0.2 if second else 0) for y in ys]
    bars = ax.barh(main_y, [v or 0.0 for v in values[::-1]], height=height, color=colors,
                   label=second[0] if second else None)
    for b, v in zip(bars, values[::-1], strict=True):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, " " + short(v), va="center", fontsize=8)
    if second:
        vals2 = list(second[2])[::-1]
        bars2 = ax.barh([y - 0.2 for y in ys], [v or 0.0 for v in vals2], height=height, color=colors, alpha=0.4,
                        label=second[1])
        for b, v in zip(bars2, vals2, strict=True):
            ax.text(b.get_width(), b.get_y() + b.get_height() / 2, " " + short(v), va="center", fontsize=7, color="#444")
        ax.legend(fontsize=8, loc="upper right")
    ax.set_yticks(ys, rev)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.margins(x=0.18)
    if log:
        ax.set_xscale("log")
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="#555")
    fig.tight_layout(rect=(0, 0.04 if note else 0, 1, 1))
    path = IMG / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
