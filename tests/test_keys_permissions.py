"""Key files and folders: ``feedline keys generate`` makes them private whatever the umask, and
``feedline serve`` refuses (as ssh does) keys that another local user could read or change."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from feedline._service.auth import ServerKeys, generate_keys
from feedline.errors import AuthError
from service_helpers import make_spec, tokenizer_path, write_spec

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.slow
def test_generate_makes_private_folders_even_under_umask_000(tmp_path: Path) -> None:
    d = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "feedline", "keys", "generate", str(d)], check=True,
                   capture_output=True, preexec_fn=lambda: os.umask(0))
    assert mode(d) == 0o700 and mode(d / "authorized") == 0o700
    assert mode(d / "server.key_secret") == 0o600 and mode(d / "client.key_secret") == 0o600
    assert mode(d / "authorized" / "client.key") == 0o644   # public, but writable by its owner only
    ServerKeys.load(d)   # what it made is accepted


@pytest.mark.parametrize(("where", "bad", "fix"), [
    ("server.key_secret", 0o644, "chmod 600"),
    ("server.key_secret", 0o640, "chmod 600"),
    ("client.key_secret", 0o604, "chmod 600"),
    ("authorized", 0o777, "chmod 700"),
    ("authorized", 0o770, "chmod 700"),
    (".", 0o757, "chmod 700"),
    ("authorized/client.key", 0o666, "chmod 644"),
])
def test_serve_refuses_keys_others_could_read_or_change(tmp_path: Path, where: str, bad: int, fix: str) -> None:
    d = tmp_path / "keys"
    generate_keys(d)
    target = d / where
    os.chmod(target, bad)
    with pytest.raises(AuthError) as e:
        ServerKeys.load(d)
    assert str(target) in str(e.value) and f"{fix} {target}" in str(e.value) and f"{bad:04o}" in str(e.value)


@pytest.mark.slow
def test_the_command_line_refuses_a_readable_secret_key_with_the_fix(tmp_path: Path) -> None:
    d = tmp_path / "keys"
    generate_keys(d)
    os.chmod(d / "server.key_secret", 0o644)
    spec = write_spec(tmp_path / "spec.json", make_spec(tmp_path, tokenizer_path(tmp_path), docs=4))
    done = subprocess.run([sys.executable, "-m", "feedline", "serve", spec, "--keys", str(d)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"chmod 600 {d / 'server.key_secret'}" in done.stderr
