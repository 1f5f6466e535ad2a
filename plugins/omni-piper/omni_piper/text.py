"""Text normalisation and sentence splitting for speech: pure functions, no voice needed.

espeak-ng (Piper's phonemizer) reads plain text well but trips on what writers type: smart
quotes, symbols, currency, abbreviations whose period it takes for a sentence end. Those are
rewritten into words here; then the text is cut into sentences, and an over-long sentence at its
clause boundaries, so each piece can be synthesised and sent on its own.
"""

from __future__ import annotations

import re
import unicodedata

MAX_SENTENCE_CHARS = 300

_TRANSLATE = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2033": '"', "\u00ab": '"', "\u00bb": '"',
    "\u2013": ", ", "\u2014": ", ", "\u2015": ", ", "\u2026": "...",
    "*": " ", "_": " ", "#": " ", "~": " ", "|": " ", "<": " ", ">": " ", "`": " ", "^": " ",
})

ABBREVIATIONS = {
    "mr": "mister", "mrs": "missus", "ms": "miz", "dr": "doctor", "prof": "professor", "st": "saint",
    "jr": "junior", "sr": "senior", "vs": "versus", "etc": "et cetera", "approx": "approximately",
    "no": "number", "mt": "mount", "ft": "feet", "jan": "january", "feb": "february", "mar": "march",
    "apr": "april", "jun": "june", "jul": "july", "aug": "august", "sep": "september",
    "sept": "september", "oct": "october", "nov": "november", "dec": "december",
}
_LATIN = {"e.g.": "for example", "i.e.": "that is", "a.m.": "a m", "p.m.": "p m"}

_ABBREV_RE = re.compile(r"\b(" + "|".join(sorted(ABBREVIATIONS, key=len, reverse=True)) + r")\.(?=\s|$)",
                        re.IGNORECASE)
_MONEY_RE = re.compile(r"([$\u00a3\u20ac])\s?(\d[\d,]*)(?:\.(\d{1,2}))?\b")
_CURRENCY = {"$": ("dollar", "cent"), "\u00a3": ("pound", "penny"), "\u20ac": ("euro", "cent")}
# a sentence ends at . ! ? (plus closing quotes/brackets) before whitespace and a capital, digit or quote
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_INITIAL = re.compile(r"(?:^|\s)[A-Z]\.$")  # "J." in "J. R. R. Tolkien" ends no sentence
_CLAUSE = re.compile(r"(?<=[,;:])\s+")


def _money(match: re.Match) -> str:
    unit, sub = _CURRENCY[match.group(1)]
    whole = int(match.group(2).replace(",", ""))
    words = f"{whole} {unit}{'' if whole == 1 else 's'}"
    cents = int((match.group(3) or "0").ljust(2, "0"))
    if cents:
        plural = "pence" if sub == "penny" else sub + "s"
        words += f" and {cents} {sub if cents == 1 else plural}"
    return words


def _abbreviation(match: re.Match) -> str:
    word = ABBREVIATIONS[match.group(1).lower()]
    return word.capitalize() if match.group(1)[0].isupper() else word


def normalize(text: str) -> str:
    """Plain, speakable text: symbols, currency, abbreviations as words; one space between words."""
    text = unicodedata.normalize("NFKC", text).translate(_TRANSLATE)
    text = re.sub(r"\n\s*\n", ". ", text)  # a blank line ends a sentence (headings, paragraphs)
    text = "".join(ch if unicodedata.category(ch)[0] != "C" else " " for ch in text)  # controls, tabs, newlines
    for latin, words in _LATIN.items():
        text = re.sub(re.escape(latin), words, text, flags=re.IGNORECASE)
    text = _MONEY_RE.sub(_money, text)
    text = re.sub(r"(\d)\s?%", r"\1 percent", text)
    text = text.replace("&", " and ").replace("@", " at ").replace("+", " plus ").replace("=", " equals ")
    text = _ABBREV_RE.sub(_abbreviation, text)
    text = re.sub(r"\s+([!?.,;:])", r"\1", text)
    text = re.sub(r"([!?])[!?]+", r"\1", text)  # "!!!" -> "!", "?!" -> "?"
    text = re.sub(r"([!?.,;:])[.,;:]+", r"\1", text)  # "..." -> ".", "?." -> "?"
    text = re.sub(r"\s+", " ", text).strip()
    return text.lstrip(".,;: ")


def _split_long(sentence: str, max_chars: int) -> list[str]:
    if len(sentence) <= max_chars:
        return [sentence]
    pieces, current = [], ""
    for clause in _CLAUSE.split(sentence):
        if current and len(current) + 1 + len(clause) > max_chars:
            pieces.append(current)
            current = clause
        else:
            current = f"{current} {clause}" if current else clause
    if current:
        pieces.append(current)
    out = []
    for piece in pieces:  # a clause still too long is cut between words
        while len(piece) > max_chars:
            cut = piece.rfind(" ", 0, max_chars)
            cut = cut if cut > 0 else max_chars
            out.append(piece[:cut].strip())
            piece = piece[cut:].strip()
        if piece:
            out.append(piece)
    return out


def split_sentences(text: str, max_chars: int = MAX_SENTENCE_CHARS) -> list[str]:
    """Sentences of normalised text, in order; none longer than `max_chars`."""
    sentences: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        candidate = text[start:match.start()].strip()
        if _INITIAL.search(text[: match.start()]):
            continue
        if candidate:
            sentences.append(text[start:match.end()].strip())
            start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return [piece for s in sentences for piece in _split_long(s, max_chars) if re.search(r"\w", piece)]
