"""Reading local corpus files: `files` (`<split>.<lang>[.gz|.bz2|.xz|.lzma]`) and `tsv` (`<split>.tsv[...]`), streamed.

Also what every reader shares: the split names, the `RawSplit` a reader returns and `CorpusError`. A file is
read chunk by chunk and its lines are yielded one at a time, so memory does not grow with the corpus. A line
is what `reder.text` says (docs/OPERATIONS.md, "Text"): it ends at "\n" or "\r\n"; a BOM at the start of a file is
removed and counted; another line terminator, control character but TAB or lone surrogate inside a line is an
error naming file, line and character, or with `data.bad_characters=replace` a space, counted (`checked`, the rule
the SWORD reader applies too). Misaligned sides, a tsv line without exactly one tab, invalid UTF-8 (unless
`lenient`), a UTF-16/32 byte order mark, missing files, two files for one split and language (`find_file`: a plain
file and any compressed sibling), a compression Python cannot read or a suffix that says another format than the
bytes (`compression`), corrupt compressed data and a file larger than `data.max_input_mb` (decompressed; so a
decompression bomb stops at the cap) are errors naming the file (and line); `id` is the 1-based line number in
the source file.
"""
from __future__ import annotations

import itertools
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator, Optional

from pipeline.config import DataConfig
from pipeline.stage import StageError
from pipeline.stages.ingest.compression import ERRORS, HEAD, READABLE, SUFFIXES, CompressionError, codec_of
from reder import text

SPLITS = ("train", "valid", "test")
MB = 10**6  # data.max_input_mb counts these
CHUNK = 1 << 20  # bytes read (decompressed) at a time

Row = tuple[int, Optional[str], Optional[str]]  # line id, src, tgt (None: undecodable, lenient mode)


class CorpusError(StageError):
    """Bad or missing input data; the message names the file (and line) and the problem."""


@dataclass
class RawSplit:
    """One split as read: `rows` yields (line id, src, tgt) once, reading as it goes; `files` are the files it
    reads; `text` counts what the text rules changed (`bom_removed`, `replaced U+<hex code point>`), filled while reading."""

    rows: Iterable[Row]
    origin: str
    files: tuple[Path, ...] = ()
    text: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class TextRules:
    """How a reader turns a file's raw lines into text (from the data config)."""

    lenient: bool = False  # undecodable line: None instead of an error
    replace: bool = False  # a bad character becomes a space (counted) instead of an error
    max_input_mb: int = DataConfig.max_input_mb

    @staticmethod
    def of(data: DataConfig) -> TextRules:
        return TextRules(data.lenient, data.bad_characters == "replace", data.max_input_mb)


def local_files(data: DataConfig, required: bool = True) -> dict[str, tuple[Path, ...]]:
    """The files a `files` or `tsv` corpus reads, per split: one file per split and language (`find_file`);
    not `required`: a missing one is left out instead of an error."""
    if not data.local_dir:
        raise CorpusError(f"data.source={data.source} needs data.local_dir (the directory holding the files)")
    local = Path(data.local_dir)
    stems = {split: getattr(data, f"{split}_split") or split for split in SPLITS}
    langs = (data.src_lang, data.tgt_lang)
    if data.source == "tsv":
        wanted = {split: [(f"{stem}.tsv", tuple(f"{stem}.{lang}" for lang in langs))] for split, stem in stems.items()}
    else:
        wanted = {split: [(f"{stem}.{lang}", (f"{stem}.tsv",)) for lang in langs] for split, stem in stems.items()}
    found = {split: tuple(find_file(local, name, rivals, required) for name, rivals in names)
             for split, names in wanted.items()}
    return {split: tuple(path for path in paths if path is not None) for split, paths in found.items()}


def read_local(data: DataConfig) -> dict[str, RawSplit]:
    """All three splits of a `files` or `tsv` corpus in `data.local_dir` (streamed)."""
    rules = TextRules.of(data)
    if data.source == "tsv":
        return {split: read_tsv(path, rules) for split, (path,) in local_files(data).items()}
    return {split: read_parallel(*paths, rules) for split, paths in local_files(data).items()}


def read_parallel(src_path: Path, tgt_path: Path, rules: TextRules = TextRules()) -> RawSplit:
    """Two line-aligned files; different line counts are an error naming both files and counts."""
    counts: Counter[str] = Counter()

    def rows() -> Iterator[Row]:
        src, tgt = TextFile(src_path, rules, counts), TextFile(tgt_path, rules, counts)
        yield from zip(itertools.count(1), src.lines(), tgt.lines())  # C-level: no Python frame per row
        for side in (src, tgt):  # zip stops at the shorter side: read both to the end to compare
            side.drain()
        if src.count != tgt.count:
            raise CorpusError(f"misaligned corpus: {src_path} has {src.count} lines but {tgt_path} has {tgt.count}; "
                              f"the two sides must have one sentence per line, aligned")

    return RawSplit(rows(), f"{src_path} + {tgt_path}", (Path(src_path), Path(tgt_path)), counts)


def read_tsv(path: Path, rules: TextRules = TextRules()) -> RawSplit:
    """`src<TAB>tgt` lines; a line without exactly one tab is an error naming file and line."""
    counts: Counter[str] = Counter()

    def rows() -> Iterator[Row]:
        for number, line in enumerate(TextFile(path, rules, counts).lines(), start=1):
            if line is None:  # undecodable (lenient): dropped and counted as such
                yield number, None, None
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise CorpusError(f"{path}:{number}: expected 2 tab-separated fields (src, tgt), got {len(fields)}")
            yield number, fields[0], fields[1]

    return RawSplit(rows(), str(path), (Path(path),), counts)


def find_file(directory: Path, name: str, rivals: tuple[str, ...] = (), required: bool = True) -> Optional[Path]:
    """The one file of `directory` that is `name`, or `name` compressed in a format Python reads (`name.gz`,
    `.bz2`, `.xz`, `.lzma`: `compression.READABLE`). Every file that could be meant — `name` with any suffix of
    `compression.SUFFIXES` (readable or not), a name differing only in case, a `rival` (`train.tsv` beside
    `train.en`) — is a candidate: more than one is an error listing them, and so is one that is not exactly
    `name[.gz|.bz2|.xz|.lzma]`, one compressed in a format Python cannot read (`.zst`, `.zip`, ...) and one whose
    suffix says another format than its bytes; none is "not found" (None when not `required`)."""
    wanted = {name, *(f"{name}{suffix}" for suffix in READABLE)}
    lowered = {f"{candidate}{suffix}".lower() for candidate in (name, *rivals) for suffix in ("", *SUFFIXES)}
    try:
        names = sorted(entry.name for entry in os.scandir(directory) if entry.is_file() and entry.name.lower() in lowered)
    except OSError:
        names = []
    if len(names) > 1:
        raise CorpusError(f"ambiguous input in {directory}: {' and '.join(names)} could each be the file for "
                          f"{name}; ingest reads exactly one file per split and language: remove or rename the others")
    if names and names[0].lower().startswith(name.lower()) and names[0][len(name):].lower() in SUFFIXES:
        path, suffix = Path(directory) / names[0], names[0][len(name):]
        try:
            with open(path, "rb") as handle:
                codec_of(handle.read(HEAD), suffix)
        except CompressionError as error:
            raise CorpusError(f"{path}: {error}") from error
    if names and names[0] in wanted:
        return Path(directory) / names[0]
    also = f" (nor {name} with {', '.join(READABLE)})"
    if names:
        raise CorpusError(f"corpus file not found: {Path(directory) / name}{also} in {directory}; "
                          f"{names[0]} is there, which ingest does not read for it (names are matched exactly, "
                          f"and data.source says files or tsv): rename it or fix data.source")
    if not required:
        return None
    raise CorpusError(f"corpus file not found: {Path(directory) / name}{also} in {directory}")


class TextFile:
    """The lines of a (possibly gzipped) file as text by `rules`, block by block: a block of whole lines is
    decoded and checked at once, and only a block with something to report goes line by line (`to_text`).
    `count` is the number of lines read so far."""

    def __init__(self, path: Path, rules: TextRules, counts: Counter[str]) -> None:
        self.path, self.rules, self.counts, self.count = path, rules, counts, 0
        self.blocks = self._blocks()

    def lines(self) -> Iterator[Optional[str]]:
        return itertools.chain.from_iterable(self.blocks)

    def drain(self) -> None:
        for _ in self.blocks:
            pass

    def _blocks(self) -> Iterator[list[Optional[str]]]:
        for block in raw_blocks(self.path, self.rules.max_input_mb):
            if self.count == 0:
                refuse_other_encodings(block, self.path)
            lines = self._fast(block)
            if lines is None:
                lines = [to_text(line, self.path, self.count + i, self.rules, self.counts)
                         for i, line in enumerate(_split(block), start=1)]
            self.count += len(lines)
            yield lines

    def _fast(self, block: bytes) -> Optional[list[str]]:
        """The block's lines when it is valid UTF-8 and holds no bad character (the usual case), else None."""
        try:
            whole = block.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if text.BAD_BUT_LF.search(whole.replace("\r\n", "\n")):
            return None  # a lone CR, a BOM's line, ... : line by line, which names or replaces it
        bom = self.count == 0 and whole.startswith(text.BOM)
        lines = _split(whole[1:] if bom else whole)
        if bom:
            self.counts["bom_removed"] += 1
        return [line[:-1] if line.endswith("\r") else line for line in lines]


def to_text(line: bytes, path: Path, number: int, rules: TextRules, counts: Counter[str]) -> Optional[str]:
    """One raw line (its "\n" gone) as text: a CRLF's "\r" dropped, UTF-8 decoded (None when undecodable and
    lenient), a BOM at the start of the file removed, then `checked`."""
    if line.endswith(b"\r"):
        line = line[:-1]
    try:
        decoded = line.decode("utf-8")
    except UnicodeDecodeError as error:
        if rules.lenient:
            return None
        raise CorpusError(f"{path}:{number}: invalid UTF-8 ({error.reason} at byte {error.start}); "
                          f"fix the file or set data.lenient=true to drop such lines") from error
    if number == 1:
        decoded, had_bom = text.strip_bom(decoded)
        if had_bom:
            counts["bom_removed"] += 1
    return checked(decoded, f"{path}:{number}", rules, counts)


def checked(line: str, where: str, rules: TextRules, counts: Counter[str]) -> str:
    """A decoded line of training data by the one rule of every reader (files, downloads, SWORD verses): a
    character `reder.text.BAD` matches is an error naming `where` (file and line) and the character, or (replace)
    a space, counted as `replaced U+<hex>`; every other character is kept."""
    if text.bad_character(line) is None:
        return line
    if not rules.replace:
        raise CorpusError(f"{where}: {text.line_problem(line)}; or set data.bad_characters=replace "
                          f"to make each such character a space (counted in report.json)")
    line, replaced = text.replace_bad(line)
    counts.update(f"replaced {text.code_point(char)}" for char in replaced)
    return line


# Byte order marks of the encodings ingest does not read, longest first (UTF-32 LE's starts with UTF-16 LE's).
OTHER_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32", "little-endian"), (b"\x00\x00\xfe\xff", "UTF-32", "big-endian"),
              (b"\xff\xfe", "UTF-16", "little-endian"), (b"\xfe\xff", "UTF-16", "big-endian"))


def refuse_other_encodings(head: bytes, path: Path) -> None:
    """A file that starts with the byte order mark of UTF-16 or UTF-32 is an error naming its encoding, lenient or
    not: ingest reads UTF-8 only, and such a file would be all undecodable lines (or NULs), not a few bad ones."""
    for bom, encoding, order in OTHER_BOMS:
        if head.startswith(bom):
            raise CorpusError(f"{path}:1: {encoding} ({order}) text, by its byte order mark; ingest reads UTF-8 "
                              f"only: convert it, e.g. iconv -f {encoding} -t UTF-8")


def raw_blocks(path: Path, max_input_mb: int) -> Iterator[bytes]:
    """A (possibly compressed: `compression.codec_of` of its bytes) file in blocks of whole lines (each ending in
    "\n", but a last line without one), read chunk by chunk; at most `max_input_mb` MB are read (decompressed)."""
    if not Path(path).is_file():
        raise CorpusError(f"corpus file not found: {path}")
    with open(path, "rb") as raw:
        try:
            codec = codec_of(raw.read(HEAD), ".lzma" if Path(path).name.lower().endswith(".lzma") else "")
        except CompressionError as error:
            raise CorpusError(f"{path}: {error}") from error
        raw.seek(0)
        size = reached = 0
        rest = b""
        with codec.open(raw) if codec else raw as handle:
            while True:
                try:
                    chunk = handle.read(CHUNK)
                except ERRORS as error:
                    problem = f"corrupt {codec.name} file" if codec else "unreadable file"
                    raise CorpusError(f"{path}:{reached + 1}: {problem} ({error}), after {reached} complete lines; "
                                      f"fetch or compress the file again") from error
                if not chunk:
                    break
                size += len(chunk)
                if size > max_input_mb * MB:
                    raise too_big(str(path), max_input_mb, codec is not None)
                cut = chunk.rfind(b"\n") + 1
                if cut:
                    block, rest = rest + chunk[:cut], chunk[cut:]
                    reached += block.count(b"\n")
                    yield block
                else:
                    rest += chunk
    if rest:
        yield rest


def _split(block: Any) -> list:
    """A block's lines without their "\n" (bytes or str)."""
    lines = block.split(b"\n" if isinstance(block, bytes) else "\n")
    if not lines[-1]:
        lines.pop()
    return lines


def too_big(what: str, max_input_mb: int, decompressed: bool) -> CorpusError:
    """The error for an input beyond `data.max_input_mb` (a decompression bomb, a wrong file)."""
    return CorpusError(f"{what}: more than data.max_input_mb={max_input_mb} MB{' once decompressed' if decompressed else ''}"
                       f"; a wrong or corrupt file, or raise data.max_input_mb")


def copy_capped(stream: BinaryIO, out: BinaryIO, what: str, max_input_mb: int) -> bytes:
    """Copy a binary stream (decompressed when its bytes are gzip, bzip2 or xz: `compression.codec_of`) into `out`
    chunk by chunk, refusing more than `max_input_mb` MB; corrupt data, or a format Python cannot read, is a
    CorpusError naming `what` too. Returns the last byte written (b"" when none), so that a caller joining parts
    can end each with a newline."""
    try:
        codec = codec_of(stream.peek(HEAD)[:HEAD])
    except CompressionError as error:
        raise CorpusError(f"{what}: {error}") from error
    size, last = 0, b""
    try:
        reader = codec.open(stream) if codec else stream
        while chunk := reader.read(CHUNK):
            size += len(chunk)
            if size > max_input_mb * MB:
                raise too_big(what, max_input_mb, codec is not None)
            out.write(chunk)
            last = chunk[-1:]
    except ERRORS as error:
        raise CorpusError(f"{what}: corrupt {codec.name + ' ' if codec else ''}data ({error}); fetch it again") from error
    return last
