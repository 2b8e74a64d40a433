"""The stage graph, declared once: for every stage its hashed config keys, its inputs, what it reads, and
from these its output directory and whether a run needs it.

    ingest ─► spm ─► tokenize ─► teacher ─► distill ─► train ─► evaluate
                                    │          └─► cmlm ───────►┤     (tune: a sweep of train)
                                    └──────────────────────────►┘

A stage's directory is `<workdir>/<name>-<hash>`, the hash over `key(cfg)` and the directory names of its
hashed `inputs` (pipeline/stage.py). A stage is needed when a target (evaluate for a pipeline run, tune
for a sweep) reaches it through inputs and reads: teacher only for KD without a given corpus, the teacher
baseline or reranking; distill only with `distill.enabled`; cmlm only for the evaluation's CMLM decoders
(`evaluate.cmlm_iterations`, `evaluate.refine_steps`). `run_pipeline.py` and the sweep walk this graph;
no stage computes another stage's path. Keys are those the stages had before the graph existed, so
finished outputs keep their directories (tests/pipeline/test_graph.py pins them).
"""
from __future__ import annotations

import math
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any

from pipeline import cmlm, distill, evaluate, ingest, spm, teacher, tokenize, train, tune
from pipeline.config import NO_BLANK_PENALTY, PipelineConfig, TrainConfig
from pipeline.stage import Stage, StageError, StageRun, is_done, require_done, run_stage, stage_dir
from reder import heads

# Keys of a train section that change neither the data order nor the optimisation: not hashed. min_workers does
# only once a host is lost, and a run that stopped for a lost host must find its checkpoints with it set.
NOT_HASHED = ("log_every", "max_failures", "storage_path", "fail_at_step", "start_timeout_s", "valid_max_sentences",
              "min_workers")
# Keys added to a hashed section after outputs existed (issues 26, 44): hashed only when set away from their
# default, which is the behaviour from before them, so finished outputs keep their directories.
ADDED_LATER = {"model": ("dag_dp",),
               "loss": ("fba_start_step", "cc_start_step", "directions", "glance_start", "glance_end", "glance_steps"),
               # compile: inductor's dropout draws other masks
               "train": ("batch_tokens", "max_time", "patience", "lr_scheduler", "warmup_fraction", "compile",
                         "min_workers"),
               "evaluate": ("rerank_weight", "cutoff_top_n", "cutoff_prob", "dag_max_transition", "dag_no_repeat_ngram",
                            "dag_length_penalty", "cmlm_iterations", "cmlm_length_beam", "refine_steps",
                            "test_sets")}  # test_sets: issue 56
# Named in the teacher and cmlm stages' keys since both directions train in one Ray Train run (issue 53: each
# update trains both models, which draws initialisation and dropout from one random stream): a new output, a new
# directory.
PAIR = {"training": "both directions in one run"}
# Stages a pipeline run lists only when it needs them (added after outputs existed; a run without them reads
# as it did before them).
OPTIONAL = ("cmlm",)


def section_key(name: str, section: Any) -> dict[str, Any]:
    """`asdict(section)` less the ADDED_LATER keys of section `name` at their defaults."""
    defaults = {f.name: f.default_factory() if f.default is MISSING else f.default for f in fields(section)}
    return {k: v for k, v in asdict(section).items() if k not in ADDED_LATER.get(name, ()) or v != defaults[k]}


def train_key(section: TrainConfig) -> dict[str, Any]:
    """The hashed part of a train section (REDER's or the teachers')."""
    return {k: v for k, v in section_key("train", section).items() if k not in NOT_HASHED}


def training_data(cfg: PipelineConfig) -> str:
    """The stage whose `train/` split REDER trains on: distill's (KD pairs) with distill.enabled, else tokenize's."""
    return "distill" if cfg.distill.enabled else "tokenize"


def uses_teachers(cfg: PipelineConfig) -> bool:
    """Whether the evaluation decodes with the teachers (baseline or reranking)."""
    return cfg.evaluate.teacher_baseline or cfg.evaluate.rerank == "teacher"


def uses_cmlm(cfg: PipelineConfig) -> bool:
    """Whether the evaluation decodes with the CMLMs (the baseline's mask-predict or the refinement of REDER)."""
    return bool(cfg.evaluate.cmlm_iterations or cfg.evaluate.refine_steps)


def _evaluate_key(cfg: PipelineConfig) -> dict[str, Any]:
    """The evaluate section as it was hashed before issue 26, so finished evaluations keep their directories:
    `rerank` none/teacher as the old `rerank_with_teacher` bool (self as `rerank`), the ADDED_LATER keys
    (the self-reranking weight, the CTC beam's cutoffs) only where they differ from their defaults."""
    key = section_key("evaluate", cfg.evaluate)
    key.pop("blank_penalties")  # the train stage tunes it into the model directory: its key (and name) has it
    if "test_sets" in key:  # named test sets with their files' SHA-256: a changed file is a new evaluation
        key["test_sets"] = evaluate.test_sets_key(cfg)
    rerank = key.pop("rerank")
    key["rerank_with_teacher"] = rerank == "teacher"
    if rerank == "self":
        key["rerank"] = rerank
    return key


def _decoding_key(cfg: PipelineConfig) -> dict[str, Any]:
    """What the train stage (and a sweep's trials) decode validation with beyond the defaults of before issue 41:
    the grid of blank penalties it tunes (`evaluate.blank_penalties`), named unless it is [0], the behaviour
    from before it (so a run that asks for no penalty keeps its directory; the default grid trains anew)."""
    penalties = cfg.evaluate.blank_penalties
    if penalties == NO_BLANK_PENALTY or not heads.head_class(cfg.model.head).emits_blank:  # DAG: no penalty
        return {}
    return {"blank_penalties": list(penalties)}


def _teacher_key(cfg: PipelineConfig) -> dict[str, Any]:
    given = teacher.given_checkpoints(cfg)
    if given:
        return {"checkpoints": {d: str(p) for d, p in given.items()}}
    return {"model": asdict(cfg.teacher.model), "train": train_key(cfg.teacher.train), **PAIR}


def _sweep_key(cfg: PipelineConfig) -> dict[str, Any]:
    """The tune section without its watchdog (`time_budget_s`): a resumed sweep may get another budget."""
    return {k: v for k, v in asdict(cfg.tune).items() if k != "time_budget_s"}


def _distill_key(cfg: PipelineConfig) -> dict[str, Any]:
    """What changes distill's output: the given corpus, or the decoding options and the engine (named only when
    it is CTranslate2, so directories made by our search keep their names; `auto` as resolved on this driver).
    Not the batching (`max_tokens`, `batch_size`) nor the actors: they change no output."""
    if cfg.distill.corpus:
        source = {"corpus": str(Path(cfg.distill.corpus).expanduser().resolve())}
    else:
        source = {"decoding": {k: getattr(cfg.distill, k) for k in distill.DECODING_KEYS}}
        if distill.engine(cfg.distill) == "ctranslate2":
            source["engine"] = "ctranslate2"
    return {**source, "feasibility": heads.feasibility_key(cfg.model)}


STAGES = (
    Stage("ingest", ingest.build, sections=("data",),
          key=lambda cfg: ingest.stage_key(cfg.data)),
    Stage("spm", spm.build, sections=("spm",),
          key=lambda cfg: {"spm": {k: v for k, v in asdict(cfg.spm).items() if k != "num_threads"},
                           "vocab_size": cfg.model.vocab_size},
          inputs=lambda cfg: {"ingest": "ingest"}),
    Stage("tokenize", tokenize.build, sections=("tokenize",), uses_ray=True,
          key=lambda cfg: heads.feasibility_key(cfg.model), inputs=lambda cfg: {"spm": "spm", "ingest": "ingest"}),
    Stage("teacher", teacher.build, sections=("teacher",), uses_ray=True, key=_teacher_key,
          inputs=lambda cfg: {"spm": "spm", "data": "tokenize"}, reads=lambda cfg: ("ingest",)),
    Stage("distill", distill.build, sections=("distill",), uses_ray=True, key=_distill_key,
          inputs=lambda cfg: {"tokenize": "tokenize", **({} if cfg.distill.corpus else {"teacher": "teacher"})},
          reads=lambda cfg: ("spm",)),
    Stage("train", train.build, sections=("model", "loss", "train"), uses_ray=True,
          key=lambda cfg: {"model": section_key("model", cfg.model), "loss": section_key("loss", cfg.loss),
                           "train": train_key(cfg.train),
                           **_decoding_key(cfg)},
          inputs=lambda cfg: {"data": training_data(cfg)}, reads=lambda cfg: ("tokenize", "ingest", "spm")),
    Stage("cmlm", cmlm.build, sections=("cmlm",), uses_ray=True,
          key=lambda cfg: {"model": asdict(cfg.cmlm.model), "train": train_key(cfg.cmlm.train), **PAIR},
          inputs=lambda cfg: {"data": training_data(cfg)}, reads=lambda cfg: ("tokenize", "ingest", "spm")),
    Stage("evaluate", evaluate.build, sections=("evaluate",),
          key=lambda cfg: {"evaluate": _evaluate_key(cfg)},
          inputs=lambda cfg: {"train": "train", "ingest": "ingest", **({"teacher": "teacher"} if uses_teachers(cfg) else {}),
                              **({"cmlm": "cmlm"} if uses_cmlm(cfg) else {})}),
    Stage("tune", tune.build, sections=("tune",), uses_ray=True,
          key=lambda cfg: {"tune": _sweep_key(cfg), "model": section_key("model", cfg.model),
                           "loss": section_key("loss", cfg.loss), "train": section_key("train", cfg.train), **_decoding_key(cfg)},
          inputs=lambda cfg: {"data": training_data(cfg)}, reads=lambda cfg: ("tokenize", "ingest", "spm")),
)
PIPELINE = tuple(stage.name for stage in STAGES if stage.name != "tune")  # a pipeline run's stages, in run order
BY_NAME = {stage.name: stage for stage in STAGES}


# The stages that train, and the config section whose `train` they use (budget.max_time is shared among them).
TRAINING = {"teacher": "teacher", "cmlm": "cmlm", "train": None}


def train_section(cfg: PipelineConfig, name: str) -> TrainConfig:
    """The TrainConfig of training stage `name`."""
    section = TRAINING[name]
    return getattr(cfg, section).train if section else cfg.train


def train_keys(name: str) -> str:
    """Where training stage `name`'s TrainConfig sits in the config: train, teacher.train or cmlm.train."""
    section = TRAINING[name]
    return f"{section}.train" if section else "train"


def time_cap(cfg: PipelineConfig, name: str, later: list[str], seconds_left: float) -> float:
    """Training stage `name`'s share of the run's budget (`budget`): the `seconds_left` of the run less the
    `max_time` of the training stages in `later` (still to run after it) and `budget.reserve`; infinite without a
    run budget. A later stage without a max_time has no claim: it gets what is left when it starts."""
    if not cfg.budget.max_time or name not in TRAINING:
        return math.inf
    claims = sum(train_section(cfg, other).max_time for other in later if other in TRAINING)
    return max(0.0, seconds_left - claims - cfg.budget.reserve)


def pipeline_stages(cfg: PipelineConfig) -> list[str]:
    """A pipeline run's stages by default: PIPELINE less the OPTIONAL stages this config does not need."""
    needs = needed(cfg)
    return [name for name in PIPELINE if name not in OPTIONAL or name in needs]


def upstream(cfg: PipelineConfig, name: str) -> dict[str, str]:
    """label → stage of everything `name` consumes: its hashed inputs, then its reads (labelled by name)."""
    stage = BY_NAME[name]
    return {**stage.inputs(cfg), **{read: read for read in stage.reads(cfg)}}


def needed(cfg: PipelineConfig, targets: tuple[str, ...] = ("evaluate",)) -> list[str]:
    """The stages a run of `targets` needs (the targets and all they consume, transitively), in run order."""
    seen: set[str] = set()
    pending = list(targets)
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending.extend(upstream(cfg, name).values())
    return [stage.name for stage in STAGES if stage.name in seen]


def output_dirs(cfg: PipelineConfig, workdir: Path) -> dict[str, Path]:
    """Every stage's output directory under `workdir` for this config, each derived once, in run order."""
    workdir = Path(workdir).resolve()
    dirs: dict[str, Path] = {}
    for stage in STAGES:  # run order: a stage's inputs are resolved before it
        names = {label: dirs[source].name for label, source in stage.inputs(cfg).items()}
        dirs[stage.name] = stage_dir(workdir, stage.name, {**stage.key(cfg), **names})
    return dirs


def output_dir(cfg: PipelineConfig, workdir: Path, name: str) -> Path:
    """Stage `name`'s output directory."""
    return output_dirs(cfg, workdir)[name]


def check_inputs(cfg: PipelineConfig, workdir: Path, name: str) -> dict[str, Path]:
    """label -> directory of everything stage `name` consumes, each finished and unchanged since (a
    StageError naming the missing stage or the changed file otherwise)."""
    dirs = output_dirs(cfg, workdir)
    return {label: require_done(dirs[source], source) for label, source in upstream(cfg, name).items()}


def run(cfg: PipelineConfig, workdir: Path, name: str, force: bool = False, tracker: Any = None,
        inputs: dict[str, Path] | None = None, resume: bool = False, time_cap_s: float = math.inf) -> Path:
    """Build stage `name` from its finished inputs (skipped when its own output is finished, unless `force`).
    `inputs`: what `check_inputs` returned, when the caller checked them already (hashing is not free);
    `resume`: continue an interrupted sweep (tune --resume); `time_cap_s`: a training stage's share of the
    run's budget (`time_cap`)."""
    stage = BY_NAME[name]
    workdir = Path(workdir).resolve()
    dirs = output_dirs(cfg, workdir)
    if is_done(dirs[name]) and not force:
        return dirs[name]  # finished: skipped without reading (hashing) its inputs
    inputs = check_inputs(cfg, workdir, name) if inputs is None else inputs
    context = StageRun(cfg=cfg, workdir=workdir, out=dirs[name], inputs=inputs, tracker=tracker, force=force,
                       resume=resume, time_cap_s=time_cap_s)

    def build(tmp: Path) -> dict[str, Any]:
        if stage.uses_ray:
            import ray

            if not ray.is_initialized():
                raise StageError(f"stage {name!r} runs on Ray, which is not connected: run_pipeline.py connects "
                                 f"once, before the first such stage (cluster.connect.connect)")
        return stage.build(context, tmp)

    sections = {section: asdict(getattr(cfg, section)) for section in stage.sections}
    return run_stage(name, dirs[name], build, config={**stage.key(cfg), **sections},
                     inputs={label: str(path) for label, path in inputs.items()}, force=force)
