"""Chat SFT: conversations rendered with the tokenizer's chat template, loss on assistant turns only.

A record's conversation is read from ``messages``, ``conversation`` or ``conversations`` (or
``task.messages``), in OpenAI form (``role``/``content``, ``tool_calls``, ``tool`` results) or
ShareGPT form (``from``/``value`` with ``human``/``gpt``/``system``/``function_call``/
``observation``); ShareGPT turns are converted to OpenAI form, a ``function_call`` turn to an
assistant ``tool_calls`` entry, an ``observation`` to ``tool`` unless the template has a special
token naming it (GLM-4's ``<|observation|>``: :mod:`~feedline._tasks.chat_probes`). Tools come
from ``tools`` (a list, or a JSON string)::

    task: {kind: chat, max_length: 4096}
    task: {kind: chat, max_length: 2048, truncation: reject, system: "You are terse."}

The conversation is rendered with the template (``task.chat_template`` or the tokenizer's),
tokenized in one batched call, and ``labels`` = ``input_ids`` on assistant tokens, -100
elsewhere. Which characters are "assistant":

* ``generation`` (templates with ``{% generation %}`` blocks): exactly the blocks, mapped to
  tokens as ``apply_chat_template(..., return_assistant_tokens_mask=True)`` does;
* ``prefix`` (any other template): the whole conversation is rendered once and each
  assistant turn is located in it, in order. The turn as the template writes it when it is the
  last message (the render of turns ``<= i`` after the render of turns ``< i``) splits into the
  header that the generation prompt also writes (``<|im_start|>assistant\\n``; Qwen3's prompt
  adds ``<think>\\n``) and what the model writes: reasoning where the template renders it, the
  reply, tool calls and the end-of-turn text (``<|im_end|>\\n`` for ChatML). That part is
  found after the same header; where the template writes earlier turns differently (Qwen3 and
  Qwen3.5 give only the latest turns a think block, DeepSeek-R1 drops earlier reasoning), the
  longest tail of it that follows a shorter header and still holds the reply and its tool-call
  names. A turn found neither way rejects the conversation (``turn_not_located``, counted and
  logged). Tokens are those the characters map to; one that straddles the turn's edge is
  trained if its other part is template text, never if it holds a neighbour message's text.

Reasoning follows the template: trained where the template renders it (Qwen3.5: the think
block of turns after the last user query, the opening ``<think>\\n`` being the generation
prompt), absent and untrained where it does not (R1; Qwen3.5's earlier turns). Tool-call
arguments are passed as objects (the Hugging Face convention) and, for templates that
concatenate them as strings (DeepSeek-R1), as JSON strings.

A conversation with content the template does not render (a tool call, tool schemas,
reasoning: :mod:`~feedline._tasks.chat_fields`) is rejected (``unrendered_content``) or, with
``unrendered: warn``, kept without it and the field named once. Every reply ends with a trained
stop (``stop``, :mod:`~feedline._tasks.chat_stop`): the template's end-of-turn text, else the
stop token after it (GLM-4's next role header), else the EOS inserted after it. A conversation
that opens with a reply is located after the template's render of no message and its generation
prompt (GLM-4's ``[gMASK]<sop>`` and ``<|assistant|>``), so that header is never trained.

``loss_mask: auto`` picks ``generation`` when the template has the tags. ``assistant_only:
false`` trains on every token.

Conversations ending on user (or tool) turns lose those trailing turns (``trailing: drop``;
they would carry no loss); one with no assistant turn is rejected (``no_assistant``).
Truncation to ``max_length`` (``truncation``): ``turns`` keeps the longest run of whole turns
ending on an assistant turn (rejects ``too_long`` when the first reply does not fit),
``reject`` rejects long conversations, ``cut`` cuts mid-turn (logged once: the kept part of the
last turn is trained on). Differences from TRL: no bundled training templates are swapped in
(``loss_mask: prefix`` works with the model's own template); a generation span
whose first character maps to no token is narrowed to the characters that do, instead of
ending the mask.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np

from feedline._core.record import Record
from feedline._tasks.base import Task, TaskOutput
from feedline._tasks.chat_fields import FieldProbe, describe
from feedline._tasks.chat_messages import ALIASES, has_object_arguments, normalize_conversation, string_arguments
from feedline._tasks.chat_probes import end_of_turn, header_stops, native_roles
from feedline._tasks.chat_stop import place_stops, stop_ids
from feedline._tasks.chat_turns import (
    free_after,
    free_before,
    locate_turn,
    offsets_of,
    reply_pieces,
    token_mask,
    tokens_before,
    tokens_within,
    turn_ends,
)
from feedline.errors import MissingDependency, SpecError, TaskError

__all__ = ["Chat", "ChatOptions", "normalize_conversation"]

log = logging.getLogger(__name__)

_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass(frozen=True, kw_only=True)
class ChatOptions:
    """Options of the ``chat`` task.

    Attributes:
        max_length: tokens per example; ``None`` keeps whole conversations.
        messages: record field holding the conversation (default: the first of messages/conversation/conversations).
        tools: record field holding the tool schemas.
        system: a system prompt prepended to conversations that have none.
        chat_template: a Jinja template replacing the tokenizer's.
        loss_mask: how assistant tokens are found: ``auto``, ``generation`` or ``prefix``.
        assistant_only: train on assistant tokens only (``false``: on every token).
        trailing: ``drop`` turns after the last assistant turn, or ``keep`` them (no loss).
        truncation: ``turns``, ``reject`` or ``cut`` (see the module docstring).
        unrendered: a conversation with a field the template does not render (``tool_calls``,
            ``reasoning_content``, tools, ...): ``reject`` it (``unrendered_content``), or ``warn``
            once per field and keep it without that field.
        stop: what ends each trained reply: ``auto`` (the template's end-of-turn text, else a stop
            token: the next role header's first token when it is a stop id, else one inserted),
            ``eos`` (a stop token always), ``template`` (only what the template writes).
    """

    max_length: int | None = 4096
    messages: str | None = None
    tools: str = "tools"
    system: str | None = None
    chat_template: str | None = None
    loss_mask: Literal["auto", "generation", "prefix"] = "auto"
    assistant_only: bool = True
    trailing: Literal["drop", "keep"] = "drop"
    truncation: Literal["turns", "reject", "cut"] = "turns"
    unrendered: Literal["reject", "warn"] = "reject"
    stop: Literal["auto", "eos", "template"] = "auto"

    def __post_init__(self) -> None:
        if self.max_length is not None and self.max_length < 2:
            raise SpecError(f"task.max_length: {self.max_length} must be >= 2")


class Chat(Task):
    """The ``chat`` task."""

    kind = "chat"
    Options = ChatOptions
    whole_records = True

    @cached_property
    def template(self) -> str:
        t = self.options.chat_template or self.tok.config.get("chat_template")
        if isinstance(t, list):  # named templates: take "default"
            t = next((x.get("template") for x in t if x.get("name") == "default"), None)
        if not t:
            raise TaskError(f"chat: tokenizer {self.tok.name!r} has no chat_template; set task.chat_template")
        return str(t)

    @cached_property
    def mode(self) -> str:
        has_tags = bool(_GENERATION.search(self.template))
        if self.options.loss_mask == "generation" and not has_tags:
            raise TaskError("chat: loss_mask: generation needs a template with {% generation %} blocks; use loss_mask: prefix")
        return "generation" if self.options.loss_mask != "prefix" and has_tags else "prefix"

    @cached_property
    def _template_kwargs(self) -> dict[str, Any]:
        return dict(self.tok.special_tokens_map)   # not tok.hf's: building it took up to 1.6 s a tokenizer

    def _render(self, msgs: list[dict[str, Any]], tools: Any, *, gen_prompt: bool = False, spans: bool = False) -> tuple[str, list[tuple[int, int]]]:
        try:
            from transformers.utils.chat_template_utils import render_jinja_template
        except ImportError as e:
            raise MissingDependency("the chat task renders chat templates with transformers; "
                                    "install it with: pip install 'feedline[hf]'") from e
        out: Any = render_jinja_template(
            conversations=[msgs], tools=tools, chat_template=self.template,
            return_assistant_tokens_mask=spans, add_generation_prompt=gen_prompt, **self._template_kwargs)
        rendered, indices = out
        return rendered[0], [(int(a), int(b)) for a, b in indices[0]] if spans else []

    def _prepare(self, rec: Record) -> tuple[str, list[Any], list[int] | None, list[dict[str, Any]], Any, list[tuple[int, int]]] | str:
        """Rendered text, assistant char spans, assistant-turn end chars (prefix mode), messages, tools,
        stops inserted (see :func:`~feedline._tasks.chat_stop.place_stops`), or a rejection."""
        opts: ChatOptions = self.options
        try:
            msgs, tools = normalize_conversation(rec.data, opts.messages, opts.tools, native=self._native_roles)
        except ValueError as e:
            return f"bad_conversation: {e}"
        if opts.system is not None and not any(m["role"] == "system" for m in msgs):
            msgs.insert(0, {"role": "system", "content": opts.system})
        if opts.trailing == "drop":
            while msgs and msgs[-1]["role"] != "assistant":
                msgs.pop()
        if not any(m["role"] == "assistant" for m in msgs):
            return "no_assistant: the conversation has no assistant turn"
        prep = self._rendered(msgs, tools)
        if isinstance(prep, str):  # a turn the template writes apart from its history may lack a field
            located = prep.startswith("turn_not_located") and opts.unrendered == "reject"
            missing = self._fields.missing(msgs, tools) if located else []
            if not missing:
                return prep
        else:
            missing = self._fields.missing(prep[3], tools, rendered=prep[0])
        if missing and opts.unrendered == "reject":
            return (f"unrendered_content: the chat template does not render {describe(missing)}; give a "
                    "chat_template that renders it, or set task.unrendered: warn to train without it")
        if missing:
            self._warn_unrendered(missing)
        if isinstance(prep, str):  # not reached: a failed render with missing fields was rejected above
            return prep
        if opts.stop == "template":
            return (*prep, [])
        text, spans, ends, msgs, tools = prep
        eot = self._template_eot if opts.stop == "auto" else ""   # eos: only a stop token ends a reply
        try:
            text, spans, ends, inserts = place_stops(text, spans, ends, stops=self._stop_texts, eot=eot)
        except ValueError:
            raise TaskError(f"chat: a reply ends with no end-of-turn text and tokenizer {self.tok.name!r} has no "
                            "EOS (added) token nor generation_config.json eos_token_id to end it with; add an "
                            "eos_token, or set task.stop: template to train replies without a stop") from None
        return text, spans, ends, msgs, tools, inserts

    def _rendered(self, msgs: list[dict[str, Any]], tools: Any) -> tuple[str, list[Any], list[int] | None, list[dict[str, Any]], Any] | str:
        try:
            return self._spans(msgs, tools)
        except MissingDependency:
            raise
        except Exception as e:  # jinja raises many types (TemplateError, TypeError, raise_exception)
            if not has_object_arguments(msgs):
                return f"template_error: {type(e).__name__}: {e}"
            first = e
        try:  # templates such as DeepSeek-R1's concatenate tool-call arguments as a JSON string
            return self._spans(string_arguments(msgs), tools)
        except Exception:
            return f"template_error: {type(first).__name__}: {first}"

    @cached_property
    def _fields(self) -> FieldProbe:
        return FieldProbe(lambda msgs, tools: self._render(msgs, tools)[0])

    def __getstate__(self) -> dict[str, Any]:
        """Picklable after use (Ray ships tasks to workers): the probe, which holds a render function, is made anew there."""
        state = dict(self.__dict__)
        state.pop("_fields", None)
        return state

    def _warn_unrendered(self, missing: list[str]) -> None:
        warned: set[str] = self.__dict__.setdefault("_warned_fields", set())
        new = list(dict.fromkeys(k for k in (re.sub(r"^message \d+ ", "", w) for w in missing) if k not in warned))
        if new:
            warned.update(new)
            log.warning("chat: the chat template of %s does not render %s; conversations are trained without it "
                        "(task.unrendered: warn)", self.tok.name, describe(new, most=len(new)))

    def _spans(self, msgs: list[dict[str, Any]], tools: Any) -> tuple[str, list[Any], list[int] | None, list[dict[str, Any]], Any] | str:
        """The render, the assistant spans (``(s, e)`` from generation blocks, ``(lo, s, e, hi)`` located), turn ends."""
        if self.mode == "generation":
            text, spans = self._render(msgs, tools, spans=True)
            return text, spans, None, msgs, tools
        text, _ = self._render(msgs, tools)
        located: list[tuple[int, int, int, int]] = []
        cursor = 0
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            span = self._locate_turn(text, cursor, msgs, i, tools)
            if span is None:
                return (f"turn_not_located: assistant turn {i} (message {i + 1} of {len(msgs)}) was not found "
                        "in the rendered conversation; give the template {% generation %} blocks")
            h, start, end = span
            located.append((free_before(text, h, msgs, i), start, end, free_after(text, end, msgs, i)))
            cursor = end
        return text, located, [e for _, _, e, _ in located], msgs, tools

    def _render_or_none(self, msgs: list[dict[str, Any]] | None, tools: Any, gen_prompt: bool = False) -> str | None:
        """The render of a partial conversation, or ``None`` when the template refuses it (``[]``
        renders as ``''``; ``None``: the template's own render of no message)."""
        if msgs is not None and not msgs:
            return ""
        try:
            return self._render(msgs or [], tools, gen_prompt=gen_prompt)[0]
        except Exception:  # e.g. "No user query found in messages." for a system-only prefix
            return None

    def _locate_turn(self, text: str, cursor: int, msgs: list[dict[str, Any]], i: int, tools: Any) -> tuple[int, int, int] | None:
        """Assistant turn ``i`` in ``text`` at or after ``cursor`` (see :func:`~feedline._tasks.chat_turns.locate_turn`)."""
        last = self._render_or_none(msgs[:i + 1], tools)
        if i:
            before = self._render_or_none(msgs[:i], tools)
            prompt = self._render_or_none(msgs[:i], tools, gen_prompt=True)
        else:  # a conversation opening with a reply: the template's render of no message, and its prompt
            before, prompt = (self._render_or_none(None, tools, gen_prompt=g) for g in (False, True))
            if before is None or prompt is None or last is None or not (last.startswith(before) and prompt.startswith(before)):
                before, prompt = self._opening(last, msgs[0], tools), None
        if before is None or last is None:
            return None
        return locate_turn(text, cursor, before=before, prompt=prompt, last=last,
                           token_ends=self._token_boundaries, needed=reply_pieces(msgs[i]))

    def _opening(self, last: str | None, first: dict[str, Any], tools: Any) -> str | None:
        """What a template that cannot render no message writes before a first message that is
        the assistant's (a default system prompt, the header): the part of ``last`` that the
        render of another first reply shares, cut at a token boundary."""
        other = "B" if str(first.get("content") or "").startswith("A") else "A"
        probe = self._render_or_none([{"role": "assistant", "content": other}], tools)
        if last is None or probe is None:
            return None
        n = next((k for k, (a, b) in enumerate(zip(last, probe, strict=False)) if a != b), min(len(last), len(probe)))
        return last[:max(c for c in self._token_boundaries(last) if c <= n)]

    def _token_boundaries(self, s: str) -> list[int]:
        """Character offsets in ``s`` where its tokens end (so a header is never cut inside a token)."""
        cache: dict[str, list[int]] = self.__dict__.setdefault("_boundaries", {})
        if s not in cache:
            enc = self.tok.backend.encode(s, add_special_tokens=False) if s else None
            cache[s] = [0, *sorted({int(e) for _, e in enc.offsets})] if enc is not None else [0]
            if len(cache) > 256:
                cache.pop(next(iter(cache)))
        return cache[s]

    def process(self, records: Sequence[Record]) -> list[TaskOutput]:
        prepared = [self._prepare(r) for r in records]
        texts = [p[0] if isinstance(p, tuple) else "" for p in prepared]
        encs = self.tok.backend.encode_batch(texts, add_special_tokens=False) if texts else []
        out: list[TaskOutput] = []
        for rec, prep, enc in zip(records, prepared, encs, strict=True):
            if isinstance(prep, str):
                reason, _, detail = prep.partition(": ")
                out.append(self.reject(rec, reason, detail))
                continue
            res = self._example(rec, prep, enc)
            out.append([res] if not isinstance(res, str) else self.reject(rec, *res.split(": ", 1)))
        return out

    def _example(self, rec: Record, prep: tuple[Any, ...], enc: Any) -> Any:
        opts: ChatOptions = self.options
        text, spans, ends, msgs, tools, inserts = prep
        ids = np.asarray(enc.ids, dtype=np.int32)
        offsets = offsets_of(enc)
        if not opts.assistant_only:
            mask = np.ones(len(ids), bool)
        elif self.mode == "generation":
            mask = token_mask(enc, spans, len(ids))
        else:
            mask = tokens_within(enc, spans, len(ids), offsets)
        n = len(ids)
        if opts.max_length is not None and n > opts.max_length:
            if opts.truncation == "reject":
                return f"too_long: {n} tokens > max_length {opts.max_length}"
            if opts.truncation == "cut":
                if not getattr(self, "_warned", False):
                    self._warned = True
                    log.warning("chat: truncation: cut keeps partial turns; the cut part of a turn is trained on")
                n = opts.max_length
            else:
                ends = ends if ends is not None else turn_ends(text, msgs, spans, inserts, lambda m: self._render(m, tools)[0])
                cut = 0
                for end in ends or []:
                    t = tokens_before(enc, end, len(enc.ids), offsets)
                    if t > opts.max_length:
                        break
                    cut = t
                if cut == 0:
                    return f"too_long: no whole assistant turn fits in max_length {opts.max_length} ({n} tokens)"
                n = cut
        ids, mask = ids[:n], mask[:n]
        if not mask.any():
            return "no_assistant_tokens: no token of an assistant turn survived rendering and truncation"
        labels = np.where(mask, ids, -100).astype(np.int32)
        return self.example(rec, 0, input_ids=ids, labels=labels)

    @cached_property
    def _template_eot(self) -> str:
        """The end-of-turn text the template writes (and the mask trains) after a reply: ``<|im_end|>``, or ``''``."""
        generation = self.mode == "generation"
        return end_of_turn(lambda msgs: self._render(msgs, None, spans=generation), generation)

    @cached_property
    def _specials(self) -> list[str]:
        """The tokenizer's special added tokens, as text."""
        return [t.content for t in self.tok.backend.get_added_tokens_decoder().values() if t.special]

    @cached_property
    def _native_roles(self) -> frozenset[str]:
        """Role aliases the template writes under a special token of their own (GLM-4's ``observation``)."""
        return native_roles(lambda msgs: self._render_or_none(msgs, None), self._specials, ALIASES)

    @cached_property
    def _stop_texts(self) -> list[str]:
        """The stop tokens (see :func:`~feedline._tasks.chat_stop.stop_ids`) that are added tokens, as text;
        without ``generation_config.json``, for a template with no end-of-turn text, also the special
        tokens that open the next user or tool turn and name its role (GLM-4's ``<|user|>``)."""
        generation = self.tok.config.get("generation_config") or {}
        added = self.tok.backend.get_added_tokens_decoder()
        ids = stop_ids(generation.get("eos_token_id"), self.tok.eos_id, self.tok.vocab_size)
        texts = [added[i].content for i in ids if i in added]
        if "eos_token_id" not in generation and not self._template_eot:
            roles = ["user", "tool", *sorted(r for r in self._native_roles if ALIASES[r] == "tool")]
            texts += [t for t in header_stops(lambda msgs: self._render_or_none(msgs, None), self._specials, roles)
                      if t not in texts]
        return texts
