"""Which parts of a conversation a chat template leaves out of its render.

A template may ignore a field it does not know: GLM-4's writes neither ``tool_calls`` nor the
conversation's tool schemas (and skips an assistant message that has no ``content``),
DeepSeek-R1's cuts ``<think>`` reasoning out of every reply, Qwen3's shows ``reasoning_content``
only after the last user query. A conversation trained so loses that text from input and labels
without a trace. :class:`FieldProbe` finds such fields by rendering a *probe*: a conversation of
the same shape (roles, which fields are set, how many tool calls, the tools' layout) whose every
value is a distinct sentinel, and listing the sentinels missing from the render. A probe's answer
depends on the shape only, so it is rendered once per shape and cached: a stream of conversations
costs one dictionary look-up each, plus one render per new shape.

    >>> probe = FieldProbe(lambda msgs, tools: "".join(m.get("content") or "" for m in msgs))
    >>> probe.missing([{"role": "user", "content": "hi"},
    ...                {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}], None)
    ['message 2 (assistant): tool_calls', 'message 2 (assistant): tool_calls arguments']
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["FieldProbe", "conversation_shape", "describe"]

Render = Callable[[list[dict[str, Any]], Any], str]

_MAX_SHAPES = 4096
_UNSEEN: Any = object()


def _sentinel(tag: str) -> str:
    # lower-case letters and digits only, so case filters (upper, title) and escaping leave it findable
    return f"zqx{tag}qz"


def _content_kind(m: dict[str, Any]) -> str:
    """``text``, ``think`` (a reply with ``</think>``), ``parts`` (a list with text), else what
    stands in for no content: ``absent``, ``none`` or ``empty`` (kept as such: templates test them)."""
    content = m.get("content")
    if isinstance(content, str):
        if not content.strip():
            return "empty"
        return "think" if "</think>" in content else "text"
    if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "text" and p.get("text") for p in content):
        return "parts"
    return "none" if "content" in m else "absent"


def conversation_shape(msgs: list[dict[str, Any]], tools: Any) -> tuple[Any, ...]:
    """What decides which fields a template renders: per message its role, the kind of its
    content, whether it has reasoning, its tool calls' count and argument type; the tools' layout."""
    shape: list[Any] = []
    for m in msgs:
        calls = m.get("tool_calls") or []
        reasoning = m.get("reasoning_content")
        shape.append((m["role"], _content_kind(m), bool(isinstance(reasoning, str) and reasoning.strip()),
                      tuple(isinstance(c.get("function", {}).get("arguments"), str) for c in calls)))
    tool_shape = tuple("function" in t for t in tools) if isinstance(tools, list) else ()
    return tuple(shape), tool_shape


def _probe(shape: tuple[Any, ...]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, str]]:
    """A conversation of ``shape`` with sentinel values, its tools, and ``{sentinel: what it stands for}``."""
    msg_shapes, tool_shape = shape
    expect: dict[str, str] = {}
    msgs: list[dict[str, Any]] = []
    for i, (role, kind, reasoning, calls) in enumerate(msg_shapes):
        where = f"message {i + 1} ({role})"
        m: dict[str, Any] = {"role": role}
        c = _sentinel(f"{i}c")
        if kind in ("text", "think", "parts"):
            expect[c] = f"{where}: content"
        if kind in ("none", "empty"):
            m["content"] = None if kind == "none" else ""
        elif kind == "text":
            m["content"] = c
        elif kind == "think":
            r = _sentinel(f"{i}t")
            expect[r] = f"{where}: <think> reasoning in content"
            m["content"] = f"<think>\n{r}\n</think>\n\n{c}"
        elif kind == "parts":
            m["content"] = [{"type": "text", "text": c}]
        if reasoning:
            r = _sentinel(f"{i}r")
            expect[r] = f"{where}: reasoning_content"
            m["reasoning_content"] = r
        if calls:
            m["tool_calls"] = []
            for j, as_string in enumerate(calls):
                name, value = _sentinel(f"{i}n{j}"), _sentinel(f"{i}a{j}")
                expect[name] = f"{where}: tool_calls"
                expect[value] = f"{where}: tool_calls arguments"
                args: Any = {"zqxarg": value}
                m["tool_calls"].append({"type": "function", "function": {
                    "name": name, "arguments": json.dumps(args) if as_string else args}})
        msgs.append(m)
    tools = None
    if tool_shape:
        tools = []
        for k, wrapped in enumerate(tool_shape):
            name, desc, param = _sentinel(f"t{k}n"), _sentinel(f"t{k}d"), _sentinel(f"t{k}p")
            expect[name] = "tools: names"
            expect[desc] = "tools: descriptions"
            expect[param] = "tools: parameters"
            fn = {"name": name, "description": desc,
                  "parameters": {"type": "object", "properties": {param: {"type": "string"}}, "required": [param]}}
            tools.append({"type": "function", "function": fn} if wrapped else fn)
    return msgs, tools, expect


def describe(missing: list[str], most: int = 3) -> str:
    """``['message 2 (assistant): tool_calls', 'tools: names', 'tools: parameters']`` as
    ``'message 2 (assistant): tool_calls; tools: names, parameters'`` (the first ``most`` places)."""
    by_place: dict[str, list[str]] = {}
    for what in missing:
        place, _, field = what.partition(": ")
        by_place.setdefault(place, []).append(field)
    parts = [f"{place}: {', '.join(fields)}" for place, fields in by_place.items()]
    return "; ".join(parts[:most]) + (f"; and {len(parts) - most} more" if len(parts) > most else "")


class FieldProbe:
    """Fields of conversations that a template's render leaves out, found once per shape.

    Args:
        render: renders ``(messages, tools)`` with the template (may raise, as templates do).
    """

    def __init__(self, render: Render) -> None:
        self._render = render
        self._cache: dict[tuple[Any, ...], list[str] | None] = {}  # threads share it: a race costs a probe
        self.probes = 0  # renders spent on probes (for tests and measurements)

    def missing(self, msgs: list[dict[str, Any]], tools: Any, rendered: str | None = None) -> list[str]:
        """What of ``msgs``/``tools`` the template does not render (``'message 3 (assistant): tool_calls'``).

        ``rendered``: the caller's render of ``msgs``/``tools``, if it has one; where the probe
        failed, the conversation's own values are looked up in it (else it is rendered here).
        """
        shape = conversation_shape(msgs, tools)
        found = self._cache.get(shape, _UNSEEN)
        if found is _UNSEEN:
            found = self._by_probe(shape)
            if len(self._cache) >= _MAX_SHAPES:
                self._cache.clear()
            self._cache[shape] = found
        if found is not None:
            return found
        if rendered is None:
            try:
                rendered = self._render(msgs, tools)
            except Exception:  # not expected: the conversation rendered before it was checked
                return []
        return _by_values(rendered.lower(), msgs, tools)

    def _by_probe(self, shape: tuple[Any, ...]) -> list[str] | None:
        msgs, tools, expect = _probe(shape)
        self.probes += 1
        try:
            text = self._render(msgs, tools).lower()
        except Exception:  # the template refuses sentinels (it validates values): check real values instead
            return None
        return list(dict.fromkeys(what for s, what in expect.items() if s not in text))


def _by_values(text: str, msgs: list[dict[str, Any]], tools: Any) -> list[str]:
    """The fallback check on the conversation's own values (whitespace-trimmed, case-folded) in
    ``text``, its render lower-cased."""
    out = []
    for i, m in enumerate(msgs):
        where = f"message {i + 1} ({m['role']})"
        content = m.get("content")
        if isinstance(content, str) and content.strip():
            answer = content.split("</think>")[-1].strip().lower()
            if answer and answer not in text:
                out.append(f"{where}: content")
        for c in m.get("tool_calls") or []:
            name = c.get("function", {}).get("name")
            if isinstance(name, str) and name.lower() not in text:
                out.append(f"{where}: tool_calls")
        reasoning = m.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning.strip() and reasoning.strip().lower() not in text:
            out.append(f"{where}: reasoning_content")
    for t in tools or []:
        name = (t.get("function", t) if isinstance(t, dict) else {}).get("name")
        if isinstance(name, str) and name.lower() not in text:
            out.append("tools: names")
    return list(dict.fromkeys(out))
