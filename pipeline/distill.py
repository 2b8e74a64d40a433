"""Distill stage: sequence-level knowledge distillation of the training split, both directions, on Ray Data.

`read_parquet(tokenize/train) -> map_batches(TeacherDecoder) -> the driver`: an actor pool of teacher
replicas (each holds both directions' teachers; one GPU per actor with `distill.use_gpu`, else CPU actors
sized to leave a CPU for the reads, docs/DESIGN.md "Ray on small machines") decodes every batch with
batched beam search (`distill.beam_size`, `length_penalty`, output length ≤ max_len_a·|x| + max_len_b).
The engine (`distill.engine`) is our beam search (`torch`) or the same teachers converted to CTranslate2
(`ctranslate2`, the optional extra `[ct2]`; `reder/ct2.py` mirrors our search, the few beam outputs that
differ are explained there); `auto` takes CTranslate2 when it is installed. The driver converts each teacher
once into the stage's temporary directory; the actors load the converted models (on the GPU with
`distill.use_gpu`). The engine used is part of the stage's key and its report. The driver sorts the
staged rows by id and writes `train/part-NNNNN.parquet` with `id`, `src_ids`, `kd_tgt_ids` (teacher
src→tgt of src), `tgt_ids`, `kd_src_ids` (teacher tgt→src of tgt) — REDER's src2tgt then trains on
(src, kd_tgt), its tgt2src on (kd_src, tgt) — plus `src_len`/`tgt_len`. Valid and test are not distilled.

A teacher output that REDER's head cannot align to its input (CTC: too long for r·|x| frames; DAG: longer
than the graph, the tokenize stage's rules) is replaced by the reference for that direction and counted
(`fallback_src2tgt`/`fallback_tgt2src`), so no pair is lost. With `distill.corpus` set, that already
distilled Parquet directory is checked (columns, types, ids of the tokenized train split) and used instead
of decoding. `report.json` and the stage's MLflow run get the statistics: sentences/s, the KD/reference
length ratio and the sacreBLEU of the teacher's output against the reference, per direction.
"""
from __future__ import annotations

import importlib.util
import logging
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline import spm, teacher, tokenize
from pipeline.config import DistillConfig, PipelineConfig
from pipeline.metrics import corpus_scores
from pipeline.parquet import write_split
from pipeline.progress import Progress
from pipeline.stage import StageError, StageRun, write_json
from reder import EOS_ID, heads
from reder.autoregressive import Transformer
from reder.checkpoint import load_teacher_dir
from reder.translate import translate_ids

log = logging.getLogger(__name__)

SCHEMA = pa.schema([("id", pa.int64()), ("src_ids", pa.list_(pa.int32())), ("kd_tgt_ids", pa.list_(pa.int32())),
                    ("tgt_ids", pa.list_(pa.int32())), ("kd_src_ids", pa.list_(pa.int32())),
                    ("src_len", pa.int32()), ("tgt_len", pa.int32())])
REQUIRED = ("id", "src_ids", "kd_tgt_ids", "tgt_ids", "kd_src_ids")
DECODING_KEYS = ("beam_size", "length_penalty", "max_len_a", "max_len_b")  # the keys that change the output


def ctranslate2_installed() -> bool:
    """Whether the optional CTranslate2 extra is importable here."""
    return importlib.util.find_spec("ctranslate2") is not None


def engine(distill: DistillConfig) -> str:
    """The engine `distill.engine` resolves to: torch or ctranslate2 (auto: ctranslate2 when installed)."""
    if distill.engine == "auto":
        return "ctranslate2" if ctranslate2_installed() else "torch"
    if distill.engine == "ctranslate2" and not ctranslate2_installed():
        raise StageError("distill: distill.engine=ctranslate2 but CTranslate2 is not installed: pip install -e '.[ct2]', "
                         "or set distill.engine=torch (or auto)")
    return distill.engine


def build(run: StageRun, tmp: Path) -> dict[str, Any]:
    """Distill input `tokenize`'s train split with input `teacher`'s models (or check and adopt
    `distill.corpus`) into `tmp`."""
    return _build(run.cfg, run.inputs["tokenize"], run.inputs["spm"], run.inputs.get("teacher"), tmp)


def _build(cfg: PipelineConfig, data: Path, spm_dir: Path, teacher_dir: Path | None, tmp: Path) -> dict[str, Any]:
    references = tokenize.read_split(data / "train")
    used = None if cfg.distill.corpus else engine(cfg.distill)
    started = time.time()
    if cfg.distill.corpus:
        table, workers = read_corpus(Path(cfg.distill.corpus).expanduser().resolve(), references), 0
    else:
        dirs = teacher.model_dirs(teacher_dir)
        for direction, directory in dirs.items():  # fail here, not inside an actor
            teacher.check_teacher(directory, direction, cfg, spm_dir / spm.MODEL_FILE)
        staging, converted = tmp / "_staging", tmp / "_ct2"
        ct2_dirs = convert_teachers(dirs, converted) if used == "ctranslate2" else None
        workers = distill_on_ray(data / "train", staging, {d: str(p) for d, p in dirs.items()}, cfg.model.vocab_size,
                                 cfg.distill, ct2_dirs)
        table = pq.read_table(staging).sort_by("id")
        shutil.rmtree(staging)
        shutil.rmtree(converted, ignore_errors=True)
        if table.column("id").to_pylist() != references.column("id").to_pylist():
            raise StageError(f"distill: Ray Data returned {table.num_rows} rows for {references.num_rows} training pairs")
    seconds = time.time() - started
    stats = statistics(table, spm_dir / spm.MODEL_FILE)  # of the teachers' own output, before any fallback
    table, fallbacks = apply_fallbacks(table, cfg)
    write_split(table, tmp / "train")
    report = {"rows": table.num_rows, "workers": workers, "engine": used, "seconds": round(seconds, 2),
              "sentences_per_s": round(2 * table.num_rows / max(seconds, 1e-9), 2) if not cfg.distill.corpus else None,
              **fallbacks, **stats}
    write_json(tmp / "report.json", report)
    log.info("distill: %d pairs in %.1f s (%s workers, %s), fallbacks %s", table.num_rows, seconds, workers,
             used or "given corpus", fallbacks)
    return {k: v for k, v in report.items() if v is not None}


def convert_teachers(teacher_dirs: dict[str, Path], out: Path) -> dict[str, str]:
    """Each direction's teacher model directory converted to CTranslate2 under `out` (float32: outputs as ours)."""
    from reder import ct2

    return {direction: str(ct2.convert(Path(path), out / direction)) for direction, path in teacher_dirs.items()}


class TeacherDecoder:
    """Ray Data UDF: a batch of tokenized pairs → the same rows plus both teachers' beam-search outputs; with
    `ct2_dirs` (each direction's teacher converted to CTranslate2) CTranslate2 decodes instead of our search."""

    def __init__(self, teacher_dirs: dict[str, str], vocab_size: int, decoding: dict[str, Any], threads: int = 1,
                 ct2_dirs: dict[str, str] | None = None) -> None:
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cpu":
            torch.set_num_threads(max(1, threads))
        self.decoding = decoding
        if ct2_dirs:
            from reder import ct2

            translators = {d: (ct2.load_translator(Path(p), self.device, max(1, threads)), Path(p)) for d, p in ct2_dirs.items()}
            self.decoders = {d: partial(_decode_ct2, *translators[d]) for d in translators}
        else:
            teachers = {d: load_teacher_dir(Path(p), d, vocab_size, self.device) for d, p in teacher_dirs.items()}
            self.decoders = {d: partial(decode, teachers[d], direction=d) for d in teachers}

    def __call__(self, batch: pa.Table) -> pa.Table:
        src, tgt = batch.column("src_ids").to_pylist(), batch.column("tgt_ids").to_pylist()
        kd_tgt = self.decoders["src2tgt"](src, **self.decoding)
        kd_src = self.decoders["tgt2src"](tgt, **self.decoding)
        ids = pa.list_(pa.int32())
        return pa.table({"id": batch.column("id"), "src_ids": pa.array(src, ids), "kd_tgt_ids": pa.array(kd_tgt, ids),
                         "tgt_ids": pa.array(tgt, ids), "kd_src_ids": pa.array(kd_src, ids)})


def decode(model: Transformer, inputs: list[list[int]], direction: str, beam_size: int, length_penalty: float,
           max_len_a: float, max_len_b: int, batch_size: int = 128) -> list[list[int]]:
    """Teacher outputs (piece ids, no EOS) for pieces without EOS, in input order: `translate_ids`'
    length-sorted batches, one batched beam search each (the same call for every caller, so outputs match
    actor or not)."""
    return translate_ids(model, [x + [EOS_ID] for x in inputs], direction, beam_size, batch_size,
                         length_penalty=length_penalty, max_len_a=max_len_a, max_len_b=max_len_b)


def _decode_ct2(translator: Any, ct2_dir: Path, inputs: list[list[int]], beam_size: int, length_penalty: float,
                max_len_a: float, max_len_b: int, batch_size: int = 128) -> list[list[int]]:
    """`decode` through CTranslate2 (`reder.ct2.translate_ids`, which mirrors our search)."""
    from reder import ct2

    return ct2.translate_ids(translator, ct2_dir, [x + [EOS_ID] for x in inputs], beam_size, length_penalty,
                             max_len_a, max_len_b, batch_size=batch_size)


def plan_actors(distill: DistillConfig) -> tuple[int, dict[str, float], float]:
    """(actors, Ray resources per actor, CPUs per read/write task): one GPU per actor with use_gpu (all the
    cluster's GPUs unless `workers` says), else CPU actors that leave a CPU for the reads (tokenize's rule)."""
    import ray

    if distill.use_gpu:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus < 1:
            raise StageError("distill: distill.use_gpu=true but the Ray cluster has no GPU; set distill.use_gpu=false")
        return distill.workers or gpus, {"num_gpus": 1, "num_cpus": distill.cpus_per_worker}, 1.0
    actors, actor_cpus, io_cpus = tokenize.plan_workers(distill.workers, tokenize.free_cpus())
    return actors, {"num_cpus": actor_cpus}, io_cpus


def distill_on_ray(train_dir: Path, staging: Path, teacher_dirs: dict[str, str], vocab_size: int,
                   distill: DistillConfig, ct2_dirs: dict[str, str] | None = None) -> int:
    """Decode the training split with an actor pool of TeacherDecoder replicas into `staging` (through
    CTranslate2 with `ct2_dirs`, `convert_teachers`); returns the number of actors."""
    import ray

    actors, resources, io_cpus = plan_actors(distill)
    files = [str(p) for p in sorted(Path(train_dir).glob("*.parquet"))]
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in files)
    context = ray.data.DataContext.get_current()
    previous, context.use_datasource_v2 = context.use_datasource_v2, False  # tokenize.py: V1 honours the block count
    try:
        dataset = ray.data.read_parquet(files, columns=["id", "src_ids", "tgt_ids"], num_cpus=io_cpus,
                                        override_num_blocks=max(4 * actors, -(-rows // tokenize.ROWS_PER_BLOCK)))
    finally:
        context.use_datasource_v2 = previous
    threads = max(1, int(resources.get("num_cpus", 1)))
    decoding = {k: getattr(distill, k) for k in DECODING_KEYS}
    dataset = dataset.map_batches(
        TeacherDecoder, fn_constructor_kwargs={"teacher_dirs": teacher_dirs, "vocab_size": vocab_size,
                                               "decoding": decoding, "threads": threads, "ct2_dirs": ct2_dirs},
        batch_format="pyarrow", batch_size=distill.batch_size, compute=ray.data.ActorPoolStrategy(size=actors),
        **resources)
    # Batches come back to the driver as the actors finish them (the driver reads them all back anyway): a
    # progress line off a terminal (on one, Ray Data's bars), then one staged file each.
    staging.mkdir(parents=True, exist_ok=True)
    progress = Progress("distill", 2 * rows, "sentence", bar=False)  # each pair: both directions
    for index, batch in enumerate(dataset.iter_batches(batch_size=None, batch_format="pyarrow")):
        pq.write_table(batch, staging / f"part-{index:05d}.parquet")
        progress.update(progress.done + 2 * batch.num_rows)
    progress.close()
    return actors


def read_corpus(path: Path, references: pa.Table) -> pa.Table:
    """An already-distilled corpus, checked: Parquet files with the KD columns as integer lists, one row per
    tokenized training pair (same ids) and the same reference sides."""
    files = sorted(Path(path).rglob("*.parquet"))
    if not files:
        raise StageError(f"distill.corpus: no Parquet files under {path}")
    tables = []
    for file in files:
        table = pq.read_table(file)
        missing = [c for c in REQUIRED if c not in table.column_names]
        if missing:
            raise StageError(f"distill.corpus: {file} lacks column(s) {missing}; a distilled corpus has {list(REQUIRED)}")
        for column in REQUIRED[1:]:
            kind = table.schema.field(column).type
            if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(kind.value_type):
                raise StageError(f"distill.corpus: {file}: column {column} is {kind}, expected a list of integer ids")
        tables.append(table.select(list(REQUIRED)).cast(pa.schema([(c, SCHEMA.field(c).type) for c in REQUIRED])))
    table = pa.concat_tables(tables).sort_by("id")
    if table.column("id").to_pylist() != references.column("id").to_pylist():
        raise StageError(f"distill.corpus: {path} has {table.num_rows} rows whose ids do not match the "
                         f"{references.num_rows} tokenized training pairs of this run (same data and SentencePiece model?)")
    for column in ("src_ids", "tgt_ids"):
        if table.column(column).to_pylist() != references.column(column).to_pylist():
            raise StageError(f"distill.corpus: {path}: {column} differs from this run's tokenized train split")
    return table


def apply_fallbacks(table: pa.Table, cfg: PipelineConfig) -> tuple[pa.Table, dict[str, int]]:
    """Replace KD outputs REDER's head cannot align (tokenize's feasibility rules) by the references."""
    feasible = heads.feasibility_rule(cfg.model)
    src, tgt = table.column("src_ids").to_pylist(), table.column("tgt_ids").to_pylist()
    kd_tgt, kd_src = table.column("kd_tgt_ids").to_pylist(), table.column("kd_src_ids").to_pylist()
    counts = {"fallback_src2tgt": 0, "fallback_tgt2src": 0}
    for i in range(table.num_rows):
        if not feasible(len(src[i]), kd_tgt[i]):
            kd_tgt[i], counts["fallback_src2tgt"] = tgt[i], counts["fallback_src2tgt"] + 1
        if not feasible(len(tgt[i]), kd_src[i]):
            kd_src[i], counts["fallback_tgt2src"] = src[i], counts["fallback_tgt2src"] + 1
    ids = pa.list_(pa.int32())
    return pa.table({"id": table.column("id"), "src_ids": pa.array(src, ids), "kd_tgt_ids": pa.array(kd_tgt, ids),
                     "tgt_ids": pa.array(tgt, ids), "kd_src_ids": pa.array(kd_src, ids),
                     "src_len": pa.array([len(s) for s in src], pa.int32()),
                     "tgt_len": pa.array([len(t) for t in tgt], pa.int32())}, schema=SCHEMA), counts


def statistics(table: pa.Table, spm_model: Path) -> dict[str, float]:
    """Per direction: KD/reference length ratio (pieces) and sacreBLEU of the teacher output against the
    reference (both detokenized with the run's SentencePiece model)."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    stats = {}
    for direction, kd, reference in (("src2tgt", "kd_tgt_ids", "tgt_ids"), ("tgt2src", "kd_src_ids", "src_ids")):
        outputs, references = table.column(kd).to_pylist(), table.column(reference).to_pylist()
        stats[f"length_ratio_{direction}"] = round(sum(map(len, outputs)) / max(1, sum(map(len, references))), 4)
        stats[f"teacher_bleu_{direction}"] = round(corpus_scores(sp.decode(outputs), sp.decode(references))["bleu"], 2)
    return stats
