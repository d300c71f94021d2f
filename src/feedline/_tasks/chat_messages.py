"""Conversations as the chat task reads them: OpenAI-form messages and tool schemas from a record.

OpenAI form (``role``/``content``, ``tool_calls``, ``tool`` results) is kept; ShareGPT form
(``from``/``value`` with ``human``/``gpt``/``system``/``function_call``/``observation``) is
converted, a ``function_call`` turn to an assistant ``tool_calls`` entry. A role alias that the
template writes under a token of its own (GLM-4's ``observation``: see
:func:`~feedline._tasks.chat_probes.native_roles`) is kept as written (``native``).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ALIASES", "has_object_arguments", "normalize_conversation", "string_arguments"]

_FIELDS = ("messages", "conversation", "conversations")
_ROLES = {
    "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant", "model": "assistant",
    "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "system": "system", "tool": "tool",
    "function": "tool", "observation": "tool", "function_response": "tool", "ipython": "tool",
    "function_call": "function_call",
}
#: Other names of the user, tool and system roles (``{alias: role}``), kept where the template knows them.
ALIASES = {k: v for k, v in _ROLES.items() if k != v and v in ("user", "tool", "system")}


def _json_or(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _tool_call(call: Any) -> dict[str, Any]:
    """An OpenAI ``tool_calls`` entry with ``arguments`` parsed from JSON when it is a string."""
    call = _json_or(call)
    if not isinstance(call, dict):
        raise ValueError(f"a tool call must be an object, got {call!r}")
    fn = call.get("function", call)
    fn = {k: v for k, v in fn.items() if v is not None}
    if "arguments" in fn:
        fn["arguments"] = _json_or(fn["arguments"])
    return {"type": "function", "function": fn}


def normalize_conversation(data: dict[str, Any], field: str | None = None, tools_field: str = "tools", *,
                           native: frozenset[str] = frozenset()) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The OpenAI-form messages and tool schemas of a record; roles in ``native`` (aliases of
    :data:`ALIASES`, lower case) are kept rather than renamed.

        >>> normalize_conversation({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]})
        ([{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'yo'}], None)

    Raises:
        ValueError: naming what is malformed.
    """
    name = field or next((f for f in _FIELDS if f in data), None)
    if name is None or name not in data:
        raise ValueError(f"no conversation field (looked for {field or ', '.join(_FIELDS)})")
    raw = data[name]
    if not isinstance(raw, list):
        raise ValueError(f"field {name!r} is {type(raw).__name__}, not a list of messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise ValueError(f"message {i} is {type(m).__name__}, not an object")
        role_raw = m.get("role", m.get("from"))
        role = _ROLES.get(str(role_raw).lower()) if role_raw is not None else None
        if role is not None and str(role_raw).lower() in native:
            role = str(role_raw).lower()
        if role is None:
            raise ValueError(f"message {i} has unknown role {role_raw!r}")
        content = m.get("content", m.get("value"))
        if role == "function_call":
            out.append({"role": "assistant", "content": None, "tool_calls": [_tool_call(content)]})
            continue
        msg = {k: v for k, v in m.items() if k not in ("from", "value") and v is not None}
        msg["role"] = role
        if content is not None:
            msg["content"] = content
        if "tool_calls" in msg:
            msg["tool_calls"] = [_tool_call(c) for c in msg["tool_calls"]]
        out.append(msg)
    tools = _json_or(data.get(tools_field))
    if tools in (None, "", []):
        tools = None
    elif not isinstance(tools, list):
        tools = [tools] if isinstance(tools, dict) else None
    return out, tools


def has_object_arguments(msgs: list[dict[str, Any]]) -> bool:
    return any(not isinstance(c["function"].get("arguments", ""), str) for m in msgs for c in m.get("tool_calls") or [])


def string_arguments(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with every tool call's ``arguments`` as a JSON string (OpenAI's wire form)."""
    out = []
    for m in msgs:
        if m.get("tool_calls"):
            calls = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"].get("arguments", {}), ensure_ascii=False)}}
                     if not isinstance(c["function"].get("arguments", ""), str) else c for c in m["tool_calls"]]
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out
