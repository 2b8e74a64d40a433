"""Tokenize stage: ingested text -> SentencePiece ids, sharded over a Ray Data actor pool.

All splits in one Ray Data pass: `read_parquet` -> `map_batches(Tokenizer)` (a callable class holding
the SentencePiece model, shipped as bytes, so no shared filesystem is needed; in tokenize_actor.py, which an
actor imports without torch) -> `write_parquet` into a staging directory. The driver then streams each split's
staged rows back in `id` order (`in_id_order`: a sweep over the staged files by smallest id, so it holds about one
file, never the corpus), counts and applies the CTC feasibility filter, and writes `part-NNNNN.parquet` files with a
fixed layout as the rows come, so the output is byte-identical whatever the number of workers (Ray's own file
names and block boundaries vary between runs). Output columns: `id` int64, `src_ids`/`tgt_ids` list<int32> (pieces
only: no BOS, no EOS), `src_len`/`tgt_len` int32.

CTC feasibility, counting the EOS the model appends: with upsampling ratio r, a source of |x| pieces
gives T = r·(|x|+1) output frames; a CTC path for y+EOS needs at least (|y|+1) + rep(y) frames, where
rep(y) counts adjacent equal pieces in y (CTC must put a blank between them). The pair is feasible for
src2tgt iff T >= (|y|+1) + rep(y), and for tgt2src iff r·(|y|+1) >= (|x|+1) + rep(x). Pairs infeasible
in either direction are dropped from train and counted by direction; on valid/test they are counted only.
With `model.head: dag` the rule is the DAG's instead: the graph over BOS x EOS has int(λ·(|x|+2))
vertices (λ = graph_upsample_ratio) and a path must visit one per token of BOS y EOS, so src2tgt is
feasible iff int(λ·(|x|+2)) >= |y|+2 (repeats need nothing extra), and tgt2src likewise.
"""
from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from cluster.connect import actor_pool_options, remote_args_allowed
from pipeline import parquet
from pipeline.stage import StageError, StageRun, split_lines, write_json
from pipeline.stages import ingest, spm
from pipeline.stages.tokenize_actor import Tokenizer
from reder import feasibility

log = logging.getLogger(__name__)

SCHEMA = pa.schema([("id", pa.int64()), ("src_ids", pa.list_(pa.int32())), ("tgt_ids", pa.list_(pa.int32())),
                    ("src_len", pa.int32()), ("tgt_len", pa.int32())])
ROWS_PER_BLOCK = 50_000
# Rows that make an actor worth its start by default: a new actor process (Python, Ray, pyarrow, SentencePiece)
# costs about as much as tokenizing ~50,000 pairs (one 2-core CPU tokenized 60,000 sentences/s in process, and Ray
# with 2 actors took 7.0 s against 1 actor's 5.6 s on Multi30k's 29,000 pairs: docs/results/data.md).
ROWS_PER_ACTOR = 50_000
STORE_BUDGET_MB = 64  # object store one tokenize execution may fill (read-ahead, staged output)


def build(run: StageRun, tmp: Path) -> dict[str, Any]:
    """Tokenize every split of input `ingest` with input `spm`'s model on Ray into `tmp`."""
    cfg, corpus, model_path = run.cfg, run.inputs["ingest"], run.inputs["spm"] / spm.MODEL_FILE
    model_proto = model_path.read_bytes()
    spm.load(model_proto, cfg.model.vocab_size)  # fail here, not inside an actor, on a bad model
    files = [p for split in ingest.SPLITS for p in sorted((corpus / split).glob("*.parquet"))]
    report = tokenize_files(files, tmp, model_proto, feasibility.upsample_ratio(cfg.model), cfg.tokenize.workers,
                            cfg.tokenize.batch_size, cfg.model.head)
    write_json(tmp / "report.json", report)
    return {**report["splits"], "workers": report["workers"], "ray_seconds": report["ray_seconds"]}


def summary(output: Path, counts: dict[str, Any]) -> list[str]:
    """Per split: pairs kept of read, and the feasibility filter's drops by direction."""
    return split_lines(counts, ingest.SPLITS, lambda entry: {k: entry[k] for k in ("infeasible_src2tgt", "infeasible_tgt2src")
                                                             if entry[k]})


def tokenize_files(files: list[Path], out: Path, model_proto: bytes, upsample_ratio: float, workers: int = 0,
                   batch_size: int = 1024, head: str = "ctc") -> dict[str, Any]:
    """Tokenize ingest Parquet files (split = name of each file's directory) into `out/<split>/`.

    All splits go through one Ray Data execution, so its fixed cost (planning, actor start) is paid once.
    Returns the report: per-split counts, the number of actors, the seconds spent on Ray."""
    staging = out / "_staging"
    started = time.time()
    actors = tokenize_on_ray([str(p) for p in files], staging, model_proto, upsample_ratio, workers, batch_size, head)
    report: dict[str, Any] = {"upsample_ratio": upsample_ratio, **({"head": head} if head != "ctc" else {}), "workers": actors,
                              "ray_seconds": round(time.time() - started, 3), "splits": {}}
    pieces = staged_pieces(staging)
    present = {Path(p).parent.name for p in files}
    for split in [s for s in ingest.SPLITS if s in present] + sorted(present - set(ingest.SPLITS)):
        counts = finalize(in_id_order(pieces.get(split, []), split), out / split, drop=(split == "train"))
        report["splits"][split] = counts
        log.debug("tokenize %s: %d pairs kept of %d", split, counts["kept"], counts["read"])
    shutil.rmtree(staging)
    log.info("tokenize: %d workers, %.1f s on Ray", actors, report["ray_seconds"])
    return report


def plan_workers(requested: int, cpus: float, rows: int) -> tuple[int, float, float]:
    """(actors, CPUs per actor, CPUs per read/write task) for `rows` pairs on a cluster with `cpus` free CPUs.

    Reads and writes always keep a share of their own (one CPU, or half of a 1-CPU cluster): an actor
    pool holding every CPU starves the read tasks and the job hangs. By default one actor per ROWS_PER_ACTOR rows
    (at least one), at most one per remaining CPU; more actors than the remaining CPUs (`requested`) share them
    fractionally."""
    if cpus <= 0:
        raise StageError("tokenize: the Ray cluster has no free CPU (ray.available_resources() shows none)")
    io_cpus = 1.0 if cpus >= 2 else cpus / 2
    budget = cpus - io_cpus
    actors = requested or max(1, min(int(budget), -(-rows // ROWS_PER_ACTOR)))
    return actors, min(1.0, budget / actors), io_cpus


CPU_WARNING = "cpu_warning"  # the log_once key of Ray Data's "no available CPUs ... will hang" warning


def free_cpus(settle_s: float = 15.0, none_free_s: float = 120.0) -> float:
    """CPUs free in the cluster now. A Ray Data actor pool or a Train worker group from a previous
    execution is torn down asynchronously, so wait (up to `settle_s`) for the free count to climb back to
    the cluster's total before sizing a new pool; on a cluster shared with other work, take what is free
    after the wait — and while nothing at all is free, keep waiting up to `none_free_s` (on a loaded
    2-core machine a finished sweep's placement groups took longer than 15 s to go)."""
    import ray

    total = ray.cluster_resources().get("CPU", 0.0)
    started = time.monotonic()
    free = ray.available_resources().get("CPU", 0.0)
    while free < total and time.monotonic() - started < (settle_s if free > 0 else none_free_s):
        time.sleep(0.1)
        free = max(free, ray.available_resources().get("CPU", 0.0))
    return free


def tokenize_on_ray(files: list[str], staging: Path, model_proto: bytes, upsample_ratio: float,
                    workers: int = 0, batch_size: int = 1024, head: str = "ctc") -> int:
    """Tokenize ingest's Parquet `files` into `staging` with a Ray Data actor pool (each row keeps its
    split, the name of its file's directory); returns the number of actors."""
    import ray

    if not files:
        raise StageError("tokenize: no Parquet files to read")
    rows = sum(pq.ParquetFile(path).metadata.num_rows for path in files)
    actors, actor_cpus, io_cpus = plan_workers(workers, free_cpus(), rows)
    # ~4 blocks per actor so every actor gets work (one block feeds one actor task), and blocks of at
    # most ROWS_PER_BLOCK rows so large corpora stream through a small object store.
    blocks = max(4 * actors, -(-rows // ROWS_PER_BLOCK))
    context = ray.data.DataContext.get_current()
    previous = context.use_datasource_v2
    # Ray 2.60's default Parquet reader (datasource V2) spent ~6 s in its ListFiles step on this 2-core
    # machine and merged all files into one block whatever override_num_blocks said; the V1 reader
    # honours override_num_blocks and made the stage ~1.6x faster (docs/results/data.md, "Tokenization").
    # The choice is made when the read is created, so it is switched only around this call.
    context.use_datasource_v2 = False
    try:
        dataset = ray.data.read_parquet(files, include_paths=True, num_cpus=io_cpus, override_num_blocks=blocks)
    finally:
        context.use_datasource_v2 = previous
    with remote_args_allowed():
        dataset = dataset.map_batches(
            Tokenizer, fn_constructor_kwargs={"model_proto": model_proto, "upsample_ratio": upsample_ratio, "head": head},
            batch_format="pyarrow", batch_size=batch_size, compute=ray.data.ActorPoolStrategy(size=actors),
            num_cpus=actor_cpus, **actor_pool_options())
    # Blocks read ahead of the actors wait in the object store, and every page of it an actor maps counts in
    # that actor's RSS (at 100x Multi30k an actor had 300 MB of its own and 650 MB of the store's): a bound
    # on the store this execution uses keeps the read-ahead, and with it the actors' RSS, small.
    limits = dataset.context.execution_options.resource_limits
    dataset.context.execution_options.resource_limits = limits.copy(object_store_memory=STORE_BUDGET_MB * 2**20)
    # Ray Data warns that "the Ray cluster currently does not have any available CPUs. The Dataset job will hang"
    # when ray.available_resources() shows none as the write starts; the read's metadata tasks have just ended
    # then and the cluster's resource view lags them (a false alarm in every default run): wait until it shows
    # the CPUs free again (a few hundred ms). The Parquet sampling tasks that write_parquet itself runs before
    # that check can still leave it lagging (seen in a smoke run): with every CPU seen free just now, the warning
    # is held back for this write alone (Ray's log_once key marked, then unmarked), and stays for a real hang.
    from ray.util.debug import log_once, reset_log_once

    held_back = free_cpus(settle_s=5.0, none_free_s=5.0) >= ray.cluster_resources().get("CPU", 0.0) \
        and log_once(CPU_WARNING)
    try:
        # a staged file is what the driver holds at once when it writes the splits (`in_id_order`)
        dataset.write_parquet(str(staging), max_rows_per_file=ROWS_PER_BLOCK, ray_remote_args={"num_cpus": io_cpus})
    finally:
        if held_back:
            reset_log_once(CPU_WARNING)
    return actors


def staged_pieces(staging: Path) -> dict[str, list[tuple[int, Path]]]:
    """split -> (smallest id, file) of every staged file holding rows of that split, by smallest id (only the
    `split` and `id` columns are read, one file at a time)."""
    pieces: dict[str, list[tuple[int, Path]]] = {}
    files, largest = ds.dataset(staging, format="parquet").files, 0  # what pq.read_table(staging) would read
    for path in files:
        keys = pq.read_table(path, columns=["split", "id"])
        largest = max(largest, keys.num_rows)
        keys = keys.group_by("split").aggregate([("id", "min")])
        for split, smallest in zip(keys.column("split").to_pylist(), keys.column("id_min").to_pylist()):
            pieces.setdefault(split, []).append((smallest, Path(path)))
    log.info("tokenize: %d staged files of %d rows at most", len(files), largest)
    return {split: sorted(found) for split, found in pieces.items()}


def in_id_order(pieces: list[tuple[int, Path]], split: str) -> Iterator[pa.Table]:
    """One split's staged rows as tables in id order, from its `staged_pieces`: a sweep by smallest id that
    holds one piece plus the rows of earlier pieces not below the next piece's smallest id. A staged file is
    what one Ray Data block of contiguous ingest rows became, so the pieces' id ranges are disjoint and
    nothing is carried over; where they overlap, only the overlap is (correct in every case)."""
    pending: pa.Table | None = None
    for index, (_, path) in enumerate(pieces):
        table = pq.read_table(path)
        table = table.filter(pc.equal(table.column("split"), split))
        pending = (table if pending is None else pa.concat_tables([pending, table])).sort_by("id")
        if index + 1 < len(pieces):
            ready = pc.sum(pc.less(pending.column("id"), pieces[index + 1][0])).as_py() or 0
        else:
            ready = pending.num_rows
        yield pending.slice(0, ready)
        pending = pending.slice(ready)


def finalize(tables: Iterable[pa.Table], out: Path, drop: bool) -> dict[str, Any]:
    """Write one split's staged rows (`tables`, in id order) into `out` as they come: count (and on train drop)
    infeasible pairs; the files are those `parquet.write_split` gives for the whole split."""
    counts = dict.fromkeys(("read", "infeasible_src2tgt", "infeasible_tgt2src", "infeasible", "kept", "dropped",
                            "src_tokens", "tgt_tokens"), 0)
    with parquet.SplitWriter(out, SCHEMA) as writer:
        for table in tables:
            forward, backward = table.column("feasible_src2tgt"), table.column("feasible_tgt2src")
            feasible = pc.and_(forward, backward)
            counts["read"] += table.num_rows
            counts["infeasible_src2tgt"] += table.num_rows - (pc.sum(forward).as_py() or 0)
            counts["infeasible_tgt2src"] += table.num_rows - (pc.sum(backward).as_py() or 0)
            counts["infeasible"] += table.num_rows - (pc.sum(feasible).as_py() or 0)
            if drop:
                table = table.filter(feasible)
            table = pa.table({name: table.column(name).combine_chunks() for name in SCHEMA.names}, schema=SCHEMA)
            counts["kept"] += table.num_rows
            counts["src_tokens"] += pc.sum(table.column("src_len")).as_py() or 0
            counts["tgt_tokens"] += pc.sum(table.column("tgt_len")).as_py() or 0
            writer.write(table)
            # Arrow's allocator (mimalloc) keeps the pages of freed tables for reuse: handed back after each table, the
            # driver stays at one table's worth (it grew ~120 MB over a 100x Multi30k sweep, bench/data_scale.py)
            pa.default_memory_pool().release_unused()
    counts["dropped"] = counts["read"] - counts["kept"]
    return counts


def read_split(path: Path) -> pa.Table:
    """A finished split as one table (files in name order, which is id order)."""
    return parquet.read_split(path, SCHEMA)

