"""Which single-byte code page a legacy Latin-script file is in, when the detector hesitates.

charset-normalizer judges a reading by its "chaos" (odd characters) and a letter-frequency
"coherence" that needs more text than a title or a short note holds; on a short Western file
it readily takes a neighbouring code page, and "Façade naïve" (cp1252) comes out as
"Faēade naļve" (cp1257) or "Fańade na’ve" (cp775). Code pages differ only in their
accented letters, so a reading is judged here by those letters: a reading FITS when every
accented letter in it belongs to ONE language's alphabet (LATIN_ALPHABETS), no other symbol sits
inside a word, and no word flips from lower to upper case half-way ("Grˆşere", "garńon" and
"öðretmen" fit no language; "Größere", "garçon" and "öğretmen" do).

The choice among the readings that fit (`choose_latin`): cp1252 first, by far the most common
legacy encoding (and a superset of latin-1's letters); then the detector's own order. When no
reading fits, the detector's choice stands. Text in other scripts (Cyrillic, Greek, Hebrew,
Arabic, CJK) is left to the detector: a reading with letters of those scripts never fits.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

# The accented letters (lower case) each Latin-script language writes; ASCII letters are in all.
LATIN_ALPHABETS = {
    "French": "àâæçéèêëîïôœùûüÿ",
    "German": "äöüß",
    "Spanish": "áéíñóúü",
    "Portuguese": "áâãàçéêíóôõú",
    "Italian": "àèéìíîòóùú",
    "Catalan": "àçèéíïòóúü",
    "Dutch": "áéèëíïóöúü",
    "Danish/Norwegian": "æøåéó",
    "Swedish/Finnish": "åäöé",
    "Icelandic": "áðéíóúýþæö",
    "Polish": "ąćęłńóśźż",
    "Czech": "áčďéěíňóřšťúůýž",
    "Slovak": "áäčďéíĺľňóôŕšťúýž",
    "Hungarian": "áéíóöőúüű",
    "Romanian": "ăâîșțşţ",
    "Croatian/Slovene/Bosnian": "čćđšž",
    "Turkish": "çğıöşüâîû",
    "Estonian": "äõöüšž",
    "Latvian": "āčēģīķļņšūž",
    "Lithuanian": "ąčęėįšųūž",
}
_ALPHABET_SETS = {language: frozenset(letters) for language, letters in LATIN_ALPHABETS.items()}
# Symbols that may stand between two letters of a word: apostrophes, the Catalan middle dot.
_IN_WORD = frozenset("’‘·")
# Code pages whose readings are always tried, beside the detector's candidates: the Windows
# Latin pages cover the Western, Central European, Turkish and Baltic alphabets.
LATIN_CODE_PAGES = ("cp1252", "cp1250", "cp1254", "cp1257")
PREFERRED = "cp1252"


def _letter(c: str) -> str:
    """The lower-case form to look up ("İ".lower() is "i" + a combining dot: keep the "i")."""
    return c.lower()[0]


def fits(text: str) -> bool:
    """Whether `text` reads as one Latin-script language (see the module docstring)."""
    accented: set[str] = set()
    for i, c in enumerate(text):
        if c < "\x80":
            continue
        before = text[i - 1] if i else " "
        after = text[i + 1] if i + 1 < len(text) else " "
        if c.isalpha():
            letter = _letter(c)
            if letter >= "\x80":
                accented.add(letter)
            if before.isalpha() and before.islower() and c.isupper():
                return False  # "garÇon": a lower-case letter then an upper-case one
        elif before.isalpha() and after.isalpha() and c not in _IN_WORD:
            return False      # "f¸r", "Za¿ó³æ": a symbol inside a word
    return any(accented <= alphabet for alphabet in _ALPHABET_SETS.values())


def _reads(sample: bytes, encoding: str, complete: bool) -> str | None:
    try:
        return codecs.getincrementaldecoder(encoding)("strict").decode(sample, complete)
    except (UnicodeDecodeError, LookupError):
        return None


def choose_latin(sample: bytes, complete: bool, detected: Sequence[str]) -> str | None:
    """The code page to read `sample` with when it is Latin-script text: cp1252 if its reading
    fits, else the first of `detected` (the detector's candidates, best first) and the Windows
    Latin pages whose reading fits; None when none fits (the caller keeps the detector's)."""
    order = [PREFERRED, *detected, *LATIN_CODE_PAGES]
    tried: set[str] = set()
    for encoding in order:
        name = codecs.lookup(encoding).name
        if name in tried:
            continue
        tried.add(name)
        text = _reads(sample, encoding, complete)
        if text is not None and any(c >= "\x80" for c in text) and fits(text):
            return encoding
    return None
