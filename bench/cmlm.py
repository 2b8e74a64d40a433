"""Iterative refinement on Multi30k En↔De: CMLM mask-predict as a baseline and as a pass over REDER's
output, against the AR teachers, at the same number of updates, on one device without Ray.

    python -m bench.quality teachers --out T $COMMON                                  # teachers + KD (bench.quality)
    python -m bench.quality reder --from T --out R $COMMON --variants kd_noaux --save-models --no-speed
    python -m bench.cmlm train --from T --out C $COMMON $CMLM                         # one CMLM per direction
    python -m bench.cmlm eval --from T --reder R/model-kd_noaux --out C $COMMON [--iterations 1 4 10]
        [--refine-steps 1 2 4] [--length-beam 5]

- `train`: one CMLM per direction (the `cmlm` section of the config, e.g. `cmlm.model.d_model=256`; the
  training core, pipeline/training/harness.py, with the `cmlm.train` section and the command line's budget: --steps
  updates of --max-tokens, as the teachers and REDER got) on the teachers phase's KD pairs (src2tgt learns
  x → teacher(x), tgt2src y → teacher(y), reder.objectives.directional.CmlmObjective), saved as model directories
  C/cmlm-<direction>; writes C/train.json.
- `eval`: the teachers (greedy, beam 4), REDER's greedy output, REDER's greedy output refined by K mask-predict
  iterations of the CMLM of its direction (each --refine-steps K; without --reder, the teachers' greedy output
  refined instead: `ar_greedy_refine<K>`), and the CMLMs alone with mask-predict (each
  --iterations T, --length-beam candidates), every one the evaluate stage's decoder (pipeline.stages.evaluate.decoders_for)
  scored with sacreBLEU BLEU / chrF on test_2016_flickr and test_2017_flickr both ways and timed in this one
  process (pipeline.stages.evaluate.measure_speed: latency at batch 1 over `evaluate.latency_sentences`, sentences/s
  at batch `evaluate.throughput_batch`, en→de); writes C/eval.json and the Markdown table C/table.md.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bench import MULTI30K, REPO_ROOT
from bench.quality import TESTS, _header, _harness, _kd_examples, _reder_inputs, _scores, _train_config

DIRECTIONS = ("src2tgt", "tgt2src")
BASELINE = "teacher_beam4"


def train_phase(args: argparse.Namespace, cfg, device: str) -> dict:
    from reder.objectives.directional import CmlmObjective
    from reder import CMLM
    from reder.checkpoint import save_model_dir

    inputs = _reder_inputs(args, cfg, device)
    examples = _kd_examples(inputs)
    report = {**_header(args, device), "benchmark": "cmlm", "train_pairs": len(examples), "model": cfg.cmlm.model.to_dict()}
    train = _train_config(args, cfg.cmlm.train)
    for direction in DIRECTIONS:
        torch.manual_seed(1)
        model = CMLM(cfg.cmlm.model).to(device)
        harness = _harness(args, model, CmlmObjective(model, direction), train, device)
        report[f"train_{direction}"] = harness.fit_examples(examples, time_cap_s=args.time_cap_s)
        report[f"train_{direction}"]["parameters"] = sum(p.numel() for p in model.parameters())
        save_model_dir(Path(args.out) / f"cmlm-{direction}", model.eval(), Path(args.source) / "spm.model", "en", "de",
                       extra={"direction": direction})
        print(json.dumps({direction: report[f"train_{direction}"]}), flush=True)
    return report


def eval_phase(args: argparse.Namespace, cfg, device: str) -> dict:
    from pipeline.stages.evaluate import decoders_for, measure_speed
    from reder.checkpoint import load_cmlm_dir, load_model_dir
    from reder.decoding.run import translate_ids

    inputs = _reder_inputs(args, cfg, device)
    if not inputs.teachers:
        raise FileNotFoundError(f"{args.source}: no teacher-<direction>/ model directories (the teachers phase saves them)")
    out = Path(args.out)
    cmlms = {d: load_cmlm_dir(out / f"cmlm-{d}", d, cfg.model.vocab_size, device) for d in DIRECTIONS}
    evaluation = replace_namespace(inputs.evaluation, beam_size=1, rerank="none", teacher_beam_size=4,
                                   cmlm_iterations=tuple(args.iterations), cmlm_length_beam=args.length_beam,
                                   refine_steps=tuple(args.refine_steps) if args.reder else ())
    if args.reder:
        reder, _ = load_model_dir(Path(args.reder), device)
        systems = decoders_for(reder, evaluation, inputs.teachers, cmlms)
    else:  # no REDER: the teachers and the CMLMs alone, as decoders_for would call them, and the refinement
        # pass over the teachers' greedy output instead of REDER's
        reder, teachers = cmlms["src2tgt"], inputs.teachers
        systems = {f"cmlm_T{t}": (lambda enc, d, bs, t=t: translate_ids(cmlms[d], enc, d, "mask_predict", bs,
                                                                         length_beam=args.length_beam, iterations=t))
                   for t in args.iterations}
        for steps in args.refine_steps:
            systems[f"ar_greedy_refine{steps}"] = lambda enc, d, bs, steps=steps: translate_ids(
                teachers[d], enc, d, "greedy", bs, refiner=cmlms[d], refine_steps=steps)
        for name, size in (("teacher_greedy", 1), ("teacher_beam4", 4)):
            systems[name] = lambda enc, d, bs, size=size: translate_ids(teachers[d], enc, d, "beam", bs, beam_size=size)
    report = {**_header(args, device), "benchmark": "cmlm", "reder": str(args.reder), "length_beam": args.length_beam,
              "splits": list(args.splits),
              "threads": torch.get_num_threads(), "scores": {}}
    for name, translate in systems.items():
        started = time.perf_counter()
        report["scores"][name] = _scores(lambda encoded, d, t=translate: t(encoded, d, 64), inputs.sp, inputs.data,
                                         splits=tuple(args.splits))
        report["scores"][name]["seconds"] = round(time.perf_counter() - started, 1)
        print(json.dumps({name: report["scores"][name]}), flush=True)
    report["speed"] = measure_speed(reder, inputs.test, systems, evaluation)
    report["training"] = _training(args)
    return report


def replace_namespace(namespace, **values):
    """A copy of a SimpleNamespace with `values` set."""
    return type(namespace)(**{**vars(namespace), **values})


def _training(args: argparse.Namespace) -> dict:
    """Updates and seconds of each system's training, from the reports of its phase (when they are there)."""
    found = {}
    paths = {"teachers": Path(args.source) / "teachers.json", "cmlm": Path(args.out) / "train.json"}
    if args.reder:
        paths["reder"] = Path(args.reder).parent / "reder.json"
    for name, path in paths.items():
        if path.is_file():
            report = json.loads(path.read_text(encoding="utf-8"))
            if name == "reder":
                entry = next(v for k, v in report.items() if isinstance(v, dict) and Path(args.reder).name == f"model-{k}")
                found[name] = {"updates": entry["train"]["steps"], "seconds": entry["train"]["seconds"]}
            else:
                parts = [report[f"train_{d}"] for d in DIRECTIONS]
                found[name] = {"updates": parts[0]["steps"], "seconds": round(sum(p["seconds"] for p in parts), 1)}
    return found


def table(report: dict) -> str:
    """The Markdown table of an eval report: BLEU / chrF per test set and direction, speed, training."""
    speed, training = report["speed"], report.get("training", {})
    base = speed[f"{BASELINE}_latency_ms"]
    cells = [(split, d) for split in report.get("splits", TESTS) for d in DIRECTIONS]
    heads = [f"{'en→de' if d == 'src2tgt' else 'de→en'} {split[5:9]} BLEU / chrF" for split, d in cells]
    lines = ["| system | " + " | ".join(heads) + " | latency b1 (ms) | sent/s b64 | speed-up vs teacher beam 4 (b1) | "
             "updates | train s |", "|---" * (len(heads) + 6) + "|"]
    for name, scores in report["scores"].items():
        system, cost = _label(name, report["length_beam"]), _cost(name, training)
        row = [f"{scores[f'{s}.{d}']['bleu']:.2f} / {scores[f'{s}.{d}']['chrf']:.1f}" for s, d in cells]
        latency, rate = speed[f"{name}_latency_ms"], speed[f"{name}_sentences_per_s"]
        lines.append(f"| {system} | " + " | ".join(row) + f" | {latency:.1f} | {rate:.0f} | {base / latency:.2f}× | "
                     f"{cost[0]} | {cost[1]} |")
    return "\n".join(lines)


def _label(name: str, length_beam: int) -> str:
    if name.startswith("teacher_"):
        return f"AR teachers, {name.removeprefix('teacher_').replace('beam', 'beam ')}"
    if name.startswith("cmlm_T"):
        return f"CMLM mask-predict, T = {name.removeprefix('cmlm_T')}, l = {length_beam}"
    if name.startswith("greedy_refine"):
        return f"REDER greedy + {name.removeprefix('greedy_refine')} CMLM refinement step(s)"
    if name.startswith("ar_greedy_refine"):
        return f"AR teachers, greedy + {name.removeprefix('ar_greedy_refine')} CMLM refinement step(s)"
    return f"REDER + KD, {name}"


def _cost(name: str, training: dict) -> tuple[str, str]:
    """(updates, training seconds) of the models behind a decoder: refinement adds the CMLMs to REDER."""
    parts = ["teachers"] if name.startswith("teacher_") else ["cmlm"] if name.startswith("cmlm_") else \
        ["teachers", "cmlm"] if name.startswith("ar_") else ["reder", "cmlm"] if "refine" in name else ["reder"]
    if not all(part in training for part in parts):
        return "–", "–"
    updates = " + ".join(f"{training[p]['updates']}" + (" ×2" if p != "reder" else "") for p in parts)
    return updates, f"{sum(training[p]['seconds'] for p in parts):,.0f}"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=("train", "eval"))
    parser.add_argument("--data-dir", default=str(MULTI30K))
    parser.add_argument("--out", required=True, help="output directory (eval: the train phase's)")
    parser.add_argument("--from", dest="source", required=True, help="the bench.quality teachers phase's output")
    parser.add_argument("--reder", default="", help="eval: REDER's model directory (bench.quality reder --save-models); "
                        "without it, the teachers and the CMLMs alone")
    parser.add_argument("--config", default=str(REPO_ROOT / "configs" / "multi30k.yaml"))
    parser.add_argument("--steps", type=int, default=3000, help="train: updates per CMLM")
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--lr", type=float, default=7e-4)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--time-cap-s", type=float, default=float("inf"))
    parser.add_argument("--iterations", type=int, nargs="+", default=[1, 4, 10], help="eval: mask-predict's T values")
    parser.add_argument("--splits", nargs="+", default=list(TESTS), choices=TESTS, help="eval: the test sets scored")
    parser.add_argument("--length-beam", type=int, default=5, help="eval: mask-predict's length candidates l")
    parser.add_argument("--refine-steps", type=int, nargs="+", default=[1, 2, 4], help="eval: refinement steps K")
    parser.add_argument("--train-limit", type=int, default=0, help="accepted for the shared $COMMON (the KD pairs are T's)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. cmlm.model.d_model=256")
    args = parser.parse_intermixed_args(argv)
    args.validate_every, args.average_best, args.beam = 0, 1, 1  # what bench.quality's helpers read
    from pipeline.config import load_config

    cfg = load_config(args.config, args.overrides)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    report = (train_phase if args.phase == "train" else eval_phase)(args, cfg, device)
    (Path(args.out) / f"{args.phase}.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    if args.phase == "eval":
        markdown = table(report)
        (Path(args.out) / "table.md").write_text(markdown + "\n", encoding="utf-8")
        print(markdown)
    return report


if __name__ == "__main__":
    main()
