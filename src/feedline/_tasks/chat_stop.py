r"""The stop each trained reply ends with, so that a fine-tuned model learns to end its turn.

Most templates close a reply with end-of-turn text that the mask trains (ChatML's
``<|im_end|>``, DeepSeek's ``<｜end▁of▁sentence｜>``). Some write none (GLM-4: a reply runs
into the next role header, ``<|user|>``/``<|observation|>``, which its ``generation_config.json``
lists as stop ids), and some close only some replies (DeepSeek-R1 writes nothing after a tool
call that a tool output follows). For a reply that ends with neither the template's end-of-turn
text nor a stop token (trailing whitespace aside), :func:`place_stops`

* extends the reply over the stop token that follows it (GLM-4's next role header), else
* inserts the first stop token's text right after the reply (the tokenizer's EOS where it is one).

It works on the rendered text, before it is tokenized, so an inserted stop never splits a token.
Stop tokens are ``eos_token_id`` of the ``generation_config.json`` beside the tokenizer (one id
or a list) and the tokenizer's EOS, those that are added (special) tokens. Without that file, a
template that writes no end-of-turn text also stops at the special tokens that open the next user
or tool turn and name its role (GLM-4's ``<|user|>``, ``<|observation|>``, found by
:func:`~feedline._tasks.chat_probes.header_stops`; ChatML's ``<|im_start|>`` names none), so
GLM-4's ids are those of ``apply_chat_template`` plus the EOS after the last reply either way.

    >>> place_stops("U: hi\nA: yo\nU: ok\nA: bye", [(9, 11), (21, 24)], None, stops=["</s>"], eot="")
    ('U: hi\nA: yo</s>\nU: ok\nA: bye</s>', [(9, 15), (25, 32)], None, [(11, 4), (24, 4)])
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["place_stops", "shift", "stop_ids"]


def stop_ids(generation_eos: Any, eos: int | None, vocab_size: int) -> list[int]:
    """The ids that end a reply: ``generation_config.json``'s ``eos_token_id`` (int or list) and
    EOS, EOS first (it is the one inserted: it ends a reply wherever it stands)."""
    ids: list[int] = []
    values: Iterable[Any] = generation_eos if isinstance(generation_eos, list) else [generation_eos]
    for v in [eos, *values]:
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab_size and v not in ids:
            ids.append(v)
    return ids


def shift(pos: int, inserts: Sequence[tuple[int, int]]) -> int:
    """Where character ``pos`` of the template's render is after ``inserts`` (``(at, length)``, in
    order); text inserted at ``pos`` itself comes before it (it ends the reply that ends there)."""
    ats = [a for a, _ in inserts]
    return pos + sum(n for _, n in inserts[:bisect.bisect_right(ats, pos)])


def place_stops(text: str, spans: list[tuple[int, ...]], ends: list[int] | None, *, stops: Sequence[str],
                eot: str) -> tuple[str, list[tuple[int, ...]], list[int] | None, list[tuple[int, int]]]:
    """The render with a stop after every reply, its spans and turn ends, and what was inserted.

    Args:
        text: the template's render.
        spans: each reply's characters, ``(s, e)`` or ``(lo, s, e, hi)`` (see :mod:`~feedline._tasks.chat_turns`), in order.
        ends: where each assistant turn ends (``None`` when not known yet: map them with :func:`shift`).
        stops: the stop tokens' texts; the first is the one inserted.
        eot: the template's end-of-turn text (``''``: none, or not to be relied on).

    Returns:
        ``(text, spans, ends, inserts)``: ``inserts`` holds ``(position in the render, length)``.
    """
    inserts: list[tuple[int, int]] = []
    grown: dict[int, int] = {}  # span index -> characters of a following stop token taken in
    for k, span in enumerate(spans):
        s, e = span[-3:-1] if len(span) == 4 else span
        if e <= s:
            continue  # nothing rendered: nothing to end
        reply = text[max(s, e - 256):e].rstrip()
        if (eot and reply.endswith(eot)) or any(reply.endswith(x) for x in stops):
            continue
        following = next((x for x in stops if text.startswith(x, e)), None)
        if following is not None:
            grown[k] = len(following)
        elif not stops:
            raise ValueError("no stop token to end a reply with")
        else:
            inserts.append((e, len(stops[0])))
    if not inserts and not grown:
        return text, spans, ends, inserts
    pieces, last = [], 0
    for at, _ in inserts:
        pieces += [text[last:at], stops[0]]
        last = at
    new_text = "".join(pieces) + text[last:]
    new_spans = []
    for k, span in enumerate(spans):
        moved = [shift(p, inserts) for p in span]
        if len(span) == 4:  # lo and s are starts: text inserted at them ends the previous reply
            moved[0], moved[1] = (p + sum(n for a, n in inserts if a < p) for p in span[:2])
            moved[2] += grown.get(k, 0)
            moved[3] = max(moved[3], moved[2])
        else:
            moved[0] = span[0] + sum(n for a, n in inserts if a < span[0])
            moved[1] += grown.get(k, 0)
        new_spans.append(tuple(moved))
    new_ends = None
    if ends is not None:
        new_ends = [shift(p, inserts) for p in ends]
        if len(new_ends) == len(new_spans):
            new_ends = [max(p, sp[-2] if len(sp) == 4 else sp[-1]) for p, sp in zip(new_ends, new_spans, strict=True)]
    return new_text, new_spans, new_ends, inserts
