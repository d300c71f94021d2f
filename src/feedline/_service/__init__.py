"""The loader service: ``feedline serve`` and the client behind ``Loader("tcp://...")``.

Modules: :mod:`.protocol` (wire format), :mod:`.server` (event loop and sockets),
:mod:`.dispatch` (protocol logic, testable without sockets through :mod:`.transport`),
:mod:`.delivery` (the interface of :mod:`.ranked` and :mod:`.shared`, the two delivery modes),
:mod:`.options` (``ServerOptions``), :mod:`.producer` (pipeline thread), :mod:`.session` (hello
validation), :mod:`.stats` (snapshot), :mod:`.client` and :mod:`.connection` (the client),
:mod:`.auth` (CurveZMQ and the bind policy), :mod:`.metrics` (Prometheus), :mod:`.streams`
(named streams), :mod:`.launch` (run ``feedline serve`` as a subprocess).
"""

from feedline._service.client import RemoteLoader
from feedline._service.launch import serve_process
from feedline._service.server import Server, ServerOptions
from feedline._service.streams import load_streams

__all__ = ["RemoteLoader", "Server", "ServerOptions", "load_streams", "serve_process"]
