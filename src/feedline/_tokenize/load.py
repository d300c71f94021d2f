"""Load a tokenizer from a ``tokenizer.json``, a directory, a SentencePiece ``.model``, or a hub name.

    >>> tok = load_tokenizer("../shared/data/tokenizers/gpt2")           # doctest: +SKIP
    >>> tok = load_tokenizer("bert-base-uncased")  # hub name: online only  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from feedline._tokenize.tokenizer import Tokenizer
from feedline.errors import TokenizerError

__all__ = ["load_spec_tokenizer", "load_tokenizer", "looks_like_path"]


def _read_config(directory: str) -> dict[str, Any]:
    cfg: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        p = os.path.join(directory, name)
        if os.path.isfile(p):
            try:
                with open(p, encoding="utf-8") as f:
                    cfg.update(json.load(f))
            except (OSError, json.JSONDecodeError) as e:
                raise TokenizerError(f"{p}: unreadable ({e})") from e
    cfg.pop("added_tokens_decoder", None)
    p = os.path.join(directory, "generation_config.json")
    if os.path.isfile(p):  # the model's stop ids (eos_token_id: one id or a list), for the chat task
        try:
            with open(p, encoding="utf-8") as f:
                eos = json.load(f).get("eos_token_id")
        except (OSError, json.JSONDecodeError, AttributeError) as e:
            raise TokenizerError(f"{p}: unreadable ({e})") from e
        if eos is not None:
            cfg["generation_config"] = {"eos_token_id": eos}
    return cfg


@functools.lru_cache(maxsize=16)
def load_tokenizer(name: str) -> Tokenizer:
    """Load and cache a tokenizer by path or hub name.

    Raises:
        TokenizerError: naming the path or hub name and what to do.
    """
    path = os.path.expanduser(name)
    if os.path.isfile(path):
        if path.endswith(".model"):
            return _from_sentencepiece(path)
        return Tokenizer.from_file(path, _read_config(os.path.dirname(path) or "."))
    if os.path.isdir(path):
        tj = os.path.join(path, "tokenizer.json")
        if os.path.isfile(tj):
            return Tokenizer.from_file(tj, _read_config(path))
        models = sorted(f for f in os.listdir(path) if f.endswith(".model"))
        if models:
            return _from_sentencepiece(os.path.join(path, models[0]), _read_config(path))
        if os.path.isfile(os.path.join(path, "tokenizer_config.json")):
            return _from_transformers(path)
        raise TokenizerError(f"{path}: no tokenizer.json, *.model or tokenizer_config.json in this directory")
    if looks_like_path(name):
        where = os.path.abspath(path)
        raise TokenizerError(f"{name}: no such tokenizer file or directory" + (f" ({where})" if where != name else "")
                             + "; give a tokenizer.json, a tokenizer folder, a SentencePiece .model or a hub name")
    return _from_transformers(name)


def looks_like_path(name: str) -> bool:
    """Whether a tokenizer name can only be a path (never a hub name such as ``gpt2`` or ``org/model``)."""
    return (name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name
            or name.lower().endswith((".json", ".model")))


def load_spec_tokenizer(name: str, root: str | None) -> Tokenizer:
    """:func:`load_tokenizer` for a spec's ``tokenizer:``. The spec resolves a relative path against
    its ``root`` only where a file is there, so one that is not is tried as written (the working
    directory, then the hub): where that fails too, the error names the path under ``root``.

    Raises:
        TokenizerError: as :func:`load_tokenizer`; for a relative path or ``org/name``, naming
            the file or folder it would be under ``root``.
    """
    try:
        return load_tokenizer(name)
    except TokenizerError as e:
        plain = os.path.expanduser(name)
        if root is None or "://" in root or "://" in name or os.path.isabs(plain) or ("/" not in name and not looks_like_path(name)):
            raise
        there = os.path.normpath(os.path.join(root, plain))
        if os.path.exists(there):
            raise
        if looks_like_path(name):
            raise TokenizerError(f"tokenizer: {name}: no such file or folder: {there} (a relative tokenizer: path is "
                                 "read from the spec's root:, else the spec file's folder); fix the path") from e
        raise TokenizerError(f"tokenizer: {name}: not a local folder ({there} does not exist; a relative path is read "
                             f"from the spec's root:, else the spec file's folder), and as a hub name: {e}") from e


def _from_transformers(name: str) -> Tokenizer:
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise TokenizerError(f"{name}: loading by hub name needs transformers: pip install 'feedline[hf]', or pass a tokenizer.json path") from e
    offline = _offline()
    if not offline and not os.path.exists(name):  # a hub name, not a local directory
        unreachable = _hub_unreachable()
        if unreachable:
            # Without network the hub client retries for about a minute: use the cache or say so now.
            try:
                hf = AutoTokenizer.from_pretrained(name, local_files_only=True)
            except Exception as e:
                raise TokenizerError(
                    f"{name}: not a local path, not in the Hugging Face cache, and the hub cannot be reached "
                    f"({unreachable}); pass a local tokenizer.json or directory, or check the network "
                    "(HF_ENDPOINT, HTTPS_PROXY)") from e
            return _wrap(name, hf)
    try:
        hf = AutoTokenizer.from_pretrained(name, local_files_only=offline)
    except Exception as e:  # transformers raises OSError, ValueError, HTTP errors...
        raise TokenizerError(
            f"{name}: could not load this tokenizer from the Hugging Face hub or cache ({type(e).__name__}); "
            "offline, pass a local tokenizer.json or directory instead"
        ) from e
    return _wrap(name, hf)


def _wrap(name: str, hf: Any) -> Tokenizer:
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        raise TokenizerError(f"{name}: only fast (Rust) tokenizers are supported; this one is slow-only")
    cfg: dict[str, Any] = {f"{r}_token": getattr(hf, f"{r}_token", None) for r in ("bos", "eos", "pad", "unk", "cls", "sep", "mask")}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    if getattr(hf, "chat_template", None):
        cfg["chat_template"] = hf.chat_template
    return Tokenizer(backend, name, cfg)


def _hub_unreachable(timeout: float = 3.0) -> str:
    """Why the hub (or the HTTPS proxy in front of it) cannot be reached within ``timeout`` s; ``""`` when it can."""
    import socket
    from urllib.parse import urlsplit

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    target = urlsplit(proxy if proxy and endpoint.startswith("https") else endpoint)
    host = target.hostname or "huggingface.co"
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return f"{host}:{port}: {e.strerror or type(e).__name__}"
    return ""


def _offline() -> bool:
    """True when the Hugging Face hub must not be contacted (``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``)."""
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _from_sentencepiece(path: str, config: dict[str, Any] | None = None) -> Tokenizer:
    """A SentencePiece ``.model`` (Unigram or BPE, with or without byte fallback), converted so
    its ids equal ``sentencepiece.encode`` (see :mod:`feedline._tokenize.spm`); roles (bos, eos,
    pad, unk) come from the model's trainer spec unless a ``tokenizer_config.json`` beside it
    names them."""
    from feedline._tokenize.spm import convert

    backend, roles, proto = convert(path)
    return Tokenizer.from_sentencepiece(backend, proto, path, {**roles, **(config or {})})
