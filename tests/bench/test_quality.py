"""bench.quality's teachers and reder phases with --validate-every: the published models are the average of
the best checkpoints by validation BLEU, as the pipeline's train stage publishes them; --save-models saves
those models and the speed phase times them afterwards (what bench/quality_gpu.sh did on the H100: REDERs trained
side by side, the DAG one among them, each timed alone afterwards)."""
import json

import pytest
import sentencepiece

from bench import quality, quality_table
from reder.checkpoint import load_model_dir
from tests.bench.conftest import TINY


def _check_averaged(entry: dict, steps: int, keep: int) -> None:
    averaged = entry["averaged"]
    assert len(averaged) == keep and {a["step"] for a in averaged} <= set(range(1, steps + 1))
    assert [a["valid_bleu"] for a in averaged] == sorted((a["valid_bleu"] for a in averaged), reverse=True)
    assert entry["validation_seconds"] > 0


@pytest.mark.slow
def test_validated_runs_publish_the_average_of_their_best_checkpoints(multi30k_slice, tmp_path):
    common = ["--data-dir", str(multi30k_slice), "--max-tokens", "600", "--warmup", "1", "--steps", "3",
              "--validate-every", "1", "--average-best", "2", *TINY]
    teachers = quality.main(["teachers", "--out", str(tmp_path / "T"), *common])
    assert teachers["validate_every"] == 1 and teachers["average_best"] == 2
    for direction in ("src2tgt", "tgt2src"):
        _check_averaged(teachers[f"train_{direction}"], 3, 2)
        assert set(teachers[f"train_{direction}"]["last_update_greedy"]) == {f"{t}.{direction}" for t in quality.TESTS}
    # trained side by side (--no-speed), each saved: the DAG beside kd_noaux, and the KD + FBA/CC model with the CTC
    # beam reranked by the teachers (the paper's setting) in a run of its own (the DAG's exact beam is ~K·L³)
    reder = quality.main(["reder", "--from", str(tmp_path / "T"), "--out", str(tmp_path / "R"), *common,
                          "--save-models", "--no-speed", "--variants", "kd_noaux", "dag_kd_noaux"])
    reranked = quality.main(["reder", "--from", str(tmp_path / "T"), "--out", str(tmp_path / "RK"), *common,
                             "--save-models", "--no-speed", "--beam", "2", "--variants", "kd"])
    for out, report, variant in (("R", reder, "kd_noaux"), ("R", reder, "dag_kd_noaux"), ("RK", reranked, "kd")):
        _check_averaged(report[variant], 3, 2)
        assert (tmp_path / out / f"model-{variant}").is_dir() and "speed" not in report[variant]
    assert set(reder["kd_noaux"]["last_update_greedy"]) == set(reder["kd_noaux"]["greedy"])
    # the saved model is the published (averaged) one: it translates the test sets to the same scores
    model, _ = load_model_dir(tmp_path / "R" / "model-kd_noaux")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "T" / "spm.model"))
    assert quality._scores(quality._greedy(model), sp, multi30k_slice) == reder["kd_noaux"]["greedy"]

    # then each saved model timed alone, beside the teachers
    speed = quality.main(["speed", "--from", str(tmp_path / "T"), "--out", str(tmp_path / "R"), *common])
    speed_reranked = quality.main(["speed", "--from", str(tmp_path / "T"), "--out", str(tmp_path / "RK"), *common])
    timed = json.loads((tmp_path / "R" / "reder.json").read_text(encoding="utf-8"))
    assert timed["kd_noaux"]["speed"] == speed["kd_noaux"] and timed["speed_measured"]["date"] == speed["date"]
    for variant, measured in (("kd_noaux", speed), ("dag_kd_noaux", speed), ("kd", speed_reranked)):
        assert {"greedy_latency_ms", "teacher_beam4_latency_ms"} <= set(measured[variant])
    assert "speedup_greedy_vs_teacher_beam4_batch1" in speed["kd_noaux"]
    assert "beam2_rerank_latency_ms" in speed_reranked["kd"] and "lookahead_latency_ms" in speed["dag_kd_noaux"]
    assert list(timed) == [*reder, "speed_measured"]  # the reder phase's order, which the table's rows follow
    for variant in ("kd_noaux", "dag_kd_noaux"):
        assert {key: value for key, value in timed[variant].items() if key != "speed"} == reder[variant]
    text = quality_table.main([str(tmp_path / "T" / "teachers.json"), str(tmp_path / "R" / "reder.json"),
                               str(tmp_path / "RK" / "reder.json")])
    assert text.count("timed alone by bench.quality speed") == 2  # two reports, each model timed alone
    assert "| REDER-DAG + KD, no FBA/CC | lookahead |" in text
    assert "| REDER + KD, FBA + CC | CTC beam 2 + teacher rerank |" in text
    (tmp_path / "R2").mkdir()
    (tmp_path / "R2" / "reder.json").write_text(json.dumps(reder), encoding="utf-8")  # trained without --save-models
    with pytest.raises(FileNotFoundError, match=r"no saved model for \['kd_noaux', 'dag_kd_noaux'\]"):
        quality.main(["speed", "--from", str(tmp_path / "T"), "--out", str(tmp_path / "R2"), *common])
    with pytest.raises(ValueError, match="not supported"):
        quality.main(["aux", "--from", str(tmp_path / "T"), "--out", str(tmp_path / "A"), *common])
