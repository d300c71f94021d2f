"""Security of the loader service: CurveZMQ keys, the allowed-clients list, and the bind policy.

``feedline keys generate DIR`` writes::

    DIR/server.key          server public key   (give it to trainers)
    DIR/server.key_secret   server key pair     (stays on the server)
    DIR/client.key_secret   client key pair     (give it to trainers)
    DIR/authorized/client.key  public keys of the clients the server accepts

The server (``feedline serve --keys DIR``) encrypts everything and accepts only clients whose
public key is in ``DIR/authorized``; the handshake of any other peer fails inside ZeroMQ, so it
receives nothing at all. A client uses ``Loader(address, keys=DIR)`` (or ``FEEDLINE_KEYS=DIR``).

Binding anywhere but loopback without keys is refused unless ``insecure`` is asked for.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth

from feedline.errors import AuthError, SpecError

__all__ = ["ClientKeys", "ServerKeys", "check_bind", "generate_keys", "is_loopback"]

SERVER_NAME = "server"
AUTHORIZED = "authorized"


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerKeys:
    """The server's key pair and the folder of accepted client public keys."""

    public: bytes
    secret: bytes
    authorized: Path

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ServerKeys:
        d = Path(directory)
        public, secret = _load(d / f"{SERVER_NAME}.key_secret", "server key pair")
        authorized = d / AUTHORIZED
        if not authorized.is_dir() or not any(authorized.glob("*.key")):
            raise SpecError(f"{authorized}: no accepted client keys; run 'feedline keys generate {d}' "
                            "or copy clients' public .key files there")
        return cls(public=public, secret=secret, authorized=authorized)

    def apply(self, socket: zmq.Socket[Any]) -> None:
        socket.curve_secretkey = self.secret
        socket.curve_publickey = self.public
        socket.curve_server = True


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientKeys:
    """The server's public key and this client's key pair."""

    server: bytes
    public: bytes
    secret: bytes

    @classmethod
    def load(cls, directory: str | os.PathLike[str], name: str = "client") -> ClientKeys:
        d = Path(directory)
        server, _ = _load(d / f"{SERVER_NAME}.key", "server public key")
        public, secret = _load(d / f"{name}.key_secret", "client key pair")
        return cls(server=server, public=public, secret=secret)

    def apply(self, socket: zmq.Socket[Any]) -> None:
        socket.curve_serverkey = self.server
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret


def _load(path: Path, what: str) -> tuple[bytes, bytes]:
    if not path.is_file():
        raise AuthError(f"{path}: {what} not found; create keys with 'feedline keys generate {path.parent}'")
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as e:
        raise AuthError(f"{path}: not a ZeroMQ certificate ({e})") from e
    if secret is None and what != "server public key":
        raise AuthError(f"{path}: holds no secret key; use the .key_secret file")
    return public, secret or b""


def generate_keys(directory: str | os.PathLike[str], client: str = "client") -> dict[str, Path]:
    """Create the server key pair (unless present) and a client key pair, and authorize the client.

    Returns the paths written, by role.
    """
    d = Path(directory)
    (d / AUTHORIZED).mkdir(parents=True, exist_ok=True)
    server_secret = d / f"{SERVER_NAME}.key_secret"
    if not server_secret.exists():
        zmq.auth.create_certificates(str(d), SERVER_NAME)
    if (d / f"{client}.key_secret").exists():
        raise SpecError(f"{d / client}.key_secret exists; choose another --client name")
    pub, sec = zmq.auth.create_certificates(str(d), client)
    authorized = d / AUTHORIZED / f"{client}.key"
    shutil.move(pub, authorized)
    os.chmod(server_secret, 0o600)
    os.chmod(sec, 0o600)
    return {"server_public": d / f"{SERVER_NAME}.key", "server_secret": server_secret,
            "client_secret": Path(sec), "authorized": authorized}


def is_loopback(address: str) -> bool:
    """Whether a bind address is reachable only from this machine.

        >>> is_loopback("tcp://127.0.0.1:5555"), is_loopback("tcp://0.0.0.0:5555"), is_loopback("ipc:///tmp/x")
        (True, False, True)
    """
    if address.startswith(("ipc://", "inproc://")):
        return True
    if not address.startswith("tcp://"):
        return False
    host = address[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # '*', an interface name or a host name
        return False


def check_bind(address: str, keys: ServerKeys | None, insecure: bool) -> None:
    """Refuse an address outside loopback unless keys (or, explicitly, ``insecure``) are given."""
    if not address.startswith(("tcp://", "ipc://", "inproc://")):
        raise SpecError(f"bind address {address!r} must start with tcp://, ipc:// or inproc://")
    if keys is None and not insecure and not is_loopback(address):
        raise SpecError(
            f"refusing to bind {address} without encryption: anyone on the network could read the data. "
            "Create keys with 'feedline keys generate DIR' and pass --keys DIR, bind tcp://127.0.0.1:PORT, "
            "or pass --insecure on a trusted network"
        )
