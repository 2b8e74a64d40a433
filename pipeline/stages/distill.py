"""Distill stage: sequence-level knowledge distillation of the training split, both directions, on Ray Data.

The driver plans the work: each direction's inputs sorted by length and cut into token-bounded batches
(`plan_batches`: sentences × the longest ≤ `distill.max_tokens` pieces with EOS; `max_tokens` 0: batches of
`distill.batch_size` sentences), the costliest first, one Ray Data block each (`from_arrow`). An actor pool of
teacher replicas (`map_batches(TeacherDecoder)`; each holds both directions' teachers, loaded once; one GPU
per actor with `distill.use_gpu`, else one CPU each) decodes every planned batch as one batched beam search
(`distill.beam_size`, `length_penalty`, output length ≤ max_len_a·|x| + max_len_b), exactly the batches
`decode` makes in one process, so the KD outputs are those of the teacher called directly. The engine
(`distill.engine`) is our beam search (`torch`) or the same teachers converted to CTranslate2 (`ctranslate2`,
the optional extra `[ct2]`; `reder/ct2.py` mirrors our search, the few beam outputs that differ are explained
there); `auto` takes CTranslate2 when it is installed and, with `distill.use_gpu`, only where CTranslate2
sees a CUDA device (`engine_choice`). The driver converts each teacher once into the stage's temporary
directory; the actors load the converted models (on the GPU with `distill.use_gpu`). The engine used and why
are in the stage's report. The driver collects the outputs as the actors finish them (each sentence
exactly once) and writes `train/part-NNNNN.parquet` with `id`, `src_ids`, `kd_tgt_ids` (teacher src→tgt of
src), `tgt_ids`, `kd_src_ids` (teacher tgt→src of tgt) — REDER's src2tgt then trains on (src, kd_tgt), its
tgt2src on (kd_src, tgt) — plus `src_len`/`tgt_len`. Valid and test are not distilled.

A teacher output that REDER's head cannot align to its input (CTC: too long for r·|x| frames; DAG: longer
than the graph, the tokenize stage's rules) is replaced by the reference for that direction and counted
(`fallback_src2tgt`/`fallback_tgt2src`), so no pair is lost. With `distill.corpus` set, that already
distilled Parquet directory is checked (columns, types, ids of the tokenized train split) and used instead
of decoding. `report.json` and the stage's MLflow run get the statistics: sentences/s, the KD/reference
length ratio and the sacreBLEU of the teacher's output against the reference, per direction.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cluster.connect import actor_pool_options, remote_args_allowed
from pipeline.config import DistillConfig, PipelineConfig
from pipeline.metrics import corpus_bleu
from pipeline.parquet import write_split
from pipeline.progress import Progress
from pipeline.stage import StageError, StageRun, write_json
from pipeline.stages import spm, teacher, tokenize
from reder import feasibility
from reder.config import EOS_ID

if TYPE_CHECKING:
    from reder.autoregressive import Transformer
    from reder.decoding.base import Ct2Model

log = logging.getLogger(__name__)

SCHEMA = pa.schema([("id", pa.int64()), ("src_ids", pa.list_(pa.int32())), ("kd_tgt_ids", pa.list_(pa.int32())),
                    ("tgt_ids", pa.list_(pa.int32())), ("kd_src_ids", pa.list_(pa.int32())),
                    ("src_len", pa.int32()), ("tgt_len", pa.int32())])
REQUIRED = ("id", "src_ids", "kd_tgt_ids", "tgt_ids", "kd_src_ids")
DECODING_KEYS = ("beam_size", "length_penalty", "max_len_a", "max_len_b")  # the keys that change the output


def ctranslate2_installed() -> bool:
    """Whether the optional CTranslate2 extra is importable here."""
    return importlib.util.find_spec("ctranslate2") is not None


# What the ctranslate2 4.x Linux wheels load to decode on a GPU, beyond the driver's libcuda.so.1: their CUDA
# runtime is linked in (so `get_cuda_device_count` needs the driver only), cuBLAS is opened at the first
# matrix product — CUDA 12's, whatever CUDA torch has (docs/USAGE.md, "Teachers and distillation").
CT2_CUDA_LIBRARIES = ("libcublasLt.so.12", "libcublas.so.12")


@functools.cache
def ctranslate2_cuda() -> tuple[int, str]:
    """(CUDA devices CTranslate2 can decode on in this process, why none): its device count, and the cuBLAS it
    opens at the first product, found on the library path or in pip's nvidia-cublas-cu12 (then loaded here, so
    CTranslate2 finds it loaded). Asked once per process, so every stage key of a run resolves `auto` alike."""
    try:
        import ctranslate2

        devices = ctranslate2.get_cuda_device_count()
    except (ImportError, OSError, RuntimeError) as error:
        return 0, f"CTranslate2 does not load ({error})"
    if not devices:
        return 0, "ctranslate2.get_cuda_device_count() is 0"
    wheel = [Path(p) / "nvidia" / "cublas" / "lib" for p in sys.path]  # nvidia-cublas-cu12's layout
    for name in CT2_CUDA_LIBRARIES:
        for candidate in [name, *(str(d / name) for d in wheel if (d / name).is_file())]:
            try:
                ctypes.CDLL(candidate, mode=ctypes.RTLD_GLOBAL)
                break
            except OSError:
                continue
        else:
            return 0, (f"CTranslate2 sees {devices} CUDA device(s) but {name} does not load (its wheels are built "
                       f"for CUDA 12: pip install nvidia-cublas-cu12, or put CUDA 12's cuBLAS on LD_LIBRARY_PATH)")
    return devices, ""


def engine_choice(distill: DistillConfig) -> tuple[str, str]:
    """(engine, why): what `distill.engine` resolves to here — auto: CTranslate2 when installed, on the GPU
    (`use_gpu`) only where it can decode on CUDA (`ctranslate2_cuda`), else our search; resolved on the
    driver, like the stage key."""
    if distill.engine == "torch":
        return "torch", "distill.engine=torch"
    installed = ctranslate2_installed()
    if distill.engine == "ctranslate2":
        if not installed:
            raise StageError("distill: distill.engine=ctranslate2 but CTranslate2 is not installed: pip install -e '.[ct2]', "
                             "or set distill.engine=torch (or auto)")
        return "ctranslate2", "distill.engine=ctranslate2"
    if not installed:
        return "torch", "auto: CTranslate2 is not installed"
    if not distill.use_gpu:
        return "ctranslate2", "auto: CTranslate2 is installed (CPU actors)"
    devices, why_not = ctranslate2_cuda()
    if devices:
        return "ctranslate2", f"auto: CTranslate2 decodes on {devices} CUDA device(s) here"
    return "torch", f"auto: our search on the GPU, as CTranslate2 cannot decode on CUDA here: {why_not}"


def engine(distill: DistillConfig) -> str:
    """The engine `distill.engine` resolves to here: torch or ctranslate2 (`engine_choice`)."""
    return engine_choice(distill)[0]


def summary(output: Path, counts: dict[str, Any]) -> list[str]:
    """The pairs written, the teachers' BLEU against the references, length ratios, and reference fallbacks."""
    return [f"{counts['rows']} pairs; teacher BLEU vs reference {counts['teacher_bleu_src2tgt']:.2f} / "
            f"{counts['teacher_bleu_tgt2src']:.2f}; length ratio {counts['length_ratio_src2tgt']:.2f} / "
            f"{counts['length_ratio_tgt2src']:.2f}; reference fallbacks {counts['fallback_src2tgt']} / "
            f"{counts['fallback_tgt2src']}"]


def build(run: StageRun, tmp: Path) -> dict[str, Any]:
    """Distill input `tokenize`'s train split with input `teacher`'s models (or check and adopt
    `distill.corpus`) into `tmp`."""
    return _build(run.cfg, run.inputs["tokenize"], run.inputs["spm"], run.inputs.get("teacher"), tmp)


def _build(cfg: PipelineConfig, data: Path, spm_dir: Path, teacher_dir: Path | None, tmp: Path) -> dict[str, Any]:
    references = tokenize.read_split(data / "train")
    used, why = (None, None) if cfg.distill.corpus else engine_choice(cfg.distill)
    if used:
        log.info("distill: engine %s (%s)", used, why)
    started = time.time()
    if cfg.distill.corpus:
        table, workers = read_corpus(Path(cfg.distill.corpus).expanduser().resolve(), references), 0
    else:
        dirs = teacher.model_dirs(teacher_dir)
        for direction, directory in dirs.items():  # fail here, not inside an actor
            teacher.check_teacher(directory, direction, cfg, spm_dir / spm.MODEL_FILE)
        ct2_dirs = convert_teachers(dirs, tmp / "_ct2") if used == "ctranslate2" else None
        table, workers = distill_on_ray(references, {d: str(p) for d, p in dirs.items()}, cfg.model.vocab_size,
                                        cfg.distill, ct2_dirs)
        if ct2_dirs:
            shutil.rmtree(tmp / "_ct2")
    seconds = time.time() - started
    stats = statistics(table, spm_dir / spm.MODEL_FILE)  # of the teachers' own output, before any fallback
    table, fallbacks = apply_fallbacks(table, cfg)
    write_split(table, tmp / "train")
    report = {"rows": table.num_rows, "workers": workers, "engine": used, "engine_choice": why,
              "seconds": round(seconds, 2),
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
    """Ray Data UDF: rows of planned batches (`work_blocks`: `batch`, `direction`, `row`, `input_ids`) → `row`,
    `direction` and the teacher's output `kd_ids`, each planned batch decoded as one batched beam search by
    its direction's teacher; with `ct2_dirs` (each direction's teacher converted to CTranslate2) CTranslate2
    decodes instead of our search."""

    def __init__(self, teacher_dirs: dict[str, str], vocab_size: int, decoding: dict[str, Any], threads: int = 1,
                 ct2_dirs: dict[str, str] | None = None) -> None:
        import torch  # here, not at the top: the driver plans the work without loading torch

        from reder.checkpoint import load_teacher_dir
        from reder.decoding.ct2 import ct2_model

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cpu":
            torch.set_num_threads(max(1, threads))
        self.decoding = decoding
        if ct2_dirs:
            devices, why_not = ctranslate2_cuda() if self.device == "cuda" else (0, "")  # loads cuBLAS 12 if needed
            if self.device == "cuda" and not devices:
                raise RuntimeError(f"distill: CTranslate2 cannot decode on this actor's GPU: {why_not}; "
                                   "set distill.engine=torch (or auto)")
            self.decoders = {d: functools.partial(decode, ct2_model(Path(p), self.device, max(1, threads)), direction=d)
                             for d, p in ct2_dirs.items()}
        else:
            teachers = {d: load_teacher_dir(Path(p), d, vocab_size, self.device) for d, p in teacher_dirs.items()}
            self.decoders = {d: functools.partial(decode, teachers[d], direction=d) for d in teachers}

    def __call__(self, rows: pa.Table) -> pa.Table:
        inputs, directions = rows.column("input_ids").to_pylist(), rows.column("direction").to_pylist()
        batches: dict[int, list[int]] = {}  # planned batch → its rows (a call may get several blocks)
        for index, number in enumerate(rows.column("batch").to_pylist()):
            batches.setdefault(number, []).append(index)
        outputs: list[list[int]] = [[] for _ in inputs]
        for members in batches.values():
            decoded = self.decoders[directions[members[0]]]([inputs[i] for i in members], **self.decoding,
                                                            max_tokens=0, batch_size=len(members))  # one search
            for index, hypothesis in zip(members, decoded):
                outputs[index] = hypothesis
        return pa.table({"row": rows.column("row"), "direction": rows.column("direction"),
                         "kd_ids": pa.array(outputs, pa.list_(pa.int32()))})


def plan_batches(lengths: Sequence[int], max_tokens: int, batch_size: int) -> list[list[int]]:
    """Indices of inputs of these lengths (pieces with EOS) in beam-search batches, in length order (stable):
    each batch as many sentences as keep sentences × the longest ≤ max_tokens (a longer sentence alone);
    max_tokens 0: batch_size sentences each."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    if not max_tokens:
        return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    batches: list[list[int]] = []
    for index in order:  # ascending: the sentence added is the batch's longest
        if batches and (len(batches[-1]) + 1) * lengths[index] <= max_tokens:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


def _in_batches(search: Callable[[list[list[int]], int], list[list[int]]], inputs: list[list[int]], max_tokens: int,
                batch_size: int) -> list[list[int]]:
    """`search(sequences with EOS, batch size)` once per `plan_batches` batch of `inputs`; outputs in input order."""
    sequences = [x + [EOS_ID] for x in inputs]
    outputs: list[list[int]] = [[] for _ in sequences]
    for batch in plan_batches([len(s) for s in sequences], max_tokens, batch_size):
        for index, hypothesis in zip(batch, search([sequences[i] for i in batch], len(batch))):
            outputs[index] = hypothesis
    return outputs


def decode(model: Transformer | Ct2Model, inputs: list[list[int]], direction: str, beam_size: int,
           length_penalty: float, max_len_a: float, max_len_b: int, max_tokens: int = 0,
           batch_size: int = 128) -> list[list[int]]:
    """Teacher outputs (piece ids, no EOS) for pieces without EOS, in input order: one batched beam search (the
    `beam` decoder of reder/decoding/: ours, or through CTranslate2 for a `Ct2Model`, which mirrors ours) per
    `plan_batches` batch (the batches the stage's actors get, so outputs match actor or not)."""
    from reder.decoding.run import translate_ids

    return _in_batches(lambda sequences, size: translate_ids(
        model, sequences, direction, "beam", size, beam_size=beam_size, length_penalty=length_penalty,
        max_len_a=max_len_a, max_len_b=max_len_b), inputs, max_tokens, batch_size)


def plan_actors(distill: DistillConfig) -> tuple[int, dict[str, float]]:
    """(actors, Ray resources per actor): one GPU per actor with use_gpu (all the cluster's GPUs unless
    `workers` says), else CPU actors sharing the free CPUs (one each by default). The work is in the object
    store already (`work_blocks`), so no read task needs a CPU of its own."""
    import ray

    if distill.use_gpu:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus < 1:
            raise StageError("distill: distill.use_gpu=true but the Ray cluster has no GPU; set distill.use_gpu=false")
        return distill.workers or gpus, {"num_gpus": 1, "num_cpus": distill.cpus_per_worker}
    cpus = tokenize.free_cpus()
    if cpus <= 0:
        raise StageError("distill: the Ray cluster has no free CPU (ray.available_resources() shows none)")
    actors = distill.workers or max(1, int(cpus))
    return actors, {"num_cpus": cpus / actors}


DIRECTIONS = (("src2tgt", "src_ids", "kd_tgt_ids"), ("tgt2src", "tgt_ids", "kd_src_ids"))  # input column, KD column


def work_blocks(train: pa.Table, distill: DistillConfig) -> list[pa.Table]:
    """The decoding work as Ray Data blocks, one per planned batch (`plan_batches` of each direction's inputs):
    rows `batch`, `direction`, `row` (the pair's index in `train`) and `input_ids`, the costliest batches
    (sentences × their longest output limit) first, so a pool's last batches are short."""
    planned = []  # (cost, direction, column, rows)
    for direction, column, _ in DIRECTIONS:
        lengths = [n + 1 for n in pc.list_value_length(train.column(column)).to_pylist()]  # with EOS
        for batch in plan_batches(lengths, distill.max_tokens, distill.batch_size):
            cost = len(batch) * (distill.max_len_a * lengths[batch[-1]] + distill.max_len_b)
            planned.append((cost, direction, column, batch))
    planned.sort(key=lambda p: -p[0])
    blocks = []
    for number, (_, direction, column, batch) in enumerate(planned):
        rows = pa.array(batch, pa.int64())
        blocks.append(pa.table({"batch": pa.array([number] * len(batch), pa.int32()),
                                "direction": pa.array([direction] * len(batch), pa.string()), "row": rows,
                                "input_ids": train.column(column).take(rows)}))
    return blocks


def decoding_dataset(blocks: list[pa.Table], teacher_dirs: dict[str, str], vocab_size: int, distill: DistillConfig,
                     ct2_dirs: dict[str, str] | None, actors: int, resources: dict[str, float]) -> Any:
    """The lazy Ray Dataset of `work_blocks`' blocks mapped by a pool of `actors` TeacherDecoder actors, each
    holding `resources` (`plan_actors`)."""
    import ray

    threads = max(1, int(resources.get("num_cpus", 1)))
    decoding = {k: getattr(distill, k) for k in DECODING_KEYS}
    # Ray Data wants a batch size for an actor that holds a GPU: the largest planned batch's rows (a call may then
    # get a planned batch in two parts, each decoded as its own search); without one a call gets whole blocks
    batch_size = max(block.num_rows for block in blocks) if resources.get("num_gpus") else None
    with remote_args_allowed():
        return ray.data.from_arrow(blocks).map_batches(
            TeacherDecoder, fn_constructor_kwargs={"teacher_dirs": teacher_dirs, "vocab_size": vocab_size,
                                                   "decoding": decoding, "threads": threads, "ct2_dirs": ct2_dirs},
            batch_format="pyarrow", batch_size=batch_size, compute=ray.data.ActorPoolStrategy(size=actors), **resources,
            **actor_pool_options())


def distill_on_ray(train: pa.Table, teacher_dirs: dict[str, str], vocab_size: int, distill: DistillConfig,
                   ct2_dirs: dict[str, str] | None = None) -> tuple[pa.Table, int]:
    """Decode the training split (`id`, `src_ids`, `tgt_ids`) with an actor pool of TeacherDecoder replicas
    (through CTranslate2 with `ct2_dirs`, `convert_teachers`); returns (`id`, `src_ids`, `kd_tgt_ids`,
    `tgt_ids`, `kd_src_ids` in `train`'s order, the number of actors)."""
    actors, resources = plan_actors(distill)
    dataset = decoding_dataset(work_blocks(train, distill), teacher_dirs, vocab_size, distill, ct2_dirs, actors,
                               resources)
    # Batches come back to the driver as the actors finish them: a progress line off a terminal (on one,
    # Ray Data's bars); each sentence must come back exactly once.
    outputs: dict[str, list[Any]] = {direction: [None] * train.num_rows for direction, _, _ in DIRECTIONS}
    progress = Progress("distill", 2 * train.num_rows, "sentence", bar=False)  # each pair: both directions
    for batch in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
        for row, direction, hypothesis in zip(*(batch.column(c).to_pylist() for c in ("row", "direction", "kd_ids"))):
            if outputs[direction][row] is not None:
                raise StageError(f"distill: Ray Data returned pair {row} ({direction}) twice")
            outputs[direction][row] = hypothesis
        progress.update(progress.done + batch.num_rows)
    progress.close()
    missing = sum(h is None for kd in outputs.values() for h in kd)
    if missing:
        raise StageError(f"distill: Ray Data returned {2 * train.num_rows - missing} of {2 * train.num_rows} sentences")
    ids = pa.list_(pa.int32())
    table = pa.table({"id": train.column("id"), "src_ids": train.column("src_ids").cast(ids),
                      "kd_tgt_ids": pa.array(outputs["src2tgt"], ids), "tgt_ids": train.column("tgt_ids").cast(ids),
                      "kd_src_ids": pa.array(outputs["tgt2src"], ids)})
    return table, actors


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
    feasible = feasibility.config_rule(cfg.model)
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
        # BLEU alone: chrF, which the stage does not report, took ~2/3 of this on the whole train split
        stats[f"teacher_bleu_{direction}"] = round(corpus_bleu(sp.decode(outputs), sp.decode(references))[0], 2)
    return stats
