"""The shared fixtures of conftest.py cost nothing until a test uses them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conftest import _RayCluster


def test_collecting_the_conftest_starts_no_ray_cluster() -> None:
    """pytest probes each conftest attribute for ``_mock_name`` and ``__wrapped__`` while collecting;
    the Ray cluster object answered by starting a cluster, in every test process."""
    cluster = _RayCluster()
    started: list[str] = []

    def start() -> SimpleNamespace:
        started.append("start")
        return SimpleNamespace(address="127.0.0.1:6379")

    cluster.start = start  # type: ignore[method-assign]
    for name in ("_mock_name", "__wrapped__", "__pytest_wrapped__", "_fixture_function_marker"):
        assert getattr(cluster, name, None) is None, name
    assert started == []
    assert cluster.address == "127.0.0.1:6379" and started == ["start"]  # a public attribute still starts it


def test_xdist_workers_share_one_feedline_cache(tmp_path_factory, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The demo corpus and tokenizers are built once a run, not once a worker."""
    from conftest import run_cache_dir

    monkeypatch.delenv("FEEDLINE_TEST_CACHE", raising=False)
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert run_cache_dir(tmp_path_factory) == str(base.parent / "feedline-cache")
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert run_cache_dir(tmp_path_factory) == str(base / "feedline-cache")


@pytest.mark.slow  # a pytest -n 2 run of its own
def test_the_tests_of_one_xdist_group_run_on_one_worker(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``make test``'s ``--dist loadgroup``: every Ray test on one worker, one cluster a run (pytest 9.2 keeps
    a node's id where xdist 3.8 does not write its group suffix; each worker started a cluster)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    test = ("import os, pytest\n"
            "pytestmark = pytest.mark.xdist_group('g')\n"
            "@pytest.mark.parametrize('i', range(3))\n"
            "def test_grouped(i):\n"
            "    with open('{name}-%d' % i, 'w') as f:\n"
            "        f.write(os.environ['PYTEST_XDIST_WORKER'])\n")
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text(test.replace("{name}", name))
    (tmp_path / "test_free.py").write_text("def test_free_1(): pass\ndef test_free_2(): pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "xdist_groups",
                          "-p", "no:cacheprovider", "-rA"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    workers = {p.name: p.read_text() for p in tmp_path.glob("[ab]-*")}
    assert len(workers) == 6 and len(set(workers.values())) == 1, workers
    assert "test_a.py::test_grouped[0]@g" in run.stdout
