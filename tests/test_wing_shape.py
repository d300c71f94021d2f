"""The package's shape where it is easiest to let go (issue 34): one thread-and-queue stage, and no
large class in the parallel wing. Both read the source (ast), so they name the module and line."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "feedline"

#: The modules that may create both a thread and a queue: the one thread-and-queue stage, and the
#: service client's socket loop (a ZeroMQ I/O thread handing frames to the caller).
THREAD_AND_QUEUE = {"_core/prefetch.py", "_service/connection.py"}
QUEUES = {"Queue", "SimpleQueue", "LifoQueue", "PriorityQueue", "JoinableQueue"}
#: The wing: every class of the partitions' room and of the Ray placement.
WING = [*sorted((SRC / "_partitions").glob("*.py")), SRC / "_ray" / "placement.py"]
MOST_LINES = 200


def _calls(tree: ast.AST) -> tuple[list[int], list[int]]:
    """Lines creating a ``threading.Thread`` and lines creating a queue (``queue.Queue`` and kin,
    ``multiprocessing``'s too), however imported."""
    threads, queues = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if name == "Thread":
                threads.append(node.lineno)
            elif name in QUEUES:
                queues.append(node.lineno)
    return threads, queues


def test_only_prefetch_and_the_clients_socket_loop_make_a_thread_and_a_queue() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        threads, queues = _calls(ast.parse(path.read_text(), str(path)))
        if threads and queues and rel not in THREAD_AND_QUEUE:
            offenders.append(f"{rel}: a thread (line {threads[0]}) and a queue (line {queues[0]})")
    assert not offenders, ("a thread handing elements through a queue is a Prefetch stage "
                           f"(feedline._core.prefetch); use one instead: {offenders}")
    for rel in THREAD_AND_QUEUE:   # the allow-list stays true, so it cannot grow stale
        assert all(_calls(ast.parse((SRC / rel).read_text()))), rel


def test_no_class_in_the_wing_runs_over_200_lines() -> None:
    long = []
    for path in WING:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                n = node.end_lineno - node.lineno + 1
                if n > MOST_LINES:
                    long.append(f"{path.relative_to(SRC).as_posix()}:{node.lineno} {node.name}: {n} lines")
    assert len(WING) > 10 and not long, f"split these classes (at most {MOST_LINES} lines each): {long}"
