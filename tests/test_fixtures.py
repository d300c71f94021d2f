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
