"""What a chat template writes around a reply, learnt once per task by rendering probe conversations.

* :func:`end_of_turn`: the text the template writes after a reply and trains with it
  (ChatML's ``<|im_end|>``), or ``''`` (GLM-4 writes none: a reply runs into the next header).
* :func:`native_roles`: role aliases (``observation``, ``function``, ``ipython``, ``human``) that the
  template writes under a special token of their own, as GLM-4 writes ``<|observation|>``. A
  message with such a role keeps it instead of becoming ``tool``/``user`` (which GLM-4's template
  would write as ``<|tool|>``: five ordinary tokens, not the token the model was trained on).
* :func:`header_stops`: the special tokens that open the next user or tool turn right after a
  reply and name its role (GLM-4's ``<|user|>``, ``<|observation|>``). A model of such a template
  ends its reply by writing the next role's token; the chat task takes them as stop tokens when
  no ``generation_config.json`` lists them (:mod:`~feedline._tasks.chat_stop`).

A render function returns ``None`` where the template refuses a probe (an unknown role, say).

    >>> glm = lambda msgs: "".join(f"<|{m['role']}|>\\n{m['content']}" for m in msgs)
    >>> header_stops(glm, ["<|user|>", "<|observation|>", "<|assistant|>"], ["user", "tool", "observation"])
    ['<|user|>', '<|observation|>']
    >>> native_roles(glm, ["<|user|>", "<|observation|>"], {"observation": "tool", "human": "user"})
    frozenset({'observation'})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["end_of_turn", "header_stops", "native_roles"]

Render = Callable[[list[dict[str, Any]]], "str | None"]

_USER, _REPLY, _NEXT = "zqxuserqz", "zqxreplyqz", "zqxnextqz"


def end_of_turn(render_spans: Callable[[list[dict[str, Any]]], tuple[str, list[tuple[int, int]]]], generation: bool) -> str:
    """The end-of-turn text the template writes (and the mask trains) after a reply, or ``''``.

    ``render_spans`` renders a conversation with its ``{% generation %}`` spans (``generation``:
    the mask follows them, so the text must lie inside the reply's span to count).
    """
    try:
        text, spans = render_spans([{"role": "user", "content": _USER}, {"role": "assistant", "content": _REPLY}])
    except Exception:
        return ""
    at = text.find(_REPLY)
    if at < 0:
        return ""
    end = next((e for s, e in spans if s <= at < e), at + len(_REPLY)) if generation else len(text)
    return text[at + len(_REPLY):end].strip()


def _header(render: Render, role: str) -> str | None:
    """What the template writes between a reply and the content of a following ``role`` message."""
    text = render([{"role": "user", "content": _USER}, {"role": "assistant", "content": _REPLY},
                   {"role": role, "content": _NEXT}])
    if text is None or _REPLY not in text or _NEXT not in text:
        return None
    start = text.index(_REPLY) + len(_REPLY)
    end = text.find(_NEXT, start)
    return text[start:end] if end >= 0 else None


def _naming(specials: Sequence[str], role: str) -> list[str]:
    return [t for t in specials if role.lower() in t.lower()]


def native_roles(render: Render, specials: Sequence[str], aliases: Mapping[str, str]) -> frozenset[str]:
    """The aliases (``{alias: canonical role}``) whose header holds a special token naming the alias."""
    known = set()
    for alias in aliases:
        header = _header(render, alias)
        if header is not None and any(t in header for t in _naming(specials, alias)):
            known.add(alias)
    return frozenset(known)


def header_stops(render: Render, specials: Sequence[str], roles: Sequence[str]) -> list[str]:
    """Special tokens that open a ``roles`` message right after a reply and name its role, in order."""
    out: list[str] = []
    for role in roles:
        header = _header(render, role)
        if header is None:
            continue
        for t in sorted(_naming(specials, role), key=len, reverse=True):
            if header.startswith(t) and t not in out:
                out.append(t)
                break
    return out
