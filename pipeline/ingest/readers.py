"""Reading local corpus files: `files` (`<split>.<lang>[.gz]`) and `tsv` (`<split>.tsv[.gz]`).

Also what every reader shares: the split names, the `RawSplit` a reader returns and `CorpusError`.
Misaligned sides, a tsv line without exactly one tab, invalid UTF-8 (unless `lenient`), missing files,
corrupt gzip data and a file larger than `data.max_input_mb` (decompressed; read in chunks, so a
decompression bomb stops at the cap) are errors naming the file (and line); `id` is the 1-based line
number in the source file.
"""
from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pipeline.config import DataConfig
from pipeline.stage import StageError

SPLITS = ("train", "valid", "test")
MB = 10**6  # data.max_input_mb counts these
CHUNK = 1 << 20  # bytes read (decompressed) at a time


class CorpusError(StageError):
    """Bad or missing input data; the message names the file (and line) and the problem."""


@dataclass
class RawSplit:
    """One split as read: line ids, both sides (None = undecodable, lenient mode) and provenance."""

    ids: list[int]
    src: list[str | None]
    tgt: list[str | None]
    origin: str


def read_local(data: DataConfig) -> dict[str, RawSplit]:
    """All three splits of a `files` or `tsv` corpus in `data.local_dir`."""
    if not data.local_dir:
        raise CorpusError(f"data.source={data.source} needs data.local_dir (the directory holding the files)")
    local = Path(data.local_dir)
    stems = {split: getattr(data, f"{split}_split") or split for split in SPLITS}
    if data.source == "tsv":
        return {split: read_tsv(find_file(local, f"{stems[split]}.tsv"), data.lenient, data.max_input_mb)
                for split in SPLITS}
    return {split: read_parallel(find_file(local, f"{stems[split]}.{data.src_lang}"),
                                 find_file(local, f"{stems[split]}.{data.tgt_lang}"), data.lenient, data.max_input_mb)
            for split in SPLITS}


def read_parallel(src_path: Path, tgt_path: Path, lenient: bool = False,
                  max_input_mb: int = DataConfig.max_input_mb) -> RawSplit:
    """Two line-aligned files; different line counts are an error naming both files and counts."""
    src_lines, tgt_lines = _read_lines(src_path, max_input_mb), _read_lines(tgt_path, max_input_mb)
    if len(src_lines) != len(tgt_lines):
        raise CorpusError(f"misaligned corpus: {src_path} has {len(src_lines)} lines but {tgt_path} has "
                          f"{len(tgt_lines)}; the two sides must have one sentence per line, aligned")
    src = [_decode(line, src_path, i + 1, lenient) for i, line in enumerate(src_lines)]
    tgt = [_decode(line, tgt_path, i + 1, lenient) for i, line in enumerate(tgt_lines)]
    return RawSplit(list(range(1, len(src) + 1)), src, tgt, f"{src_path} + {tgt_path}")


def read_tsv(path: Path, lenient: bool = False, max_input_mb: int = DataConfig.max_input_mb) -> RawSplit:
    """`src<TAB>tgt` lines; a line without exactly one tab is an error naming file and line."""
    ids, src, tgt = [], [], []
    for number, line in enumerate(_read_lines(path, max_input_mb), start=1):
        fields = line.split(b"\t")
        if len(fields) != 2:
            raise CorpusError(f"{path}:{number}: expected 2 tab-separated fields (src, tgt), got {len(fields)}")
        ids.append(number)
        src.append(_decode(fields[0], path, number, lenient))
        tgt.append(_decode(fields[1], path, number, lenient))
    return RawSplit(ids, src, tgt, str(path))


def find_file(directory: Path, name: str) -> Path:
    """`directory/name`, or its `.gz` twin; a clear error when neither exists."""
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise CorpusError(f"corpus file not found: {directory / name} (nor {name}.gz) in {directory}")


def _read_lines(path: Path, max_input_mb: int) -> list[bytes]:
    """Raw lines of a (possibly gzipped) file, split on '\\n' only, '\\r\\n' endings accepted; at most
    `max_input_mb` MB are read (after decompression), chunk by chunk."""
    if not Path(path).is_file():
        raise CorpusError(f"corpus file not found: {path}")
    with open(path, "rb") as handle:
        gzipped = handle.read(2) == b"\x1f\x8b"
    chunks: list[bytes] = []
    size = 0
    try:
        with (gzip.open if gzipped else open)(path, "rb") as handle:
            while chunk := handle.read(CHUNK):
                size += len(chunk)
                if size > max_input_mb * MB:
                    raise too_big(str(path), max_input_mb, gzipped)
                chunks.append(chunk)
    except (OSError, EOFError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
        reached = sum(chunk.count(b"\n") for chunk in chunks)
        problem = "corrupt gzip file" if gzipped else "unreadable file"
        raise CorpusError(f"{path}:{reached + 1}: {problem} ({error}), after {reached} complete lines; "
                          f"fetch or compress the file again") from error
    blob = b"".join(chunks)
    del chunks
    if not blob:
        return []
    lines = blob.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def too_big(what: str, max_input_mb: int, decompressed: bool) -> CorpusError:
    """The error for an input beyond `data.max_input_mb` (a decompression bomb, a wrong file)."""
    return CorpusError(f"{what}: more than data.max_input_mb={max_input_mb} MB{' once decompressed' if decompressed else ''}"
                       f"; a wrong or corrupt file, or raise data.max_input_mb (ingest holds a whole split in memory)")


def read_capped(stream: BinaryIO, what: str, max_input_mb: int) -> bytes:
    """All of a binary stream (gunzipped when it starts with gzip's magic bytes), chunk by chunk, refusing
    more than `max_input_mb` MB; corrupt data is a CorpusError naming `what` too."""
    gzipped = stream.peek(2)[:2] == b"\x1f\x8b"
    chunks, size = [], 0
    try:
        reader = gzip.GzipFile(fileobj=stream) if gzipped else stream
        while chunk := reader.read(CHUNK):
            size += len(chunk)
            if size > max_input_mb * MB:
                raise too_big(what, max_input_mb, gzipped)
            chunks.append(chunk)
    except (OSError, EOFError, zlib.error) as error:
        raise CorpusError(f"{what}: corrupt {'gzip ' if gzipped else ''}data ({error}); fetch it again") from error
    return b"".join(chunks)


def _decode(line: bytes, path: Path, number: int, lenient: bool) -> str | None:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as error:
        if lenient:
            return None
        raise CorpusError(f"{path}:{number}: invalid UTF-8 ({error.reason} at byte {error.start}); "
                          f"fix the file or set data.lenient=true to drop such lines") from error
