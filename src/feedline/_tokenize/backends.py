"""Encoder backends: which library turns text into ids, verified to match ``tokenizers`` exactly.

``tokenizer: {path: gpt2/, backend: auto}`` (a plain ``tokenizer: gpt2/`` means the same):

* ``hf``: the Hugging Face ``tokenizers`` encoder (``encode_batch_fast``), as always.
* ``fastokens``: the ``fastokens`` encoder (Rust BPE, ``pip install 'feedline[fast]'``), required:
  a tokenizer it cannot load or a verification it fails is an error.
* ``wordcache``: ``tokenizers``' own ids per distinct word, memoized
  (:mod:`feedline._tokenize.wordcache`; BERT's WordPiece family), required likewise.
* ``sentencepiece``: ``sentencepiece`` itself, for a tokenizer loaded from a SentencePiece
  ``.model`` (:class:`~feedline._tokenize.encoder.SentencePieceEncoder`, installed with
  ``feedline[hf]``): its ids by construction, not checked against the converted pipeline, which
  differs from it on rare texts (combining marks, lattice ties; :mod:`feedline._tokenize.spm`).
* ``auto`` (default): for a ``.model`` file, sentencepiece when it is installed; otherwise fastokens when it is installed, loads the tokenizer, and encodes the
  verification corpus (:func:`verification_corpus`) identically to ``tokenizers``; else the word
  cache when the tokenizer has its shape and it passes the same verification; otherwise
  ``tokenizers``. The choice and its reason are logged (``feedline._tokenize``). The load-time
  check (fastokens takes 0.3-2 s and ~100 MB to load a large vocabulary) starts once a stream has
  encoded :data:`START_AFTER_CHARS` characters with ``tokenizers`` (so short runs, ``inspect`` and
  small corpora never pay for it) and its first batch is out (a stream holds it until then:
  :meth:`VerifiedEncoder.hold`), and runs on a background thread, once per tokenizer in a
  process. The stream pauses up to :data:`CHECK_WAIT_S` for it once (beside ``tokenizers`` on every
  core, the one-core load takes several times longer), then ``tokenizers`` encodes until it is
  done; batches do not depend on when it finishes.

Verification does not stop at load time. A :class:`VerifiedEncoder` encodes the texts holding the
first ``window`` characters of the actual data with both encoders and hands out the ``tokenizers``
ids for them; afterwards it re-encodes one text of every ``spot_every``-th call with ``tokenizers``. A
difference inside the window makes ``auto`` fall back to ``tokenizers`` for good (logged; every
id handed out so far came from ``tokenizers``, so batches stay identical), and ``fastokens`` or
``wordcache`` raise :class:`~feedline.errors.TokenizerDivergence`; a difference found by a spot
check raises for all, since earlier batches may already hold the fast encoder's ids. Batches are
therefore the same for every backend, and the backend is not part of the spec hash.

Only plain ids come from a fast encoder (and from sentencepiece): offsets, word ids and pairs (whole-word masking, chat masks,
classification pairs) are always computed by ``tokenizers`` (``Tokenizer.backend``).

    >>> tok = with_backend(load_tokenizer("gpt2/"), "auto")         # doctest: +SKIP
    >>> tok.encoder.name                                            # doctest: +SKIP
    'fastokens'
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

import numpy as np

from feedline._tokenize.check import Verdict, check_fastokens, checked, describe, first_difference, verdict_future
from feedline._tokenize.encoder import (
    Encoder,
    FastEncoder,
    HfEncoder,
    SentencePieceEncoder,
    TokenizerLike,
    join_ids,
    split_ids,
)
from feedline._tokenize.wordcache import WordCacheEncoder
from feedline.errors import MissingDependency, TokenizerDivergence, TokenizerError

__all__ = [
    "Backend",
    "Encoder",
    "FastEncoder",
    "HfEncoder",
    "SentencePieceEncoder",
    "Verdict",
    "VerifiedEncoder",
    "WordCacheEncoder",
    "check_fastokens",
    "verdict_future",
    "with_backend",
]

log = logging.getLogger("feedline.tokenize")

Backend = Literal["auto", "hf", "fastokens", "wordcache", "sentencepiece"]
T = TypeVar("T", bound=TokenizerLike)
BACKENDS: tuple[str, ...] = ("auto", "hf", "fastokens", "wordcache", "sentencepiece")

#: Characters of real data encoded by both encoders before the fast encoder's ids are used.
WINDOW_CHARS = 1 << 18
#: After the window, one text of every this many calls is re-encoded by ``tokenizers``.
SPOT_EVERY = 16
#: ``auto`` starts the fastokens check after a stream has encoded this many characters (and its
#: first batch is out). Smaller streams never load fastokens; past it, loading (0.6 s of one core
#: for GPT-2, 3.5 s for a Llama-3 vocabulary) is repaid within the next few MiB of text, and every
#: character encoded before it costs ~15x more CPU, so it starts as early as a short run allows.
START_AFTER_CHARS = 1 << 18
#: While a stream waits for its first batch (:meth:`VerifiedEncoder.hold`), the check waits too,
#: unless the stream has encoded this many characters.
HOLD_LIMIT_CHARS = 1 << 23
#: Once its first batch is out, a stream waits up to this long (once) for a running check instead
#: of encoding beside it: ``tokenizers`` on every core starves the one-core fastokens load (0.6 s
#: for GPT-2 alone took 2.8-7 s beside it on 2 cores), and ~15x cheaper ids sooner repay the pause.
CHECK_WAIT_S = 5.0
#: Before the check has passed, ``tokenizers`` encodes a call's texts this many characters at a
#: time, so that a check started meanwhile is joined within one slice, not after the whole chunk.
SLICE_CHARS = 1 << 16


class VerifiedEncoder:
    """A fast encoder (fastokens, the word cache), checked against ``tokenizers`` on the data (see the
    module docstring).

    Args:
        hf, fast: the two encoders.
        strict: raise on any difference (``backend: fastokens``/``wordcache``); else fall back inside the window.
        label: the tokenizer's name, for messages.
        window: characters of data encoded by both before the fast encoder's ids are used.
        spot_every: afterwards, one text of every ``spot_every``-th call is re-encoded.
        pending: instead of ``fast``, the load-time check still running in the background
            (``auto``): until it is done, ``tokenizers`` encodes; then the fast encoder takes over
            (starting with the window) if it passed.
        start, start_after: instead of ``pending``, how to start that check, once this encoder
            has encoded ``start_after`` characters (or :meth:`wait` is called).
        check_wait: once the check runs and no stream holds it, the next encode waits this many
            seconds for it (once) before encoding with ``tokenizers`` beside it.
    """

    def __init__(self, hf: HfEncoder, fast: Encoder | None, *, strict: bool, label: str,
                 window: int = WINDOW_CHARS, spot_every: int = SPOT_EVERY,
                 pending: cf.Future[Verdict] | None = None,
                 start: Callable[[], cf.Future[Verdict]] | None = None, start_after: int = 0,
                 check_wait: float = CHECK_WAIT_S) -> None:
        self.hf, self.fast, self.pending = hf, fast, pending
        self.check_wait, self._waited, self._wait_until = check_wait, False, 0.0
        self.start, self.start_after, self.seen = start, start_after, 0
        self.strict, self.label = strict, label
        self.window, self.spot_every = window, max(1, spot_every)
        self.checked = 0
        self.calls = 0
        self.fell_back = fast is None and pending is None and start is None
        self._lock = threading.Lock()
        self._holds, self._start_after = 0, start_after

    @property
    def name(self) -> str:
        return "hf" if self.fell_back or self.fast is None else self.fast.name

    def wait(self, timeout: float | None = None) -> str:
        """Start (if deferred) and wait for the load-time check; returns :attr:`name`."""
        with self._lock:
            if self.start is not None:
                self.pending, self.start = self.start(), None
        if self.pending is not None:
            self.pending.result(timeout)
            self._resolve()
        return self.name

    def hold(self) -> None:
        """Keep the deferred check from starting until :meth:`release_hold` (or :data:`HOLD_LIMIT_CHARS`).

        A stream holds it until its first batch is out: the check (loading fastokens, encoding the
        verification corpus) would take the cores that the first batch waits for.
        """
        with self._lock:
            if self.start is not None:
                if not self._holds:
                    self._start_after, self.start_after = self.start_after, max(self.start_after, HOLD_LIMIT_CHARS)
                self._holds += 1

    def release_hold(self) -> None:
        """Undo one :meth:`hold`; the check starts at once when it is due."""
        with self._lock:
            if not self._holds:
                return
            self._holds -= 1
            if not self._holds:
                self.start_after = self._start_after
                if self.start is not None and self.seen >= self.start_after:
                    self.pending, self.start = self.start(), None

    def _resolve(self) -> None:
        with self._lock:
            if self.pending is None or not self.pending.done():
                return
            verdict, self.pending = self.pending.result(), None
            if verdict.fast is None:
                self.fell_back = True
                log.info("tokenizer %r: encoding with tokenizers (%s)", self.label, verdict.reason)
            else:
                self.fast = verdict.fast
                log.info("tokenizer %r: encoding with %s from now on (%s; the next %d characters of data "
                         "are checked too)", self.label, verdict.fast.name, verdict.reason, self.window)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[np.ndarray]:
        if not texts:
            return []
        got = self._encode(texts, add_special_tokens)
        return got if isinstance(got, list) else split_ids(*got)

    def encode_flat(self, texts: Sequence[str], add_special_tokens: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Like :meth:`encode_batch`, as one flat array and bounds (the fast encoders' own layout: no split)."""
        if not texts:
            return np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64)
        got = self._encode(texts, add_special_tokens, flat=True)
        return join_ids(got) if isinstance(got, list) else got

    def _encode(self, texts: Sequence[str], add_special_tokens: bool,
                flat: bool = False) -> list[np.ndarray] | tuple[np.ndarray, np.ndarray]:
        """Ids from whichever encoder the state of the check says (the fast encoder's flat when ``flat``)."""
        if self.start is not None:
            with self._lock:
                self.seen += sum(len(t) for t in texts)
                if self.start is not None and self.seen >= self.start_after:
                    self.pending, self.start = self.start(), None
                deferred = self.start is not None
            if deferred:
                return self._before_check(texts, add_special_tokens)
        if self.pending is not None:
            if not self._switch_now():
                return self._before_check(texts, add_special_tokens)
            self._resolve()
        checked = 0
        with self._lock:
            if self.fell_back:
                mode = "hf"
            elif self.checked < self.window:
                mode = "window"
                budget = self.window - self.checked
                while checked < len(texts) and budget > 0:  # the texts that fill what is left of the window
                    budget -= len(texts[checked])
                    checked += 1
                self.checked += sum(len(t) for t in texts[:checked])
            else:
                self.calls += 1
                mode = "spot" if self.calls % self.spot_every == 0 else "fast"
        if mode == "hf" or self.fast is None:
            return self.hf.encode_batch(texts, add_special_tokens)
        if mode == "window":
            return self._window(texts, checked, add_special_tokens)
        try:
            got = self.fast.encode_flat(texts, add_special_tokens)
        except Exception:  # e.g. lone surrogates: tokenizers decides (encodes or raises its own error)
            return self.hf.encode_batch(texts, add_special_tokens)
        if mode == "spot":
            i = (self.calls // self.spot_every) % len(texts)
            want = self.hf.encode_batch([texts[i]], add_special_tokens)[0]
            mine = got[0][got[1][i]:got[1][i + 1]]
            if not np.array_equal(want, mine):
                name = self.fast.name
                raise TokenizerDivergence(
                    describe(self.label, texts[i], want, mine, name)
                    + f"; batches already delivered may hold {name} ids. Set tokenizer: {{backend: hf}} and restart "
                    f"from a state saved before this run used {name}, and report the text"
                    + (" to fastokens" if name == "fastokens" else " to feedline"))
        return got if flat else split_ids(*got)

    def _switch_now(self) -> bool:
        """True when the check is done (by any thread: every thread calling this encoder switches
        within one slice of :meth:`_before_check`); False while it is deferred. A started check is
        waited for once, up to :attr:`check_wait` seconds from the first call that finds it running
        (unless a stream still holds it), and every thread arriving in that window pauses with it
        (a thread encoding with ``tokenizers`` meanwhile would take the cores the check needs)."""
        with self._lock:
            pending = self.pending
            if pending is None:
                return self.start is None  # resolved already (by another thread), or never deferred
            timeout = 0.0
            if not pending.done() and not self._holds:
                now = time.monotonic()
                if not self._waited:
                    self._waited, self._wait_until = True, now + self.check_wait
                timeout = self._wait_until - now
        if timeout > 0:
            cf.wait([pending], timeout=timeout)
        return pending.done()

    def _before_check(self, texts: Sequence[str], add_special_tokens: bool) -> list[np.ndarray]:
        """``tokenizers``' ids until the check is done, a slice of :data:`SLICE_CHARS` at a time; the
        texts after the slice where it is done (or waited for) go through :meth:`_encode` again."""
        out: list[np.ndarray] = []
        i = 0
        while i < len(texts):
            j, size = i + 1, len(texts[i])
            while j < len(texts) and size < SLICE_CHARS:
                size += len(texts[j])
                j += 1
            out += self.hf.encode_batch(texts[i:j], add_special_tokens)
            i = j
            if i < len(texts) and self._switch_now():
                rest = self._encode(texts[i:], add_special_tokens)
                return out + (rest if isinstance(rest, list) else split_ids(*rest))
        return out

    def _window(self, texts: Sequence[str], checked: int, add_special_tokens: bool) -> list[np.ndarray]:
        """Encode with the fast encoder and compare the first ``checked`` texts with tokenizers.

        The checked texts are handed out as tokenizers encoded them. On a difference: raise
        (strict), or fall back and encode the rest with tokenizers too.
        """
        assert self.fast is not None
        want = self.hf.encode_batch(texts[:checked], add_special_tokens)
        try:
            got: list[np.ndarray] | None = self.fast.encode_batch(texts, add_special_tokens)
        except Exception:  # the fast encoder failing where tokenizers did not is a difference
            got = None
        bad = first_difference(want, None if got is None else got[:checked])
        if bad is None and got is not None:
            return want + got[checked:]
        message = describe(self.label, texts[bad or 0], want[bad or 0], None if got is None else got[bad or 0],
                           self.fast.name)
        if self.strict:
            raise TokenizerDivergence(message + " on the data; use tokenizer: {backend: hf} (or auto)")
        with self._lock:
            self.fell_back = True
        log.warning("%s on the data; encoding with tokenizers from now on (every id so far came from tokenizers)", message)
        return want + self.hf.encode_batch(texts[checked:], add_special_tokens)


def with_backend(tok: T, backend: str) -> T:
    """A view of ``tok`` whose plain-id encoding uses ``backend`` (``auto``, ``hf``, ``fastokens``,
    ``wordcache``, ``sentencepiece``).

    Each call makes a fresh :class:`VerifiedEncoder` (its own data window), sharing the loaded
    tokenizers and the cached load-time verification.

    Raises:
        TokenizerError: ``fastokens`` or ``wordcache`` was asked for and cannot load or verify
            this tokenizer.
        MissingDependency: ``fastokens`` or ``sentencepiece`` was asked for and is not installed.
    """
    if backend not in BACKENDS:
        raise TokenizerError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    hf = HfEncoder(tok.backend)
    if backend == "hf":
        return tok.with_encoder(hf, "hf")
    if backend in ("sentencepiece", "auto"):
        spm = _sentencepiece(tok, required=backend == "sentencepiece")
        if spm is not None:
            return tok.with_encoder(spm, backend)
    if backend == "auto" and not checked(tok, "auto"):
        log.info("tokenizer %r: encoding with tokenizers; a faster encoder is checked in the background after the "
                 "first %d characters", tok.name, START_AFTER_CHARS)
        pending = VerifiedEncoder(hf, None, strict=False, label=tok.name, window=WINDOW_CHARS,
                                  spot_every=SPOT_EVERY, start=lambda: verdict_future(tok, "auto"),
                                  start_after=START_AFTER_CHARS)
        return tok.with_encoder(pending, backend)
    verdict = verdict_future(tok, backend).result()  # type: ignore[arg-type]  # auto, fastokens or wordcache
    if verdict.fast is None:
        if backend != "auto":
            err = MissingDependency if verdict.missing else TokenizerError
            raise err(f"tokenizer {tok.name!r}: backend: {backend}: {verdict.reason}; use backend: auto or hf")
        log.info("tokenizer %r: encoding with tokenizers (%s)", tok.name, verdict.reason)
        return tok.with_encoder(hf, backend)
    log.info("tokenizer %r: encoding with %s (%s; the first %d characters of data are checked too)",
             tok.name, verdict.fast.name, verdict.reason, WINDOW_CHARS)
    encoder = VerifiedEncoder(hf, verdict.fast, strict=backend != "auto", label=tok.name,
                              window=WINDOW_CHARS, spot_every=SPOT_EVERY)
    return tok.with_encoder(encoder, backend)


def _sentencepiece(tok: TokenizerLike, *, required: bool) -> Encoder | None:
    """sentencepiece's encoder for a tokenizer loaded from a ``.model``; ``None`` (``auto``) when
    there is no model or no sentencepiece, an error when ``required``."""
    proto: bytes | None = getattr(tok, "sentencepiece_model", None)
    if proto is None:
        if required:
            raise TokenizerError(f"tokenizer {tok.name!r}: backend: sentencepiece needs a SentencePiece .model file "
                                 "(loaded as is, no tokens added); use backend: auto or hf")
        return None
    try:
        encoder = SentencePieceEncoder(proto)
    except ImportError:
        if required:
            raise MissingDependency(f"tokenizer {tok.name!r}: backend: sentencepiece needs the sentencepiece package: "
                                    "pip install 'feedline[hf]'") from None
        log.warning("tokenizer %r: sentencepiece is not installed, so the converted pipeline encodes this .model "
                    "(it differs from sentencepiece on rare texts: pip install 'feedline[hf]')", tok.name)
        return None
    except RuntimeError as e:
        if required:
            raise TokenizerError(f"tokenizer {tok.name!r}: sentencepiece cannot load the model ({e})") from e
        log.warning("tokenizer %r: sentencepiece cannot load the model (%s); the converted pipeline encodes it", tok.name, e)
        return None
    log.info("tokenizer %r: encoding with sentencepiece (the model's own encoder)", tok.name)
    return encoder
