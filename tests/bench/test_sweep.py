import json

import pytest

from bench import sweep


def packing_report(rates: dict[int, float], cores: int = 16) -> dict:
    return {"cores": cores, "packings": [{"trials": n, "threads_per_trial": cores // n, "updates_per_s": rate,
                                          "tokens_per_s": rate * 1000, "wall_s": 40.0, "runs": []}
                                         for n, rate in rates.items()]}


def test_the_sizing_packs_the_most_trials_within_5_percent_of_the_best_rate_and_fits_their_waves_in_the_budget():
    report = packing_report({1: 10.0, 2: 18.0, 4: 24.0, 8: 23.5})  # 8 is within 5 % of 4's 24 updates/s
    sized = sweep.size(report, trials=8, budget_s=445.0, fixed_s=45.0, start_s=30.0, cores=16)
    o = sized["overrides"]
    assert o["tune.max_concurrent"] == 8 and o["train.gpus_per_worker"] == 0.125 and o["train.cpus_per_worker"] == 2
    assert sized["reasoning"]["waves"] == 1 and o["tune.num_samples"] == 8
    assert o["train.max_time"] == int((445 - 45 - 30) * 0.92)  # one wave: all but Ray, the data and a group's start
    assert o["train.max_steps"] == int(o["train.max_time"] * 23.5 / 8)  # what a packed trial's rate buys
    assert o["train.validate_every"] == o["train.max_steps"] // 8 and o["tune.grace_period"] == o["train.max_steps"] // 4
    assert any("seed" in line for line in sized["cannot_decide"])
    # 8 well below the best: 4 at once, two waves, each half the time
    halved = sweep.size(packing_report({1: 10.0, 2: 18.0, 4: 24.0, 8: 20.0}), 8, 445.0, 45.0, 30.0, 16)
    assert halved["overrides"]["tune.max_concurrent"] == 4 and halved["reasoning"]["waves"] == 2
    assert halved["overrides"]["train.max_time"] == int(((445 - 45) / 2 - 30) * 0.92)
    # never more at once than there are trials
    assert sweep.size(report, 2, 445.0, 45.0, 30.0, 16)["overrides"]["tune.max_concurrent"] == 2


def test_a_budget_that_leaves_no_training_is_refused_with_what_to_change():
    with pytest.raises(SystemExit, match="give the sweep more time or fewer trials"):
        sweep.size(packing_report({1: 10.0}), trials=8, budget_s=200.0, fixed_s=45.0, start_s=30.0, cores=16)


def test_size_prints_the_overrides_a_tune_command_takes(tmp_path, capsys):
    (tmp_path / "P.json").write_text(json.dumps(packing_report({1: 10.0, 2: 19.0})), encoding="utf-8")
    assert sweep.main(["size", "--packing", str(tmp_path / "P.json"), "--budget-s", "400", "--trials", "4",
                       "--out", str(tmp_path / "S.json")]) == 0
    lines = capsys.readouterr().out.split()
    assert "tune.max_concurrent=2" in lines and all("=" in line for line in lines)
    assert json.loads((tmp_path / "S.json").read_text())["overrides"]["tune.max_concurrent"] == 2
