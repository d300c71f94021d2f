"""``feedline serve --state FILE``: the service's resume file, rewritten when a watermark moved.

    >>> f = StateFile("serve-state.json", {"train": spec.accepted_hashes()})  # doctest: +SKIP
    >>> f.load()              # {"train": <global state>} ({} when the file does not exist yet)  # doctest: +SKIP
    >>> f.save({"train": q.watermark_wire})                          # doctest: +SKIP

The file holds each stream's shared-mode watermark (the state after the last step such that it
and every step before it were acked) as the state JSON a client would resume from::

    {"feedline_server_state": 1, "streams": {"train": {"version": 1, "spec_hash": ..., "step": 46, ...}}}

The server saves at most once per tick (a second) and once more before it says goodbye, each
time only if a watermark moved: a file write never follows each ack on the event loop, and a
``kill -9`` loses at most the last second's acks (their batches are delivered again: at least
once). Each save writes a temporary file beside it and renames it over the old one, so the file
is always whole: a ``kill -9`` at any moment leaves the previous or the new state, never a part
(no ``fsync``: a power loss may lose the last renames). A state is accepted under any hash its
stream's spec accepts (:meth:`~feedline._spec.spec.Spec.accepted_hashes`: the current one and
the earlier releases' hash of the same stream), as the loader's resume does. A file holding a
single state (what ``GET /state`` answers) is accepted too, for the stream whose spec it was
saved under.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from feedline._core.bounded import NotRegularFile, read_bounded, utf8_error
from feedline._service.protocol import state_as_json
from feedline._state import check_state, parse_state_json
from feedline.errors import SpecError, StateError

__all__ = ["StateFile"]

FORMAT = 1
MAX_BYTES = 256 << 20   # a state file's size (a state holds at most 4 M values: about 40 MB)


class StateFile:
    """One server's resume file; see the module docstring.

    Args:
        path: the file (it need not exist yet).
        hashes: per stream, the spec hashes its states may carry (current first), or just one.
    """

    def __init__(self, path: str | os.PathLike[str], hashes: Mapping[str, str | tuple[str, ...]]) -> None:
        self.path = Path(path)
        self.hashes = {n: (h,) if isinstance(h, str) else tuple(h) for n, h in hashes.items()}
        self.states: dict[str, str] = {}   # stream -> state JSON, as last saved or loaded
        self.saves = 0

    def load(self) -> dict[str, dict[str, Any]]:
        """Each stream's start state from the file (none for a stream it does not name; ``{}`` when
        the file does not exist).

        Raises:
            SpecError: the file cannot be read or is not a state file.
            StateError: a state in it is malformed or was saved under another spec.
        """
        text = self._read()
        if text is None:
            return {}
        try:
            doc = parse_state_json(text)
        except StateError as e:
            raise StateError(f"{self.path}: {e}; delete the file to start the streams over") from None
        if isinstance(doc, dict) and doc.get("feedline_server_state") == FORMAT and isinstance(doc.get("streams"), dict):
            raw = doc["streams"]
        elif isinstance(doc, dict) and "spec_hash" in doc:   # one state, as GET /state gives it
            raw = {n: doc for n, h in self.hashes.items() if doc.get("spec_hash") in h}
            if not raw:
                raise StateError(f"{self.path}: its state was saved under spec {doc.get('spec_hash')!r}, which no "
                                 f"stream of this server has ({', '.join(f'{n}: {h[0]}' for n, h in self.hashes.items())}); "
                                 "serve the spec it was saved for, or delete the file to start over")
        else:
            raise SpecError(f"{self.path}: not a feedline state file (expected "
                            f'{{"feedline_server_state": {FORMAT}, "streams": {{...}}}} or one state from GET /state)')
        out: dict[str, dict[str, Any]] = {}
        for name, state in raw.items():
            if name not in self.hashes:
                raise StateError(f"{self.path}: holds a state for stream {name!r}, which this server does not serve "
                                 f"(it serves {', '.join(sorted(self.hashes))}); serve that stream too, or delete "
                                 "the file to start over")
            try:
                out[name] = check_state(state, self.hashes[name])
            except StateError as e:
                raise StateError(f"{self.path}: stream {name!r}: {e}") from None
            self.states[name] = json.dumps(state, separators=(",", ":"))
        return out

    def _read(self) -> str | None:
        """The file's text (``None``: it does not exist): a regular file of at most :data:`MAX_BYTES`, as UTF-8.

        A FIFO, a device (a link to ``/dev/zero``) or a folder is refused before a byte is read
        (:func:`~feedline._core.bounded.read_bounded`) instead of hanging or filling memory.
        """
        try:
            data = read_bounded(self.path, MAX_BYTES)
        except FileNotFoundError:
            return None
        except NotRegularFile as e:
            raise SpecError(f"{self.path}: the --state file is {e.what}; give a regular file (or a path "
                            "that does not exist yet: the server creates it)") from None
        except OSError as e:
            raise SpecError(f"{self.path}: cannot read the --state file ({e.strerror})") from None
        if len(data) > MAX_BYTES:
            raise SpecError(f"{self.path}: larger than {MAX_BYTES:,} bytes, so not a --state file the server "
                            "wrote; give another path, or delete the file to start the streams over")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SpecError(f"{self.path}: not a feedline state file ({utf8_error(data, e)[1]} is not UTF-8 "
                            "text); give another path, or delete the file to start the streams over") from None

    def save(self, wires: Mapping[str, bytes | str]) -> None:
        """Record these streams' states (as batch headers carry them) and rewrite the file atomically."""
        for name, wire in wires.items():
            self.states[name] = state_as_json(wire)
        body = ",".join(f"{json.dumps(n)}:{s}" for n, s in sorted(self.states.items()))
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(f'{{"feedline_server_state":{FORMAT},"streams":{{{body}}}}}\n', encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise SpecError(f"{self.path}: cannot write the --state file ({e.strerror})") from e
        self.saves += 1
