"""The ingest stage itself: how it builds the splits, and the fingerprint of its input files.

Its hash (`ingest_key`, pipeline/stagekeys.py) covers the data config (less what does not change the
data) and `input_fingerprint`: the files it reads, by content (not where they lie), and no other file.
`build` reads the corpus (`read_corpus` picks the reader for `data.source`), streams each split through the
filters into its Parquet files (`pipeline.parquet.SplitWriter`, in id order), applies `data.limit` (lines past
it are still read and checked, so a limit never hides a bad input), logs the files it read and writes
`report.json`; a split with no pairs left is an error.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
from itertools import islice
from pathlib import Path
from typing import Any

from pipeline.config import DataConfig
from pipeline.parquet import SplitWriter
from pipeline.stage import StageRun, drill_hold, split_lines, write_json
from pipeline.stages.ingest.corpora import local_pairs, read_named
from pipeline.stages.ingest.filters import SCHEMA, filter_split
from pipeline.stages.ingest.readers import SPLITS, CorpusError, RawSplit, local_files, read_local
from pipeline.stages.ingest.sword import read_sword

log = logging.getLogger(__name__)


def build(run: StageRun, tmp: Path) -> dict[str, Any]:
    """Read, validate, filter and write the corpus into `tmp`."""
    return _build(run.cfg.data, run.workdir, tmp)


def _build(data: DataConfig, workdir: Path, tmp: Path) -> dict[str, Any]:
    raw, notes = read_corpus(data, workdir)
    report: dict[str, Any] = {"source": data.source, "src_lang": data.src_lang, "tgt_lang": data.tgt_lang,
                              **notes, "splits": {}}
    files = [path for split in SPLITS for path in raw[split].files]
    if files:
        report["inputs"] = {path.name: _file_digest(path) for path in files}
        log.info("ingest reads %d files from %s: %s", len(files), files[0].parent, ", ".join(p.name for p in files))
    elif data.source == "sword":
        report["inputs"] = input_fingerprint(data)
        log.info("ingest reads SWORD modules %s and %s from %s (%d files)", data.sword_src_module,
                 data.sword_tgt_module, data.sword_path, len(report["inputs"]))
    for split in SPLITS:
        part = raw[split]
        rows = iter(part.rows)
        with SplitWriter(tmp / split, SCHEMA) as writer:
            counts = filter_split(islice(rows, data.limit) if data.limit else rows, data, split == "train", writer,
                                  spill_dir=tmp)
        for _ in rows:  # past data.limit: read and checked, not kept
            pass
        if part.text:
            counts["text"] = dict(sorted(part.text.items()))
        if counts["kept"] == 0:
            raise CorpusError(f"empty corpus: no {split} pairs left from {part.origin} "
                              f"(read {counts['read']}, dropped {counts['dropped']})")
        report["splits"][split] = counts
        log.debug("ingest %s: %d pairs kept of %d read (%s)", split, counts["kept"], counts["read"], part.origin)
        drill_hold("ingest")  # tests/faults: a signal here finds one split written and the others not
    write_json(tmp / "report.json", report)
    return report["splits"]


def summary(output: Path, counts: dict[str, Any]) -> list[str]:
    """Per split: pairs kept of read, and what was dropped (train) or flagged (valid, test), by reason."""
    return split_lines(counts, SPLITS, lambda entry: {**entry["dropped"], **entry.get("flagged", {})})


def read_corpus(data: DataConfig, workdir: Path) -> tuple[dict[str, RawSplit], dict[str, Any]]:
    """All three splits of the configured corpus, ready to be read (streamed; checked as they are read:
    alignment, UTF-8, text), and notes for the report."""
    if data.source == "sword":
        return read_sword(data)
    if data.source in ("files", "tsv"):
        return read_local(data), {}
    return read_named(data, workdir), {}


def input_fingerprint(data: DataConfig) -> dict[str, Any]:
    """Identity of the input files, so edited inputs change the stage hash and nothing else does: each file
    ingest reads from `local_dir` by name and SHA-256 of its content (computed once per version of a file in a
    process); for `sword`, each module's configuration file and the files of its data directory (the conf's
    `DataPath`), by path and SHA-256 — what pysword reads, and nothing else of the library. Two candidates for
    one file are an error here already (`readers.find_file`); a missing file is left out (the build names it)."""
    if data.source == "sword":
        return {str(p): _file_digest(p) if p.is_file() else "missing"
                for p in _sword_files(data)}
    if not data.local_dir or not Path(data.local_dir).is_dir():
        return {}
    return {p.name: _file_digest(p) for p in sorted(_files_read(data))}


def _sword_files(data: DataConfig) -> list[Path]:
    """The two SWORD modules' files: each one's `mods.d` configuration file (missing ones too, to be named),
    then the files of the directory its `DataPath=` line names, relative to the library (`sword_path`)."""
    library, files = Path(data.sword_path), []
    for name in (data.sword_src_module, data.sword_tgt_module):
        conf = next((p for p in (library / "mods.d" / f"{name}.conf", library / "mods.d" / f"{name.lower()}.conf")
                     if p.is_file()), library / "mods.d" / f"{name}.conf")
        files.append(conf)
        if conf.is_file():
            lines = conf.read_text(encoding="utf-8", errors="replace").splitlines()
            paths = [line.split("=", 1)[1].strip() for line in lines if line.strip().lower().startswith("datapath=")]
            directory = library / paths[0] if paths else None
            if directory is not None and directory.is_dir():
                files += sorted(p for p in directory.iterdir() if p.is_file())
    return files


def _files_read(data: DataConfig) -> list[Path]:
    """The files of `local_dir` that ingest reads (those that exist)."""
    if data.source in ("files", "tsv"):
        return [path for paths in local_files(data, required=False).values() for path in paths]
    return [path for pair in local_pairs(data).values() for path in pair]


def _identity(stat: os.stat_result) -> tuple[int, ...]:
    """What changes when a file is written (ctime too, which `touch -d`/os.utime cannot set back)."""
    return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def _file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, computed once per version of the file in this process."""
    return _content_digest(str(path.resolve()), *_identity(path.stat()))


@functools.lru_cache(maxsize=256)
def _content_digest(path: str, *identity: int) -> str:
    """SHA-256 of a file's bytes; `identity` is only the cache's key (the graph asks often)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
