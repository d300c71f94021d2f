"""The shared fixtures of conftest.py cost nothing until a test uses them."""

from __future__ import annotations

from types import SimpleNamespace

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
