"""Ingest stage: a parallel corpus in, validated Parquet splits out (`id` int64, `src`, `tgt` string).

Sources (`data.source`):
- `files`: `<local_dir>/<split>.<lang>` text files (optionally `.gz`), one sentence per line;
- `tsv`: `<local_dir>/<split>.tsv[.gz]`, `src<TAB>tgt` per line;
- named corpora (`multi30k`, `iwslt14`, `wmt16_enro`, `wmt14_ende`): read from `local_dir` when it holds
  the split's files, otherwise downloaded into `cache_dir` (WMT test sets through sacreBLEU);
- `sword` (the default): two SWORD Bible modules read with pysword, aligned by verse reference and split
  deterministically by a seeded hash of the reference.

Validation: sides with different line counts, invalid UTF-8 (unless `lenient`), missing files and an
empty result are errors naming the file (and line). Empty lines, over-long lines, extreme length ratios
and duplicate pairs are dropped from train and counted by reason in `report.json`; in valid/test they
are only counted (`flagged`), so test sets stay intact. `id` is the 1-based line number in the source
file (for `sword`, the verse's position in canonical order).
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import html
import logging
import os
import re
import shutil
import tarfile
import urllib.request
import zipfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import DataConfig, PipelineConfig
from pipeline.stage import StageError, StageRun, digest, write_json

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
SCHEMA = pa.schema([("id", pa.int64()), ("src", pa.string()), ("tgt", pa.string())])
ROWS_PER_FILE = 4096  # several files per split let Ray Data read them in parallel downstream
SWORD_INSTALL = "apt-get install -y sword-text-web sword-text-sparv"


class CorpusError(StageError):
    """Bad or missing input data; the message names the file (and line) and the problem."""


@dataclass(frozen=True)
class Archive:
    """A download holding one side per language: `member` names the file inside (with `{lang}`);
    an empty member means the URL itself (with `{lang}`) is the file, possibly gzipped."""

    url: str
    member: str = ""


@dataclass(frozen=True)
class SplitSource:
    stem: str  # local file names: <stem>.<lang>[.gz]
    archives: tuple[Archive, ...] = ()  # concatenated in order when downloaded
    sacrebleu: str = ""  # or: a sacreBLEU test set name


@dataclass(frozen=True)
class NamedCorpus:
    languages: tuple[str, ...]
    splits: dict[str, SplitSource]
    note: str = ""


_MULTI30K = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{stem}.{lang}.gz"
_IWSLT14 = "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"
NAMED: dict[str, NamedCorpus] = {
    "multi30k": NamedCorpus(
        languages=("en", "de", "fr", "cs"),
        splits={name: SplitSource(stem, (Archive(_MULTI30K.replace("{stem}", stem)),))
                for name, stem in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr"))}),
    "iwslt14": NamedCorpus(
        languages=("de", "en"),
        # Local copies: fairseq's prepare-iwslt14.sh output before BPE (train/valid/test.{de,en}).
        # Downloaded: the same talks from fairseq's archive, untokenized (see _prepare_iwslt14).
        splits={name: SplitSource(name, (Archive(_IWSLT14, "iwslt14"),)) for name in SPLITS}),
    "wmt16_enro": NamedCorpus(
        languages=("en", "ro"),
        splits={
            "train": SplitSource("train", (
                Archive("http://data.statmt.org/wmt16/translation-task/training-parallel-ep-v8.tgz",
                        "training-parallel-ep-v8/europarl-v8.ro-en.{lang}"),
                Archive("https://object.pouta.csc.fi/OPUS-SETIMES/v2/moses/en-ro.txt.zip",
                        "SETIMES.en-ro.{lang}"))),
            "valid": SplitSource("newsdev2016", sacrebleu="wmt16/dev"),
            "test": SplitSource("newstest2016", sacrebleu="wmt16"),
        }),
    "wmt14_ende": NamedCorpus(
        languages=("en", "de"),
        splits={
            "train": SplitSource("train", (
                Archive("http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
                        "training/europarl-v7.de-en.{lang}"),
                Archive("http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
                        "commoncrawl.de-en.{lang}"),
                Archive("http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz",
                        "training/news-commentary-v9.de-en.{lang}"))),
            "valid": SplitSource("newstest2013", sacrebleu="wmt13"),
            "test": SplitSource("newstest2014", sacrebleu="wmt14/full"),
        }),
}


@dataclass
class RawSplit:
    """One split as read: line ids, both sides (None = undecodable, lenient mode) and provenance."""

    ids: list[int]
    src: list[str | None]
    tgt: list[str | None]
    origin: str


# ----------------------------------------------------------------------------------------------- stage

def build(run: StageRun, tmp: Path) -> dict[str, Any]:
    """Read, validate, filter and write the corpus into `tmp`."""
    return _build(run.cfg.data, run.workdir, tmp)


def _build(data: DataConfig, workdir: Path, tmp: Path) -> dict[str, Any]:
    raw, notes = read_corpus(data, workdir)
    report: dict[str, Any] = {"source": data.source, "src_lang": data.src_lang, "tgt_lang": data.tgt_lang,
                              **notes, "splits": {}}
    for split in SPLITS:
        part = raw[split]
        if data.limit:
            part = RawSplit(part.ids[: data.limit], part.src[: data.limit], part.tgt[: data.limit], part.origin)
        table, counts = filter_split(part, data, drop=(split == "train"))
        if table.num_rows == 0:
            raise CorpusError(f"empty corpus: no {split} pairs left from {part.origin} "
                              f"(read {counts['read']}, dropped {counts['dropped']})")
        write_split(table, tmp / split)
        report["splits"][split] = counts
        log.info("ingest %s: %d pairs kept of %d read (%s)", split, counts["kept"], counts["read"], part.origin)
    write_json(tmp / "report.json", report)
    return report["splits"]


# ------------------------------------------------------------------------------------------ filtering

def filter_split(part: RawSplit, data: DataConfig, drop: bool) -> tuple[pa.Table, dict[str, Any]]:
    """Apply the filters; `drop` removes flagged pairs (train), otherwise they are only counted."""
    reasons: Counter[str] = Counter()
    seen: set[str] = set()
    keep_ids, keep_src, keep_tgt = [], [], []
    for line_id, src, tgt in zip(part.ids, part.src, part.tgt):
        if src is None or tgt is None:  # undecodable, lenient mode: cannot be kept in any split
            reasons["invalid_utf8"] += 1
            continue
        src, tgt = src.strip(), tgt.strip()
        reason = _flag(src, tgt, data, seen)
        if reason:
            reasons[reason] += 1
            if drop:
                continue
        keep_ids.append(line_id)
        keep_src.append(src)
        keep_tgt.append(tgt)
    table = pa.table({"id": pa.array(keep_ids, pa.int64()), "src": pa.array(keep_src, pa.string()),
                      "tgt": pa.array(keep_tgt, pa.string())}, schema=SCHEMA)
    undecodable = {"invalid_utf8": reasons["invalid_utf8"]} if reasons["invalid_utf8"] else {}
    counts: dict[str, Any] = {"read": len(part.ids), "kept": table.num_rows}
    if drop:
        counts["dropped"] = dict(sorted(reasons.items()))
    else:
        counts["dropped"] = undecodable
        counts["flagged"] = {k: v for k, v in sorted(reasons.items()) if k != "invalid_utf8"}
    return table, counts


def _flag(src: str, tgt: str, data: DataConfig, seen: set[str]) -> str:
    """The first reason this pair would be dropped, or ''."""
    if not src or not tgt:
        return "empty"
    if len(src) > data.max_chars or len(tgt) > data.max_chars:
        return "too_long"
    if max(len(src), len(tgt)) > data.max_length_ratio * min(len(src), len(tgt)):
        return "length_ratio"
    if data.dedupe:
        key = hashlib.blake2b(f"{src}\t{tgt}".encode("utf-8"), digest_size=16).hexdigest()
        if key in seen:
            return "duplicate"
        seen.add(key)
    return ""


def write_split(table: pa.Table, directory: Path) -> None:
    """Write a split as `part-NNNNN.parquet` files of at most ROWS_PER_FILE rows, sorted by id."""
    directory.mkdir(parents=True)
    table = table.sort_by("id")
    for index, start in enumerate(range(0, table.num_rows, ROWS_PER_FILE)):
        pq.write_table(table.slice(start, ROWS_PER_FILE), directory / f"part-{index:05d}.parquet")


# ---------------------------------------------------------------------------------------------- readers

def read_corpus(data: DataConfig, workdir: Path) -> tuple[dict[str, RawSplit], dict[str, Any]]:
    """All three splits of the configured corpus, read and checked (alignment, UTF-8), and notes for
    the report."""
    if data.source == "sword":
        return read_sword(data)
    return _read_text_corpus(data, workdir), {}


def _read_text_corpus(data: DataConfig, workdir: Path) -> dict[str, RawSplit]:
    if data.source in ("files", "tsv"):
        if not data.local_dir:
            raise CorpusError(f"data.source={data.source} needs data.local_dir (the directory holding the files)")
        local = Path(data.local_dir)
        stems = {split: getattr(data, f"{split}_split") or split for split in SPLITS}
        if data.source == "tsv":
            return {split: read_tsv(_find(local, f"{stems[split]}.tsv"), data.lenient) for split in SPLITS}
        return {split: read_parallel(_find(local, f"{stems[split]}.{data.src_lang}"),
                                     _find(local, f"{stems[split]}.{data.tgt_lang}"), data.lenient)
                for split in SPLITS}
    return read_named(data, workdir)


def read_parallel(src_path: Path, tgt_path: Path, lenient: bool = False) -> RawSplit:
    """Two line-aligned files; different line counts are an error naming both files and counts."""
    src_lines, tgt_lines = _read_lines(src_path), _read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise CorpusError(f"misaligned corpus: {src_path} has {len(src_lines)} lines but {tgt_path} has "
                          f"{len(tgt_lines)}; the two sides must have one sentence per line, aligned")
    src = [_decode(line, src_path, i + 1, lenient) for i, line in enumerate(src_lines)]
    tgt = [_decode(line, tgt_path, i + 1, lenient) for i, line in enumerate(tgt_lines)]
    return RawSplit(list(range(1, len(src) + 1)), src, tgt, f"{src_path} + {tgt_path}")


def read_tsv(path: Path, lenient: bool = False) -> RawSplit:
    """`src<TAB>tgt` lines; a line without exactly one tab is an error naming file and line."""
    ids, src, tgt = [], [], []
    for number, line in enumerate(_read_lines(path), start=1):
        fields = line.split(b"\t")
        if len(fields) != 2:
            raise CorpusError(f"{path}:{number}: expected 2 tab-separated fields (src, tgt), got {len(fields)}")
        ids.append(number)
        src.append(_decode(fields[0], path, number, lenient))
        tgt.append(_decode(fields[1], path, number, lenient))
    return RawSplit(ids, src, tgt, str(path))


def _find(directory: Path, name: str) -> Path:
    """`directory/name`, or its `.gz` twin; a clear error when neither exists."""
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise CorpusError(f"corpus file not found: {directory / name} (nor {name}.gz) in {directory}")


def _read_lines(path: Path) -> list[bytes]:
    """Raw lines of a (possibly gzipped) file, split on '\\n' only, '\\r\\n' endings accepted."""
    if not Path(path).is_file():
        raise CorpusError(f"corpus file not found: {path}")
    with open(path, "rb") as handle:
        blob = handle.read()
    if blob[:2] == b"\x1f\x8b":
        try:
            blob = gzip.decompress(blob)
        except (OSError, EOFError) as error:
            raise CorpusError(f"{path}: corrupt gzip file ({error})") from error
    if not blob:
        return []
    lines = blob.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def _decode(line: bytes, path: Path, number: int, lenient: bool) -> str | None:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as error:
        if lenient:
            return None
        raise CorpusError(f"{path}:{number}: invalid UTF-8 ({error.reason} at byte {error.start}); "
                          f"fix the file or set data.lenient=true to drop such lines") from error


# ------------------------------------------------------------------------------------- named corpora

def read_named(data: DataConfig, workdir: Path) -> dict[str, RawSplit]:
    """A named corpus from local_dir where it has the files, else downloaded (if allowed)."""
    corpus = NAMED[data.source]
    for lang in (data.src_lang, data.tgt_lang):
        if lang not in corpus.languages:
            raise CorpusError(f"data.source={data.source} has languages {list(corpus.languages)}, "
                              f"not {lang!r} (check data.src_lang / data.tgt_lang)")
    cache = Path(data.cache_dir or workdir / "downloads").resolve() / data.source
    splits = {}
    for split in SPLITS:
        source = corpus.splits[split]
        stem = getattr(data, f"{split}_split") or source.stem
        paths = _local_pair(data, stem)
        if paths is None:
            if not data.download:
                raise CorpusError(f"corpus file not found: {data.source} {split} ({stem}.{data.src_lang}, "
                                  f"{stem}.{data.tgt_lang}) is not in data.local_dir={data.local_dir!r} "
                                  f"and data.download is false")
            paths = _fetch(data, source if stem == source.stem else SplitSource(stem), cache, stem)
        splits[split] = read_parallel(*paths, lenient=data.lenient)
    return splits


def _local_pair(data: DataConfig, stem: str) -> tuple[Path, Path] | None:
    if not data.local_dir:
        return None
    local = Path(data.local_dir)
    try:
        return _find(local, f"{stem}.{data.src_lang}"), _find(local, f"{stem}.{data.tgt_lang}")
    except CorpusError:
        return None


def _fetch(data: DataConfig, source: SplitSource, cache: Path, stem: str) -> tuple[Path, Path]:
    """Download (once, into `cache`) and return the pair of files for one split."""
    langs = (data.src_lang, data.tgt_lang)
    targets = tuple(cache / f"{stem}.{lang}" for lang in langs)
    if all(path.is_file() for path in targets):
        return targets
    cache.mkdir(parents=True, exist_ok=True)
    if source.sacrebleu:
        from sacrebleu.utils import get_files  # its own download and SGML/XML handling

        files = get_files(source.sacrebleu, f"{langs[0]}-{langs[1]}")  # [source side, reference]
        for origin, target in zip(files[:2], targets):
            _atomic_copy(Path(origin), target)
        return targets
    if not source.archives:
        raise CorpusError(f"{data.source}: no download known for split file stem {stem!r}; put "
                          f"{stem}.{langs[0]} and {stem}.{langs[1]} into data.local_dir")
    if data.source == "iwslt14":
        return _prepare_iwslt14(download(source.archives[0].url, cache), cache, stem, langs)
    for lang, target in zip(langs, targets):
        parts = []
        for archive in source.archives:
            url = archive.url.replace("{lang}", lang)
            local = download(url, cache)
            parts.append(_member(local, archive.member.replace("{lang}", lang)) if archive.member
                         else _maybe_gunzip(local.read_bytes()))
        _atomic_write(target, b"".join(part if part.endswith(b"\n") or not part else part + b"\n"
                                       for part in parts))
    return targets


def download(url: str, directory: Path) -> Path:
    """Fetch `url` into `directory` once (atomic: temp file + rename); returns the local path."""
    target = Path(directory) / url.rstrip("/").rsplit("/", 1)[-1].split("?")[0]
    if target.is_file():
        return target
    log.info("downloading %s", url)
    tmp = target.with_name(f".{target.name}.part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
            shutil.copyfileobj(response, out, length=1 << 20)
        os.replace(tmp, target)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        raise CorpusError(f"download failed: {url} ({error}); put the files into data.local_dir "
                          f"instead") from error
    return target


def _member(archive: Path, member: str) -> bytes:
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as handle:
            try:
                return handle.read(member)
            except KeyError as error:
                raise CorpusError(f"{archive}: has no member {member!r}") from error
    with tarfile.open(archive) as handle:
        try:
            extracted = handle.extractfile(member)
        except KeyError as error:
            raise CorpusError(f"{archive}: has no member {member!r}") from error
        if extracted is None:
            raise CorpusError(f"{archive}: member {member!r} is not a file")
        return _maybe_gunzip(extracted.read())


def _maybe_gunzip(blob: bytes) -> bytes:
    return gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob


_IWSLT_META = re.compile(rb"^\s*<(url|talkid|keywords|speaker|reviewer|translator|title|description)>")
_IWSLT_SEG = re.compile(rb"<seg id=\"?\d+\"?>\s*(.*?)\s*</seg>")
_IWSLT_TEST = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
               "IWSLT14.TED.tst2012")


def _prepare_iwslt14(archive: Path, cache: Path, stem: str, langs: tuple[str, str]) -> tuple[Path, Path]:
    """fairseq's prepare-iwslt14.sh split without its Moses tokenization and lowercasing: train is
    train.tags minus metadata lines, valid is every 23rd train line, test the dev/tst talks."""
    texts: dict[str, dict[str, list[bytes]]] = {}
    for lang in langs:
        tags = _member(archive, f"de-en/train.tags.de-en.{lang}").split(b"\n")
        body = [line.strip() for line in tags if line.strip() and not _IWSLT_META.match(line)]
        test: list[bytes] = []
        for name in _IWSLT_TEST:
            test += _IWSLT_SEG.findall(_member(archive, f"de-en/{name}.de-en.{lang}.xml"))
        texts[lang] = {"train": [l for i, l in enumerate(body, 1) if i % 23 != 0],
                       "valid": [l for i, l in enumerate(body, 1) if i % 23 == 0], "test": test}
    for split in SPLITS:
        for lang in langs:
            _atomic_write(cache / f"{split}.{lang}", b"".join(line + b"\n" for line in texts[lang][split]))
    return cache / f"{stem}.{langs[0]}", cache / f"{stem}.{langs[1]}"


def _atomic_write(path: Path, blob: bytes) -> None:
    tmp = path.with_name(f".{path.name}.part")
    tmp.write_bytes(blob)
    os.replace(tmp, path)


def _atomic_copy(origin: Path, target: Path) -> None:
    _atomic_write(target, origin.read_bytes())


# ------------------------------------------------------------------------------------------- SWORD

_NOTE = re.compile(r"<note\b[^>]*>.*?</note>", re.DOTALL)
_TAG = re.compile(r"<[^>]*>")
_GAP = re.compile(r"(?<=\w)\x00+(?=\w)")


def clean_osis(raw: str) -> str:
    """Plain verse text from OSIS markup: footnotes removed, tags stripped, entities decoded.

    A footnote sitting between two words (`God</w><note>…</note><w>created`) becomes a space, which
    pysword's own cleaner loses ("Godcreated")."""
    text = _NOTE.sub("\x00", raw)
    text = html.unescape(_TAG.sub("", text))
    text = _GAP.sub(" ", text).replace("\x00", "")
    return " ".join(text.split())


def read_sword(data: DataConfig) -> tuple[dict[str, RawSplit], dict[str, Any]]:
    """Verse-aligned pairs from two SWORD modules, split deterministically by hashed reference.

    Verses empty in either module (omitted verses, or books one module lacks text for) are not pairs
    at all: they are left out before the split and counted as `sword_empty_verses`."""
    every = read_sword_pairs(data.sword_path, data.sword_src_module, data.sword_tgt_module)
    pairs = [pair for pair in every if pair[1] and pair[2]]
    if not pairs:
        raise CorpusError(f"empty corpus: SWORD modules {data.sword_src_module} and {data.sword_tgt_module} "
                          f"in {data.sword_path} share no non-empty verses")
    order = sorted(range(len(pairs)), key=lambda i: hashlib.sha256(
        f"{data.split_seed}:{pairs[i][0]}".encode()).hexdigest())
    if data.test_size + data.valid_size >= len(pairs):
        raise CorpusError(f"data.valid_size + data.test_size = {data.valid_size + data.test_size} leaves no "
                          f"training pairs out of {len(pairs)} verses")
    chosen = {"test": order[: data.test_size], "valid": order[data.test_size: data.test_size + data.valid_size],
              "train": order[data.test_size + data.valid_size:]}
    origin = f"SWORD {data.sword_src_module} + {data.sword_tgt_module} in {data.sword_path}"
    splits = {}
    for split, indices in chosen.items():
        indices = sorted(indices)
        splits[split] = RawSplit([pairs[i][3] for i in indices], [pairs[i][1] for i in indices],
                                 [pairs[i][2] for i in indices], f"{origin} ({split})")
    return splits, {"sword_verses": len(every), "sword_empty_verses": len(every) - len(pairs)}


def read_sword_pairs(sword_path: str, src_module: str, tgt_module: str) -> list[tuple[str, str, str, int]]:
    """(reference, src text, tgt text, id) for every verse both modules have, in canonical order; the id
    is the 1-based position in that order.

    Verses are matched by (book, chapter, verse); where the two versifications differ (e.g. NRSVA vs
    KJV in Revelation 12/13) a few neighbouring verses may be paired off by one."""
    from pysword.modules import SwordModules

    modules = SwordModules(paths=[sword_path])
    try:
        found = modules.parse_modules()
    except (OSError, ValueError, IndexError) as error:  # pysword raises these on a missing/broken library
        found = {}
        log.debug("pysword: %s", error)
    missing = [name for name in (src_module, tgt_module) if name not in found]
    if missing:
        raise CorpusError(f"SWORD module(s) {missing} not found under {sword_path}. The default corpus "
                          f"needs the Debian packages: {SWORD_INSTALL} (or pick another data.source)")
    bibles = [modules.get_bible_from_module(name) for name in (src_module, tgt_module)]
    for bible in bibles:
        if hasattr(bible, "_decompressed_text"):
            # pysword decompresses a whole book block for every verse; a small cache makes the full
            # read take well under a second instead of minutes.
            bible._decompressed_text = functools.lru_cache(maxsize=4)(bible._decompressed_text)
    src_bible, tgt_bible = bibles
    tgt_structure = tgt_bible.get_structure()
    pairs = []
    for books in src_bible.get_structure().get_books().values():
        for book in books:
            try:
                _, other = tgt_structure.find_book(book.osis_name)
            except ValueError:
                continue  # e.g. deuterocanonical books only one module has
            for chapter in range(1, min(book.num_chapters, other.num_chapters) + 1):
                count = min(book.chapter_lengths[chapter - 1], other.chapter_lengths[chapter - 1])
                verses = list(range(1, count + 1))
                src = list(src_bible.get_iter(books=book.name, chapters=chapter, verses=verses, clean=False))
                tgt = list(tgt_bible.get_iter(books=other.name, chapters=chapter, verses=verses, clean=False))
                if len(src) != count or len(tgt) != count:
                    raise CorpusError(f"SWORD {book.osis_name} {chapter}: expected {count} verses, read "
                                      f"{len(src)} ({src_module}) and {len(tgt)} ({tgt_module})")
                for verse, (a, b) in enumerate(zip(src, tgt), start=1):
                    pairs.append((f"{book.osis_name}.{chapter}.{verse}", clean_osis(a), clean_osis(b),
                                  len(pairs) + 1))
    return pairs


def input_fingerprint(data: DataConfig) -> dict[str, Any]:
    """Cheap identity of the input files (name, size, mtime), so edited inputs change the stage hash."""
    if data.source == "sword":
        mods = Path(data.sword_path) / "mods.d"
        confs = [next((p for p in (mods / f"{name}.conf", mods / f"{name.lower()}.conf") if p.is_file()),
                      mods / f"{name}.conf") for name in (data.sword_src_module, data.sword_tgt_module)]
        return {str(p): digest(p.read_text(errors="replace")) if p.is_file() else "missing" for p in confs}
    if not data.local_dir or not Path(data.local_dir).is_dir():
        return {}
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns]
            for p in sorted(Path(data.local_dir).iterdir()) if p.is_file()}
