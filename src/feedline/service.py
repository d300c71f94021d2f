"""The loader service: one process reads, tokenizes and batches; trainer ranks on any machine connect.

Run it with ``feedline serve spec.yaml --bind tcp://0.0.0.0:5555`` (``docs/service.md``), or from
Python::

    from feedline.service import serve_process
    with serve_process("spec.yaml") as address:   # a `feedline serve` child process
        loader = feedline.Loader(address, rank=0, world_size=2)

:class:`Server` runs a service in this process (``ServerOptions`` holds every ``feedline serve``
option); :func:`load_streams` reads a multi-stream spec; :class:`RemoteLoader` is what
``feedline.Loader(address)`` returns.
"""

from feedline._service import RemoteLoader, Server, ServerOptions, load_streams, serve_process

__all__ = ["RemoteLoader", "Server", "ServerOptions", "load_streams", "serve_process"]
