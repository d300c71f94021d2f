"""Which wikilinks are not prose, in any language: namespace names, aliases, language prefixes.

A wiki names its namespaces in its own language (``Файл``, ``Kategorie``, ``ファイル``), and
every wiki also accepts the English canonical names (``File``, ``Image``, ``Category``) and a few
aliases (Bulgarian ``Картинка`` and ``Изображение`` for ``Файл``). A dump's
``<siteinfo><namespaces>`` gives the wiki's own names (:func:`siteinfo_names`); the aliases,
which dumps do not list, come from :data:`ALIASES`, a table for the most common languages, used
whole for every dump (so a dump without siteinfo is covered too). A :class:`LinkRules` built from
those names decides which ``[[...]]`` links are removed with their captions: files, media,
categories and templates (:data:`HIDDEN_NAMESPACES`), interlanguage links (:data:`LANGUAGES`,
plus any lowercase ``xx:`` / ``xxx-yy:`` prefix that is not a namespace), and, whatever the
namespace is called, links to a media file (``....jpg``) or whose first option is an image option
(``мини``, ``miniatur``, ``サムネイル``, ``200px``; :data:`IMAGE_OPTIONS`). Links through a sister
project (``[[wikisource:...]]``, :data:`INTERWIKI`) stay visible.

    >>> rules = LinkRules.of(("Файл", "Категория"))
    >>> rules.hidden("Категория:Календари"), rules.hidden("de:Kalender"), rules.hidden("Календар")
    (True, True, False)
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

__all__ = ["ALIASES", "HIDDEN_NAMESPACES", "IMAGE_OPTIONS", "INTERWIKI", "LANGUAGES", "LinkRules", "siteinfo_names"]

#: Namespaces whose links are not prose: Media (-2), File (6), Template (10), Category (14).
HIDDEN_NAMESPACES = frozenset({-2, 6, 10, 14})

#: Names and aliases of the hidden namespaces: the English canonical ones (valid on every wiki)
#: and, per language, the local names and aliases (MediaWiki's ``Messages*.php`` namespace
#: names of each language).
ALIASES: dict[str, tuple[str, ...]] = {
    "en": ("Media", "File", "Image", "Template", "Category"),
    "bg": ("Медия", "Файл", "Картинка", "Изображение", "Шаблон", "Категория"),
    "de": ("Medium", "Datei", "Bild", "Vorlage", "Kategorie"),
    "fr": ("Média", "Fichier", "Image", "Modèle", "Catégorie"),
    "es": ("Medio", "Archivo", "Imagen", "Plantilla", "Categoría"),
    "ru": ("Медиа", "Файл", "Изображение", "Шаблон", "Категория"),
    "uk": ("Медіа", "Файл", "Зображення", "Шаблон", "Категорія"),
    "ja": ("メディア", "ファイル", "画像", "テンプレート", "カテゴリ"),
    "zh": ("媒体", "媒體", "文件", "檔案", "档案", "图像", "圖像", "模板", "样板", "樣板", "分类", "分類"),
    "it": ("Immagine", "Categoria"),
    "pt": ("Multimédia", "Ficheiro", "Arquivo", "Imagem", "Predefinição", "Modelo", "Categoria"),
    "pl": ("Plik", "Grafika", "Szablon", "Kategoria"),
    "nl": ("Bestand", "Afbeelding", "Sjabloon", "Categorie"),
    "sv": ("Fil", "Bild", "Mall", "Kategori"),
    "cs": ("Soubor", "Obrázek", "Šablona", "Kategorie"),
    "fi": ("Tiedosto", "Kuva", "Malline", "Luokka"),
    "tr": ("Dosya", "Resim", "Şablon", "Kategori"),
    "hu": ("Fájl", "Kép", "Sablon", "Kategória"),
    "ro": ("Fișier", "Imagine", "Format", "Categorie"),
    "id": ("Berkas", "Gambar", "Templat", "Kategori"),
    "vi": ("Tập tin", "Hình", "Bản mẫu", "Thể loại"),
    "ko": ("파일", "그림", "틀", "분류"),
    "ar": ("ملف", "صورة", "قالب", "تصنيف"),
    "fa": ("پرونده", "تصویر", "الگو", "رده"),
    "he": ("קובץ", "תמונה", "תבנית", "קטגוריה"),
}

#: Image options that may open a file link's options (the English ones and their translations).
IMAGE_OPTIONS = frozenset({
    "thumb", "thumbnail", "frame", "framed", "frameless", "upright", "left", "right", "center", "centre", "none",
    "border", "мини", "миниатюра", "рамка", "безрамка", "дясно", "ляво", "център", "справа", "слева", "центр",
    "міні", "мініатюра", "праворуч", "ліворуч", "miniatur", "mini", "rahmenlos", "hochkant", "rechts", "links",
    "zentriert", "vignette", "droite", "gauche", "centré", "miniatura", "derecha", "izquierda", "centro", "destra",
    "sinistra", "direita", "esquerda", "mały", "prawo", "lewo", "miniatuur", "サムネイル", "サムネ", "右", "左",
    "中央", "なし", "缩略图", "縮圖", "居中",
})

#: Interlanguage link prefixes (Wikipedia language codes) that the generic ``xx:``/``xx-yy:``
#: pattern does not cover or that come capitalized.
LANGUAGES = frozenset({
    "simple", "zh-yue", "zh-min-nan", "zh-classical", "be-tarask", "be-x-old", "bat-smg", "cbk-zam", "fiu-vro",
    "map-bms", "nds-nl", "roa-rup", "roa-tara", "en", "de", "fr", "es", "ru", "bg", "ja", "zh", "it", "pt",
    "pl", "nl", "uk", "sv", "cs", "fi", "tr", "hu", "ro", "id", "vi", "ko", "ar", "fa", "he", "ca", "no", "nn",
    "da", "el", "sr", "hr", "bs", "sh", "sk", "sl", "et", "lv", "lt", "eo", "eu", "gl", "hi", "bn", "ta", "te",
    "th", "ms", "ceb", "war", "arz", "azb", "ast", "ka", "hy", "az", "kk", "uz", "be", "mk", "sq", "af", "is",
    "ga", "cy", "la", "lb", "ur", "mr", "ml", "kn", "gu", "pa", "ne", "si", "my", "km", "lo", "mn", "tl", "sw",
})

#: Interwiki prefixes of the sister projects: links through them are visible (``[[wikisource:File:X.pdf|label]]``).
INTERWIKI = frozenset({
    "wikipedia", "wikisource", "wiktionary", "wikibooks", "wikiquote", "wikinews", "wikiversity", "wikivoyage",
    "wikidata", "wikispecies", "wikimedia", "commons", "meta", "mediawikiwiki", "mw", "species", "w", "s", "b",
    "n", "q", "v", "voy", "d", "m", "wikt", "c",
})

_GENERIC_LANGUAGE = re.compile(r"[a-z]{2,3}(?:-[a-z0-9]+)*")  # xx, xxx, zh-min-nan (lowercase, as dumps write them)
_MEDIA_FILE = re.compile(
    r"\.(?:jpe?g|png|gif|svg|tiff?|webp|bmp|xcf|pdf|djvu|ogg|ogv|oga|opus|webm|mp3|wav|flac|midi?|stl)\s*$",
    re.IGNORECASE)
_PX = re.compile(r"^\s*(?:\d+\s*)?(?:x\s*)?\d+\s*(?:px|пкс|пкс\.|пиксела|пикс|ピクセル)\s*$", re.IGNORECASE)


def _key(name: str) -> str:
    """A namespace name as MediaWiki compares it: spaces and underscores alike, case-insensitive."""
    return " ".join(name.replace("_", " ").split()).casefold()


_BUILT_IN = frozenset(_key(n) for names in ALIASES.values() for n in names)


@dataclass(frozen=True)
class LinkRules:
    """Decides which link targets are hidden: ``names`` are the hidden namespaces' names (all
    languages of :data:`ALIASES` and the dump's own), ``namespaces`` every namespace name of the
    dump (never taken for a language prefix)."""

    names: frozenset[str]
    namespaces: frozenset[str] = frozenset()

    @classmethod
    def of(cls, hidden: tuple[str, ...] = (), namespaces: tuple[str, ...] = ()) -> LinkRules:
        """The rules for a dump whose hidden namespaces are named ``hidden`` (cached)."""
        return _rules(tuple(sorted(hidden)), tuple(sorted(namespaces)))

    def hidden(self, target: str, options: str = "") -> bool:
        """Whether a link to ``target`` (before any ``|``), with ``options`` (after it), is removed."""
        prefix, colon, rest = target.partition(":")
        if not colon:
            return False
        word = prefix.strip()
        key = _key(word)
        if key in self.names:
            return True
        if key in self.namespaces or key in INTERWIKI:
            return False
        if word in LANGUAGES or (_GENERIC_LANGUAGE.fullmatch(word) and rest[:1] not in (" ", "\t", "")):
            return True
        if ":" in rest:  # two prefixes: an interwiki link (hidden above when it is a language's)
            return False
        if _MEDIA_FILE.search(rest):
            return True
        first = options.split("|", 1)[0].strip()
        return bool(first) and (first.casefold() in IMAGE_OPTIONS or bool(_PX.match(first)))


@functools.lru_cache(maxsize=64)
def _rules(hidden: tuple[str, ...], namespaces: tuple[str, ...]) -> LinkRules:
    return LinkRules(_BUILT_IN | {_key(n) for n in hidden}, frozenset(_key(n) for n in namespaces))


def siteinfo_names(namespaces: dict[int, list[str]]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(hidden, all)`` namespace names of a dump's ``<namespaces>`` (``{key: [names]}``)."""
    hidden = tuple(n for k, names in namespaces.items() if k in HIDDEN_NAMESPACES for n in names if n)
    every = tuple(n for names in namespaces.values() for n in names if n)
    return hidden, every
