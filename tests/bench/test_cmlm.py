"""bench.cmlm's table: one row per decoder, the speed-up over the teachers' beam 4 from the same process's
timings, and the training cost of the models behind a row (refinement: REDER and the CMLMs)."""
from bench import cmlm

CELLS = ("test_2016_flickr.src2tgt", "test_2016_flickr.tgt2src", "test_2017_flickr.src2tgt", "test_2017_flickr.tgt2src")


def test_the_table_has_a_row_per_decoder_with_its_speed_up_and_cost():
    names = ("teacher_beam4", "greedy", "greedy_refine2", "cmlm_T4")
    report = {"length_beam": 5,
              "scores": {name: {cell: {"bleu": 10.0 + i, "chrf": 40.0} for cell in CELLS} for i, name in enumerate(names)},
              "speed": {**{f"{name}_latency_ms": latency for name, latency in zip(names, (80.0, 10.0, 20.0, 40.0))},
                        **{f"{name}_sentences_per_s": 100.0 for name in names}},
              "training": {"teachers": {"updates": 300, "seconds": 900.0}, "reder": {"updates": 300, "seconds": 1500.0},
                           "cmlm": {"updates": 300, "seconds": 600.0}}}
    rows = cmlm.table(report).splitlines()[2:]
    assert len(rows) == 4
    assert rows[0].startswith("| AR teachers, beam 4 | 10.00 / 40.0") and "| 1.00× | 300 ×2 | 900 |" in rows[0]
    assert rows[1].startswith("| REDER + KD, greedy |") and "| 8.00× | 300 | 1,500 |" in rows[1]
    assert rows[2].startswith("| REDER greedy + 2 CMLM refinement step(s) |") and "| 4.00× | 300 + 300 ×2 | 2,100 |" in rows[2]
    assert rows[3].startswith("| CMLM mask-predict, T = 4, l = 5 |") and "| 2.00× | 300 ×2 | 600 |" in rows[3]
    del report["training"]["cmlm"]
    assert cmlm.table(report).splitlines()[5].endswith("| – | – |")  # a cost not known is not guessed
