"""The position and recall splits of reservoir/studies/diagnostics.py on streams whose answer is known."""

import numpy as np

from reservoir.studies.diagnostics import recall_mask, story_positions


def test_positions_restart_after_every_end_of_story():
    stream = np.array([5, 6, 7, 0, 5, 6, 0, 0, 9])
    assert story_positions(stream, eot_id=0).tolist() == [1, 2, 3, 4, 1, 2, 3, 1, 1]


def test_recall_marks_a_repeat_within_its_story_only():
    #                  0  1  2  3  4  5  6  7  8  9 10 11 12
    stream = np.array([1, 2, 3, 4, 1, 2, 3, 4, 0, 1, 2, 3, 4])
    expected = [False] * 6 + [True, True] + [False] * 5  # (1,2,3) and (2,3,4) again; story 2 starts afresh
    assert recall_mask(stream, eot_id=0, k=2).tolist() == expected
    assert not recall_mask(stream, eot_id=0, k=4).any()  # no 5-gram repeats in a story


def test_recall_on_text_without_story_boundaries_looks_back_over_the_whole_stream():
    stream = np.array([3, 4, 5] * 4)
    assert recall_mask(stream, eot_id=0, k=2).tolist() == [False] * 5 + [True] * 7  # from the 2nd (3,4,5)
