"""Pipeline configuration: YAML -> nested frozen dataclasses, with dotted `key=value` overrides.

One loader for every section, reder's model and loss sections included: `reder.configio.from_dict`
(unknown keys and wrong types are errors that name the key's path, `data.max_chars: expected int, got
str 'many'`). This module adds the YAML reading, the overrides and the cross-section checks. Defaults
live only in the dataclasses below.

Vocabulary size has one source of truth: `model.vocab_size`. The SentencePiece stage trains
`model.vocab_size - 1` pieces (pad, unk, bos, eos and the learned pieces) and appends the CTC blank as
the last id, so the spm model, the tokenized ids and the model's embedding table always agree.
"""
from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from reder.config import (CUTOFF_PROB, CUTOFF_TOP_N, RERANK_WEIGHT, RERANKERS, CmlmConfig, LossConfig, ModelConfig,
                          TransformerConfig)
from reder.configio import ConfigError, FieldError, from_dict, require, to_dict


@dataclass(frozen=True)
class DataConfig:
    """Where the parallel corpus comes from and how ingestion filters it (pipeline/stages/ingest/)."""

    source: Literal["sword", "multi30k", "iwslt14", "wmt16_enro", "wmt14_ende", "files", "tsv"] = "sword"
    src_lang: str = "en"
    tgt_lang: str = "es"
    # Directory holding local copies (`<split>.<lang>` text files, optionally .gz/.bz2/.xz/.lzma; for `tsv`,
    # `<split>.tsv`). Relative paths are resolved against the config file's directory.
    local_dir: str = ""
    download: bool = True  # named corpora: fetch what local_dir lacks (into cache_dir)
    cache_dir: str = ""  # empty: <workdir>/downloads
    # File stems of the three splits for `files`/`tsv`; named corpora have their own defaults and
    # only take these when set explicitly (e.g. multi30k's test_2017_flickr).
    train_split: str = ""
    valid_split: str = ""
    test_split: str = ""
    limit: int = 0  # keep only the first N lines of each split (0 = all); for smoke runs
    # Filters. They drop pairs from the train split only; on valid/test they are counted, never
    # applied, so test sets stay comparable with published numbers.
    max_chars: int = 1000  # a side longer than this (in characters) is dropped
    max_length_ratio: float = 3.0  # max(len)/min(len) in characters, both sides
    dedupe: bool = True  # drop repeated (src, tgt) pairs within train
    lenient: bool = False  # invalid UTF-8: drop and count the pair instead of failing
    # A line terminator other than \n / \r\n (lone CR, U+2028, U+2029, NEL, VT, FF), a control character but
    # TAB or a lone surrogate inside a line (reder.text), in any reader (files, downloads, SWORD verses): "error"
    # names file, line and character; "replace" makes each a space, counted per character in report.json. Hashed
    # only when set to replace (added after outputs existed).
    bad_characters: Literal["error", "replace"] = "error"
    # SWORD (the embedded default): two Bible modules, verse-aligned.
    sword_path: str = "/usr/share/sword"
    sword_src_module: str = "engWEB2015eb"
    sword_tgt_module: str = "spaRV1909eb"
    # Deterministic split of corpora that ship without one (sword): hash of (seed, verse reference).
    valid_size: int = 1000
    test_size: int = 1000
    split_seed: int = 1
    # Bytes read from one corpus file, after decompression, in MB (10^6 bytes): a guard against a
    # decompression bomb or a wrong file. The largest shipped corpus (wmt14_ende) has sides of ~0.7 GB; ingest
    # streams local files (its memory does not grow with them), a download is assembled in memory once.
    max_input_mb: int = 4000

    def __post_init__(self) -> None:
        if self.tgt_lang == self.src_lang:
            raise FieldError("tgt_lang", f"must differ from src_lang ({self.src_lang!r}), got {self.tgt_lang!r}",
                             ("src_lang",))
        require(self, limit=">= 0", max_chars=">= 1", max_length_ratio=">= 1", valid_size=">= 0", test_size=">= 0",
                max_input_mb=">= 1")


@dataclass(frozen=True)
class SpmConfig:
    """Joint SentencePiece model (pipeline/stages/spm.py). Its size is `model.vocab_size` (see module doc)."""

    model_type: Literal["bpe", "unigram"] = "bpe"
    character_coverage: float = 1.0
    sample_size: int = 200_000  # sentences (both sides pooled) sampled from train to fit the model
    seed: int = 1
    num_threads: int = 2

    def __post_init__(self) -> None:
        require(self, character_coverage="in [0.9, 1]", sample_size=">= 1", num_threads=">= 1")


@dataclass(frozen=True)
class TokenizeConfig:
    """Tokenization on Ray Data (pipeline/stages/tokenize.py). Neither field changes the output."""

    workers: int = 0  # tokenizer actors; 0 = one per 50,000 pairs, at most the cluster's CPUs less one for reads
    batch_size: int = 1024  # rows per map_batches call

    def __post_init__(self) -> None:
        require(self, workers=">= 0", batch_size=">= 1")


PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass(frozen=True)
class TrainConfig:
    """A training run (the training core, pipeline/training/harness.py, on Ray Train, pipeline/training/raytrain.py). Batches
    are per worker, fairseq-style; the optimisation defaults are the paper recipe (docs/MODEL_NOTES.md,
    "Training"), the shipped configs size the run."""

    num_workers: int = 1  # Ray Train workers (DDP ranks)
    # > 0: elastic (Ray Train's num_workers=(min, max)): a group that lost a host goes on with as few as min_workers
    # ranks, each update made up to num_workers' batch by gradient accumulation; 0 = exactly num_workers, and a
    # group that cannot be placed again stops the stage (train.start_timeout_s per try, max_failures + 1 tries)
    min_workers: int = 0
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    # Only with use_gpu. A fraction (0.25) packs that many Tune trials, or one run's workers, on one GPU; workers
    # that hold fractions train under a gloo process group (NCCL refuses two ranks on one GPU)
    gpus_per_worker: float = 1.0
    max_tokens: int = 4096  # per worker and micro-batch, counted as batch_tokens says
    # How a micro-batch's tokens are counted against max_tokens (EOS included): "sum" = sentences × (longest
    # source + longest target), this code's convention; "max" = sentences × max(longest source, longest
    # target), fairseq's (its max_tokens bounds each side), so about twice the sentences at the same max_tokens.
    batch_tokens: Literal["sum", "max"] = "sum"
    update_freq: int = 1  # micro-batches per update (gradient accumulation)
    max_steps: int = 300_000  # optimizer updates
    lr: float = 5e-4
    warmup_steps: int = 4000  # inverse-sqrt schedule: linear warm-up from warmup_init_lr, then lr·√(warmup/step)
    warmup_init_lr: float = 1e-7
    adam_betas: tuple[float, ...] = (0.9, 0.98)
    adam_eps: float = 1e-8
    weight_decay: float = 0.01
    clip_norm: float = 1.0  # 0 = no clipping (the norm is still reported)
    bf16: bool = True  # autocast to bfloat16 on GPU; ignored on CPU
    log_every: int = 10  # steps between metric reports (loss terms, lr, tokens/s, grad norm)
    validate_every: int = 2000  # steps between validations; each validation writes a checkpoint
    valid_max_sentences: int = 500  # validation decodes at most this many sentences (0 = all)
    keep_checkpoints: int = 5  # Ray keeps the best K by validation BLEU (and always the latest)
    average_best: int = 5  # the final model averages the best N checkpoints (1 = the best alone)
    max_failures: int = 1  # worker-group restarts from the latest checkpoint before the stage fails (-1 = no limit)
    storage_path: str = ""  # Ray Train storage; empty = <workdir>/ray_results (shared storage on a cluster)
    seed: int = 1
    fail_at_step: int = 0  # fault drill: raise once after this step in a run that did not resume (0 = off)
    # how long the driver waits for the requested resources to exist, and Ray Train for each placement of its group
    start_timeout_s: float = 60.0
    placement_strategy: str = "PACK"  # Ray placement of the workers: PACK, SPREAD (across nodes), STRICT_*
    # Stopping by time and by plateau. max_time: seconds of the training loop (updates and validations,
    # summed over resumes; the worker group's start comes on top), 0 = no limit: fairseq's --stop-time-hours. The
    # run stops at max_steps or max_time, whichever comes first, and validates its last update. A run stopped by
    # time is not reproducible across cards: its manifest records the updates it reached, the card and the seed.
    # Under a run budget (`budget`), a stage without max_time trains until its share of the budget runs out.
    max_time: float = 0.0
    # Stop after this many validations in a row without a new best valid_bleu (fairseq's --patience); 0 = off.
    patience: int = 0
    # The learning rate after warm-up: "inverse_sqrt" (fairseq's: lr·√(warmup/step)) or "linear" (fairseq's
    # polynomial_decay of power 1: down to 0 at the end of the planned run, max_steps or max_time).
    lr_scheduler: Literal["inverse_sqrt", "linear"] = "inverse_sqrt"
    # > 0: warm up over this fraction of the planned run instead of warmup_steps; the run's progress is the larger
    # of step/max_steps and elapsed/max_time (without max_time: elapsed/its share of the run budget, when it has
    # one), so a time-budgeted run warms up and decays over its budget.
    warmup_fraction: float = 0.0
    # torch.compile REDER's attention and feed-forward branches (dropout then draws other masks)
    compile: bool = False

    def __post_init__(self) -> None:
        require(self, num_workers=">= 1", cpus_per_worker="> 0", gpus_per_worker="> 0", max_tokens=">= 1",
                update_freq=">= 1", max_steps=">= 1", lr="> 0", warmup_steps=">= 0", warmup_init_lr=">= 0")
        if len(self.adam_betas) != 2 or not all(0 <= beta < 1 for beta in self.adam_betas):
            raise FieldError("adam_betas", f"must be two values in [0, 1), got {list(self.adam_betas)}")
        require(self, adam_eps="> 0", weight_decay=">= 0", clip_norm=">= 0", log_every=">= 1", validate_every=">= 1",
                valid_max_sentences=">= 0", keep_checkpoints=">= 1", average_best=">= 1")
        if self.gpus_per_worker > 1 and self.gpus_per_worker != int(self.gpus_per_worker):
            raise FieldError("gpus_per_worker", f"must be a fraction of one GPU (<= 1) or whole GPUs, got {self.gpus_per_worker}")
        if self.average_best > self.keep_checkpoints:
            raise FieldError("average_best", f"must be <= keep_checkpoints ({self.keep_checkpoints}), got "
                             f"{self.average_best}", ("keep_checkpoints",))
        require(self, max_failures=">= -1", fail_at_step=">= 0", start_timeout_s="> 0", max_time=">= 0", patience=">= 0")
        if not 0 <= self.min_workers <= self.num_workers:
            raise FieldError("min_workers", f"must be in [0, num_workers ({self.num_workers})], got {self.min_workers}",
                             ("num_workers",))
        if not 0 <= self.warmup_fraction < 1:
            raise FieldError("warmup_fraction", f"must be in [0, 1), got {self.warmup_fraction}")
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise FieldError("placement_strategy", f"must be one of {list(PLACEMENT_STRATEGIES)}, "
                             f"got {self.placement_strategy!r}")


# The grid of evaluate.blank_penalties: the diagnosis's best offsets were 2-4 (docs/results/stage2_diag.md).
BLANK_PENALTIES = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0)
NO_BLANK_PENALTY = (0.0,)


@dataclass(frozen=True)
class EvaluateConfig:
    """Evaluation (pipeline/stages/evaluate.py): decoders, splits and the speed measurements."""

    # What is decoded and scored: the ingested splits (train, valid, test) and the names of `test_sets`. Each is
    # scored both ways with every decoder; test and each named set get their own metrics (`<name>_bleu_src2tgt`,
    # ...) in MLflow and their own row under results.json's `sets`.
    splits: tuple[str, ...] = ("test", "valid")
    # More test sets by name, each listed in `splits` to be scored: {src: FILE, tgt: FILE} (plain text, one
    # sentence a line, src_lang and tgt_lang sides; paths relative to the config file) or {sacrebleu: NAME} with
    # an optional langpair (default "<src_lang>-<tgt_lang>"), a sacreBLEU test set its cache already holds
    # (`sacrebleu -t NAME -l PAIR --echo src` fetches it). Hashed only when set (added after outputs existed).
    test_sets: dict = field(default_factory=dict)
    beam_size: int = 5  # CTC prefix beam search (greedy always runs too); 1 = greedy only
    batch_size: int = 64
    max_sentences: int = 0  # per split, 0 = all
    measure_speed: bool = True  # time every decoder (latency at batch 1, throughput): results.json's `speed`
    latency_sentences: int = 100  # sentences timed one at a time (batch 1)
    throughput_batch: int = 64  # batch size of the throughput measurement
    teacher_baseline: bool = True  # also decode and time the AR teachers (greedy and teacher_beam_size)
    teacher_beam_size: int = 4
    # CTC beam candidates rescored: none; by the model's own reverse direction, forward + rerank_weight ·
    # reverse (decoder beamK_selfrerank); or by the teacher (decoder beamK_rerank)
    rerank: str = "none"
    rerank_weight: float = RERANK_WEIGHT
    cutoff_top_n: int = CUTOFF_TOP_N  # CTC beam: tokens each frame offers it (reder.decode.frame_candidates)
    cutoff_prob: float = CUTOFF_PROB  # ... of which the most likely reaching this cumulative probability
    # CTC: the blank penalties c tried on the validation split, each direction's best (greedy BLEU; of equals
    # the nearest 0) lowering the blank's logit by c wherever the model decodes: in the train stage's
    # validations (so checkpoints are ranked by calibrated output) and for the published model (its config.json,
    # read by reder.translate, reder.load, the Serve app and the MLflow pyfunc; so in this stage too). [0]: off,
    # the paper's decoding. The CTC blank is over-predicted by a thin, oscillating margin (docs/results/ctc_decoding.md).
    blank_penalties: tuple[float, ...] = BLANK_PENALTIES
    dag_max_transition: int = 0  # DAG decoders: the longest jump between vertices (0: no bound)
    dag_no_repeat_ngram: int = 0  # DAG greedy/lookahead: block consecutive repeated n-grams up to n (0: off)
    dag_length_penalty: float = 1.0  # DAG Viterbi and beam: score / length**this
    # The CMLM of each direction (the cmlm stage, trained when one of these asks for it): mask-predict with T
    # iterations for each T here (decoder cmlm_T<T>, cmlm_length_beam length candidates) and REDER's greedy
    # output refined by K mask-predict iterations for each K here (decoder greedy_refine<K>)
    cmlm_iterations: tuple[int, ...] = ()
    cmlm_length_beam: int = 5
    refine_steps: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name, spec in self.test_sets.items():
            _check_test_set(f"test_sets.{name}", name, spec)
        known = {"train", "valid", "test", *self.test_sets}
        if not self.splits or set(self.splits) - known or len(set(self.splits)) < len(self.splits):
            raise FieldError("splits", f"must be a non-empty list of distinct names of {sorted(known)} (train, "
                                       f"valid, test and the names of test_sets), got {list(self.splits)}")
        require(self, beam_size=">= 1", batch_size=">= 1", max_sentences=">= 0", latency_sentences=">= 0",
                throughput_batch=">= 1", teacher_beam_size=">= 1", rerank_weight=">= 0", cutoff_top_n=">= 1",
                dag_max_transition=">= 0", dag_no_repeat_ngram=">= 0", dag_length_penalty=">= 0", cmlm_length_beam=">= 1")
        for key in ("cmlm_iterations", "refine_steps"):
            values = getattr(self, key)
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values) or len(set(values)) < len(values):
                raise FieldError(key, f"must be distinct ints >= 1, got {list(values)}")
        if self.rerank not in RERANKERS:
            raise FieldError("rerank", f"must be one of {list(RERANKERS)}, got {self.rerank!r}")
        if not 0 < self.cutoff_prob <= 1:
            raise FieldError("cutoff_prob", f"must be in (0, 1], got {self.cutoff_prob}")
        if not self.blank_penalties or len(set(self.blank_penalties)) < len(self.blank_penalties):
            raise FieldError("blank_penalties", f"must be a non-empty list of distinct numbers ([0]: no penalty), "
                                                f"got {list(self.blank_penalties)}")


def _check_test_set(key: str, name: str, spec: Any) -> None:
    """One `evaluate.test_sets` entry: {src: FILE, tgt: FILE} or {sacrebleu: NAME[, langpair: "xx-yy"]}."""
    if name in ("train", "valid", "test") or not str(name).replace("_", "").replace("-", "").isalnum():
        raise FieldError(key, "a test set's name is letters, digits, _ and - (not train, valid or test: those are "
                              f"the ingested splits), got {name!r}")
    files = isinstance(spec, dict) and set(spec) == {"src", "tgt"}
    named = isinstance(spec, dict) and "sacrebleu" in spec and set(spec) <= {"sacrebleu", "langpair"}
    if not (files or named) or not all(isinstance(value, str) and value for value in spec.values()):
        raise FieldError(key, f"expected {{src: FILE, tgt: FILE}} or {{sacrebleu: NAME, langpair: xx-yy}} (strings), "
                              f"got {spec!r}")


@dataclass(frozen=True)
class TeacherConfig:
    """The autoregressive teachers, one per direction (pipeline/stages/teacher.py): their shape and their Ray Train
    run (the same TrainConfig as REDER's; batches, schedule and checkpoints work the same way). With both
    checkpoint paths set, those model directories are used instead of training."""

    model: TransformerConfig = field(default_factory=TransformerConfig)  # vocab_size: always model.vocab_size
    train: TrainConfig = field(default_factory=TrainConfig)
    src2tgt_checkpoint: str = ""  # an existing teacher model directory (reder.checkpoint) for src→tgt
    tgt2src_checkpoint: str = ""

    def __post_init__(self) -> None:
        for key, other in (("src2tgt_checkpoint", "tgt2src_checkpoint"), ("tgt2src_checkpoint", "src2tgt_checkpoint")):
            if getattr(self, other) and not getattr(self, key):
                raise FieldError(key, f"must be set when {other} is ({getattr(self, other)!r}): both teachers or "
                                 f"neither, got {getattr(self, key)!r}", (other,))


@dataclass(frozen=True)
class CmlmStageConfig:
    """The CMLM baseline and refiner, one per direction (pipeline/stages/cmlm.py): its shape and its Ray Train run (the
    same TrainConfig as REDER's and the teachers'), on REDER's training split (the KD pairs with distill.enabled).
    Trained when the evaluation asks for it (evaluate.cmlm_iterations, evaluate.refine_steps) or with --stages cmlm."""

    model: CmlmConfig = field(default_factory=CmlmConfig)  # vocab_size: always model.vocab_size
    train: TrainConfig = field(default_factory=TrainConfig)


DISTILL_ENGINES = ("auto", "torch", "ctranslate2")


@dataclass(frozen=True)
class DistillConfig:
    """Sequence-level knowledge distillation (pipeline/stages/distill.py): the teachers decode the training split
    in both directions with batched beam search; REDER's src2tgt trains on (x, teacher(x)), its tgt2src on
    (teacher(y), y). Valid and test are never distilled."""

    enabled: bool = True  # false: REDER trains on the references (no KD)
    # true: REDER trains on the references beside the distilled pairs, each training pair twice (as distilled and
    # as given; the train stage's data, not distill's output)
    references: bool = False
    corpus: str = ""  # an already-distilled train Parquet dir (id, src_ids, kd_tgt_ids, tgt_ids, kd_src_ids)
    beam_size: int = 4
    length_penalty: float = 1.0
    max_len_a: float = 1.2  # longest output: max_len_a · |input| + max_len_b pieces
    max_len_b: int = 10
    # One batched beam search: sentences sorted by length, cut where sentences x the longest (pieces with EOS)
    # would pass max_tokens; 0 = batches of batch_size sentences. Neither changes an output (not hashed).
    max_tokens: int = 8192
    batch_size: int = 128  # sentences per beam search with max_tokens 0
    workers: int = 0  # teacher replicas (Ray Data actors); 0 = one per GPU with use_gpu, else one per free CPU
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    # torch (our beam search), ctranslate2 (the optional extra), auto: ctranslate2 if installed and, with
    # use_gpu, only where it can decode on CUDA (a device and CUDA 12's cuBLAS load), else torch
    engine: str = "auto"

    def __post_init__(self) -> None:
        require(self, beam_size=">= 1", max_len_a=">= 0", max_len_b=">= 0", max_tokens=">= 0", batch_size=">= 1",
                workers=">= 0", cpus_per_worker="> 0")
        if self.engine not in DISTILL_ENGINES:
            raise FieldError("engine", f"must be one of {list(DISTILL_ENGINES)}, got {self.engine!r}")


SEARCH_KINDS = ("choice", "grid", "uniform", "loguniform")


@dataclass(frozen=True)
class TuneConfig:
    """Ray Tune sweeps of training keys (pipeline/stages/tune.py). `space` maps a dotted key of the model, loss
    or train sections to one of {choice: [..]}, {grid: [..]}, {uniform: [lo, hi]} or
    {loguniform: [lo, hi], zero: p} (p = the probability of sampling exactly 0)."""

    space: dict = field(default_factory=dict)
    num_samples: int = 8  # samples of the space: each grid point is run num_samples times (3 x a 3-point grid = 9 trials)
    metric: str = "valid_bleu"  # reported at every validation; the mean of both directions' BLEU
    mode: Literal["max", "min"] = "max"
    search: Literal["random", "optuna"] = "random"
    scheduler: Literal["asha", "fifo"] = "asha"
    grace_period: int = 0  # steps before ASHA may stop a trial; 0 = train.validate_every
    reduction_factor: int = 2
    max_concurrent: int = 0  # 0 = as many trials as the cluster's CPUs/GPUs hold
    max_failures: int = 0  # retries of a failed trial (the sweep goes on either way; -1 = no limit)
    # Stall watchdog: seconds one invocation (a run, or a --resume) may take before Tune stops the sweep,
    # which then fails with its state kept for --resume; 0 = no limit.
    time_budget_s: float = 0.0

    def __post_init__(self) -> None:
        for key, spec in self.space.items():
            _check_search_space(f"space.{key}", spec)
        require(self, num_samples=">= 1", grace_period=">= 0", reduction_factor=">= 2", max_concurrent=">= 0",
                max_failures=">= -1", time_budget_s=">= 0")


def _check_search_space(key: str, spec: Any) -> None:
    """One `tune.space` entry: exactly one search kind with its values (FieldError names `key` or `key.<kind>`)."""
    if not isinstance(spec, dict) or len(set(spec) & set(SEARCH_KINDS)) != 1 or set(spec) - {*SEARCH_KINDS, "zero"}:
        raise FieldError(key, f"expected one of {list(SEARCH_KINDS)} (loguniform may add zero: p), got {spec!r}")
    kind = next(k for k in SEARCH_KINDS if k in spec)
    values = spec[kind]
    if not isinstance(values, list) or not values:
        raise FieldError(f"{key}.{kind}", f"expected a non-empty list, got {values!r}")
    if kind in ("uniform", "loguniform") and (len(values) != 2 or not _numbers(values) or not values[0] < values[1]):
        raise FieldError(f"{key}.{kind}", f"expected [low, high] with low < high, got {values}")
    if kind == "loguniform" and values[0] <= 0:
        raise FieldError(f"{key}.loguniform", f"low must be > 0 (use zero: p for 0), got {values}")
    if "zero" in spec and kind != "loguniform":
        raise FieldError(f"{key}.zero", f"goes with loguniform only, not {kind}, got {spec['zero']!r}")
    if "zero" in spec and (not _numbers([spec["zero"]]) or not 0 <= spec["zero"] < 1):
        raise FieldError(f"{key}.zero", f"must be a probability in [0, 1), got {spec['zero']!r}")
    if not all(math.isfinite(item) for item in (*values, spec.get("zero", 0)) if isinstance(item, float)):
        raise FieldError(key, f"values must be finite numbers, got {spec!r}")


def _numbers(values: list) -> bool:
    return all(isinstance(value, (int, float)) for value in values)


@dataclass(frozen=True)
class RayConfig:
    """How the driver connects to Ray: `address` empty starts a local instance."""

    address: str = ""
    num_cpus: int = 0  # local instance only; 0 = all
    object_store_memory_mb: int = 0  # local instance only; 0 = Ray's default
    # local instance only: Ray's dashboard (its web UI and the State API, `ray list actors`); false starts the
    # instance without them, 2-3 s sooner and 4-5 CPU-s cheaper on a 2-core machine (the run itself needs neither)
    dashboard: bool = True

    def __post_init__(self) -> None:
        require(self, num_cpus=">= 0", object_store_memory_mb=">= 0")


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow: an empty `uri` means $MLFLOW_TRACKING_URI, else sqlite:///<workdir>/mlflow.db."""

    enabled: bool = True
    uri: str = ""
    experiment: str = "duplex"
    # Run names are `<run_prefix>-<stage directory>` (`smoke-train-6e5c497f3bce`), the invocation's parent
    # run `<run_prefix>-pipeline-<hash of its last stage>`; empty: the config file's name (smoke, default).
    run_prefix: str = ""
    # The train stage's model is logged as an MLflow pyfunc that translates (pipeline/mlflow_model.py) and
    # registered under this name ({src}, {tgt}: the language codes); empty: logged, not registered.
    registered_model: str = "reder-{src}-{tgt}"
    # The registry alias (models:/<registered_model>@<alias>) that the evaluate stage moves to the new version only
    # when it beats the holder: a higher mean of test BLEU src2tgt and tgt2src (greedy, the headline test split),
    # scored on the same references; no holder: the first evaluated version takes it. Empty: no alias.
    alias: str = "champion"
    # MLflow's system metrics (CPU and GPU utilisation, GPU memory, host memory, disk, network: `system/node_<k>/...`)
    # on the training runs (teacher, cmlm, train), sampled every system_metrics_interval_s by the first worker of each
    # node. Needs psutil (and nvidia-ml-py for GPUs); without them, or off, a run records none and goes on.
    system_metrics: bool = True
    system_metrics_interval_s: float = 10.0

    def __post_init__(self) -> None:
        require(self, system_metrics_interval_s="> 0")
        if self.alias and (not self.alias.replace("_", "").replace("-", "").isalnum() or self.alias.lower() == "latest"
                           or self.alias[0].isdigit()):
            raise FieldError("alias", f"an MLflow alias: letters, digits, _ and -, not starting with a digit nor "
                                      f"'latest' (reserved), got {self.alias!r}")


@dataclass(frozen=True)
class BudgetConfig:
    """A wall-clock budget for the whole pipeline run (run_pipeline.py, from its start), shared by its training
    stages (teacher, cmlm, train): each stops at its own `max_time` or earlier, when the run's time left, less
    the `max_time` of every training stage still to come and `reserve` seconds for what follows the last one's
    updates (its last validation and publishing, evaluate), runs out: a stage's share counts from the stage's
    start, its worker group's start included. It shortens stages with a max_time only, so it is not part of any
    stage's key; a stage it cut says so in its manifest (`stopped_by`: "time_cap"). A training stage without a
    max_time claims nothing from the stages before it and trains until its share runs out, its schedule sized to
    that share: the last one takes what the run has left less the reserve."""

    max_time: float = 0.0  # seconds for the whole run, from run_pipeline.py's start; 0 = no run budget
    reserve: float = 0.0  # seconds kept for what follows the last training stage's updates (publishing, evaluate)

    def __post_init__(self) -> None:
        require(self, max_time=">= 0", reserve=">= 0")


@dataclass(frozen=True)
class PipelineConfig:
    """The whole run. Later stages add their own sections here."""

    workdir: str = "runs/default"  # relative paths resolve against the current directory
    data: DataConfig = field(default_factory=DataConfig)
    spm: SpmConfig = field(default_factory=SpmConfig)
    tokenize: TokenizeConfig = field(default_factory=TokenizeConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    cmlm: CmlmStageConfig = field(default_factory=CmlmStageConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts and lists (tuples become lists), loadable again by `from_dict`."""
        return to_dict(self)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> PipelineConfig:
    """Load a YAML file (or the defaults when None), apply `a.b=value` overrides, and validate."""
    raw: dict[str, Any] = {}
    lines: dict[str, int] = {}  # dotted key path (`train.adam_betas[1]`) -> its line in the file
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        raw = _read_yaml(path, lines)
        if raw is None:  # empty, or comments only: the defaults
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}:{lines.get('', 1)}: top level must be a mapping of sections (data:, "
                              f"train:, ...), got {_kind(raw)} {raw!r}")
        raw = _resolve_local_dir(raw, path.parent)
    for override in overrides:
        _apply_override(raw, override)
    if path is not None and not (raw.get("tracking") or {}).get("run_prefix"):
        raw.setdefault("tracking", {})
        if isinstance(raw["tracking"], dict):
            raw["tracking"]["run_prefix"] = path.stem
    raw = _teacher_vocabulary(raw)
    try:
        cfg = from_dict(PipelineConfig, raw)
        check_consistency(cfg)
    except ConfigError as error:
        if path is None:
            raise
        overridden = [override.partition("=")[0] for override in overrides]
        raise _located(error, path, lines, overridden) from error
    return cfg


_KEY = re.compile(r"^([^\s:]+): ")  # a ConfigError's message starts with the key's path


def _located(error: ConfigError, path: Path, lines: dict[str, int], overridden: list[str]) -> ConfigError:
    """`error` (naming a key's path) prefixed with the file and the line that set the key (or the list holding the
    item it names). Unchanged where the file did not set it: an override did, which the message names as the
    command line spelled it, or the key kept its default and a check relating it to another failed."""
    found = getattr(error, "key", "") or (_KEY.match(str(error)) or [None, ""])[1]
    if any(found == key or found.startswith((f"{key}.", f"{key}[")) for key in overridden):
        return error
    where = found
    while where not in lines and re.search(r"\[\d+\]$", where):
        where = re.sub(r"\[\d+\]$", "", where)
    if not where or where not in lines:
        return error
    return ConfigError(f"{path}:{lines[where]}: {error}", getattr(error, "key", ""))


def _kind(value: Any) -> str:
    """A YAML value's kind in words, for messages."""
    kinds = {dict: "a mapping", list: "a list", type(None): "null (an empty document)"}
    return kinds.get(type(value), type(value).__name__)


def _read_yaml(path: Path, lines: dict[str, int] | None = None) -> Any:
    """The YAML document in `path`; unreadable bytes and syntax errors name the file and line. `lines` gets the line
    of every key and list item, by dotted path (`load_yaml`)."""
    try:
        blob = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the config file ({error.strerror})") from error
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as error:
        line = blob[: error.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 ({error.reason} at byte {error.start}); save the config "
                          f"as UTF-8") from error
    try:
        return load_yaml(text, str(path), in_file=True, lines=lines)
    except yaml.YAMLError as error:
        raise ConfigError(f"{_yaml_problem(error, str(path))}; fix the YAML syntax") from error


class _PlainLoader(yaml.SafeLoader):
    """SafeLoader for plain data only. Explicit tags (`!!str`, `!!set`), anchors (`&name`) and aliases
    (`*name`) are errors naming the line and the key (`compose_node`); `construct_mapping` refuses a key given twice
    in one mapping (SafeLoader keeps the last silently, so a second `train:` section would replace the first
    whole) and merge keys (`<<`), naming the key's path and both lines. Scalars resolve as YAML 1.1 does (so `yes`,
    `no`, `on`, `off` are booleans: a str field refuses them, naming the key) but for the numbers it reads where
    YAML 1.2 and people read something else: `1:20` (sexagesimal 80) and `010` (octal 8) stay strings, which a
    number field refuses, and `1e-3` is a float (YAML 1.1: a string)."""

    def __init__(self, text: str, where: str) -> None:
        super().__init__(text)
        self.where = where
        self.paths: dict[int, str] = {}  # id of a mapping node -> its dotted path, for the messages
        self.lines: dict[str, int] = {}  # dotted path of every key and list item -> its 1-based line
        self.composing: list[str] = []  # dotted paths of the nodes being composed, outermost first

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        outer = self.composing[-1] if self.composing else ""
        here = (f"{outer}[{index}]" if isinstance(index, int) else
                f"{outer}.{index.value}".lstrip(".") if isinstance(index, yaml.ScalarNode) else outer)
        construct = ("an alias (*)" if isinstance(event, yaml.AliasEvent) else
                     f"an anchor (&{event.anchor})" if event.anchor else
                     f"a tag ({event.tag})" if getattr(event, "tag", None) else "")
        if construct:
            at = f"key '{here}'" if here else "the top level"
            raise ConfigError(f"{self.where}:{event.start_mark.line + 1}: {construct} is not plain data, at {at}; "
                              f"the config takes mappings, lists and scalars only (write the value out)")
        self.composing.append(here)
        try:
            return super().compose_node(parent, index)
        finally:
            self.composing.pop()

    def index_paths(self, node: yaml.Node, prefix: str = "") -> None:
        """Record every mapping's dotted path under `node` (composed, not yet constructed), and the line of every
        key and list item by the path a config error names it by (`data.max_chars`, `train.adam_betas[1]`)."""
        if isinstance(node, yaml.MappingNode):
            self.paths[id(node)] = prefix
            for key, value in node.value:
                self.index_paths(value, f"{prefix}{key.value if isinstance(key, yaml.ScalarNode) else '?'}.")
                self.lines.setdefault(f"{prefix}{self._key_text(key)}", key.start_mark.line + 1)
        elif isinstance(node, yaml.SequenceNode):
            for index, value in enumerate(node.value):
                self.index_paths(value, f"{prefix}{index}.")
                self.lines.setdefault(f"{prefix.rstrip('.')}[{index}]", value.start_mark.line + 1)

    def _key_text(self, node: yaml.Node) -> str:
        """A key as `from_dict` spells it in a path: its constructed value (`on:` is the key True)."""
        if isinstance(node, yaml.ScalarNode):
            try:
                return str(self.construct_object(node))
            except yaml.YAMLError:
                pass
        return str(getattr(node, "value", "?"))

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            plain_merge = isinstance(key_node, yaml.ScalarNode) and key_node.value == "<<" and not key_node.style
            if key_node.tag == _MERGE or plain_merge:
                raise ConfigError(f"{self.where}:{line}: a merge key (<<) is not plain data, in "
                                  f"'{self.paths.get(id(node), '').rstrip('.') or 'the top level'}'; write the keys out")
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, typing.Hashable):
                raise ConfigError(f"{self.where}:{line}: a key that is a {_kind(key)[2:]}, in "
                                  f"'{self.paths.get(id(node), '').rstrip('.') or 'the top level'}'; keys are names")
            if key in lines:
                raise ConfigError(f"{self.where}:{line}: key '{self.paths.get(id(node), '')}{key}' given twice "
                                  f"(lines {lines[key]} and {line}); the second would silently replace the first: "
                                  f"keep one")
            lines[key] = line
        return super().construct_mapping(node, deep)


_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_MERGE, _VALUE = "tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"  # `<<` and `=`: strings here (a key `<<` refused)
_PlainLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (_INT, _FLOAT, _MERGE, _VALUE)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_PlainLoader.add_implicit_resolver(_INT, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+|0o[0-7_]+)$"),
                                   list("-+0123456789"))
_PlainLoader.add_implicit_resolver(_FLOAT, re.compile(
    r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))


def load_yaml(text: str, where: str, in_file: bool = False, lines: dict[str, int] | None = None) -> Any:
    """The one YAML document in `text` as plain data by `_PlainLoader`'s rules (`where` names it in errors);
    `in_file`: dotted keys (`data.max_chars: 5`, a command-line override's spelling) are refused too, outside
    `tune.space`, whose keys name swept config keys. `lines` gets the line of every key and list item by dotted
    path, and '' the document's first line."""
    loader = _PlainLoader(text, where)
    try:
        node = loader.get_single_node()
        if node is not None:
            loader.index_paths(node)
            loader.lines[""] = node.start_mark.line + 1
        if lines is not None:
            lines.update(loader.lines)
        if in_file and isinstance(node, yaml.MappingNode):
            _refuse_dotted_keys(node, (), where)
        return loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


def _refuse_dotted_keys(node: yaml.MappingNode, path: tuple[str, ...], where: str) -> None:
    """A dotted key in a file is a second spelling of a section's key: an error naming its line and, where
    the section sets the same key, that line too."""
    if path == ("tune", "space"):
        return
    for key_node, value in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else ""
        if "." in key:
            full = ".".join((*path, key))
            twin = _find_key(node, key.split("."))
            also = f"; the section sets it too, at line {twin}: one key given twice" if twin else ""
            raise ConfigError(f"{where}:{key_node.start_mark.line + 1}: dotted key '{full}' in a file{also}; "
                              f"dotted keys are command-line overrides: in a file, write it under its section "
                              f"({key.split('.')[0]}:)")
        if isinstance(value, yaml.MappingNode):
            _refuse_dotted_keys(value, (*path, key), where)


def _find_key(node: yaml.Node, parts: list[str]) -> int:
    """The 1-based line of the key that the nested mappings under `node` set for `parts` ([a, b] for a.b), or 0."""
    line = 0
    for part in parts:
        if not isinstance(node, yaml.MappingNode):
            return 0
        match = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
        if match is None:
            return 0
        line, node = match[0].start_mark.line + 1, match[1]
    return line


def _yaml_problem(error: yaml.YAMLError, where: str, with_line: bool = True) -> str:
    """`where:line:column: invalid YAML (problem)` from a PyYAML error (its problem_mark is 0-based)."""
    mark = getattr(error, "problem_mark", None)
    if mark is not None and with_line:
        where = f"{where}:{mark.line + 1}:{mark.column + 1}"
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    if problem.startswith("but ") and getattr(error, "context", None):  # "but found another document"
        problem = f"{error.context} {problem}"
    return f"{where}: invalid YAML ({problem})"


def check_consistency(cfg: PipelineConfig) -> None:
    """Cross-section rules that no single section can check."""
    if not cfg.workdir.strip():  # Path("") is the current directory: stage outputs would land there
        raise ConfigError(f"workdir: must not be empty (stage outputs go under it; e.g. workdir=runs/default), "
                          f"got {cfg.workdir!r}")
    if cfg.cmlm.model.vocab_size != cfg.model.vocab_size:
        raise ConfigError(f"cmlm.model.vocab_size: must equal model.vocab_size ({cfg.model.vocab_size}), as the "
                          f"CMLMs and REDER share one SentencePiece vocabulary (leave it unset), got "
                          f"{cfg.cmlm.model.vocab_size}")
    if cfg.teacher.model.vocab_size != cfg.model.vocab_size:
        raise ConfigError(f"teacher.model.vocab_size: must equal model.vocab_size ({cfg.model.vocab_size}), as "
                          f"teachers and REDER share one SentencePiece vocabulary (leave it unset), got "
                          f"{cfg.teacher.model.vocab_size}")
    if cfg.model.vocab_size < 64:
        raise ConfigError(f"model.vocab_size: must be >= 64 for a joint SentencePiece model, "
                          f"got {cfg.model.vocab_size}")
    if cfg.distill.references and not cfg.distill.enabled:
        raise ConfigError("distill.references: trains on the references beside the distilled pairs, so it needs "
                          "distill.enabled=true (without distillation REDER trains on the references alone)")
    if cfg.loss.uses_nmla() and cfg.model.head != "ctc":
        key = "nmla_start_step" if cfg.loss.nmla_start_step is not None else "nmla_start_fraction"
        raise ConfigError(f"loss.{key}: NMLA is a loss over CTC's alignments, so it needs model.head=ctc, "
                          f"got model.head {cfg.model.head!r}")
    if cfg.evaluate.rerank != "none" and (cfg.model.head != "ctc" or cfg.evaluate.beam_size < 2):
        raise ConfigError(f"evaluate.rerank: reranks the CTC beam, so it needs model.head=ctc and "
                          f"evaluate.beam_size >= 2, got {cfg.evaluate.rerank!r} with model.head {cfg.model.head!r} and "
                          f"evaluate.beam_size {cfg.evaluate.beam_size}")
    for key, spec in cfg.tune.space.items():
        section, _, name = key.partition(".")
        if section not in ("model", "loss", "train") or not name:
            raise ConfigError(f"tune.space.{key}: not a training key (model.*, loss.*, train.*)")
        try:
            _field_type(typing.get_type_hints(PipelineConfig)[section], name, key)
        except ConfigError as error:
            raise ConfigError(f"tune.space.{key}: {error}") from error
        if key == "model.upsample_ratio" and min(spec.get("choice", spec.get("grid", [0]))) < cfg.model.upsample_ratio:
            raise ConfigError(f"tune.space.model.upsample_ratio: values must be >= model.upsample_ratio "
                              f"({cfg.model.upsample_ratio}), which tokenize filtered the pairs for, got {spec}")


def to_yaml(cfg: PipelineConfig) -> str:
    """The resolved config as YAML (loadable again with load_config)."""
    return yaml.dump(cfg.to_dict(), Dumper=_PlainDumper, sort_keys=False)


class _PlainDumper(yaml.SafeDumper):
    """SafeDumper that writes a value seen twice out twice: no anchors or aliases, which `load_yaml` refuses; and
    quotes a string by `_PlainLoader`'s reading of scalars (`1e-3`, a string, is written '1e-3')."""

    yaml_implicit_resolvers = _PlainLoader.yaml_implicit_resolvers

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _apply_override(raw: dict[str, Any], override: str) -> None:
    """Apply one `a.b.c=value` override; the value is parsed as YAML (so 3 is int, 1e-3 is float)."""
    key, sep, text = override.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {override!r}: expected dotted.key=value")
    parts = key.split(".")
    node = raw
    known: type | None = PipelineConfig
    for i, part in enumerate(parts[:-1]):
        known = _field_type(known, part, ".".join(parts[: i + 1]))
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {'.'.join(parts[: i + 1])} is not a section")
        node = child
    _field_type(known, parts[-1], key)
    try:
        node[parts[-1]] = _parse_scalar(text, f"override {override!r}")
    except yaml.YAMLError as error:
        problem = _yaml_problem(error, f"override {override!r}", with_line=False)
        raise ConfigError(f"{problem}; quote or fix the value") from error


def _field_type(cls: type | None, name: str, path: str) -> type | None:
    if cls is None or not dataclasses.is_dataclass(cls):
        raise ConfigError(f"unknown key {path!r}: its parent is not a section")
    hints = typing.get_type_hints(cls)
    if name not in hints:
        raise ConfigError(f"unknown key {path!r}; known keys there are {sorted(hints)}")
    hint = hints[name]
    return hint if dataclasses.is_dataclass(hint) else None


def _parse_scalar(text: str, where: str) -> Any:
    # A 1e-3 in YAML 1.1 is a string; accept it as the float it obviously is.
    value = load_yaml(text, where) if text != "" else ""
    if isinstance(value, str):
        try:
            return float(value) if any(c in value.lower() for c in ".e") and value.strip() else value
        except ValueError:
            return value
    return value


def _teacher_vocabulary(raw: dict[str, Any]) -> dict[str, Any]:
    """teacher.model.vocab_size and cmlm.model.vocab_size follow model.vocab_size (one joint vocabulary) unless
    set explicitly."""
    model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    vocab = model.get("vocab_size", ModelConfig.vocab_size)
    for name in ("teacher", "cmlm"):
        section = raw.get(name) if isinstance(raw.get(name), dict) else {}
        section_model = section.get("model") if isinstance(section.get("model"), dict) else {}
        if name in raw and not isinstance(raw[name], dict) or "model" in section and not isinstance(section["model"], dict):
            continue  # from_dict reports the bad section
        raw = {**raw, name: {**section, "model": {"vocab_size": vocab, **section_model}}}
    return raw


def _resolve_local_dir(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    """Make data.local_dir and the files of evaluate.test_sets relative to the YAML file, so configs work from
    any current directory."""
    data = raw.get("data")
    if isinstance(data, dict) and isinstance(data.get("local_dir"), str) and data["local_dir"]:
        local = Path(data["local_dir"]).expanduser()
        if not local.is_absolute():
            raw = {**raw, "data": {**data, "local_dir": str((base / local).resolve())}}
    evaluation = raw.get("evaluate")
    sets = evaluation.get("test_sets") if isinstance(evaluation, dict) else None
    if isinstance(sets, dict):
        resolved = {name: {side: str((base / Path(value).expanduser()).resolve()) if side in ("src", "tgt") and
                           isinstance(value, str) and value else value for side, value in spec.items()}
                    if isinstance(spec, dict) else spec for name, spec in sets.items()}
        raw = {**raw, "evaluate": {**evaluation, "test_sets": resolved}}
    return raw
