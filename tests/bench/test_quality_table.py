"""bench.quality_table: the one table built from the committed bench.quality reports (real H100 numbers)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import quality_table

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
TEACHERS, REDER = RESULTS / "quality_teachers_h100.json", RESULTS / "quality_reder_h100.json"


def test_rows_carry_the_reports_numbers_and_the_cost_of_kd():
    teachers, reder = json.loads(TEACHERS.read_text()), json.loads(REDER.read_text())
    table = {(row["system"], row["decoder"]): row for row in quality_table.rows(teachers, [reder])}
    beam = table[("AR teachers (one per direction; the KD source)", "beam 4")]
    assert beam["test_2016_flickr.src2tgt"] == teachers["teacher_beam4"]["test_2016_flickr.src2tgt"]
    assert beam["speedup_vs_teacher_beam4_batch1"] == 1.0 and beam["updates"] == "3000 + 3000"
    teacher_s = teachers["train_src2tgt"]["seconds"] + teachers["train_tgt2src"]["seconds"]
    kd, raw = table[("REDER + KD, FBA + CC", "greedy")], table[("REDER, no KD, FBA + CC", "greedy")]
    assert kd["test_2017_flickr.tgt2src"] == reder["kd"]["greedy"]["test_2017_flickr.tgt2src"]
    assert kd["roundtrip_bleu_src"] == reder["kd"]["roundtrip_bleu_src"]
    # a KD model costs its own training plus both teachers and the distillation; without KD, its own only
    assert kd["total_s"] == round(reder["kd"]["train"]["seconds"] + teacher_s + teachers["distill_seconds"])
    assert raw["total_s"] == round(reder["raw"]["train"]["seconds"])
    # measured in the same process as the teachers' beam 4 when the reder phase had them, else from its own phase
    assert kd["speedup_vs_teacher_beam4_batch1"] == round(
        teachers["speed"]["teacher_beam4_latency_ms"] / reder["kd"]["speed"]["greedy_latency_ms"], 2)


def test_markdown_and_files(tmp_path, capsys):
    out = tmp_path / "table"
    text = quality_table.main([str(TEACHERS), str(REDER), "--out", str(out)])
    assert out.with_suffix(".md").read_text() == text
    assert "| REDER + KD, no FBA/CC | greedy | 31.62 / 59.2 | 35.43 / 56.4 |" in text
    assert len(json.loads(out.with_suffix(".json").read_text())["rows"]) == 2 + 3


@pytest.mark.parametrize("change, message", [
    ({"device": "cpu"}, "one table holds one device's numbers"),
    ({"phase": "teachers"}, "not a bench.quality 'reder' report"),
])
def test_mixed_devices_and_wrong_reports_are_errors_naming_the_file(tmp_path, capsys, change, message):
    bad = tmp_path / "reder.json"
    bad.write_text(json.dumps({**json.loads(REDER.read_text()), **change}))
    with pytest.raises(SystemExit):
        quality_table.main([str(TEACHERS), str(bad)])
    error = capsys.readouterr().err
    assert message in error and str(bad) in error


def test_baseline_teachers_are_rows_without_kd_cost(capsys):
    teachers = json.loads(TEACHERS.read_text())
    text = quality_table.main([str(TEACHERS), str(REDER), "--baseline", str(TEACHERS)])
    seconds = round(teachers["train_src2tgt"]["seconds"] + teachers["train_tgt2src"]["seconds"])
    assert "| AR teachers (one per direction; baseline only) | beam 4 | 37.41 / 62.2 |" in text
    assert text.count(f"| 3000 + 3000 | {seconds} | {seconds} |") == 4  # KD source and baseline, beam 4 and greedy


def test_every_quality_variant_has_a_label():
    from bench import quality

    assert set(quality_table.LABELS) == set(quality.VARIANTS)


def test_an_averaged_model_is_published_first_and_its_last_update_labelled(capsys):
    """A reder report made with --validate-every (CPU, KD without FBA/CC): the averaged model's greedy row
    carries the round trip and the speed; the last update's row comes after it, labelled, without either."""
    teachers, reder = RESULTS / "quality_teachers800_kd_cpu.json", RESULTS / "quality_reder_kd800_cpu.json"
    entry = json.loads(reder.read_text())["kd_noaux"]
    table = quality_table.rows(json.loads(teachers.read_text()), [json.loads(reder.read_text())])
    published, last = table[-2], table[-1]
    assert published["decoder"] == "greedy" and last["decoder"] == "greedy, last update (not averaged)"
    assert published["test_2016_flickr.tgt2src"] == entry["greedy"]["test_2016_flickr.tgt2src"]
    assert last["test_2016_flickr.tgt2src"] == entry["last_update_greedy"]["test_2016_flickr.tgt2src"]
    assert published["roundtrip_bleu_src"] == entry["roundtrip_bleu_src"] and last["roundtrip_bleu_src"] is None
    assert last["latency_ms"] is None and published["latency_ms"] == entry["speed"]["greedy_latency_ms"]
    text = quality_table.main([str(teachers), str(reder)])
    assert "the average of its best 3 checkpoints by validation BLEU (scored every 100 updates)" in text
    assert "FBA + CC from" not in text  # the report's only variant trains without them


def test_models_trained_together_and_timed_alone_afterwards(capsys):
    """The H100 run of bench/quality_gpu.sh: REDERs trained with --no-speed, then timed by the speed phase
    (kd_noaux) or not at all (kd, whose timing was cut off): the untimed rows show no speed, never a guess."""
    teachers = RESULTS / "quality_teachers3000_h100.json"
    reders = [RESULTS / f"quality_reder3000_{variant}_h100.json" for variant in ("kd", "kd_noaux")]
    kd, kd_noaux = (json.loads(path.read_text()) for path in reders)
    table = {(row["system"], row["decoder"]): row
             for row in quality_table.rows(json.loads(teachers.read_text()), [kd, kd_noaux])}
    rerank = table[("REDER + KD, FBA + CC", "CTC beam 20 + teacher rerank")]
    assert "speed" not in kd["kd"] and rerank["latency_ms"] is None and rerank["speedup_vs_teacher_beam4_batch1"] is None
    assert rerank["test_2016_flickr.src2tgt"] == kd["kd"]["beam20_rerank"]["test_2016_flickr.src2tgt"]
    timed = table[("REDER + KD, no FBA/CC", "greedy")]  # the speed-up measured beside the teachers, in one process
    assert timed["speedup_vs_teacher_beam4_batch1"] == kd_noaux["kd_noaux"]["speed"]["speedup_greedy_vs_teacher_beam4_batch1"]
    assert ", 3000 updates or 700 s, FBA + CC from update 1500," in quality_table._sources(
        json.loads(teachers.read_text()), [{**kd, "time_cap_s": 700}], [])  # a report that records its time cap
    text = quality_table.main([str(teachers), *map(str, reders)])
    assert text.count("timed alone by bench.quality speed") == 1 and "| CTC beam 20 + teacher rerank | 37.68 / 63.0 |" in text


def test_a_model_timed_without_the_teachers_is_compared_with_the_teachers_phase_timing(capsys):
    """The H100 DAG run: trained and timed alone, without the teachers' models (the speed-up is against the
    teachers phase's own timing, and the sources line says so); the last update, stopped by the time cap
    between validations, was among the averaged checkpoints."""
    teachers = json.loads((RESULTS / "quality_teachers3000_h100.json").read_text())
    dag = json.loads((RESULTS / "quality_reder3000_dag_kd_noaux_h100.json").read_text())
    assert not dag["teachers_loaded"] and dag["dag_kd_noaux"]["averaged"][0]["step"] == dag["dag_kd_noaux"]["train"]["steps"]
    table = {(row["system"], row["decoder"]): row for row in quality_table.rows(teachers, [dag])}
    lookahead = table[("REDER-DAG + KD, no FBA/CC", "lookahead")]
    assert lookahead["speedup_vs_teacher_beam4_batch1"] == round(
        teachers["speed"]["teacher_beam4_latency_ms"] / dag["dag_kd_noaux"]["speed"]["lookahead_latency_ms"], 2)
    assert "timed without the teachers (speed-up against the teachers phase's timing)" in \
        quality_table._sources(teachers, [dag], [])
    kd = json.loads((RESULTS / "quality_reder3000_kd_noaux_h100.json").read_text())
    assert "timed without the teachers" not in quality_table._sources(teachers, [kd], [])
