"""Text from outside that is not Unicode text.

A byte that is not UTF-8 (a file read with ``errors="surrogateescape"``) and a lone surrogate
that JSON may escape (``"\\ud800"``) both arrive as a surrogate in a ``str``: one that nothing
writes (SQLite, a UTF-8 log or file). Readers find it where it came in and name it there."""

from __future__ import annotations


def not_text_at(text: str) -> int | None:
    """The index of the first character of ``text`` UTF-8 cannot encode (None: it is text)."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None


def not_utf8(text: str, at: int) -> str:
    """What a reader says of the character at ``at`` (``not_text_at``): the byte it was read
    from."""
    return f"not UTF-8 (byte {ord(text[at]) & 0xFF:#04x})"
