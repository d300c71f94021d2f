"""Wikitext to clean plain text, with ``mwparserfromhell``; and a markup-residue measure.

    >>> wikitext_to_text("'''Bold''' [[Paris|city]] {{cite web|x}}<ref>note</ref> end.")
    'Bold city end.'
    >>> markup_residue("plain [[link]] text")["[["]
    1

Templates, references, tables, galleries, math, file/image/category links and HTML comments
are removed; links keep their label; bold/italic quotes and heading ``=`` marks are stripped;
entities are decoded; runs of blank lines collapse to one.
"""

from __future__ import annotations

import re
from typing import Any

from feedline.errors import require

__all__ = ["RESIDUE_PATTERNS", "markup_residue", "wikitext_to_text"]

_DROP_TAGS = frozenset({
    "ref", "references", "gallery", "imagemap", "timeline", "math", "chem", "ce", "score", "graph",
    "syntaxhighlight", "source", "templatedata", "mapframe", "maplink", "hiero", "table", "noinclude",
    "includeonly", "indicator", "categorytree", "inputbox",
})
_DROP_LINK = re.compile(r"^\s*:?\s*(file|image|category|media)\s*:", re.IGNORECASE)
_BLANKS = re.compile(r"\n\s*\n(\s*\n)+")
_SPACES = re.compile(r"[ \t]+")

# What must not survive cleaning, by kind: link/template/table brackets, quote markup, tags,
# escaped entities, heading marks.
RESIDUE_PATTERNS: dict[str, re.Pattern[str]] = {
    "[[": re.compile(r"\[\["), "]]": re.compile(r"\]\]"), "{{": re.compile(r"\{\{"), "}}": re.compile(r"\}\}"),
    "{|": re.compile(r"\{\|"), "|-": re.compile(r"^\|-", re.MULTILINE), "''": re.compile(r"''"),
    "<tag>": re.compile(r"</?(ref|references|div|span|small|br|table|td|tr|gallery|math|sup|sub)\b[^>]*>", re.IGNORECASE),
    "&entity;": re.compile(r"&(lt|gt|amp|quot|nbsp|#\d+);"), "==": re.compile(r"^=+.*=+\s*$", re.MULTILINE),
}


def markup_residue(text: str) -> dict[str, int]:
    """Count leftover wiki/HTML markup in ``text`` by kind (all zeros for clean text)."""
    return {name: len(p.findall(text)) for name, p in RESIDUE_PATTERNS.items()}


def wikitext_to_text(source: str) -> str:
    """Plain text of a wikitext page."""
    mwparserfromhell: Any = require("mwparserfromhell", "text")
    code = mwparserfromhell.parse(source)
    for node in code.filter_tags(recursive=True):
        if str(node.tag).strip().lower() in _DROP_TAGS:
            _remove(code, node)
    for link in code.filter_wikilinks(recursive=True):
        if _DROP_LINK.match(str(link.title)):
            _remove(code, link)
    for template in code.filter_templates(recursive=False):
        _remove(code, template)
    for comment in code.filter_comments(recursive=True):
        _remove(code, comment)
    text = code.strip_code(normalize=True, collapse=True)
    lines = [_SPACES.sub(" ", ln).strip() for ln in text.split("\n")]
    text = "\n".join(ln for ln in lines if not _is_debris(ln))
    return _BLANKS.sub("\n\n", text).strip()


def _remove(code: object, node: object) -> None:
    try:
        code.remove(node)  # type: ignore[attr-defined]
    except ValueError:  # already gone with a removed parent
        pass


def _is_debris(line: str) -> bool:
    """Lines that are only left-over table or list punctuation."""
    return bool(line) and not any(c.isalnum() for c in line) and len(line) < 8
