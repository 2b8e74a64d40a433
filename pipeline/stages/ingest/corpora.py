"""Named corpora (`multi30k`, `iwslt14`, `wmt16_enro`, `wmt14_ende`): where each split comes from.

A split is read from `data.local_dir` when it holds the split's `<stem>.<lang>[.gz|...]` files, otherwise
downloaded once into the cache (`data.cache_dir`, default `<workdir>/downloads`) when `data.download`
allows: archives are fetched and their members concatenated, WMT test sets come through sacreBLEU, and
IWSLT14 is split the way fairseq's prepare-iwslt14.sh splits it (without its tokenization).
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shutil
import tarfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from pipeline.config import DataConfig
from pipeline.stages.ingest.readers import (SPLITS, CorpusError, RawSplit, TextRules, copy_capped, find_file,
                                     read_parallel)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Archive:
    """A download holding one side per language: `member` names the file inside (with `{lang}`);
    an empty member means the URL itself (with `{lang}`) is the file, possibly gzipped."""

    url: str
    member: str = ""


@dataclass(frozen=True)
class SplitSource:
    stem: str  # local file names: <stem>.<lang>, or compressed (readers.find_file)
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


def read_named(data: DataConfig, workdir: Path) -> dict[str, RawSplit]:
    """A named corpus from local_dir where it has the files, else downloaded (if allowed); streamed."""
    corpus = NAMED[data.source]
    for lang in (data.src_lang, data.tgt_lang):
        if lang not in corpus.languages:
            raise CorpusError(f"data.source={data.source} has languages {list(corpus.languages)}, "
                              f"not {lang!r} (check data.src_lang / data.tgt_lang)")
    cache = Path(data.cache_dir or workdir / "downloads").resolve() / data.source
    local = local_pairs(data)
    splits = {}
    for split in SPLITS:
        source = corpus.splits[split]
        stem = _stem(data, split)
        paths = local.get(split)
        if paths is None:
            if not data.download:
                raise CorpusError(f"corpus file not found: {data.source} {split} ({stem}.{data.src_lang}, "
                                  f"{stem}.{data.tgt_lang}) is not in data.local_dir={data.local_dir!r} "
                                  f"and data.download is false")
            paths = _fetch(data, source if stem == source.stem else SplitSource(stem), cache, stem)
        splits[split] = read_parallel(*paths, TextRules.of(data))
    return splits


def local_pairs(data: DataConfig) -> dict[str, tuple[Path, Path]]:
    """The splits of a named corpus that `data.local_dir` holds both sides of, with their two files (one file
    per split and language: `find_file`)."""
    if not data.local_dir or data.source not in NAMED:
        return {}
    local, pairs = Path(data.local_dir), {}
    for split in SPLITS:
        stem = _stem(data, split)
        paths = tuple(find_file(local, f"{stem}.{lang}", required=False) for lang in (data.src_lang, data.tgt_lang))
        if all(paths):
            pairs[split] = paths
    return pairs


def _stem(data: DataConfig, split: str) -> str:
    return getattr(data, f"{split}_split") or NAMED[data.source].splits[split].stem


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
    cap = data.max_input_mb
    if data.source == "iwslt14":
        return _prepare_iwslt14(download(source.archives[0].url, cache), cache, stem, langs, cap)
    for lang, target in zip(langs, targets):
        with _atomic_output(target) as out:  # streamed: a WMT14 side is 0.7 GB
            for archive in source.archives:
                local = download(archive.url.replace("{lang}", lang), cache)
                if archive.member:
                    last = _copy_member(local, archive.member.replace("{lang}", lang), out, cap)
                else:
                    with open(local, "rb") as stream:
                        last = copy_capped(stream, out, str(local), cap)
                if last not in (b"", b"\n"):  # each part ends its last line
                    out.write(b"\n")
    return targets


def download(url: str, directory: Path) -> Path:
    """Fetch `url` into `directory` once (atomic: temp file + rename); returns the local path."""
    target = Path(directory) / url.rstrip("/").rsplit("/", 1)[-1].split("?")[0]
    if target.is_file():
        return target
    log.info("downloading %s", url)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, _atomic_output(target) as out:
            shutil.copyfileobj(response, out, length=1 << 20)
    except OSError as error:
        raise CorpusError(f"download failed: {url} ({error}); put the files into data.local_dir "
                          f"instead") from error
    return target


def _member(archive: Path, member: str, max_input_mb: int) -> bytes:
    """One member of a zip or tar archive (gunzipped if it is gzip data), at most `max_input_mb` MB, whole."""
    buffer = io.BytesIO()
    _copy_member(archive, member, buffer, max_input_mb)
    return buffer.getvalue()


def _copy_member(archive: Path, member: str, out: BinaryIO, max_input_mb: int) -> bytes:
    """Copy one member of a zip or tar archive into `out` as `copy_capped` does; returns its last byte."""
    what = f"{archive}:{member}"
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as handle:
            try:
                stream = handle.open(member)
            except KeyError as error:
                raise CorpusError(f"{archive}: has no member {member!r}") from error
            with stream:
                return copy_capped(stream, out, what, max_input_mb)
    with tarfile.open(archive) as handle:
        try:
            extracted = handle.extractfile(member)
        except KeyError as error:
            raise CorpusError(f"{archive}: has no member {member!r}") from error
        if extracted is None:
            raise CorpusError(f"{archive}: member {member!r} is not a file")
        return copy_capped(extracted, out, what, max_input_mb)


_IWSLT_META = re.compile(rb"^\s*<(url|talkid|keywords|speaker|reviewer|translator|title|description)>")
_IWSLT_SEG = re.compile(rb"<seg id=\"?\d+\"?>\s*(.*?)\s*</seg>")
_IWSLT_TEST = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
               "IWSLT14.TED.tst2012")


def _prepare_iwslt14(archive: Path, cache: Path, stem: str, langs: tuple[str, str],
                     max_input_mb: int) -> tuple[Path, Path]:
    """fairseq's prepare-iwslt14.sh split without its Moses tokenization and lowercasing: train is
    train.tags minus metadata lines, valid is every 23rd train line, test the dev/tst talks."""
    texts: dict[str, dict[str, list[bytes]]] = {}
    for lang in langs:
        tags = _member(archive, f"de-en/train.tags.de-en.{lang}", max_input_mb).split(b"\n")
        body = [line.strip() for line in tags if line.strip() and not _IWSLT_META.match(line)]
        test: list[bytes] = []
        for name in _IWSLT_TEST:
            test += _IWSLT_SEG.findall(_member(archive, f"de-en/{name}.de-en.{lang}.xml", max_input_mb))
        texts[lang] = {"train": [l for i, l in enumerate(body, 1) if i % 23 != 0],
                       "valid": [l for i, l in enumerate(body, 1) if i % 23 == 0], "test": test}
    for split in SPLITS:
        for lang in langs:
            _atomic_write(cache / f"{split}.{lang}", b"".join(line + b"\n" for line in texts[lang][split]))
    return cache / f"{stem}.{langs[0]}", cache / f"{stem}.{langs[1]}"


@contextlib.contextmanager
def _atomic_output(path: Path) -> Iterator[BinaryIO]:
    """A binary file written under a temporary name and renamed to `path` when the block ends without error;
    on an error the temporary file is removed and `path` is left as it was."""
    tmp = path.with_name(f".{path.name}.part")
    try:
        with open(tmp, "wb") as out:
            yield out
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _atomic_write(path: Path, blob: bytes) -> None:
    with _atomic_output(path) as out:
        out.write(blob)


def _atomic_copy(origin: Path, target: Path) -> None:
    with _atomic_output(target) as out, open(origin, "rb") as stream:
        shutil.copyfileobj(stream, out, length=1 << 20)
