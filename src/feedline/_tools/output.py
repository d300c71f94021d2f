"""Atomic output for the offline tools (export, pack, shard): nothing half-written under a final name.

Files are written under temporary names in the target directory and renamed into place only
when the whole run is complete; the manifest (if any) is renamed last, so it always describes
exactly the files next to it::

    >>> with AtomicOutput("out/", overwrite=False) as out:               # doctest: +SKIP
    ...     write_shard(out.temp("examples-00000.arrow"))
    ...     write_manifest(out.temp("manifest.json"))
    ...     out.publish(["examples-00000.arrow", "manifest.json"])

* A run that dies leaves only ``.feedline-tmp-<pid>-<name>`` files (hidden: directory sources
  skip them); the next run into the same directory removes those of dead processes.
* Writing into a directory that holds anything else (or over an existing file) needs
  ``overwrite=True``. Publishing then first removes the previous run's manifest (so an
  interrupted publish never looks complete), then the previous run's files (the names matching
  the tool's ``patterns``) that this run does not replace. Other files are never touched.
* ``inputs``: paths the run reads; an output that is one of them (or a directory holding one,
  for exclusive output) is refused before anything is written.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from collections.abc import Iterable, Sequence

from feedline.errors import SpecError

__all__ = ["AtomicOutput"]

_TMP = ".feedline-tmp-"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftovers (a previous call in this process) are dead too
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _same(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _inside(path: str, directory: str) -> bool:
    p, d = os.path.realpath(path), os.path.realpath(directory)
    return p == d or p.startswith(d.rstrip(os.sep) + os.sep)


class AtomicOutput:
    """A directory receiving one run's files atomically (see the module docstring).

    Args:
        directory: the output directory (created).
        overwrite: allow replacing a previous run's output (or other content: never removed).
        files: the final names this run will publish, when known up front and the directory
            is shared (one output file among others): only those may not exist yet. ``None``:
            the directory is the run's own and must be empty (hidden files aside).
        patterns: glob patterns of the names this tool publishes (a previous run's files, removed
            with ``overwrite``).
        inputs: paths the run reads; an output on one of them is refused.
        what: the tool's name for messages.

    Raises:
        SpecError: the output is an existing file, one of the inputs, or not empty without
            ``overwrite``.
    """

    def __init__(self, directory: str, *, overwrite: bool = False, files: Sequence[str] | None = None,
                 patterns: Sequence[str] = (), inputs: Iterable[str] = (), what: str = "output") -> None:
        self.directory = directory or "."
        self.overwrite = overwrite
        self.files = list(files) if files is not None else None
        self.patterns = tuple(patterns)
        self.what = what
        self._temps: dict[str, str] = {}
        self._check(list(inputs))
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise SpecError(f"{what}: cannot create the output directory {self.directory!r} ({e.strerror})") from e
        self._clean_dead()
        self._check_empty()

    # ----------------------------------------------------------------- checks
    def _check(self, inputs: list[str]) -> None:
        d = self.directory
        targets = [os.path.join(d, f) for f in self.files] if self.files is not None else [d]
        for inp in inputs:
            if not os.path.exists(inp):
                continue
            if any(_same(t, inp) for t in targets):
                raise SpecError(f"{self.what}: the output {inp!r} is also an input; write somewhere else")
            if self.files is None and (_inside(d, inp) or _inside(inp, d)):
                raise SpecError(f"{self.what}: the output directory {d!r} holds (or is inside) the input {inp!r}; "
                                "write somewhere else")
        if os.path.exists(d) and not os.path.isdir(d):
            raise SpecError(f"{self.what}: the output {d!r} is an existing file; give a directory")

    def _clean_dead(self) -> None:
        for name in os.listdir(self.directory):
            if not name.startswith(_TMP):
                continue
            pid = name[len(_TMP):].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.directory, name))

    def _check_empty(self) -> None:
        if self.overwrite:
            return
        if self.files is not None:
            taken = [f for f in self.files if os.path.exists(os.path.join(self.directory, f))]
            if taken:
                raise SpecError(f"{self.what}: {os.path.join(self.directory, taken[0])!r} exists; "
                                "pass --overwrite to replace it")
            return
        present = sorted(n for n in os.listdir(self.directory) if not n.startswith("."))
        if present:
            raise SpecError(f"{self.what}: the output directory {self.directory!r} is not empty "
                            f"({len(present)} entries, e.g. {present[0]!r}); pass --overwrite to replace "
                            "the previous output, or choose an empty directory")

    # ----------------------------------------------------------------- writing
    def temp(self, name: str) -> str:
        """The temporary path to write final file ``name`` to (in the target directory)."""
        if os.sep in name or name.startswith("."):
            raise ValueError(f"output names are plain file names, got {name!r}")
        if name not in self._temps:
            self._temps[name] = os.path.join(self.directory, f"{_TMP}{os.getpid()}-{name}")
        return self._temps[name]

    def _previous(self) -> list[str]:
        """The files of a previous run: the names matching the tool's patterns."""
        return sorted(n for n in os.listdir(self.directory)
                      if not n.startswith(".") and any(fnmatch.fnmatchcase(n, p) for p in self.patterns))

    def publish(self, names: Sequence[str], manifest: str | None = None) -> None:
        """Rename the temporaries of ``names`` into place; ``manifest`` (one of them) goes last.

        Stale files of the previous run are removed first; then the data files are renamed,
        then the manifest.
        """
        order = [n for n in names if n != manifest] + ([manifest] if manifest is not None else [])
        for n in order:
            if n not in self._temps or not os.path.exists(self._temps[n]):
                raise FileNotFoundError(f"{self.what}: {n!r} was not written")
        if self.overwrite:
            old = self._previous()
            stale = ([manifest] if manifest in old else []) + [n for n in old if n not in order]
            for n in stale:  # the old manifest first: a publish cut short never looks complete
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    os.remove(os.path.join(self.directory, n))
        for n in order:
            os.replace(self._temps.pop(n), os.path.join(self.directory, n))

    def abort(self) -> None:
        """Remove this run's temporaries (after a failure)."""
        for path in self._temps.values():
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        self._temps.clear()

    def __enter__(self) -> AtomicOutput:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.abort()  # after publish nothing is left; after an error the temporaries go
