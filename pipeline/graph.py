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
no stage computes another stage's path. What each stage hashes (its key): pipeline/stagekeys.py, one versioned
scheme; finished outputs keep their directories (tests/pipeline/test_graph.py pins them). `plan` says per stage
whether a run would run it or reuse its directory, and why (`run_pipeline.py --dry-run`).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline import stagekeys
from pipeline.config import PipelineConfig, TrainConfig
from pipeline.stage import Stage, StageError, StageRun, is_done, read_manifest, require_done, run_stage, stage_dir
from pipeline.stages import cmlm, distill, evaluate, ingest, spm, teacher, tokenize, train, tune

# Stages a pipeline run lists only when it needs them (added after outputs existed; a run without them reads
# as it did before them).
OPTIONAL = ("cmlm",)


def training_data(cfg: PipelineConfig) -> str:
    """The stage whose `train/` split REDER trains on: distill's (KD pairs) with distill.enabled, else tokenize's."""
    return "distill" if cfg.distill.enabled else "tokenize"


def uses_teachers(cfg: PipelineConfig) -> bool:
    """Whether the evaluation decodes with the teachers (baseline or reranking)."""
    return cfg.evaluate.teacher_baseline or cfg.evaluate.rerank == "teacher"


def uses_cmlm(cfg: PipelineConfig) -> bool:
    """Whether the evaluation decodes with the CMLMs (the baseline's mask-predict or the refinement of REDER)."""
    return bool(cfg.evaluate.cmlm_iterations or cfg.evaluate.refine_steps)


STAGES = (
    Stage("ingest", ingest.build, sections=("data",), summary=ingest.summary, key=stagekeys.ingest_key),
    Stage("spm", spm.build, sections=("spm",), summary=spm.summary, key=stagekeys.spm_key,
          inputs=lambda cfg: {"ingest": "ingest"}),
    Stage("tokenize", tokenize.build, sections=("tokenize",), uses_ray=True, summary=tokenize.summary,
          key=stagekeys.tokenize_key, inputs=lambda cfg: {"spm": "spm", "ingest": "ingest"}),
    Stage("teacher", teacher.build, sections=("teacher",), uses_ray=True, key=stagekeys.teacher_key, summary=teacher.summary,
          needed_when=("distill.enabled", "distill.corpus", "evaluate.teacher_baseline", "evaluate.rerank"),
          inputs=lambda cfg: {"spm": "spm", "data": "tokenize"}, reads=lambda cfg: ("ingest",)),
    Stage("distill", distill.build, sections=("distill",), uses_ray=True, key=stagekeys.distill_key, summary=distill.summary,
          needed_when=("distill.enabled",),
          inputs=lambda cfg: {"tokenize": "tokenize", **({} if cfg.distill.corpus else {"teacher": "teacher"})},
          reads=lambda cfg: ("spm",)),
    Stage("train", train.build, sections=("model", "loss", "train"), uses_ray=True, summary=train.summary,
          key=stagekeys.train_stage_key,
          inputs=lambda cfg: {"data": training_data(cfg)}, reads=lambda cfg: ("tokenize", "ingest", "spm")),
    Stage("cmlm", cmlm.build, sections=("cmlm",), uses_ray=True,
          needed_when=("evaluate.cmlm_iterations", "evaluate.refine_steps"),
          key=stagekeys.cmlm_key,
          inputs=lambda cfg: {"data": training_data(cfg)}, reads=lambda cfg: ("tokenize", "ingest", "spm")),
    Stage("evaluate", evaluate.build, sections=("evaluate",), summary=evaluate.summary,
          key=stagekeys.evaluate_key,
          inputs=lambda cfg: {"train": "train", "ingest": "ingest", **({"teacher": "teacher"} if uses_teachers(cfg) else {}),
                              **({"cmlm": "cmlm"} if uses_cmlm(cfg) else {})}),
    Stage("tune", tune.build, sections=("tune",), uses_ray=True,
          key=stagekeys.tune_key,
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


def why_not_needed(cfg: PipelineConfig, name: str) -> str:
    """The config keys that decide whether a run needs stage `name`, with their values (`key=value, ...`)."""
    values = []
    for dotted in BY_NAME[name].needed_when:
        section, key = dotted.split(".")
        value = getattr(getattr(cfg, section), key)
        values.append(f"{dotted}={list(value) if isinstance(value, tuple) else value if value != '' else 'unset'}")
    return ", ".join(values)


@dataclass(frozen=True)
class Step:
    """What a run would do with one stage: `action` "not needed", "reuse" (a finished directory) or "run", and
    why (`reason`: the deciding keys, or what differs from the nearest finished directory of the stage)."""

    name: str
    output: Path
    action: str
    reason: str


def plan(cfg: PipelineConfig, workdir: Path, stages: list[str], force: bool = False) -> list[Step]:
    """Per stage of `stages`, whether a run would run it, reuse its directory, or not need it, and why; what
    `run_pipeline.py` runs and what its `--dry-run` prints. A stage named in `stages` that is OPTIONAL is wanted."""
    needs = needed(cfg, ("evaluate", *[name for name in stages if name in OPTIONAL]))
    dirs = output_dirs(cfg, workdir)
    steps = []
    for name in stages:
        if name not in needs:
            steps.append(Step(name, dirs[name], "not needed", why_not_needed(cfg, name)))
        elif is_done(dirs[name]) and not force:
            steps.append(Step(name, dirs[name], "reuse", "finished earlier with this config"))
        else:
            steps.append(Step(name, dirs[name], "run", "--force" if force else _why_new(cfg, dirs, name)))
    return steps


def _why_new(cfg: PipelineConfig, dirs: dict[str, Path], name: str) -> str:
    """Why stage `name` has no finished directory for this config: none of the stage at all, or the keys in which
    the nearest finished one (fewest differences in its recorded config and inputs) differs from this run's."""
    stage = BY_NAME[name]
    ours = _flat({"config": {**stage.key(cfg), **{s: asdict(getattr(cfg, s)) for s in stage.sections}},
                  "inputs": {label: str(dirs[source]) for label, source in upstream(cfg, name).items()}})
    nearest: list[str] | None = None
    for other in sorted(dirs[name].parent.glob(f"{name}-*")):
        if other != dirs[name] and is_done(other):
            manifest = read_manifest(other)
            theirs = _flat({"config": manifest.get("config", {}), "inputs": manifest.get("inputs", {})})
            changed = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
            if nearest is None or len(changed) < len(nearest):
                nearest, closest = changed, other
    if nearest is None:
        return "no finished directory of this stage"
    shown = ", ".join(key.removeprefix("config.") for key in nearest[:6])  # an input stays `inputs.<label>` + (f" (+{len(nearest) - 6} more)" if len(nearest) > 6 else "")
    return f"nearest finished {closest.name} differs in {shown or 'nothing recorded (key version)'}"


def _flat(value: Any, prefix: str = "") -> dict[str, str]:
    """A nested dict as dotted key → JSON of the leaf value."""
    if isinstance(value, dict) and value:
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): json.dumps(value, sort_keys=True, default=str)}


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
