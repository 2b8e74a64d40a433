"""What a corpus file's compression is, for every reader of training data (local files, downloads, archive members).

One table, `SUFFIXES`: every suffix a compressed (or archived) sibling of a text file may carry, each with the
format it names. Python 3.11's standard library reads four of them (`READABLE`: gzip `.gz`, bzip2 `.bz2`, xz
`.xz`, lzma `.lzma`), which ingest reads transparently; the others (zstd, which only Python 3.14 reads, compress
`.Z`, brotli, lz4, 7-Zip, zip and tar archives) are errors naming the file and its format: decompress it first.
The bytes decide how a file is read (`codec_of`): a file starts with its format's magic bytes, and a name
whose suffix says another format than its bytes is an error (a `.gz` that holds plain text, a `train.en` that
is zstd). Only `.lzma` (the old "alone" format) has no magic bytes: its suffix alone says it. A suffix is what a
name adds to the name it was looked up by (`readers.find_file`): in `train.br`, Breton, `.br` is no brotli.
"""
from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Callable, Optional


@dataclass(frozen=True)
class Codec:
    """A compression format: its name, its magic bytes (b"": none) and, when Python reads it, how to open it."""

    name: str
    magic: bytes = b""
    open: Optional[Callable[[BinaryIO], BinaryIO]] = None


GZIP = Codec("gzip", b"\x1f\x8b", lambda raw: gzip.GzipFile(fileobj=raw))
BZIP2 = Codec("bzip2", b"BZh", lambda raw: bz2.BZ2File(raw))
XZ = Codec("xz", b"\xfd7zXZ\x00", lambda raw: lzma.LZMAFile(raw, format=lzma.FORMAT_XZ))
LZMA = Codec("lzma", b"", lambda raw: lzma.LZMAFile(raw, format=lzma.FORMAT_ALONE))
ZSTD = Codec("zstd (Python 3.11 has no zstd; 3.14's compression.zstd has)", b"\x28\xb5\x2f\xfd")
COMPRESS = Codec("compress (.Z)", b"\x1f\x9d")
BROTLI = Codec("brotli")
LZ4 = Codec("lz4", b"\x04\x22\x4d\x18")
SEVEN_ZIP = Codec("7-Zip", b"7z\xbc\xaf\x27\x1c")
ZIP = Codec("a zip archive", b"PK\x03\x04")
TAR = Codec("a tar archive")

# Every suffix of a compressed or archived sibling, lower-case (names are matched ignoring case).
SUFFIXES: dict[str, Codec] = {
    ".gz": GZIP, ".bz2": BZIP2, ".xz": XZ, ".lzma": LZMA,
    ".zst": ZSTD, ".zstd": ZSTD, ".z": COMPRESS, ".br": BROTLI, ".lz4": LZ4, ".7z": SEVEN_ZIP, ".zip": ZIP,
    ".tar": TAR, ".tar.gz": TAR, ".tgz": TAR, ".tar.bz2": TAR, ".tbz2": TAR, ".tar.xz": TAR, ".txz": TAR,
}
READABLE = tuple(suffix for suffix, codec in SUFFIXES.items() if codec.open is not None)
ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)  # what a corrupt stream raises (BadGzipFile is an OSError)
HEAD = 8  # bytes `codec_of` looks at


class CompressionError(ValueError):
    """A file whose compression cannot be read, or whose name says another format than its bytes."""


def sniff(head: bytes) -> Optional[Codec]:
    """The format whose magic bytes `head` (a file's first HEAD bytes) starts with, or None (plain, or `.lzma`).
    bzip2's "BZh" must be followed by a block size digit, so that a text starting "BZh" stays text."""
    for codec in dict.fromkeys(SUFFIXES.values()):
        if codec.magic and head.startswith(codec.magic):
            if codec is BZIP2 and head[3:4] not in b"123456789":
                continue
            return codec
    return None


def codec_of(head: bytes, suffix: str = "") -> Optional[Codec]:
    """How to read a file that starts with `head`: None for plain bytes, else a readable Codec. `suffix` is the
    compression suffix its name adds to the name it was looked up by (`.gz` for `train.en.gz` found for `train.en`;
    '' when none, or unknown): a suffix that says another format than the bytes is an error, and `.lzma`, without
    magic bytes, is known by its suffix alone. A format Python cannot read is a CompressionError too."""
    named, found = SUFFIXES.get(suffix.lower()) if suffix else None, sniff(head)
    if named is LZMA and found is None:
        found = LZMA
    codec = found or named
    if codec is not None and codec.open is None:
        how = "compressed" if found is not None else "named"
        raise CompressionError(f"{how} as {codec.name}, which ingest cannot read: decompress it "
                               f"(ingest reads plain UTF-8 text, or text compressed as {', '.join(READABLE)})")
    if named is not None and found is not named:
        what = f"{found.name} data" if found else "not compressed (plain bytes)"
        raise CompressionError(f"named {suffix} ({named.name}) but {what}: rename it to what it holds")
    return found
