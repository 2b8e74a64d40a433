"""bench.pipeline_summary on the two GPU runs of the quick recipe kept in docs/results (their workdirs' files, as
bench/gpu_env/quick_gpu.sh tars them): one that finished and one stopped at its limit in evaluate, which the summary used
to refuse with a traceback (no last_run.json)."""
import tarfile
from pathlib import Path

import pytest

from bench import pipeline_summary

RUNS = Path(__file__).resolve().parents[2] / "docs" / "results" / "pipeline_multi30k_quick_h200"


def _workdir(tmp_path: Path, tarball: str) -> Path:
    with tarfile.open(RUNS / tarball) as archive:
        archive.extractall(tmp_path, filter="data")
    return tmp_path


def test_a_finished_run_is_scored_against_the_issues_targets(tmp_path):
    result = pipeline_summary.summary(_workdir(tmp_path, "results.tar.gz"), 397.6)
    assert result["finished"] is True and result["wall_seconds"] == 397.6
    assert set(result["stage_seconds"]) == {"ingest", "spm", "tokenize", "teacher", "distill", "train", "evaluate"}
    assert list(result["test_bleu"]) == ["test"]  # test 2016 alone: the run scored no other set
    en_de, de_en = result["test_bleu"]["test"]["src2tgt"], result["test_bleu"]["test"]["tgt2src"]
    assert en_de["teacher_beam4"] == pytest.approx(37.31, abs=0.005) and de_en["teacher_beam4"] == pytest.approx(41.06, abs=0.005)
    assert en_de["greedy"] == pytest.approx(35.42, abs=0.005) and en_de["sentences"] == 1000
    assert en_de["greedy_gap"] == pytest.approx(1.89) and en_de["greedy_target_met"] is False  # within 1.0: not
    assert en_de["reranked_gap"] == pytest.approx(3.04)  # beside, not a target: its latency is far over 2x greedy's
    assert {key for key in result["targets"] if "src2tgt" in key or "tgt2src" in key} == {
        "teacher_src2tgt", "teacher_tgt2src", "greedy_src2tgt", "greedy_tgt2src"}
    assert "paired_bootstrap" not in en_de  # the tarball holds no hypothesis files
    assert result["targets"]["pipeline_seconds"] is True and result["targets"]["non_training_share"] is False
    assert result["training_loop_seconds"]["train"] == pytest.approx(116.1)
    assert "the run stopped before its end" not in pipeline_summary.markdown(result)


def test_a_run_stopped_at_its_limit_is_summed_up_from_the_stages_it_finished(tmp_path):
    result = pipeline_summary.summary(_workdir(tmp_path, "stop66-results.tar.gz"), 560.0)
    assert result["finished"] is False
    assert result["stage_seconds"] == {"ingest": 0.3, "spm": 0.9, "tokenize": 13.5, "teacher": 204.8, "distill": 77.0,
                                       "train": 198.0}  # in the order they ran; evaluate did not finish
    assert result["training_loop_seconds"] == {"teacher": 160.1, "cmlm": 0, "train": 151.7}
    assert result["stops"]["train"]["stopped_by"] == "time_cap" and result["stops"]["train"]["steps"] == 1399
    assert result["reder_steady_tokens_per_s"] > 250_000
    assert all(v is None for v in result["test_bleu"]["test"]["src2tgt"].values() if not isinstance(v, bool))
    assert not any(result["targets"].values())  # nothing it did not reach counts as met
    assert pipeline_summary.markdown(result).startswith("the run stopped before its end")


def test_every_scored_test_set_is_held_to_the_gap_with_the_paired_bootstrap_of_greedy_against_the_teachers(tmp_path):
    """A second test set (test 2017 flickr) gets its own targets; where the evaluate stage left its hypothesis files
    and translations table, greedy is compared with the teachers' beam 4 by sacreBLEU's paired bootstrap, as
    duplex-compare compares two runs."""
    import json

    from sacrebleu.metrics import BLEU

    evaluate = tmp_path / "evaluate-000000000000"
    (evaluate / "translations").mkdir(parents=True)
    source = [f"a small dog number {i} runs in the park" for i in range(40)]
    reference = [f"ein kleiner hund nummer {i} läuft im park" for i in range(40)]
    teacher = {"src2tgt": reference[:30] + [f"ein hund {i} läuft" for i in range(30, 40)], "tgt2src": source}
    greedy = {"src2tgt": reference[:20] + [f"ein hund {i} im park" for i in range(20, 40)],
              "tgt2src": source[:35] + ["a dog"] * 5}
    scores = {}
    for name in ("test", "test_2017_flickr"):
        (evaluate / "translations" / f"{name}.json").write_text(json.dumps({"source": source, "reference": reference}))
        for direction, references in (("src2tgt", reference), ("tgt2src", source)):
            for decoder, lines in (("teacher_beam4", teacher), ("greedy", greedy)):
                (evaluate / f"{name}.{direction}.{decoder}.txt").write_text("\n".join(lines[direction]) + "\n")
                scores[f"{name}.{direction}.{decoder}"] = {"bleu": BLEU().corpus_score(lines[direction], [references]).score,
                                                           "sentences": 40}
    (evaluate / "results.json").write_text(json.dumps({"scores": scores}))
    result = pipeline_summary.summary(tmp_path, 100.0)
    assert list(result["test_bleu"]) == ["test", "test_2017_flickr"]
    assert result["test_bleu"]["test"]["src2tgt"]["reranked_gap"] is None  # a run that scored no reranked beam
    assert {"greedy_src2tgt_test_2017_flickr", "greedy_tgt2src_test_2017_flickr"} <= set(result["targets"])
    for name in ("test", "test_2017_flickr"):
        gaps = result["test_bleu"][name]
        assert gaps["tgt2src"]["greedy_gap"] > 0 and gaps["src2tgt"]["greedy_gap"] > pipeline_summary.GREEDY_GAP
        paired = gaps["src2tgt"]["paired_bootstrap"]
        assert paired["delta"] == pytest.approx(-gaps["src2tgt"]["greedy_gap"], abs=0.011) and paired["p_value"] < 0.05
        assert paired["greedy_ci95"] > 0 and paired["samples"] == pipeline_summary.BOOTSTRAP_SAMPLES
    assert result["targets"]["greedy_src2tgt"] is False and result["targets"]["greedy_src2tgt_test_2017_flickr"] is False
    assert "| test_2017_flickr | greedy − teacher (p; greedy ±95 %) |" in pipeline_summary.markdown(result)
    json.dumps(result)  # what main prints and writes
