"""The ingest stage itself: how it builds the splits, and the fingerprint of its input files.

Its hash (pipeline/graph.py) covers the data config (less `download`/`cache_dir`, which do not change the
data) and `input_fingerprint` of the input files. `build` reads the corpus (`read_corpus` picks the reader for
`data.source`), applies `data.limit`, filters each split, writes it with `pipeline.parquet.write_split`
in id order and writes `report.json`; a split with no pairs left is an error.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline.config import DataConfig
from pipeline.ingest.corpora import read_named
from pipeline.ingest.filters import filter_split
from pipeline.ingest.readers import SPLITS, CorpusError, RawSplit, read_local
from pipeline.ingest.sword import read_sword
from pipeline.parquet import write_split
from pipeline.stage import StageRun, digest, write_json

log = logging.getLogger(__name__)


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
        write_split(table.sort_by("id"), tmp / split)
        report["splits"][split] = counts
        log.debug("ingest %s: %d pairs kept of %d read (%s)", split, counts["kept"], counts["read"], part.origin)
    write_json(tmp / "report.json", report)
    return report["splits"]


def read_corpus(data: DataConfig, workdir: Path) -> tuple[dict[str, RawSplit], dict[str, Any]]:
    """All three splits of the configured corpus, read and checked (alignment, UTF-8), and notes for
    the report."""
    if data.source == "sword":
        return read_sword(data)
    if data.source in ("files", "tsv"):
        return read_local(data), {}
    return read_named(data, workdir), {}


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
