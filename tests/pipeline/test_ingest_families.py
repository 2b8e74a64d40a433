"""The training-data readers' one policy for bad input, tested by family rather than by the cases seen:
every Unicode code point by its category, every byte order mark and every text encoding Python has, every
compression suffix the readers name and every one Python's standard library lists (docs/USAGE.md, "Bad input")."""
from __future__ import annotations

import bz2
import codecs
import encodings.aliases
import gzip
import io
import json
import lzma
import mimetypes
import re
import shutil
import sys
import tarfile
import unicodedata
import zipfile
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline import graph
from pipeline.config import load_config
from pipeline.stages import ingest
from pipeline.stages.ingest import CorpusError
from pipeline.stages.ingest import compression
from pipeline.stages.ingest.readers import TextFile, TextRules, checked, copy_capped, find_file, read_parallel
from reder import text
from tests.pipeline.conftest import write_files_corpus
from tests.pipeline.sword_module import write_ztext_module

ALL = range(sys.maxunicode + 1)


def policy(char: str) -> str:
    """The training-data policy of one code point, from its Unicode category alone (docs/USAGE.md, "Bad input"):
    `text` is kept as it is, `bad` is an error naming file, line and character (or a space, counted, with
    data.bad_characters=replace), `surrogate` cannot be in UTF-8 at all (its bytes are invalid UTF-8)."""
    category = unicodedata.category(char)
    if category == "Cs":
        return "surrogate"
    if category in ("Zl", "Zp") or category == "Cc" and char != "\t":
        return "bad"
    return "text"


FAMILY = {kind: [chr(c) for c in ALL if policy(chr(c)) == kind] for kind in ("text", "bad", "surrogate")}


def test_the_pattern_of_characters_no_line_holds_is_the_policy_over_the_whole_code_space():
    assert {char for char in map(chr, ALL) if text.BAD.match(char)} == {*FAMILY["bad"], *FAMILY["surrogate"]}
    assert {unicodedata.category(char) for char in FAMILY["text"]} == \
        {unicodedata.category(chr(c)) for c in ALL} - {"Cs", "Zl", "Zp"}  # every other category has text: Cc has TAB


def _read(path: Path, rules: TextRules = TextRules()) -> tuple[list, Counter]:
    counts: Counter[str] = Counter()
    return list(TextFile(path, rules, counts).lines()), counts


def test_every_character_of_every_other_category_is_read_unchanged(tmp_path):
    """Format characters (Cf: U+FEFF not at the start of a file, bidi controls, ZWJ), private use (Co), unassigned
    code points and noncharacters (Cn), combining marks, TAB: every code point the policy calls text, in lines of
    64, is read back as it was, nothing counted."""
    chars = [char for char in FAMILY["text"] if char != "\n"]
    lines = ["".join(chars[i:i + 64]) for i in range(0, len(chars), 64)]
    path = tmp_path / "all.txt"
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
    assert _read(path) == (lines, Counter())
    verse = "".join(char for char in FAMILY["text"] if not char.isspace())  # SWORD verses: whitespace is folded
    assert checked(verse, "SWORD module X Gen.1.1", TextRules(), Counter()) == verse


@pytest.mark.parametrize("replace", [False, True], ids=["error", "replace"])
def test_every_bad_character_is_an_error_naming_file_line_and_character_or_a_counted_space(tmp_path, replace):
    """Every control character but TAB and every line or paragraph separator, at line 2 of a file: an error that
    names the file, line 2 and the code point; with replace a space, counted by code point."""
    for char in FAMILY["bad"]:
        if char == "\n":
            continue  # the line break itself
        path = tmp_path / f"{ord(char):x}.txt"
        path.write_bytes(f"first\nab{char}c\nlast\n".encode("utf-8"))
        if replace:
            assert _read(path, TextRules(replace=True)) == (["first", "ab c", "last"],
                                                            Counter({f"replaced U+{ord(char):04X}": 1}))
            continue
        with pytest.raises(CorpusError, match=rf"^{re.escape(str(path))}:2: U\+{ord(char):04X} \(.+\) at character 3: "):
            _read(path)


def test_every_surrogate_is_invalid_utf8_in_a_file_and_a_bad_character_in_a_verse(tmp_path):
    """Surrogates cannot be UTF-8: their three-byte forms are an error naming the line (lenient: the line is
    dropped); in a string (a SWORD verse) each is named, or with replace a space."""
    path = tmp_path / "surrogates.txt"
    path.write_bytes(b"ok\n" + b"".join(f"a{char}b\n".encode("utf-8", "surrogatepass") for char in FAMILY["surrogate"]))
    with pytest.raises(CorpusError, match=rf"^{re.escape(str(path))}:2: invalid UTF-8"):
        _read(path)
    lines, _ = _read(path, TextRules(lenient=True))
    assert lines == ["ok"] + [None] * len(FAMILY["surrogate"])
    for char in FAMILY["surrogate"][::97]:
        with pytest.raises(CorpusError, match=rf"^SWORD module X Gen\.1\.1: U\+{ord(char):04X} \(a lone surrogate\)"):
            checked(f"a{char}b", "SWORD module X Gen.1.1", TextRules(), Counter())
        assert checked(f"a{char}b", "w", TextRules(replace=True), Counter()) == "a b"


def test_a_sword_verse_follows_the_same_policy_for_every_bad_character(tmp_path):
    """SWORD verses: whitespace (line terminators included) is markup layout, folded; every other bad character
    is an error naming module, verse and character, or with replace a space counted in report.json's `text`."""
    odd = [char for char in FAMILY["bad"] if not char.isspace()]
    library = tmp_path / "sword"
    verses = {("Gen", 1 + i // 30, 1 + i % 30): f"Verse {i} {char} end." for i, char in enumerate(odd)}
    write_ztext_module(library, "OddEn", verses)
    write_ztext_module(library, "OddEs", {key: f"Versículo {key[2]}." for key in verses}, "es")
    settings = [f"data.sword_path={library}", "data.sword_src_module=OddEn", "data.sword_tgt_module=OddEs",
                "data.valid_size=1", "data.test_size=1"]
    with pytest.raises(CorpusError, match=rf"^SWORD module OddEn Gen\.1\.1: U\+{ord(odd[0]):04X} \(.+\) at character"):
        ingest.read_sword(load_config(None, settings).data)
    raw, notes = ingest.read_sword(load_config(None, [*settings, "data.bad_characters=replace"]).data)
    assert notes["text"] == {f"replaced U+{ord(char):04X}": 1 for char in odd}
    assert all("  end." in src for part in raw.values() for _, src, _ in part.rows)
    folded = {("Gen", 1, 1): "a\u2028b\x85c\x0bd\x1ce"}
    write_ztext_module(tmp_path / "folded", "FoldEn", folded)
    write_ztext_module(tmp_path / "folded", "FoldEs", {("Gen", 1, 1): "x"}, "es")
    assert ingest.sword.read_sword_pairs(str(tmp_path / "folded"), "FoldEn", "FoldEs")[0][1] == "a b c d e"


# --- byte order marks and encodings


def _text_codecs() -> list[str]:
    """Every text encoding Python has (by its canonical name), once."""
    names = set()
    for name in {*encodings.aliases.aliases.values(), "utf_8_sig", "utf_16", "utf_32"}:
        try:
            info = codecs.lookup(name)
        except LookupError:
            continue
        if getattr(info, "_is_text_encoding", True):
            names.add(info.name)
    return sorted(names)


CODECS = _text_codecs()
SAMPLE = "Grüße, café!\nZweite Zeile.\n"


def _encoded(codec: str) -> bytes | None:
    try:
        return SAMPLE.encode(codec)
    except (UnicodeError, LookupError):
        return None


def test_every_encoding_that_writes_a_byte_order_mark_is_named_or_read(tmp_path):
    """Of every encoding Python has, those whose output starts with a BOM: UTF-8's is removed and counted; a UTF-16
    or UTF-32 one is an error naming the file, line 1 and the encoding (lenient or not: not a few bad lines)."""
    boms = {codecs.BOM_UTF8: None, codecs.BOM_UTF32_LE: "UTF-32", codecs.BOM_UTF32_BE: "UTF-32",
            codecs.BOM_UTF16_LE: "UTF-16", codecs.BOM_UTF16_BE: "UTF-16"}
    marked = {codec: blob for codec in CODECS if (blob := _encoded(codec)) and blob.startswith(tuple(boms))}
    assert {"utf-8-sig", "utf-16", "utf-32"} <= set(marked)
    for codec, blob in marked.items():
        path = tmp_path / f"{codec}.txt"
        path.write_bytes(blob)
        bom = next(bom for bom in boms if blob.startswith(bom))  # the longest first: UTF-32 LE's starts like UTF-16 LE's
        if boms[bom] is None:
            assert _read(path) == (SAMPLE.splitlines(), Counter({"bom_removed": 1}))
            continue
        for rules in (TextRules(), TextRules(lenient=True)):
            with pytest.raises(CorpusError, match=rf"^{re.escape(str(path))}:1: {boms[bom]} \(.+-endian\) text, by its "
                                                  rf"byte order mark; ingest reads UTF-8 only"):
                _read(path, rules)


def test_every_other_encoding_is_read_as_utf8_or_an_error_naming_file_and_line(tmp_path):
    """Text in each of Python's encodings: its bytes are read as UTF-8, so it is the same text (UTF-8 itself, or
    bytes no other encoding changes), other text that happens to be valid UTF-8 (UTF-7's ASCII), or an error naming
    the file and a line; lenient, undecodable lines are dropped. Never another exception."""
    errors = 0
    for codec in CODECS:
        blob = _encoded(codec)
        if blob is None:
            continue
        path = tmp_path / f"{codec}.txt"
        path.write_bytes(blob)
        for rules in (TextRules(), TextRules(lenient=True)):
            try:
                lines, _ = _read(path, rules)
            except CorpusError as error:
                assert re.match(rf"^{re.escape(str(path))}:\d+: ", str(error)), (codec, str(error))
                errors += 1
                continue
            if blob == SAMPLE.encode("utf-8"):
                assert lines == SAMPLE.splitlines(), codec
    assert errors > len(CODECS) // 2  # most encodings of "ü" and "é" are no UTF-8


def test_a_feff_anywhere_but_the_start_of_a_file_is_text(tmp_path):
    """U+FEFF is a byte order mark only at the start of a file; at the start of a later line (files joined with
    cat) or inside one it is a format character like any other (Cf), kept: removing it would change the text."""
    path = tmp_path / "joined.txt"
    path.write_bytes("\ufeffone\n\ufefftwo\nth\ufeffree\n".encode("utf-8"))
    assert _read(path) == (["one", "\ufefftwo", "th\ufeffree"], Counter({"bom_removed": 1}))


# --- compression


def _stdlib_suffixes() -> set[str]:
    """Every suffix Python's standard library names for compressed or archived files."""
    return {suffix.lower() for suffix in mimetypes.encodings_map} | \
        {suffix.lower() for _, suffixes, _ in shutil.get_unpack_formats() for suffix in suffixes}


SUFFIXES = sorted(set(compression.SUFFIXES) | _stdlib_suffixes())
PACKERS = {"gzip": lambda blob: gzip.compress(blob, mtime=0), "bzip2": bz2.compress,
           "xz": lambda blob: lzma.compress(blob, format=lzma.FORMAT_XZ),
           "lzma": lambda blob: lzma.compress(blob, format=lzma.FORMAT_ALONE)}


def _packed(suffix: str, blob: bytes, name: str = "train.en") -> bytes:
    """`blob` in the format `suffix` names: real data where Python writes it, else the format's magic and junk."""
    codec = compression.SUFFIXES[suffix]
    if codec.name in PACKERS:
        return PACKERS[codec.name](blob)
    if codec is compression.ZIP:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr(name, blob)
        return buffer.getvalue()
    if codec is compression.TAR:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            archive.addfile(info, io.BytesIO(blob))
        return buffer.getvalue()
    return codec.magic + b"\x00junk" * 4


def test_the_table_names_every_suffix_the_standard_library_lists():
    """A compression Python's standard library gains (mimetypes, shutil's unpack formats) must get a row, readable
    (by `codec.open`) or named and refused; and a format the stdlib reads must not be refused."""
    assert _stdlib_suffixes() <= set(compression.SUFFIXES)
    assert {codec.name for codec in compression.SUFFIXES.values() if codec.open} == set(PACKERS)
    zstd = compression.SUFFIXES[".zst"]
    assert (zstd.open is not None) == (sys.version_info >= (3, 14)) or zstd.open is None  # 3.14: compression.zstd


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_any_compressed_sibling_beside_the_plain_file_is_ambiguous(tmp_path, suffix):
    """`train.en` and `train.en<suffix>` side by side, for every suffix: an error naming both, whatever the suffix."""
    corpus = write_files_corpus(tmp_path / "corpus")
    sibling = corpus / f"train.en{suffix}"
    sibling.write_bytes(_packed(suffix, (corpus / "train.en").read_bytes()))
    with pytest.raises(CorpusError, match=rf"^ambiguous input in {re.escape(str(corpus))}: train\.en and "
                                          rf"train\.en{re.escape(suffix)} could each be the file for train\.en"):
        find_file(corpus, "train.en")
    with pytest.raises(CorpusError, match="ambiguous input"):
        ingest.input_fingerprint(load_config(None, ["data.source=files", f"data.local_dir={corpus}",
                                                    "data.src_lang=en", "data.tgt_lang=de"]).data)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_compressed_file_alone_is_read_like_the_plain_one_or_named_as_unreadable(tmp_path, suffix):
    """`train.en<suffix>` alone: the formats Python reads give the plain file's lines; the others are an error
    naming the file and its format."""
    corpus = write_files_corpus(tmp_path / "corpus")
    plain = corpus / "train.en"
    blob = plain.read_bytes()
    packed = corpus / f"train.en{suffix}"
    packed.write_bytes(_packed(suffix, blob))
    plain.unlink()
    codec = compression.SUFFIXES[suffix]
    if codec.open is None:
        with pytest.raises(CorpusError, match=rf"^{re.escape(str(packed))}: (named|compressed) as "
                                              rf"{re.escape(codec.name)}, which ingest cannot read: decompress it"):
            find_file(corpus, "train.en")
        return
    assert find_file(corpus, "train.en") == packed
    split = read_parallel(packed, corpus / "train.de")
    assert [src for _, src, _ in split.rows] == blob.decode("utf-8").splitlines()


def test_a_language_code_that_is_also_a_suffix_names_no_compression(tmp_path):
    """Breton's `br` is brotli's suffix: `train.br`, looked up as `train.br`, is a plain file; `train.br.gz` beside
    it is its compressed sibling."""
    corpus = write_files_corpus(tmp_path / "corpus", langs=("en", "br"))
    assert find_file(corpus, "train.br") == corpus / "train.br"
    assert [src for _, _, src in read_parallel(corpus / "train.en", corpus / "train.br").rows][:1] == \
        (corpus / "train.br").read_text(encoding="utf-8").splitlines()[:1]
    (corpus / "train.br.gz").write_bytes(gzip.compress((corpus / "train.br").read_bytes()))
    with pytest.raises(CorpusError, match=r"ambiguous input .*: train\.br and train\.br\.gz"):
        find_file(corpus, "train.br")


@pytest.mark.parametrize("suffix", [s for s in compression.SUFFIXES if compression.SUFFIXES[s].open])
def test_a_suffix_that_says_another_format_than_the_bytes_is_an_error(tmp_path, suffix):
    """A `.gz` (any readable suffix) holding plain text or another format's bytes: an error naming the file, its
    suffix and what the bytes are; bytes of a format without the suffix (a gzipped `train.en`) are read."""
    corpus = write_files_corpus(tmp_path / "corpus")
    blob = (corpus / "train.en").read_bytes()
    (corpus / "train.en").unlink()
    for other in ("", *PACKERS):
        if other == compression.SUFFIXES[suffix].name:
            continue
        packed = corpus / f"train.en{suffix}"
        packed.write_bytes(PACKERS[other](blob) if other else blob)
        if other == "lzma" or compression.SUFFIXES[suffix] is compression.LZMA and other == "":
            # lzma-alone data has no magic bytes: under another suffix its bytes look plain
            with pytest.raises(CorpusError, match=rf"^{re.escape(str(packed))}"):
                list(read_parallel(find_file(corpus, "train.en"), corpus / "train.de").rows)
            continue
        with pytest.raises(CorpusError, match=rf"^{re.escape(str(packed))}: named {re.escape(suffix)} \(.+\) but "):
            find_file(corpus, "train.en")
    plain_name = corpus / "train.en"
    for name, pack in PACKERS.items():
        if name == "lzma":
            continue
        packed.unlink(missing_ok=True)
        plain_name.write_bytes(pack(blob))
        assert [src for _, src, _ in read_parallel(plain_name, corpus / "train.de").rows] == \
            blob.decode("utf-8").splitlines()


@pytest.mark.parametrize("name", list(PACKERS))
def test_corrupt_data_of_every_readable_format_names_file_line_and_format(tmp_path, name):
    corpus = write_files_corpus(tmp_path / "corpus")
    blob = (corpus / "train.en").read_bytes()
    suffix = next(s for s, codec in compression.SUFFIXES.items() if codec.name == name)
    packed = corpus / f"train.en{suffix}"
    packed.write_bytes(PACKERS[name](blob)[:-20])  # truncated
    (corpus / "train.en").unlink()
    with pytest.raises(CorpusError, match=rf"^{re.escape(str(packed))}:\d+: corrupt {name} file \(.+\), after \d+ "
                                          r"complete lines"):
        list(read_parallel(packed, corpus / "train.de").rows)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_downloads_and_archive_members_follow_the_same_table(suffix):
    """A download or archive member (`copy_capped`) is read by its bytes: each readable format decompressed, each
    other format with magic bytes an error naming it."""
    blob = b"one\ntwo\n"
    codec = compression.SUFFIXES[suffix]
    packed = _packed(suffix, blob)
    out = io.BytesIO()
    stream = io.BufferedReader(io.BytesIO(packed))
    if codec.open is not None and codec.magic:
        assert copy_capped(stream, out, "https://x/train.en" + suffix, 1) == b"\n" and out.getvalue() == blob
    elif codec.magic:
        with pytest.raises(CorpusError, match=rf"^https://x/train\.en{re.escape(suffix)}: compressed as "
                                              rf"{re.escape(codec.name)}, which ingest cannot read"):
            copy_capped(stream, out, "https://x/train.en" + suffix, 1)


def test_a_bzip2_corpus_ingests_to_the_same_tables_as_the_plain_one(tmp_path):
    """End to end: the stage's output does not depend on which readable compression a file has."""
    corpus = write_files_corpus(tmp_path / "corpus")
    settings = ["data.source=files", f"data.local_dir={corpus}", "data.src_lang=en", "data.tgt_lang=de"]
    plain = graph.run(load_config(None, settings), tmp_path / "plain", "ingest")
    for name, suffix in (("train.en", ".bz2"), ("valid.de", ".xz"), ("test.en", ".lzma")):
        path = corpus / name
        packed = corpus / f"{name}{suffix}"
        packed.write_bytes(PACKERS[compression.SUFFIXES[suffix].name](path.read_bytes()))
        path.unlink()
    packed_out = graph.run(load_config(None, settings), tmp_path / "packed", "ingest")
    for split in ingest.SPLITS:
        assert pq.read_table(packed_out / split).equals(pq.read_table(plain / split))
    assert json.loads((packed_out / "report.json").read_text())["splits"] == \
        json.loads((plain / "report.json").read_text())["splits"]


# --- the other reader of reference text: evaluate.test_sets files


@pytest.mark.parametrize("char", [c for c in FAMILY["bad"] if c != "\n"], ids=lambda c: f"U+{ord(c):04X}")
def test_a_test_set_file_follows_the_training_data_policy(tmp_path, char):
    """`evaluate.test_sets` files are references: read as ingest reads a corpus file. A bad character is an error
    naming file, line and code point (str.splitlines split U+2028, FF, NEL... into two lines, misaligning the pairs
    scored after it, and kept a BOM in the first source sentence); a leading BOM is removed; compressed is read."""
    from pipeline.stages.evaluate import read_test_set

    src, tgt = tmp_path / "set.en", tmp_path / "set.de"
    src.write_bytes(f"\ufeffone\nt{char}wo\nthree\n".encode("utf-8"))
    tgt.write_bytes(gzip.compress("eins\nzwei\ndrei\n".encode("utf-8")))
    spec = {"src": str(src), "tgt": str(tgt)}
    with pytest.raises(CorpusError, match=rf"^{re.escape(str(src))}:2: U\+{ord(char):04X} "):
        read_test_set(spec, "en", "de")
    src.write_bytes("\ufeffone\ntwo\nthree\n".encode("utf-8"))
    assert read_test_set(spec, "en", "de") == (["one", "two", "three"], ["eins", "zwei", "drei"])
