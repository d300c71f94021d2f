"""On a fresh clone, the pytest-xdist workers share the rewriting of the test modules' asserts.

Without pytest's rewritten bytecode (``__pycache__/*-pytest-*.pyc``) every worker parsed and rewrote every
test module itself, all at the same time: 4-4.5 CPU s a worker more than with it (about 6.5 s against 2 s
to collect). Here each worker first imports its share of the modules, those whose bytecode is missing
(pytest's import hook rewrites them and writes the bytecode, as collection would), waits for the others'
shares (a few seconds at most), then collects, reading the rest from bytecode: the three workers' cold
collection took 9.5-10 CPU s, not 14-19. Collection later finds these modules imported (the ``prepend``
import mode imports a module by its name). Anything unforeseen (another import mode, bytecode written
elsewhere or not at all, a module that fails to import) leaves the module to collection, as before.
conftest.py imports the hook.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _bytecode(module: Path) -> Path:
    """Where pytest's import hook writes a test module's rewritten bytecode."""
    return module.parent / "__pycache__" / f"{module.stem}.{sys.implementation.cache_tag}-pytest-{pytest.__version__}.pyc"


def _modules(config: pytest.Config) -> list[Path]:
    """The test modules beside this file that the run's arguments name or contain."""
    base = config.invocation_params.dir
    found: set[Path] = set()
    for arg in config.args:
        path = (base / arg.split("::")[0]).resolve()
        if path.is_dir() and (path == HERE or HERE.is_relative_to(path)):
            found.update(HERE.glob("test_*.py"))
        elif path.parent == HERE and path.match("test_*.py"):
            found.add(path)
    return sorted(found)


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    config = session.config
    worker = getattr(config, "workerinput", None)
    if worker is None or sys.dont_write_bytecode or config.getoption("importmode") != "prepend":
        return
    if str(HERE) not in sys.path or not worker["workerid"].removeprefix("gw").isdigit():
        return
    modules = _modules(config)
    if all(_bytecode(m).exists() for m in modules):
        return
    index, count = int(worker["workerid"].removeprefix("gw")), int(worker["workercount"])
    start = time.monotonic()
    mine = modules[index::count]   # the same shares whenever each worker looks
    for module in mine:
        if _bytecode(module).exists():
            continue
        try:
            importlib.import_module(module.stem)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # an error, or a skip (pytest.importorskip): collection imports it again and reports it
            pass
    if not all(_bytecode(m).exists() for m in mine):
        return  # this pytest writes its bytecode elsewhere (or not at all): do not wait for the others'
    deadline = time.monotonic() + 5 + (time.monotonic() - start)
    while time.monotonic() < deadline and not all(_bytecode(m).exists() for m in modules):
        time.sleep(0.05)
