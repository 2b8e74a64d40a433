"""What a line of text is, for every reader of text: the ingest stage, `python -m reder.translate`, the Ray
Serve app and the MLflow pyfunc (docs/OPERATIONS.md, "Text").

A line ends at "\\n"; a "\\r" just before it belongs to the ending ("\\r\\n"). Inside a line every character is
text except the other line terminators (a lone CR, VT, FF, NEL U+0085, LINE SEPARATOR U+2028, PARAGRAPH
SEPARATOR U+2029) and the other control characters (Unicode category Cc, U+0000-U+001F and U+007F-U+009F) but
TAB: `BAD` matches exactly those, and a lone surrogate (category Cs, U+D800-U+DFFF: no character, which no
UTF-8 decoder gives but a JSON "\\ud800" escape or a library's text can hold, and which cannot be written as
UTF-8). A byte order mark (U+FEFF) at the very start of a file or stream is no text and is removed (`strip_bom`);
elsewhere U+FEFF is a character like any other format character (category Cf). Pure Python: no torch, no Ray.
"""
from __future__ import annotations

import re
from typing import Optional

BOM = "\ufeff"
BAD = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
BAD_BUT_LF = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")  # for many lines joined by "\n" at once
_NAMES = {"\x00": "NUL", "\x0a": "LINE FEED", "\x0b": "VERTICAL TAB", "\x0c": "FORM FEED", "\x0d": "CARRIAGE RETURN",
          "\x1b": "ESCAPE", "\x7f": "DELETE", "\x85": "NEXT LINE", "\u2028": "LINE SEPARATOR",
          "\u2029": "PARAGRAPH SEPARATOR"}
_TERMINATORS = "\x0a\x0b\x0c\x0d\x85\u2028\u2029"


def code_point(char: str) -> str:
    """`U+000D` for "\\r"."""
    return f"U+{ord(char):04X}"


def describe(char: str) -> str:
    """`U+000D (CARRIAGE RETURN)`; a control character without a common name is `U+0001 (a control character)`."""
    if "\ud800" <= char <= "\udfff":
        return f"{code_point(char)} (a lone surrogate)"
    return f"{code_point(char)} ({_NAMES.get(char, 'a control character')})"


def why_bad(char: str) -> str:
    """Why `char` (one `BAD` matches) cannot be inside a line, and what to do."""
    if char == "\n":
        return "a line break inside one item: send one sentence per item"
    if char == "\r":
        return ("lines end at \\n or \\r\\n only, so a lone CR is inside a line (old Mac line endings?): "
                "convert the file, e.g. tr '\\r' '\\n'")
    if "\ud800" <= char <= "\udfff":
        return "half of a UTF-16 pair, no character: it cannot be written as UTF-8; fix what produced the text"
    if char in _TERMINATORS:
        return "a line terminator other than \\n is no line break here: replace it by \\n or a space"
    return "a control character (of those only TAB is text): remove it, or fix the file's encoding"


def bad_character(line: str) -> Optional[int]:
    """The 0-based index of the first character of `line` that `BAD` matches, or None."""
    found = BAD.search(line)
    return found.start() if found else None


def replace_bad(line: str) -> tuple[str, list[str]]:
    """`line` with every `BAD` character replaced by a space, and the replaced characters."""
    replaced = BAD.findall(line)
    return (BAD.sub(" ", line), replaced) if replaced else (line, [])


def strip_bom(text: str) -> tuple[str, bool]:
    """`text` without a leading byte order mark, and whether it had one."""
    return (text[1:], True) if text.startswith(BOM) else (text, False)


def line_problem(line: str) -> Optional[str]:
    """What keeps the string `line` from being one line of text (`U+0000 (NUL) at character 3: why`), or None."""
    index = bad_character(line)
    if index is None:
        return None
    return f"{describe(line[index])} at character {index + 1}: {why_bad(line[index])}"


def normalise(line: str) -> tuple[str, Optional[str]]:
    """Text to translate, kept whatever it holds (the translators' rule, not the training data's): `line` with
    every `BAD` character replaced by a space, and what was replaced (`U+2028 (LINE SEPARATOR) at character 4
    (and 2 more) replaced by a space`), or None when nothing was."""
    index = bad_character(line)
    if index is None:
        return line, None
    cleaned, replaced = replace_bad(line)
    more = f" (and {len(replaced) - 1} more)" if len(replaced) > 1 else ""
    return cleaned, f"{describe(line[index])} at character {index + 1}{more} replaced by a space"


def read_lines(data: bytes | str, strict: bool = True) -> tuple[list[str], list[str]]:
    """Lines of a whole input (a stream's bytes, UTF-8, or text): split at "\\n" only, a CRLF's "\\r" dropped,
    a leading BOM removed. `strict`: a line that is not UTF-8 or holds a `BAD` character is a ValueError naming
    the line and the character (`line 5: U+0000 (NUL) at character 3: ...`). Otherwise every line is kept, one
    per "\\n" always: bytes that are not UTF-8 become U+FFFD and `BAD` characters spaces (`normalise`), each
    change a note (`line 5: ...`). Returns the lines and the notes."""
    newline = b"\n" if isinstance(data, bytes) else "\n"
    pieces = data.split(newline)
    if pieces[-1] == newline[:0]:
        pieces.pop()  # the text ended with a newline, or was empty
    lines, notes = [], []
    for number, piece in enumerate(pieces, start=1):
        if isinstance(piece, bytes):
            try:
                piece = piece.decode("utf-8")
            except UnicodeDecodeError as error:
                problem = f"not UTF-8 text (byte 0x{piece[error.start]:02x} at byte {error.start + 1} of the line)"
                if strict:
                    raise ValueError(f"line {number}: {problem}") from None
                piece = piece.decode("utf-8", errors="replace")
                notes.append(f"line {number}: {problem}: undecodable bytes replaced by U+FFFD")
        if number == 1:
            piece, _ = strip_bom(piece)
        piece = piece[:-1] if piece.endswith("\r") else piece
        if strict:
            problem = line_problem(piece)
            if problem:
                raise ValueError(f"line {number}: {problem}")
        else:
            piece, note = normalise(piece)
            if note:
                notes.append(f"line {number}: {note}")
        lines.append(piece)
    return lines, notes


def split_lines(data: bytes | str) -> list[str]:
    """`read_lines(data)` in strict mode: the lines, or a ValueError naming the first bad one."""
    return read_lines(data, strict=True)[0]
