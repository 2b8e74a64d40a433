"""pipeline.metrics: the best setting of a swept knob."""
from pipeline.metrics import best_setting


def test_best_setting_is_the_highest_score_and_of_equals_the_one_nearest_zero():
    assert best_setting({0.0: 5.0, 1.0: 7.0, 2.0: 6.0}) == 1.0
    assert best_setting({-1.0: 7.0, 0.0: 5.0, 1.0: 7.0, 3.0: 7.0}) == -1.0  # |−1| = |1|: then the smaller
    assert best_setting({0.0: 7.0, 0.5: 7.0}) == 0.0
    assert best_setting({2.0: 1.0}) == 2.0
