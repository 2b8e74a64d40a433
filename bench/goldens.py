"""Golden outputs for a behaviour-preserving change: record them at the commit a change starts from, check them
bit for bit after it.

    python -m bench.goldens record OUT.json     # at the starting commit
    python -m bench.goldens check OUT.json      # after the change: every value equal, or the differences listed
    python -m bench.goldens stages WORKDIR OUT.json [--check]   # a pipeline run's stage outputs (e.g. configs/smoke.yaml)

What is recorded, all on the CPU from fixed seeds, one thread:
- 20 training steps of every objective (REDER's duplex objective with CTC and with the DAG head — FBA and CC from
  step 5, glancing —, a simplex REDER, REDER with KD's own tgt2src batch, the teachers' pair and the CMLMs' pair):
  every named term of every step, as float.hex (bit-exact);
- the saved parameter names of each model (what a model directory holds);
- every decoder's output (ids) of the trained models on a fixed batch: CTC greedy, beam, self- and
  teacher-reranked beam, under a blank penalty, by penalty (`greedy_by_penalty`, `reranked_by_penalty`); DAG
  greedy, lookahead, Viterbi, beam and path beam with their options; the teacher's greedy and beam; mask-predict and CMLM
  refinement; CTranslate2 greedy and beam when it is installed;
- `stages`: each stage directory's name (its config hash) and the SHA-256 of what it published: Parquet files,
  hypotheses, SentencePiece models, and each model's tensors by name (names in today's layout,
  reder.checkpoint.upgrade_state_dict), not the pickle's bytes.
"""
import argparse
import inspect
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from reder import CMLM, EOS_ID, CmlmConfig, LossConfig, ModelConfig, REDER, Transformer, TransformerConfig
from reder.ctc import pad_batch

VOCAB, STEPS, BATCH = 160, 20, 12


def objective(model: torch.nn.Module, loss: LossConfig) -> torch.nn.Module:
    """REDER's training objective for `model` under `loss`, as the code being checked builds it."""
    from reder.objectives import duplex

    if len(inspect.signature(duplex.DuplexLoss).parameters) > 1:  # DuplexLoss(model, config)
        return duplex.DuplexLoss(model, loss)
    model.loss_config = loss  # the layout before objectives owned their weights
    return duplex.DuplexLoss(model)


def pair_objective(kind: str, models: dict[str, torch.nn.Module]) -> torch.nn.Module:
    from reder.objectives import directional

    one = directional.TeacherObjective if kind == "teacher" else directional.CmlmObjective
    return directional.PairObjective({d: one(m, d) for d, m in models.items()})


def batches(seed: int) -> list[tuple[torch.Tensor, ...]]:
    """STEPS fixed batches of (src, src_lengths, tgt, tgt_lengths): pieces 4..VOCAB−2 ending in EOS."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(STEPS):
        lengths = torch.randint(3, 11, (2, BATCH), generator=generator)
        sides = [[torch.randint(4, VOCAB - 1, (int(n) - 1,), generator=generator).tolist() + [EOS_ID] for n in row]
                 for row in lengths]
        out.append((*pad_batch(sides[0]), *pad_batch(sides[1])))
    return out


def train(model: torch.nn.Module, loss: torch.nn.Module, seed: int, kd: bool = False,
          copy_rounds: int = 0) -> list[dict[str, str]]:
    """STEPS Adam updates of `loss`; every step's terms as float.hex. `copy_rounds` × STEPS more on batches whose
    target is the source (so that a teacher learns to end sentences at varied lengths; not recorded)."""
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    record = []
    data, reverse = batches(seed), batches(seed + 1)
    for step, batch in enumerate(data):
        options = {"tgt2src_batch": reverse[step]} if kd else {}
        terms = loss(*batch, step, **options)
        optimizer.zero_grad()
        terms["total"].backward()
        optimizer.step()
        record.append({name: float(value.detach()).hex() for name, value in sorted(terms.items())})
    copies = [(s, n, s, n) for round in range(copy_rounds) for s, n, _, _ in batches(seed + 2 + round)]
    for batch in copies:
        terms = loss(*batch, 0)
        optimizer.zero_grad()
        terms["total"].backward()
        optimizer.step()
    model.eval()
    return record


def reder_config(head: str) -> ModelConfig:
    return ModelConfig(vocab_size=VOCAB, d_model=32, n_heads=2, ffn_dim=64, layers_per_end=2, max_positions=128,
                       dropout=0.1, head=head, graph_upsample_ratio=3.0)


def transformer_config(cls: type) -> Any:
    return cls(vocab_size=VOCAB, d_model=32, n_heads=2, ffn_dim=64, encoder_layers=1, decoder_layers=1,
               max_positions=128)


def decode_all(models: dict[str, torch.nn.Module], work: Path) -> dict[str, Any]:
    """Every decoder's output on a fixed batch, through reder/decoding/."""
    from reder.decoding.ctc import CtcBeam, greedy_by_penalty, nbest, reranked_by_penalty
    from reder.decoding.run import translate_ids

    sequences = [row for row in batches(99)[0][0].tolist()]
    sequences = [s[: s.index(EOS_ID) + 1] for s in sequences]
    ctc, dag = models["ctc"], models["dag"]
    teachers, cmlms = models["teachers"], models["cmlms"]
    run: dict[str, Callable[[], Any]] = {}
    for d in ("src2tgt", "tgt2src"):
        run[f"ctc_greedy_{d}"] = lambda d=d: translate_ids(ctc, sequences, d)
        run[f"ctc_greedy_penalty_{d}"] = lambda d=d: translate_ids(ctc, sequences, d, "greedy", blank_penalty=0.7)
        run[f"ctc_beam4_{d}"] = lambda d=d: translate_ids(ctc, sequences, d, "beam", beam_size=4)
        run[f"ctc_beam4_cutoff_{d}"] = lambda d=d: translate_ids(ctc, sequences, d, "beam", beam_size=4, cutoff_top_n=3,
                                                                 cutoff_prob=0.9)
        run[f"ctc_beam4_self_{d}"] = lambda d=d: translate_ids(ctc, sequences, d, "beam", beam_size=4, rerank="self",
                                                               rerank_weight=0.5)
        run[f"ctc_beam4_teacher_{d}"] = lambda d=d: translate_ids(ctc, sequences, d, "beam", beam_size=4,
                                                                  rerank="teacher", teacher=teachers[d])
        run[f"ctc_by_penalty_{d}"] = lambda d=d: {str(k): v for k, v in greedy_by_penalty(
            ctc, sequences, d, [0.0, 0.5, 1.0], batch_size=5).items()}
        run[f"ctc_reranked_by_penalty_{d}"] = lambda d=d: {str(k): v for k, v in reranked_by_penalty(
            ctc, sequences, d, [0.0, 0.5], {"beam": CtcBeam(beam_size=3),
                                            "self": CtcBeam(beam_size=3, rerank="self", rerank_weight=1.0),
                                            "teacher": CtcBeam(beam_size=3, rerank="teacher", teacher=teachers[d])},
            5).items()}
        run[f"ctc_nbest_{d}"] = lambda d=d: nbest(ctc, *pad_batch(sequences), d, 4)
        for name, options in (("greedy", {"no_repeat_ngram": 2}), ("lookahead", {"no_repeat_ngram": 2}),
                              ("viterbi", {"length_penalty": 1.2})):
            run[f"dag_{name}_{d}"] = lambda d=d, name=name: translate_ids(dag, sequences, d, name)
            run[f"dag_{name}_options_{d}"] = lambda d=d, name=name, options=options: translate_ids(
                dag, sequences, d, name, max_transition=3, **options)
        run[f"dag_beam3_{d}"] = lambda d=d: translate_ids(dag, sequences, d, "beam", 5, beam_size=3)
        run[f"dag_path_beam3_{d}"] = lambda d=d: translate_ids(dag, sequences, d, "path_beam", beam_size=3,
                                                               top_tokens=3, length_penalty=0.8)
        run[f"dag_beam3_options_{d}"] = lambda d=d: translate_ids(dag, sequences, d, "beam", beam_size=3,
                                                                  max_transition=4, length_penalty=0.8)
        run[f"teacher_greedy_{d}"] = lambda d=d: translate_ids(teachers[d], sequences, d)
        run[f"teacher_beam4_{d}"] = lambda d=d: translate_ids(teachers[d], sequences, d, "beam", beam_size=4)
        run[f"teacher_beam4_lp_{d}"] = lambda d=d: translate_ids(teachers[d], sequences, d, "beam", beam_size=4,
                                                                 length_penalty=0.6, max_len_a=1.0)
        run[f"cmlm_T1_{d}"] = lambda d=d: translate_ids(cmlms[d], sequences, d, "mask_predict", length_beam=3,
                                                        iterations=1)
        run[f"cmlm_T4_{d}"] = lambda d=d: translate_ids(cmlms[d], sequences, d, "mask_predict", length_beam=3,
                                                        iterations=4)
        run[f"ctc_refine2_{d}"] = lambda d=d: translate_ids(ctc, sequences, d, refiner=cmlms[d], refine_steps=2)
    outputs = {name: fn() for name, fn in run.items()}
    outputs.update(ct2_outputs(teachers["src2tgt"], sequences, work))
    return outputs


def ct2_outputs(teacher: Transformer, sequences: list[list[int]], work: Path) -> dict[str, Any]:
    """CTranslate2's greedy and beam 4 of the src2tgt teacher, when CTranslate2 is installed."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return {}
    from pipeline.stages.spm import train as train_spm
    from reder.ct2 import convert_model
    from reder.decoding.ct2 import ct2_model
    from reder.decoding.run import translate_ids

    bible = Path(__file__).resolve().parent.parent / "tests" / "data" / "bible_en_es"
    lines = [line for side in ("train.en", "train.es") for line in (bible / side).read_text(encoding="utf-8").splitlines()]
    (work / "spm.model").write_bytes(train_spm(lines, VOCAB))
    model = ct2_model(convert_model(teacher, work / "spm.model", work / "ct2"))
    return {"ct2_beam1": translate_ids(model, sequences, "src2tgt"),
            "ct2_beam4": translate_ids(model, sequences, "src2tgt", "beam", beam_size=4)}


def record(work: Path) -> dict[str, Any]:
    torch.set_num_threads(1)
    result: dict[str, Any] = {"losses": {}, "parameters": {}}
    loss = LossConfig(lambda_fba=0.1, lambda_cc=0.1, aux_start_step=5, glance_start=0.5, glance_end=0.1,
                      glance_steps=STEPS)
    models: dict[str, Any] = {}
    for head in ("ctc", "dag"):
        torch.manual_seed(1)
        model = REDER(reder_config(head))
        result["losses"][f"reder_{head}"] = train(model, objective(model, loss), 1)
        result["parameters"][f"reder_{head}"] = list(model.state_dict())
        models[head] = model
    torch.manual_seed(2)
    simplex = REDER(reder_config("ctc"))
    result["losses"]["reder_ctc_simplex"] = train(simplex, objective(simplex, LossConfig(directions=("src2tgt",),
                                                                                        aux_start_step=5)), 2)
    torch.manual_seed(3)
    kd = REDER(reder_config("ctc"))
    result["losses"]["reder_ctc_kd"] = train(kd, objective(kd, LossConfig(aux_start_step=5)), 3, kd=True)
    for kind, cls, config in (("teachers", Transformer, TransformerConfig), ("cmlms", CMLM, CmlmConfig)):
        torch.manual_seed(4)
        pair = {d: cls(transformer_config(config)) for d in ("src2tgt", "tgt2src")}
        both = torch.nn.ModuleDict(pair)
        result["losses"][kind] = train(both, pair_objective("teacher" if kind == "teachers" else "cmlm", pair), 4,
                                       kd=kind == "cmlms", copy_rounds=8 if kind == "teachers" else 0)
        result["parameters"][kind] = list(both.state_dict())
        models[kind] = pair
    result["decoders"] = decode_all(models, work)
    return result


def stage_digests(workdir: Path) -> dict[str, str]:
    """Stage directory → file → SHA-256 of a finished pipeline run's published outputs (see module doc)."""
    import hashlib

    from reder.checkpoint import load_tensors, upgrade_state_dict

    digests: dict[str, str] = {}
    for stage in sorted(p for p in workdir.iterdir() if (p / "_SUCCESS").is_file()):
        for path in sorted(stage.rglob("*")):
            name = f"{stage.name}/{path.relative_to(stage)}"
            if path.suffix in (".parquet", ".txt", ".model") and path.is_file():
                digests[name] = hashlib.sha256(path.read_bytes()).hexdigest()
            elif path.name == "model.pt":
                state = upgrade_state_dict(load_tensors(path))
                for key, tensor in state.items():
                    digests[f"{name}:{key}"] = hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()
    return digests


def differences(expected: Any, got: Any, where: str = "") -> list[str]:
    if isinstance(expected, dict) and isinstance(got, dict):
        out = [f"{where}/{k}: missing" for k in expected if k not in got]
        out += [f"{where}/{k}: new" for k in got if k not in expected]
        for key in expected:
            if key in got:
                out += differences(expected[key], got[key], f"{where}/{key}")
        return out
    return [] if expected == got else [f"{where}: {str(expected)[:120]} != {str(got)[:120]}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("record", "check", "stages"))
    parser.add_argument("file", type=Path, help="the goldens (record, check); the pipeline's workdir (stages)")
    parser.add_argument("out", type=Path, nargs="?", help="stages: the digests' file")
    parser.add_argument("--check", action="store_true", help="stages: compare with OUT instead of writing it")
    args = parser.parse_args(argv)
    if args.action == "stages":
        digests = stage_digests(args.file)
        if not args.check:
            args.out.write_text(json.dumps(digests, indent=1), encoding="utf-8")
            print(f"{len(digests)} digests of {args.file}'s stages in {args.out}")
            return 0
        found = differences(json.loads(args.out.read_text(encoding="utf-8")), digests)
        print("\n".join(found + [f"{len(found)} differences from {args.out}"]))
        return 1 if found else 0
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        result = json.loads(json.dumps(record(Path(work))))  # tuples as lists, as the file holds them
    if args.action == "record":
        args.file.write_text(json.dumps(result), encoding="utf-8")
        print(f"recorded {sum(len(v) for v in result['losses'].values())} training steps and "
              f"{len(result['decoders'])} decoder outputs in {args.file}")
        return 0
    found = differences(json.loads(args.file.read_text(encoding="utf-8")), result)
    for line in found:
        print(line)
    print(f"{len(found)} differences from {args.file}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
