"""Wikitext to clean plain text, in a few linear passes; and a markup-residue measure.

    >>> wikitext_to_text("'''Bold''' [[Paris|city]] {{cite web|x}}<ref>note</ref> end.")
    'Bold city end.'
    >>> wikitext_to_text("[[File:A.jpg|thumb|A [[map]] of it]]Text in [[de:Paris]]<blockquote>quoted</blockquote>")
    'Text in quoted'
    >>> markup_residue("plain [[link]] text")["[["]
    1

What goes, in order: comments; elements whose content is not prose (``<ref>``,
``<references/>``, ``<gallery>``, ``<math>``, ``<table>``, ... see ``DROP_TAGS``); templates
``{{...}}`` and parameters ``{{{...}}}`` (nested, by bracket depth); tables ``{| ... |}``
(nested); file/image/media, category, template and interlanguage links (with their captions),
in any language (:class:`~feedline._sources.wikins.LinkRules`: the dump's namespace names, a
built-in table of aliases, media file names and image options such as ``мини``); other
HTML tags (their content stays: ``<blockquote>``, ``<span>``, ``<small>``, ...); bold/italic
quotes, heading ``=`` marks, list markers, behaviour switches (``__TOC__``, ``__СЪДЪРЖАНИЕ__``,
``__目次__``: any ``__WORD__`` without lowercase letters). Links keep their
label (``[[Paris|city]]`` -> ``city``, ``[[bus]]es`` -> ``buses``), external links theirs;
entities are decoded; runs of blank lines collapse to one.

It is written for speed (regular expressions and bracket scans, no parse tree): the 106
articles of a real 206-page dump clean in well under a second per core (``bench/wikixml.py``),
and :data:`RESIDUE_PATTERNS` finds nothing in them (``tests/test_wikixml.py``).
"""

from __future__ import annotations

import html
import re

from feedline._sources.wikins import IMAGE_OPTIONS, LinkRules

__all__ = ["DROP_TAGS", "RESIDUE_PATTERNS", "markup_residue", "wikitext_to_text"]

#: Elements removed with their content.
DROP_TAGS = frozenset({
    "ref", "references", "gallery", "imagemap", "timeline", "math", "chem", "ce", "score", "graph",
    "syntaxhighlight", "source", "templatedata", "mapframe", "maplink", "hiero", "table", "noinclude",
    "includeonly", "indicator", "categorytree", "inputbox", "templatestyles", "charinsert", "section",
})
_TAG_ALT = "|".join(sorted(DROP_TAGS))
_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
_DROP_EMPTY = re.compile(rf"<\s*(?:{_TAG_ALT})\b[^<>]*/\s*>", re.IGNORECASE)
_DROP_PAIRED = re.compile(rf"<\s*({_TAG_ALT})\b[^<>]*>.*?<\s*/\s*\1\s*>", re.IGNORECASE | re.DOTALL)
_DROP_OPEN = re.compile(rf"<\s*/?\s*(?:{_TAG_ALT})\b[^<>]*>", re.IGNORECASE)  # unpaired left-overs
_PARAM = re.compile(r"\{\{\{[^{}]*\}\}\}")  # template parameters {{{1|default}}}
_BRACES = re.compile(r"\{\{|\}\}")
_TABLE = re.compile(r"^[ \t]*(\{\||\|\})", re.MULTILINE)
_LINK = re.compile(r"\[\[((?:[^\[\]]|\[(?!\[)|\](?!\]))*)\]\]")  # innermost: single brackets allowed inside
_EXT_LINK = re.compile(r"\[(?:https?:|ftp:|mailto:|//)[^\s\]]*[ \t]*([^\]\n]*)\]")
_QUOTES = re.compile(r"'{2,}")
_HEADING = re.compile(r"^[ \t]*(=+)[ \t]*(.*?)[ \t]*\1[ \t]*$", re.MULTILINE)
_BR = re.compile(r"<\s*br\s*/?\s*>", re.IGNORECASE)
_TAG = re.compile(r"<\s*/?\s*[a-zA-Z][a-zA-Z0-9]*\b[^<>]*>")
_MAGIC = re.compile(r"__([^\W_]{2,})__")
_LIST = re.compile(r"^[ \t]*[*#:;]+[ \t]*", re.MULTILINE)
_RULE = re.compile(r"^[ \t]*-{4,}[ \t]*$", re.MULTILINE)
_SPACES = re.compile(r"[ \t\u00a0]+")
_SPACE_PUNCT = re.compile(r" +([,.;:!?)])")
_BLANKS = re.compile(r"\n\s*\n(\s*\n)+")
_OPTIONS = "|".join(map(re.escape, sorted(IMAGE_OPTIONS)))

# What must not survive cleaning, by kind (the test lists them): references, templates, tables,
# files/images/galleries, categories, interlanguage links, HTML tags, bold/italic quotes,
# entities, heading marks, behaviour switches.
RESIDUE_PATTERNS: dict[str, re.Pattern[str]] = {
    "[[": re.compile(r"\[\["), "]]": re.compile(r"\]\]"), "{{": re.compile(r"\{\{"), "}}": re.compile(r"\}\}"),
    "{|": re.compile(r"\{\|"), "|}": re.compile(r"^\s*\|\}", re.MULTILINE),
    "|-": re.compile(r"^\s*\|[-+]", re.MULTILINE), "table cell": re.compile(r"^\s*[!|]\s*\S.*\|\|", re.MULTILINE),
    "''": re.compile(r"''"),
    "<ref>": re.compile(r"<\s*/?\s*(ref|references)\b", re.IGNORECASE),
    "<tag>": re.compile(r"<\s*/?\s*[a-zA-Z][a-zA-Z0-9]*\b[^<>\n]{0,200}>"),
    "file:": re.compile(r"\b(File|Image|Media|Category|Файл|Картинка|Изображение|Категория|Категорія|Datei|Bild"
                        r"|Kategorie|Fichier|Catégorie|Archivo|Categoría|Categoria|ファイル|画像|カテゴリ|Category):\S",
                        re.IGNORECASE),
    "thumb|": re.compile(rf"(?:^|\|)\s*(?:{_OPTIONS})\s*\||\b\d+\s*(?:px|пкс|ピクセル)\b", re.IGNORECASE | re.MULTILINE),
    "interlanguage": re.compile(r"^[a-z]{2,3}(-[a-z0-9]+)*:\S", re.MULTILINE),
    "&entity;": re.compile(r"&(lt|gt|amp|quot|nbsp|ndash|mdash|#\d+|#x[0-9a-fA-F]+);"),
    "==": re.compile(r"^=+.*=+\s*$", re.MULTILINE), "__SWITCH__": re.compile(r"__[^\W_a-z]{2,}__"),
}


def markup_residue(text: str) -> dict[str, int]:
    """Count leftover wiki/HTML markup in ``text`` by kind (all zeros for clean text)."""
    return {name: len(p.findall(text)) for name, p in RESIDUE_PATTERNS.items()}


def wikitext_to_text(source: str, rules: LinkRules | None = None) -> str:
    """Plain text of a wikitext page (see the module docstring for what is removed); ``rules``
    say which links are not prose (default: every language of the built-in table)."""
    rules = rules or LinkRules.of()
    s = _COMMENT.sub("", source)
    s = _DROP_EMPTY.sub("", s)
    s = _DROP_PAIRED.sub("", s)
    s = _DROP_OPEN.sub("", s)
    s = _PARAM.sub("", s)
    s = _remove_nested(s, _BRACES)
    s = _remove_nested(s, _TABLE)
    s = _links(s, rules)
    s = _EXT_LINK.sub(lambda m: m.group(1), s)
    s = _QUOTES.sub("", s)
    s = _HEADING.sub(lambda m: m.group(2), s)
    s = _BR.sub("\n", s)
    s = _TAG.sub("", s)
    s = _MAGIC.sub(_switch, s)
    s = _RULE.sub("", s)
    s = _LIST.sub("", s)
    s = html.unescape(s)
    lines = [_SPACE_PUNCT.sub(r"\1", _SPACES.sub(" ", ln)).strip() for ln in s.split("\n")]
    s = "\n".join(ln for ln in lines if not _is_debris(ln))
    return _BLANKS.sub("\n\n", s).strip()


def _remove_nested(s: str, tokens: re.Pattern[str]) -> str:
    """Drop every span between an opener (a token starting with ``{``) and its matching closer,
    nesting counted; an opener never closed loses only itself, a stray closer is dropped."""
    out: list[str] = []
    depth, at, start = 0, 0, 0
    opens: list[int] = []
    for m in tokens.finditer(s):
        tok = m.group(m.lastindex or 0)
        if tok[0] == "{":
            if depth == 0:
                out.append(s[at:m.start()])
                start = m.start()
            depth += 1
            opens.append(m.end())
        elif depth:
            depth -= 1
            opens.pop()
            if depth == 0:
                at = m.end()
        else:
            out.append(s[at:m.start()])
            at = m.end()
    if depth:  # unclosed: keep the text after the outermost opener, without the opener
        tail = s[opens[0]:] if opens else s[start:]
        return "".join(out) + _remove_nested(tail, tokens)
    out.append(s[at:])
    return "".join(out)


def _switch(m: re.Match[str]) -> str:
    """A behaviour switch goes (``__NOTOC__``, ``__БЕЗСЪДЪРЖАНИЕ__``); ``__init__`` stays."""
    return m.group(0) if any(c.islower() for c in m.group(1)) else ""


def _link_text(m: re.Match[str], rules: LinkRules) -> str:
    inner = m.group(1)
    target, bar, label = inner.partition("|")
    visible = target.lstrip().startswith(":")  # [[:Category:X]] is a link to the category page
    if not visible and rules.hidden(target, label):
        return ""
    if bar:
        return label if label.strip() else re.sub(r"\s*\(.*\)\s*$", "", target).split(":", 1)[-1]
    target = target.strip().lstrip(":")
    return target.split(":", 1)[1] if visible and rules.hidden(target) else target.strip()


def _links(s: str, rules: LinkRules) -> str:
    """Wikilinks innermost first (a file caption's links before the file link)."""
    def text(m: re.Match[str]) -> str:
        return _link_text(m, rules)

    while True:
        new = _LINK.sub(text, s)
        if new == s:
            return new
        s = new


def _is_debris(line: str) -> bool:
    """Lines that are only left-over table or list punctuation."""
    return bool(line) and not any(c.isalnum() for c in line) and len(line) < 8
