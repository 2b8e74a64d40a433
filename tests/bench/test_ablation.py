import json

import pytest

from bench import ablation, quality
from tests.bench.conftest import TINY


def test_the_ablation_trains_each_technique_beside_its_seeds_baseline_and_compares_them(multi30k_slice, tmp_path, capsys):
    common = ["--data-dir", str(multi30k_slice), "--max-tokens", "600", "--warmup", "1", *TINY]
    quality.main(["teachers", "--out", str(tmp_path / "T"), "--steps", "2", *common])
    assert ablation.main(["--from", str(tmp_path / "T"), "--out", str(tmp_path / "A"), "--steps", "5",
                          "--techniques", "nmla", "ratio3", "references", "--seeds", "1", "2", "--third-seed", "3",
                          *common]) == 0
    report = json.loads((tmp_path / "A" / "ablation.json").read_text(encoding="utf-8"))
    runs = {(entry["technique"], entry["seed"]): entry for entry in report["runs"]}
    assert {("baseline", 1), ("baseline", 2), ("nmla", 1), ("nmla", 2), ("ratio3", 1), ("ratio3", 2)} <= set(runs)
    assert runs["nmla", 1]["loss_overrides"] == {"nmla_start_step": 4, "nmla_ngram": 2}  # 0.8 × 5 updates
    assert runs["ratio3", 1]["model_overrides"] == {"upsample_ratio": 3}
    assert runs["references", 1]["references"] and not runs["baseline", 1]["references"]
    assert runs["references", 1]["train_pairs"] == 2 * runs["baseline", 1]["train_pairs"]  # the KD pairs, then the references
    for entry in runs.values():
        assert entry["train"]["steps"] == 5 and entry["seconds_per_update"] > 0 and entry["cpu_seconds_per_update"] > 0
    # a tiny model's BLEU differences are noise: every technique's cells are open, so the third seed ran for each
    for technique in ("nmla", "ratio3"):
        assert list(report["paired"][technique]) == ["1", "2", "3"] and (technique, 3) in runs
        for seed, cells in report["paired"][technique].items():
            for cell, test in cells.items():
                assert test["system"] == runs[technique, int(seed)]["greedy"][cell]
                assert test["baseline"] == runs["baseline", int(seed)]["greedy"][cell]
        for cell, summary in report["over_seeds"][technique].items():
            deltas = [report["paired"][technique][s][cell]["delta"] for s in ("1", "2", "3")]
            assert summary["mean_delta"] == round(sum(deltas) / 3, 2)
    assert ("baseline", 3) in runs and sum(1 for key in runs if key == ("baseline", 3)) == 1
    table = capsys.readouterr().out
    assert "| nmla | 3 |" in table and "| ratio3 | 3 |" in table
    cost = sum(runs["nmla", s]["cpu_seconds_per_update"] for s in (1, 2, 3)) / 3
    base = sum(runs["baseline", s]["cpu_seconds_per_update"] for s in (1, 2, 3)) / 3
    assert f"| {cost:.3f} ({cost / base:.2f}×) |" in next(line for line in table.splitlines() if line.startswith("| nmla |"))
    # runs kept before the CPU time was measured (wall time only, which pauses inflate) are left out of the cost
    older = {**report, "runs": [{k: v for k, v in entry.items() if k != "cpu_seconds_per_update" or entry["technique"] != "nmla"}
                                for entry in report["runs"]]}
    assert next(line for line in ablation.summary(older).splitlines() if line.startswith("| nmla |")).endswith("| — |")
    assert ablation.main(["--out", str(tmp_path / "A"), "--summary"]) == 0
    assert "| nmla | 3 |" in capsys.readouterr().out
    # run again: every model is kept from A/runs, none trained, the same comparisons
    again = ["--from", str(tmp_path / "T"), "--out", str(tmp_path / "A"), "--techniques", "nmla", "ratio3", "references",
             "--seeds", "1", "2", "--third-seed", "3", *common]
    assert ablation.main([*again, "--steps", "5"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("kept: ") == 12 and '"technique"' not in printed
    rerun = json.loads((tmp_path / "A" / "ablation.json").read_text(encoding="utf-8"))
    assert rerun["paired"] == report["paired"] and rerun["runs"] == report["runs"]
    # a kept run made with other arguments is refused, naming its file and what differs
    with pytest.raises(SystemExit, match=r"runs/baseline-1\.json: made with other arguments \(steps differ\)"):
        ablation.main([*again, "--steps", "6"])


def test_a_third_seed_is_wanted_only_where_two_leave_a_cell_open():
    settled = [{"a": {"delta": 1.2, "p_value": 0.01}, "b": {"delta": -0.8, "p_value": 0.02}},
               {"a": {"delta": 0.9, "p_value": 0.03}, "b": {"delta": -1.1, "p_value": 0.001}}]
    assert not ablation.unsettled(settled)
    for cell, change in (("a", {"delta": -0.3}), ("a", {"p_value": 0.2}), ("b", {"delta": 0.0})):
        opened = [dict(pair) for pair in settled]
        opened[1] = {**opened[1], cell: {**opened[1][cell], **change}}
        assert ablation.unsettled(opened), (cell, change)
