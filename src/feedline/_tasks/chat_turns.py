r"""Where assistant turns are in a rendered conversation, and which tokens hold them.

:func:`locate_turn` finds one assistant turn in the render of the whole conversation without
assuming that renders of the first turns are prefixes of it. For turn ``i`` it is given three
renders: ``before`` (turns ``< i``), ``prompt`` (the same with the generation prompt) and
``last`` (turns ``<= i``, so turn ``i`` is the last message). With Qwen3.5's template::

    last[len(before):]   <|im_start|>assistant\n<think>\n | \n</think>\n\nFour.<|im_end|>\n
    prompt[len(before):] <|im_start|>assistant\n<think>\n
                         header (common to both, cut at a   body: what the model writes
                         token boundary of the prompt)

The body is looked up after the header in the whole render, in order. An earlier turn that
the template writes without the think block (``<|im_start|>assistant\nFour.<|im_end|>\n``) is
found as the longest tail of the body (``Four.<|im_end|>\n``) right after the longest shorter
header (``<|im_start|>assistant\n``), provided the tail holds the reply (:func:`reply_pieces`).

    >>> locate_turn("<s>U: hi\nA: yo.\n", 0, before="<s>U: hi\n", prompt="<s>U: hi\nA:",
    ...             last="<s>U: hi\nA: yo.\n", token_ends=lambda s: list(range(len(s) + 1)), needed=["yo."])
    (9, 11, 16)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from feedline._tasks.chat_stop import shift

__all__ = ["free_after", "free_before", "locate_turn", "offsets_of", "reply_pieces", "token_mask", "tokens_before", "tokens_within",
           "turn_ends"]


def locate_turn(text: str, cursor: int, *, before: str, prompt: str | None, last: str,
                token_ends: Callable[[str], list[int]], needed: Sequence[str]) -> tuple[int, int, int] | None:
    """``(header start, body start, body end)`` of the turn in ``text`` at or after ``cursor``, or ``None``.

    Args:
        text: the render of the whole conversation.
        cursor: where the previous assistant turn ended.
        before, prompt, last: renders of the turns before it, with the generation prompt, and through it.
        token_ends: character offsets where a string's tokens end (headers are cut only there).
        needed: strings the located tail must contain (the reply, tool-call names).
    """
    if not last.startswith(before):
        return None
    gen = prompt[len(before):] if prompt is not None and prompt.startswith(before) else ""
    turn = last[len(before):]
    cuts = token_ends(gen)
    k = max((c for c in cuts if turn.startswith(gen[:c])), default=0)
    header, body = turn[:k], turn[k:]
    pos = text.find(header + body, cursor)
    if pos >= 0:
        return pos, pos + len(header), pos + len(header) + len(body)
    for c in sorted((c for c in cuts if 0 < c <= k), reverse=True):
        head = header[:c]
        pos = text.find(head, cursor)
        while pos >= 0:
            start = pos + len(head)
            for j in range(len(body)):
                tail = body[j:]
                if text.startswith(tail, start):
                    if all(piece in tail for piece in needed):
                        return pos, start, start + len(tail)
                    break
            pos = text.find(head, pos + 1)
    return None


def reply_pieces(m: dict[str, Any]) -> list[str]:
    """Strings every render of an assistant message contains: its final answer and tool names."""
    content = m.get("content")
    pieces = []
    if isinstance(content, str):
        answer = content.split("</think>")[-1].strip()
        if answer:
            pieces.append(answer)
    for call in m.get("tool_calls") or []:
        name = call.get("function", {}).get("name")
        if isinstance(name, str):
            pieces.append(name)
    return pieces


def free_before(text: str, h: int, msgs: list[dict[str, Any]], i: int) -> int:
    """Where the text before turn ``i``'s header stops being the previous message's content.

    A token that straddles the turn's start may also cover template markup (``>`` of R1's
    ``<｜tool▁outputs▁end｜>``), never the previous message's own text.
    """
    prev = str(msgs[i - 1].get("content") or "").strip() if i and msgs[i - 1]["role"] != "assistant" else ""
    at = text.rfind(prev, 0, h) if prev else -1
    return at + len(prev) if at >= 0 else h


def free_after(text: str, end: int, msgs: list[dict[str, Any]], i: int) -> int:
    """Where the next message's content starts after turn ``i`` (a straddling token stops there)."""
    if i + 1 >= len(msgs):
        return len(text)
    nxt = str(msgs[i + 1].get("content") or "").strip() if msgs[i + 1]["role"] != "assistant" else ""
    at = text.find(nxt, end) if nxt else -1
    return at if at >= 0 else end


def offsets_of(enc: Any) -> np.ndarray:
    """An encoding's ``(start, end)`` character offsets as an ``[n, 2]`` array (convert once per encoding)."""
    return np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)


def tokens_before(enc: Any, char: int, n: int, offsets: np.ndarray | None = None) -> int:
    """Number of tokens that start before character ``char``."""
    offsets = offsets_of(enc) if offsets is None else offsets
    return int(np.searchsorted(offsets[:, 0], char, side="left")) if n else 0


def tokens_within(enc: Any, spans: Sequence[tuple[int, int, int, int]], n: int, offsets: np.ndarray | None = None) -> np.ndarray:
    """Tokens that overlap a turn's characters ``[s, e)`` and lie inside ``[lo, hi)``.

    Like ``apply_chat_template``'s mask, a token holding the turn's first or last character is
    trained even when it also covers template text around the turn (ChatML's ``"\n\n"`` after
    ``<think>``); ``lo``/``hi`` bound it by the neighbouring messages' own text, which is never
    trained.
    """
    mask = np.zeros(n, dtype=bool)
    if not n:
        return mask
    offsets = offsets_of(enc) if offsets is None else offsets
    starts, ends = offsets[:, 0], offsets[:, 1]
    for lo, s, e, hi in spans:
        mask |= (starts >= lo) & (ends <= hi) & (ends > s) & (starts < e)
    return mask


def token_mask(enc: Any, spans: Sequence[tuple[int, int]], n: int) -> np.ndarray:
    """Tokens covering each character span ``[s, e)``, as ``apply_chat_template`` maps them.

    A span's first and last tokens are those holding its first and last characters (characters
    that map to no token, such as ones a normalizer dropped, are skipped).
    """
    mask = np.zeros(n, dtype=bool)
    for s, e in spans:
        ts = next((t for c in range(s, e) if (t := enc.char_to_token(c)) is not None), None)
        if ts is None:
            continue
        te = next(t for c in range(e - 1, s - 1, -1) if (t := enc.char_to_token(c)) is not None)
        mask[ts:te + 1] = True
    return mask



def turn_ends(text: str, msgs: list[dict[str, Any]], spans: Sequence[tuple[int, ...]], inserts: list[tuple[int, int]],
              render: Callable[[list[dict[str, Any]]], str]) -> list[int] | None:
    """Where each assistant turn ends in ``text`` (the render with ``inserts``: stops placed after
    replies, see :mod:`~feedline._tasks.chat_stop`), from ``render`` of the turns through it;
    ``None`` when those renders are not prefixes of the template's own render."""
    pieces, last, moved = [], 0, 0
    for at, n in inserts:  # the template's own render
        pieces.append(text[last:at + moved])
        last, moved = at + moved + n, moved + n
    original = "".join(pieces) + text[last:]
    ends = []
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            through = render(msgs[:i + 1])
            if not original.startswith(through):
                return None
            ends.append(shift(len(through), inserts))
    if len(ends) == len(spans):  # a reply's stop stays with it
        ends = [max(end, span[-1]) for end, span in zip(ends, spans, strict=True)]
    return ends
