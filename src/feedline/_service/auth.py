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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth

from feedline.errors import AuthError, SpecError

__all__ = ["ClientKeys", "ServerKeys", "check_bind", "check_metrics_host", "check_permissions", "generate_keys",
           "is_loopback"]

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
        check_permissions(d)
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

    Secret key files are created with mode 0600 (never readable by others, not even briefly), and
    the folders with 0700, whatever the umask.
    Returns the paths written, by role.
    """
    d = Path(directory)
    d.parent.mkdir(parents=True, exist_ok=True)
    for folder in (d, d / AUTHORIZED):   # 0700 whatever the umask: nobody else may add a key
        try:
            folder.mkdir(mode=0o700)
            os.chmod(folder, 0o700)
        except FileExistsError:
            pass
    server_secret = d / f"{SERVER_NAME}.key_secret"
    if not server_secret.exists():
        public, secret = zmq.curve_keypair()
        _write_certificate(d / f"{SERVER_NAME}.key", public)
        _write_certificate(server_secret, public, secret)
    client_secret = d / f"{client}.key_secret"
    if client_secret.exists():
        raise SpecError(f"{client_secret} exists; choose another --client name")
    public, secret = zmq.curve_keypair()
    _write_certificate(client_secret, public, secret)
    authorized = d / AUTHORIZED / f"{client}.key"
    _write_certificate(authorized, public)
    return {"server_public": d / f"{SERVER_NAME}.key", "server_secret": server_secret,
            "client_secret": client_secret, "authorized": authorized}


def _write_certificate(path: Path, public: bytes, secret: bytes | None = None) -> None:
    """Write a ZeroMQ certificate (the format ``zmq.auth.load_certificate`` reads); secret ones as 0600."""
    lines = ["#   ZeroMQ CURVE " + ("**Secret** Certificate, written by 'feedline keys generate'"
                                     if secret else "Public Certificate, written by 'feedline keys generate'"),
             "#   " + ("Keep it private; do not change its permissions." if secret else "Give it to the other side."),
             "", "metadata", "curve", f'    public-key = "{public.decode("ascii")}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode("ascii")}"')
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret is not None else 0o644)
    except FileExistsError:
        raise SpecError(f"{path} exists and would be overwritten; remove it or use another folder") from None
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")


def check_permissions(directory: str | os.PathLike[str]) -> None:
    """Refuse, as ssh does, a keys folder that another local user could use or change: a secret key
    readable by others, or the folder, ``authorized/`` or an authorized key writable by others, or
    any of them owned by another user. The message gives the ``chmod`` that fixes it.

    Raises:
        AuthError: naming the path, its mode and the fix.
    """
    if os.name != "posix":
        return
    d = Path(directory)
    authorized = d / AUTHORIZED
    checks: list[tuple[Path, int, str]] = [(d, 0o022, "chmod 700"), (authorized, 0o022, "chmod 700")]
    checks += [(p, 0o077, "chmod 600") for p in sorted(d.glob("*.key_secret"))]
    checks += [(p, 0o022, "chmod 644") for p in sorted(authorized.glob("*.key"))]
    for path, forbidden, fix in checks:
        st = path.stat()
        if st.st_uid not in (os.getuid(), 0):
            raise AuthError(f"{path} belongs to another user (uid {st.st_uid}); keys must be owned by the user who "
                            f"runs the server: chown {os.getuid()} {path}")
        mode = st.st_mode & 0o777
        if mode & forbidden:
            what = "readable by other users" if forbidden == 0o077 else "writable by other users (they could add a key)"
            raise AuthError(f"{path} is {what} (mode {mode:04o}); refusing to use it. Fix: {fix} {path}")


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


def check_metrics_host(host: str, keys: ServerKeys | None, insecure: bool) -> None:
    """Refuse a metrics endpoint (plain HTTP, no authentication) off loopback for a keyed service."""
    if keys is not None and not insecure and not is_loopback(f"tcp://{host}:0"):
        raise SpecError(
            f"refusing to serve metrics on {host}: the service uses keys, but the metrics endpoint is plain HTTP "
            "that anyone who reaches it can read (stream names, clients, rates). Keep --metrics-host 127.0.0.1 and "
            "scrape through a tunnel or an authenticating proxy, or pass --metrics-insecure on a trusted network"
        )
