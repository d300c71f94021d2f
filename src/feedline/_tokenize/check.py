"""The load-time checks: does a fast encoder encode a tokenizer exactly like ``tokenizers``?

Two fast encoders exist: fastokens (:class:`~feedline._tokenize.encoder.FastEncoder`, Rust BPE)
and the word cache (:class:`~feedline._tokenize.wordcache.WordCacheEncoder`, for tokenizers that
split at whitespace, such as BERT's). :func:`verdict_future` loads one (``kind``) and compares it
with ``tokenizers`` on :func:`~feedline._tokenize.verification.verification_corpus`, on a
background thread, once per distinct tokenizer and kind in a process (keyed by the digest of its
``tokenizer.json`` or of its JSON). ``auto`` is fastokens if it passes, else the word cache if it
passes, else none. :mod:`feedline._tokenize.backends` decides when to start a check and what to
do with the verdict.

    >>> check_fastokens(load_tokenizer("gpt2/")).reason              # doctest: +SKIP
    'verified identical on 59 texts, 35917 characters'
    >>> verdict_future(load_tokenizer("bert/"), "auto").result().fast.name  # doctest: +SKIP
    'wordcache'
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import numpy as np

from feedline._tokenize.encoder import Encoder, FastEncoder, HfEncoder, TokenizerLike
from feedline._tokenize.verification import verification_corpus
from feedline._tokenize.wordcache import WordCacheEncoder, wordcache_refusal

__all__ = ["Verdict", "check_fastokens", "checked", "describe", "first_difference", "verdict_future"]

T = TypeVar("T", bound=TokenizerLike)
Kind = Literal["auto", "fastokens", "wordcache"]


def first_difference(want: Sequence[np.ndarray], got: Sequence[np.ndarray] | None) -> int | None:
    if got is None or len(got) != len(want):
        return 0
    for i, (a, b) in enumerate(zip(want, got, strict=True)):
        if a.shape != b.shape or not np.array_equal(a, b):
            return i
    return None


def describe(name: str, text: str, want: np.ndarray, got: np.ndarray | None, encoder: str = "fastokens") -> str:
    snippet = text[:60] + ("..." if len(text) > 60 else "")
    n = 0 if got is None else next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    shown = "an error" if got is None else f"{got[n:n + 5].tolist()} from token {n}"
    return (f"tokenizer {name!r}: {encoder} and tokenizers encode {snippet!r} differently "
            f"(tokenizers {want[n:n + 5].tolist()}, {encoder} {shown})")


@dataclass(frozen=True)
class Verdict:
    """Whether a fast encoder may encode for a tokenizer: ``fast`` is that encoder when verified."""

    fast: Encoder | None
    reason: str
    missing: bool = False


# (digest of a tokenizer's JSON, kind) -> its check: every pipeline (a service cursor, a loader)
# loads its own tokenizer object, and one check (one fastokens load, ~100 MB for a large
# vocabulary; one word cache shared by every stream) per distinct tokenizer in a process is enough.
_VERDICTS: collections.OrderedDict[tuple[str, str], cf.Future[Verdict]] = collections.OrderedDict()
_VERDICTS_KEPT = 24
_VERDICTS_LOCK = threading.Lock()


def _source(tok: TokenizerLike) -> str | None:
    """The ``tokenizer.json`` that still describes ``tok`` (its ``source_file``), if any."""
    return getattr(tok, "source_file", None)


def _key(tok: TokenizerLike) -> str:
    """The digest of ``tok``'s JSON, computed once per tokenizer object: of the file it was read from
    when it has one (reading and hashing release the GIL; serialising the backend holds it for
    0.05-0.3 s, which stalled the consumer picking up the first batch), else of ``to_str()``."""
    key: str | None = getattr(tok, "_fastokens_key", None)
    if key is None:
        source = _source(tok)
        if source is not None:
            with open(source, "rb") as f:
                key = "file:" + hashlib.blake2b(f.read(), digest_size=16).hexdigest()
        else:
            key = hashlib.blake2b(tok.backend.to_str().encode(), digest_size=16).hexdigest()
        try:
            tok._fastokens_key = key  # type: ignore[attr-defined]
        except AttributeError:  # a tokenizer with __slots__: recomputed next time
            pass
    return key


def verdict_future(tok: T, kind: Kind = "fastokens") -> cf.Future[Verdict]:
    """The load-time check of ``kind`` for ``tok``, started on a background thread the first time
    (fastokens releases the GIL while it loads), cached per distinct tokenizer and kind."""
    key = (_key(tok), kind)
    with _VERDICTS_LOCK:
        cached = _VERDICTS.get(key)
        if cached is not None:
            _VERDICTS.move_to_end(key)
            return cached
        fut: cf.Future[Verdict] = cf.Future()
        _VERDICTS[key] = fut
        while len(_VERDICTS) > _VERDICTS_KEPT:
            _VERDICTS.popitem(last=False)

    def run() -> None:
        try:
            fut.set_result(_CHECKS[kind](tok))
        except BaseException as e:  # reported as a verdict, never lost with the thread
            fut.set_result(Verdict(None, f"the check failed: {type(e).__name__}: {e}"))

    # Not a daemon: the interpreter waits for it at exit. A daemon thread still inside fastokens'
    # Rust code when Python finalizes is unwound by force, and the process aborts.
    threading.Thread(target=run, name=f"feedline-{kind}-check", daemon=False).start()
    return fut


def checked(tok: T, kind: Kind = "auto") -> bool:
    """Whether the load-time check ``kind`` of ``tok`` has finished (never starts one)."""
    with _VERDICTS_LOCK:
        if not _VERDICTS:  # no check in this process yet: no need to digest the tokenizer's JSON
            return False
    key = _key(tok)
    with _VERDICTS_LOCK:
        cached = _VERDICTS.get((key, kind))
    return cached is not None and cached.done()


def check_fastokens(tok: T) -> Verdict:
    """Load ``tok`` into fastokens and compare it with ``tokenizers`` on :func:`verification_corpus`.

    Cached per distinct tokenizer; waits for a check already running.
    """
    return verdict_future(tok, "fastokens").result()


def _check_auto(tok: T) -> Verdict:
    """fastokens if it passes, else the word cache if it passes (both reasons kept)."""
    first = verdict_future(tok, "fastokens").result()
    if first.fast is not None:
        return first
    second = verdict_future(tok, "wordcache").result()
    if second.fast is not None:
        return Verdict(second.fast, f"the word cache {second.reason}; {first.reason}")
    return Verdict(None, f"{first.reason}; the word cache: {second.reason}")


def _compare(tok: T, fast: Encoder) -> Verdict:
    """``fast`` against ``tokenizers`` on the verification corpus, with and without special tokens."""
    hf = HfEncoder(tok.backend)
    corpus = verification_corpus(tok)
    for special in (False, True):
        want = hf.encode_batch(corpus, special)
        try:
            got: list[np.ndarray] | None = fast.encode_batch(corpus, special)
        except Exception:
            got = None
        bad = first_difference(want, got)
        if bad is not None:
            detail = describe(tok.name, corpus[bad], want[bad], None if got is None else got[bad], fast.name)
            return Verdict(None, f"verification failed: {detail} (add_special_tokens={special})")
    return Verdict(fast, f"verified identical on {len(corpus)} texts, {sum(map(len, corpus))} characters")


def _check_wordcache(tok: T) -> Verdict:
    source = _source(tok)
    if source is not None:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    else:
        text = tok.backend.to_str()
    refusal = wordcache_refusal(text)
    if refusal is not None:
        return Verdict(None, f"not for this tokenizer: {refusal}")
    return _compare(tok, WordCacheEncoder(tok.backend))


def _check_fastokens(tok: T) -> Verdict:
    try:
        import fastokens
    except ImportError:
        return Verdict(None, "fastokens is not installed (pip install 'feedline[fast]')", missing=True)
    try:
        source = _source(tok)
        if source is not None:  # the file, with the settings feedline gives the tokenizers backend
            loaded = fastokens.Tokenizer.from_file(source)
            loaded.no_padding()
            loaded.no_truncation()
        else:
            loaded = fastokens.Tokenizer.from_json_str(tok.backend.to_str())
        fast = FastEncoder(loaded)
    except Exception as e:
        return Verdict(None, f"fastokens cannot load it: {str(e).splitlines()[0][:160]}")
    return _compare(tok, fast)


_CHECKS = {"auto": _check_auto, "fastokens": _check_fastokens, "wordcache": _check_wordcache}
