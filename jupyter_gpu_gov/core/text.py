"""Text from outside that is not Unicode text, or that a reader would not see as it is.

A byte that is not UTF-8 (a file read with ``errors="surrogateescape"``) and a lone surrogate
that JSON may escape (``"\\ud800"``) both arrive as a surrogate in a ``str``: one that nothing
writes (SQLite, a UTF-8 log or file). Readers find it where it came in and name it there."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from urllib.parse import quote

# What ends a line or reorders it as shown: C0 controls, DEL, C1 controls (U+0085 is a line
# break to some readers, U+009B a CSI to many terminals), the line and paragraph separators,
# and the bidi controls. A name a user chose may hold any of them.
_BIDI = (0x61C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
CONTROLS = (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, *_BIDI)


def quoted(value: object, limit: int = 60) -> str:
    """A value an error quotes, cut to ``limit`` characters: an int past 4,300 digits has no
    repr (ValueError), so it is said by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"a whole number of {value.bit_length()} bits"
    return f"{value!r:.{limit}}"


def escape_table(keep: str = "") -> dict[int, str]:
    """``str.translate``'s table writing each of ``CONTROLS`` but those in ``keep`` as ``repr``
    writes it (``\\n``, ``\\x1b``, ``\\u202e``)."""
    return {c: repr(chr(c))[1:-1] for c in CONTROLS if chr(c) not in keep}


_ESCAPED = escape_table()  # every control character, newline and tab too


def escaped(text: object) -> str:
    """``text`` on one line: each control character written as ``repr`` writes it (``\\n``,
    ``\\x1b``, ``\\u202e``). What a log line quotes from outside (a user's or a server's name,
    a choice, an API's error text) goes through this, so it can neither end the line nor
    start a forged one."""
    return str(text).translate(_ESCAPED)


def isolated(name: str) -> str:
    """A name a user chose, in plain text beside other text (a tooltip), as its own bidi
    isolate (U+2068 ... U+2069: HTML's ``<bdi>`` in plain text): a bidi control in it
    (U+202E) reorders the name alone, never the text around it."""
    return f"\u2068{name}\u2069"


def in_sentence(name: str) -> str:
    """A name from outside (a user's, a team's) inside a sentence the governor writes (a reason:
    "culled by user:…", "team … needs this borrowed GPU back"): ``isolated`` where it could
    reorder the sentence around it (a bidi control, a right-to-left letter: anything but
    ASCII), else as it is, so an ordinary name's reason reads as it always did."""
    return name if name.isascii() else isolated(name)


def listed(names: Iterable[str]) -> str:
    """Names from outside (teams, an admin's tier names) listed in a sentence: "a, b, c", each
    ``in_sentence``."""
    return ", ".join(in_sentence(name) for name in names)


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


# The longest line a file handed to the command line may have (a trace's sample, a diagnosis
# window: a few hundred characters). Python reads a line whole before anyone sees it, so a
# file of one line of gigabytes took that much memory before its error was named.
MAX_LINE = 1 << 20


class LineTooLong(ValueError):
    """A line of a file longer than ``MAX_LINE``; its message names the line."""


def bounded_lines(file, limit: int = MAX_LINE) -> Iterator[str]:
    """The lines of a text ``file`` as iterating it gives them, each read at most ``limit``
    characters at a time: a longer one raises ``LineTooLong`` naming its number (from 1)."""
    number = 0
    while line := file.readline(limit + 1):
        number += 1
        if len(line) > limit and not (len(line) == limit + 1 and line.endswith("\n")):
            raise LineTooLong(f"line {number}: longer than {limit:,} characters")
        yield line


def cut(text: str, limit: int = 2000) -> str:
    """``text``, past ``limit`` characters cut, saying by how much: what an error message
    quotes from a file (a value of megabytes) is shown, never whole."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def path_segment(name: str) -> str:
    """A user's or server's name as one segment of a URL's path, whatever it holds: quoted, and
    ``.`` and ``..`` written ``%2E`` and ``%2E%2E``, which the Hub reads as the name and no
    client or proxy takes out of the path as a dot segment (libcurl does: the cull of a server
    named ``..`` went to its owner's ``/users/alice/``, and that of ``.`` stopped their default
    server). JupyterHub 4.1 to 5.x take any server name."""
    if name in (".", ".."):
        return name.replace(".", "%2E")
    return quote(name, safe="")


# -- a name as the governor keeps it ------------------------------------------------------------
# JupyterHub's database keeps a user's and a server's name in 255 characters, unenforced on
# SQLite; JupyterHub 4.1 to 5.x take any server name (6.x starts one made before it), NUL
# included, which PostgreSQL refuses in text, as SQLite and PostgreSQL both refuse a lone
# surrogate. Such a name was once left out of the pass: its server held a GPU ungoverned.
STORED_LENGTH = 255
# What marks a kept form: a name that holds it is kept as one too, so that no name a user
# chooses is the kept form of another (a server named after another's kept form would have
# shared its record). U+FFFD: "not shown as it is", and in no name a person types.
STORED_MARK = "\ufffd"
_SHOWN = 120  # characters of the name kept readable in its kept form (escaped)


def stored_name(name: str) -> str:
    """A user's or server's name as the governor's store, ledger, pages and API keep it: the
    name itself where the store can hold it as it is (the Hub's every ordinary name); else,
    bounded to ``STORED_LENGTH`` and text every store takes, its first characters escaped
    (``escaped``), ``STORED_MARK`` and the SHA-256 of the whole name: one name, one kept form,
    none of them an ordinary name. Every call to the Hub uses the name itself."""
    if (
        len(name) <= STORED_LENGTH
        and "\0" not in name
        and STORED_MARK not in name
        and (name.isascii() or not_text_at(name) is None)
    ):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    shown = escaped(name[:_SHOWN]).encode("utf-8", "backslashreplace").decode("utf-8")
    return f"{shown[:_SHOWN]}{STORED_MARK}{digest}"


_KEPT_FORM = re.compile(f".{{0,{_SHOWN}}}{STORED_MARK}[0-9a-f]{{64}}", re.S)


def kept_as_it_was(name: str) -> bool:
    """Whether ``name``, read from a store, is a name holding ``STORED_MARK`` that a release
    before this rule kept as it is, not a kept form: its kept form is ``stored_name(name)``.
    (A name a user chose to end in U+FFFD and 64 hex digits reads as a kept form.)"""
    return STORED_MARK in name and not _KEPT_FORM.fullmatch(name)


def kept_forms(name: str) -> frozenset[str]:
    """What a reader's filter ``name`` (``?user=``) finds in the store: the kept form of the name
    as the Hub gives it, and the name itself where it is a kept form already (as the pages and
    the API show it). For an ordinary name, the name alone. Only for a reader who may read
    every name it finds (an admin, a team's reader): a name may be both."""
    return frozenset((name, stored_name(name)))
