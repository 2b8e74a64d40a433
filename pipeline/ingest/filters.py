"""Filtering one split into the ingest output table (`id` int64, `src`, `tgt` string).

Both sides are stripped. A pair is flagged for the first of: an empty side, a side over `max_chars`,
a character length ratio over `max_length_ratio`, a repeat of an earlier pair (`dedupe`). Flagged pairs
are dropped from train and only counted (`flagged`) in valid/test, so test sets stay intact; pairs that
could not be decoded (`lenient` mode) are dropped from every split as `invalid_utf8`.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import pyarrow as pa

from pipeline.config import DataConfig
from pipeline.ingest.readers import RawSplit

SCHEMA = pa.schema([("id", pa.int64()), ("src", pa.string()), ("tgt", pa.string())])


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
