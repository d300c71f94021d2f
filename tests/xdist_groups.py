"""``--dist loadgroup`` for the pytest this suite runs on: the tests of one ``xdist_group`` share a worker.

pytest-xdist (3.8) groups tests by a ``@NAME`` suffix it writes into each marked item's
``_nodeid`` on the workers; pytest 9.2 keeps a node's id in ``_id`` instead, so the suffix was
never seen: the Ray tests ran on every worker, each starting its own cluster (~10 CPU-s and its
daemons) beside the others. This hook writes the suffix where the running pytest keeps the id.
conftest.py imports it; a pytest run loads it alone with ``-p xdist_groups``.
"""

from __future__ import annotations

import pytest


def _group(item: pytest.Item) -> str | None:
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")})
    return "_".join(names) or None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # set on xdist workers under --dist loadgroup
        return
    for item in items:
        group = _group(item)
        if group is None or item.nodeid.endswith(f"@{group}"):
            continue  # ungrouped, or an xdist that wrote the suffix itself
        nodeid = f"{item.nodeid}@{group}"
        if hasattr(item, "_id"):
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(nodeid)
        else:
            item._nodeid = nodeid  # type: ignore[attr-defined]
