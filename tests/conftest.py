"""Shared test fixtures: the real data beside the repo (skipped cleanly when absent) and small corpora."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewrite_once import pytest_collection  # noqa: F401  (a fresh clone's workers share the assert rewriting)
from xdist_groups import pytest_collection_modifyitems  # noqa: F401  (--dist loadgroup on pytest 9.2)

# One OpenMP thread for torch in the test processes and every process they start (set before any
# test module imports torch): with an xdist worker on each core, torch's default of a thread per
# core left its threads spinning while they waited for a core (15-25 % more CPU in torch-heavy files).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# XLA compiles the JAX tests' steps without its LLVM optimisation passes: their models are tiny, so
# compiling is most of a step's cost (the JAX example, the JAX recipe and test_jax_loader.py 18.6 and
# 18.7 CPU-s with the passes, 15.4 and 14.1 without); the arrays computed are the same operations.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

# The cyclic garbage collector runs a young collection every 100,000 allocations in the test processes,
# not every 700: they hold torch, transformers, datasets ... (0.3-0.5 M objects), and the default
# thresholds brought a full collection every few seconds (~130 ms each). Over six tokenizer-heavy files
# (-n 2) collection took 1.4 CPU s, not 4.2, and the run 5 % less CPU. Cycles are still collected, later.
gc.set_threshold(100_000, 50, 100)
# And so does every Python process the tests start but `feedline serve` (the servers' memory bounds
# see a user's server): subprocess_site/sitecustomize.py, found through PYTHONPATH by the subprocesses.
SUBPROCESS_SITE = str(Path(__file__).resolve().parent / "subprocess_site")
if SUBPROCESS_SITE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SUBPROCESS_SITE, os.environ.get("PYTHONPATH")) if p)


def _start_the_fork_server_with_feedlines_preloads() -> None:
    """The process's one fork server heeds its preloads only when it starts, and a torch
    ``DataLoader`` in a test may start it before any partition worker; set them at once (feedline's
    own modules included: the tests import feedline from where the fork server does)."""
    import feedline._partitions.launch  # noqa: F401  (registers the worker's modules)
    from feedline._core import forkserver

    forkserver.context()


_start_the_fork_server_with_feedlines_preloads()

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TOKENIZERS = SHARED_DATA / "tokenizers"


def shared(*parts: str) -> Path:
    """A path under ``../shared/data``; skips the test when it is absent (a user's clone has none)."""
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"real test data not available: {p}")
    return p


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep feedline's cache (demo corpus, tokenizers) out of the user's home during tests."""
    monkeypatch.setenv("FEEDLINE_CACHE", run_cache_dir(tmp_path_factory))


def run_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One cache a run: xdist workers (basetemp ``.../pytest-N/popen-gwK``) share ``.../pytest-N/feedline-cache``,
    so the demo corpus and the demo/example tokenizers are built once, not once a worker (their builders
    write a temporary and rename it in, so two workers building at once both finish with whole files)."""
    base = tmp_path_factory.getbasetemp()
    run = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return os.environ.get("FEEDLINE_TEST_CACHE") or str(run / "feedline-cache")


@pytest.fixture(scope="session")
def gpt2_path() -> str:
    return str(shared("tokenizers", "gpt2"))


@pytest.fixture(scope="session")
def bert_path() -> str:
    return str(shared("tokenizers", "bert-base-uncased"))


@pytest.fixture(scope="session")
def small_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A byte-level BPE tokenizer trained here on generated text: always available."""
    from feedline._tools.train_tokenizer import train_tokenizer
    from feedline.testing import make_corpus

    d = tmp_path_factory.mktemp("small-tok")
    make_corpus(d / "corpus", files=2, docs=200)
    train_tokenizer([str(d / "corpus")], str(d / "tok"), kind="bpe", vocab_size=400)
    return str(d / "tok")


@pytest.fixture
def corpus(tmp_path: Path) -> str:
    """A 3-file JSONL corpus of 40 documents each; returns its directory."""
    from feedline.testing import make_corpus

    make_corpus(tmp_path / "corpus", files=3, docs=40)
    return str(tmp_path / "corpus")


#: Ray's periodic reports that a test cluster has no reader for (an hour apart: effectively never); with
#: them, each raylet and idle worker used ~20 % more CPU idle (~0.45 CPU-s a minute each).
_RAY_QUIET = {"metrics_report_interval_ms": 3_600_000, "task_events_report_interval_ms": 3_600_000,
              "event_stats": False, "debug_dump_period_milliseconds": 3_600_000}


class _RayCluster:
    """One local Ray cluster for the Ray tests of this process (the xdist group "ray" keeps them on
    one worker): a head and a worker node of one CPU each, as ``ray start`` would run them (two nodes:
    the ray placement spreads its actors over both, and a test loses one; a third node only added a
    raylet, two agents and an idle worker, ~5 CPU-s over the Ray tests).

    Started at the first Ray test and stopped after the last of a run of them (its daemons use
    ~2.5 CPU-s a minute idle, beside the other tests), since each start costs about 6-10 CPU-s.
    Joined by its own address: a bare ``ray.init()`` joins any cluster already running on the
    machine (another test run's) and then fails on ``num_cpus``. Attributes are those of the
    running ``ray.cluster_utils.Cluster``; a test that removes a node adds one back.
    """

    def __init__(self) -> None:
        self._cluster: Any = None

    def start(self) -> Any:
        if self._cluster is None:
            import ray
            from ray.cluster_utils import Cluster

            # no worker processes started ahead of need: a raylet otherwise starts one per CPU when it comes up
            # and when the first driver joins, and most of them are never used (each ~3 CPU-s of imports);
            # and no periodic metrics, task events, event statistics or debug dumps, which no test reads
            config = {"enable_worker_prestart": False, "prestart_worker_first_driver": False, **_RAY_QUIET}
            # no log monitor (~6-10 CPU-s over the Ray tests, tailing every worker's log files to relay
            # their prints to the driver, which no test reads; the files stay in the session's logs folder),
            # and no autoscaler monitor (a fixed local cluster has nothing to scale)
            head = {"num_cpus": 1, "include_dashboard": False, "include_log_monitor": False, "no_monitor": True,
                    "_system_config": config}
            c = Cluster(initialize_head=True, head_node_args=head)
            c.add_node(num_cpus=1)
            c.wait_for_nodes()
            ray.init(address=c.address, include_dashboard=False, configure_logging=False)
            self._cluster = c
        return self._cluster

    def stop(self) -> None:
        if self._cluster is not None:
            import ray

            ray.shutdown()
            self._cluster.shutdown()
            self._cluster = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            # pytest's fixture collection probes every conftest attribute for _mock_name, __wrapped__, ...:
            # delegating those started a cluster (~10 CPU-s and its daemons) in every test process
            raise AttributeError(name)
        return getattr(self.start(), name)


_RAY = _RayCluster()


def _in_ray_group(item: pytest.Item | None) -> bool:
    mark = item.get_closest_marker("xdist_group") if item is not None else None
    return mark is not None and "ray" in (*mark.args, mark.kwargs.get("name"))


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """The local Ray cluster of :class:`_RayCluster`, running while a test uses it."""
    pytest.importorskip("ray")
    _RAY.start()
    yield _RAY
    _RAY.stop()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "ray_cluster" in getattr(item, "fixturenames", ()):
        _RAY.start()   # again, where a run of Ray tests was interrupted by others (an unusual order)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield   # the test's fixtures first: one may hide ray (sys.modules["ray"] = None) until then
    if not _in_ray_group(nextitem):
        _RAY.stop()
