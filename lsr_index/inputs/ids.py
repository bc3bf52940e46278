"""The one rule for ids, documents' and queries' alike: what run files, qrels and Lucene terms can hold."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

# Lucene cannot index a term longer than this many UTF-8 bytes (IndexWriter.MAX_TERM_LENGTH); ids are terms.
MAX_ID_BYTES = 32766
# Python's \s is exactly str.isspace(); \x00-\x1f and \x7f-\x9f are Unicode's controls (Cc); then surrogates.
_BAD_ID_CHAR = re.compile(r"[\s\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def check_id(doc_id: str) -> str | None:
    """Why ``doc_id`` cannot be a document id (a reason that quotes it), or None when it can.

    Run and qrels files separate columns by whitespace and the tools that read them disagree on what
    whitespace is (Python's split() takes U+00A0 and U+2028, Java's \\s and trec_eval do not), so an id may
    hold no character that ``str.isspace()`` calls whitespace, no control character (Unicode Cc: line
    breaks, NUL, U+0085) and no lone surrogate (not UTF-8). Format characters (Cf, e.g. U+200B) are
    allowed: nothing splits on them, and real titles hold them. Lucene caps a term at 32,766 UTF-8 bytes.
    """
    if not doc_id:
        return "id '' is empty"
    bad = _BAD_ID_CHAR.search(doc_id)
    if bad:
        char = bad.group()
        kind = "whitespace" if char.isspace() else "a lone surrogate" if ord(char) >= 0xD800 else "a control character"
        return f"id {_shown(doc_id)} contains {kind} (U+{ord(char):04X} at character {bad.start() + 1})"
    if len(doc_id) * 4 > MAX_ID_BYTES and (size := len(doc_id.encode())) > MAX_ID_BYTES:
        return f"id {_shown(doc_id)} is {size:,} UTF-8 bytes, over Lucene's limit of {MAX_ID_BYTES:,} for a term"
    return None


def _shown(doc_id: str) -> str:
    return repr(doc_id if len(doc_id) <= 60 else doc_id[:60] + "…")


class RepeatedField:
    """Finds a JSON object that names one of ``keys`` (an id or text field) more than once.

    JSON parsers keep the last of repeated names without a word, so ``{"id": "a", "id": "b"}`` would silently
    be document "b": which one was meant cannot be known. A line with no more ':' than its object has names holds
    no repeat (a fraction of a microsecond a line, small beside parsing it); else a count of each quoted name finds
    candidates (about a microsecond a name for a 1 kB line), and only those lines are parsed again, for the names
    of the outermost object.
    """

    def __init__(self, keys: Iterable[str]):
        self._quoted = tuple((key, json.dumps(key, ensure_ascii=False).encode()) for key in dict.fromkeys(keys))

    def __call__(self, line: bytes, record: dict[str, object]) -> str | None:
        """The first key named twice in ``record``, the object parsed from ``line`` (valid JSON), if any."""
        if line.count(b":") <= len(record):  # each name, nested ones too, is followed by a ':': a repeat needs more
            return None
        candidates = [key for key, quoted in self._quoted if key in record and line.count(quoted) > 1]
        if not candidates:
            return None
        outermost: list[list[tuple[str, object]]] = [[]]

        def keep(pairs: list[tuple[str, object]]) -> None:  # inner objects come first, the outermost last
            outermost[0] = pairs

        try:
            json.loads(line, object_pairs_hook=keep)
        except (ValueError, RecursionError):  # nesting that orjson takes but Python's parser does not: no verdict
            return None
        names = [name for name, _ in outermost[0]]
        return next((key for key in candidates if names.count(key) > 1), None)
