"""The texts on which a fast encoder (fastokens, the word cache) must match ``tokenizers`` before it encodes.

    >>> texts = verification_corpus(load_tokenizer("gpt2/"))    # doctest: +SKIP

Families where encoders disagree when they disagree at all: scripts, normalisation-prone
characters, emoji sequences, whitespace runs, long unbroken runs, digits, code, real prose, and
the tokenizer's own added tokens written as literal text in several contexts.
"""

from __future__ import annotations

from feedline._tokenize.encoder import TokenizerLike

__all__ = ["verification_corpus"]

# Text families where encoders disagree when they disagree at all: scripts, normalisation-prone
# characters, emoji sequences, whitespace runs, long unbroken runs, digits, code.
_CORPUS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog. Ünïcödé naïve café résumé façade Œuvre straße.",
    "Москва — столица России. Ελληνικά γράμματα: αβγδε. עברית: שלום עולם. العربية: مرحبا بالعالم.",
    "हिन्दी भाषा देवनागरी में लिखी जाती है। ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ ქართული ენა Հայերեն",
    "中文分词没有空格。日本語の文章にはひらがな、カタカナ、漢字が混在します。한국어 문장은 띄어쓰기를 합니다。",
    "全角：ＡＢＣ１２３，半角ｶﾀｶﾅ。「引用」『二重』【括弧】〜～・…",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵🇫🇷 ❤️‍🔥 1️⃣ 🫠 ©️ ™ ∑∫√∞ ≠ ≤ ≥",
    "spaces:  two   three    four     five\ttab\t\ttabs\n\nnewlines\r\nCRLF \u00a0nbsp\u3000ideographic\u2028ls   ",
    "        indented code block\n    def f(x):\n        return x  # comment\n\n\n\n",
    " leading space", "trailing space ", "   ", "\n", "\t", "", "a", " a", "a ", "  a  ",
    "a" * 4000,
    "x" * 1000 + " " + "ab" * 700 + " " + "é" * 600,
    "1234567890" * 120,
    "3.14159265358979323846 1,000,000 -42 0x1F 1e-9 2025-11-23T13:12:53Z $19.99 €5,50 ¥1000",
    "https://example.com/path/to/resource?query=value&other=1#fragment user@example.org",
    "aGVsbG8gd29ybGQgdGhpcyBpcyBhIGxvbmcgYmFzZTY0IGJsb2Igd2l0aG91dCBzcGFjZXM" * 20,
    "Pneumonoultramicroscopicsilicovolcanoconiosis Donaudampfschifffahrtsgesellschaftskapitän",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}} <html><body class='x'>&amp;&lt;&gt;</body></html>",
    "ﬁ ﬂ ﬀ ℌ ℍ Ⅸ ① ⁵ ₂ ½ Å Å é é ẞ ǅ İ ı K",
    "zero\u200bwidth\u200cjoiner\u200dmark\ufeffbom\u00admixed",
    "don't can't won't I'm you're he'll we've they'd 'quoted' \"double\" ‘curly’ “curly”",
    "controls:a\x0bb c\x0cd e\x1cf g\x1dh i\x1ej k\x1fl m\x85n o\x00p q\x7fr s\x9ft u\ufffdv \u0301w x\u00a8y \u2475z",
    "!!!??? ... --- ___ *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}} ||| ~~~ ``` ''' \"\"\"",
)


def _prose(limit: int = 24_000) -> list[str]:
    """Real English prose and code that ships with Python (the reference's help topics)."""
    try:
        from pydoc_data import topics
    except ImportError:  # pragma: no cover - stripped Python builds
        return []
    out, total = [], 0
    for _name, text in sorted(topics.topics.items()):
        piece = text[:2000]
        out.append(piece)
        total += len(piece)
        if total >= limit:
            break
    return out


def verification_corpus(tok: TokenizerLike) -> list[str]:
    """Texts that must encode identically before a fast encoder is trusted with ``tok``.

    Mixed scripts, CJK, emoji, whitespace runs, very long words, real prose, and every added
    token of ``tok`` as literal text in several contexts (alone, glued to words, between spaces
    and newlines, repeated).
    """
    texts = list(_CORPUS) + _prose()
    added = sorted(t.content for t in tok.backend.get_added_tokens_decoder().values())
    for t in added:
        texts += [t, f"a{t}b", f" {t} ", f"Hello {t}world", f"\n{t}\n\n", f"{t}{t}", f"x  {t}  y"]
    if added:
        texts.append(" ".join(added) + " " + "".join(added))
    return texts
