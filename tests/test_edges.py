"""EDGES=True's walks (reservoir/studies/frontier/edges.py): which edges an envelope point sits on, the step
beyond each, and where a walk ends, from records alone. The stage end to end: tests/test_frontier_study.py."""

import math

import pytest

from reservoir.studies.frontier.edges import edge_walks, edges_of, parse_cell, step_beyond, walk
from reservoir.studies.frontier.grid import DEFAULTS, Cell

GRID = {**DEFAULTS, "FAMILIES": ["transformer++", "lstm"]}  # xs..l, 1.5e-3..1.2e-2, batches 8 and 16


def test_the_step_beyond_each_edge_is_the_next_preset_half_or_twice_the_rate_or_the_batch():
    cell = Cell("transformer++", "xs", 1.5e-3, 8)
    assert step_beyond(cell, "size", -1) == Cell("transformer++", "xxs", 1.5e-3, 8)
    assert step_beyond(Cell("lstm", "l", 6e-3, 16), "size", +1).size == "xl"
    assert step_beyond(Cell("lstm", "xl", 6e-3, 16), "size", +1) is None  # no preset beyond xl
    assert step_beyond(Cell("lstm", "xxs", 6e-3, 16), "size", -1) is None
    assert step_beyond(cell, "learning_rate", -1).learning_rate == 7.5e-4
    assert step_beyond(cell, "learning_rate", +1).learning_rate == 3e-3
    assert step_beyond(cell, "batch_size", -1).batch_size == 4 and step_beyond(cell, "batch_size", +1).batch_size == 16
    assert step_beyond(Cell("lstm", "s", 6e-3, 1), "batch_size", -1) is None  # no batch below 1
    assert step_beyond(Cell("lstm", "s", 6e-3, 3), "batch_size", -1) is None  # not half of 3


def test_a_point_sits_on_the_edges_its_values_end_a_list_of_several():
    assert edges_of(Cell("transformer++", "xs", 1.5e-3, 8), GRID) == [("size", -1), ("learning_rate", -1),
                                                                      ("batch_size", -1)]
    assert edges_of(Cell("lstm", "l", 1.2e-2, 16), GRID) == [("size", 1), ("learning_rate", 1), ("batch_size", 1)]
    assert edges_of(Cell("lstm", "s", 3e-3, 16), GRID) == [("batch_size", 1)]
    one = {**GRID, "SIZES": ["xs"], "LEARNING_RATES": [3e-3], "BATCH_SIZES": [8]}  # one value: a choice, no range
    assert edges_of(Cell("lstm", "xs", 3e-3, 8), one) == []


def test_a_walk_follows_better_steps_and_ends_on_the_first_worse_one():
    start = Cell("lstm", "xs", 1.5e-3, 8)
    rates = {7.5e-4: 1.90, 3.75e-4: 1.95}  # the first step beats the point (2.00), the second does not
    row = walk(start, 2.0, "learning_rate", -1, lambda c: rates.get(c.learning_rate), {}, 1e12)
    assert [s["value"] for s in row["steps"]] == [7.5e-4, 3.75e-4] and row["end"] == "worse"
    assert row["moved"] == pytest.approx(-0.10) and row["next"] is None
    worse = walk(start, 1.8, "learning_rate", -1, lambda c: rates.get(c.learning_rate), {}, 1e12)
    assert len(worse["steps"]) == 1 and worse["end"] == "worse" and worse["moved"] == 0
    # a step not run yet is the walk's next; one that cannot train at the budget ends it, with why
    pending = walk(start, 2.0, "learning_rate", -1, lambda c: None, {}, 1e12)
    assert pending["end"] == "not run yet" and pending["next"] == Cell("lstm", "xs", 7.5e-4, 8)
    cannot = {f"{Cell('lstm', 'xs', 1.5e-3, 4).name}@{1e12!r}": "250 steps < 300"}
    ended = walk(start, 2.0, "batch_size", -1, lambda c: None, cannot, 1e12)
    assert ended["end"] == "cannot train" and ended["steps"][0]["why"] == "250 steps < 300"
    # a diverged step is worse than any score; past the last preset the walk ends
    assert walk(start, 2.0, "size", -1, lambda c: math.inf, {}, 1e12)["end"] == "worse"
    smallest = walk(Cell("lstm", "xxs", 1.5e-3, 8), 2.0, "size", -1, lambda c: 1.0, {}, 1e12)
    assert smallest["end"] == "no preset beyond" and smallest["steps"] == []


def test_the_walks_start_from_each_familys_first_seed_best_and_read_the_steps_records():
    def row(cell, budget, bpc, seed=1337, extra=False):
        return {"cell": cell.name, "family": cell.family, "size": cell.size, "learning_rate": cell.learning_rate,
                "batch_size": cell.batch_size, "budget": budget, "val_bpc": bpc, "seed": seed, "envelope_seed": extra}

    best, other = Cell("lstm", "s", 3e-3, 8), Cell("lstm", "m", 3e-3, 8)
    rows = [row(best, 1e12, 2.0), row(other, 1e12, 2.1), row(best, 1e12, 1.0, seed=1338, extra=True)]
    steps = [row(Cell("lstm", "s", 3e-3, 4), 1e12, 2.05)]
    walks = edge_walks(rows, steps, GRID, [1e12], 1337, {})
    assert [(w["family"], w["cell"], w["axis"], w["end"]) for w in walks] == [("lstm", best.name, "batch_size",
                                                                                "worse")]
    assert walks[0]["val_bpc"] == 2.0  # the first seed's score, not the extra seed's
    # the point trained again beside its steps (its record is another processor's): the walk reads that score
    (beside,) = edge_walks(rows, [*steps, row(best, 1e12, 2.10)], GRID, [1e12], 1337, {})
    assert (beside["val_bpc"], beside["recorded_bpc"], beside["trained_beside"]) == (2.10, 2.0, True)
    assert beside["moved"] == pytest.approx(-0.05) and beside["next"] == Cell("lstm", "s", 3e-3, 2)


def test_a_steps_folder_names_its_cell_or_is_refused():
    for cell in (Cell("transformer++", "xxs", 7.5e-4, 4), Cell("frozen_retention", "xl", 2.4e-2, 32)):
        assert parse_cell(cell.name) == cell
    for name in ("logs", "transformer++-xs-lr0.003", "nosuch-xs-lr0.003-b8", "lstm-huge-lr0.003-b8"):
        assert parse_cell(name) is None


def test_the_reports_summary_counts_the_edges_walked_and_the_walks_not_run_yet():
    from reservoir.studies.frontier.report import _edges

    point = {"cell": "lstm-s-lr0.003-b8", "family": "lstm", "size": "s", "learning_rate": 3e-3, "batch_size": 8,
             "budget": 1e12, "val_bpc": 2.0, "seed": 1337, "envelope_seed": False}
    step = {**point, "cell": "lstm-s-lr0.003-b4", "batch_size": 4, "val_bpc": 2.05}

    def summary(steps, sd=None):
        report = {"families": ["lstm"], "edges": {"max_tokens_per_param": 300,
                                                  "walks": edge_walks([point], steps, GRID, [1e12], 1337, {})},
                  "envelope": {"lstm": [{"budget": 1e12, "bpc_sd": sd}]}}
        return [line for line in _edges(report, "##") if line and not line.startswith(("|", "#", "Each"))]

    assert summary([]) == ["1 walks are not finished: the study's command with EDGES=True continues them."]
    assert summary([step]) == ["At none of the 1 edges walked did the step beyond beat the point."]


def test_a_step_that_beats_its_point_by_less_than_the_seeds_spread_does_not_ask_the_grid_to_grow():
    """A one-seed walk found batch 32 better by 0.018 (Shakespeare, 7.8e12) where the point's seeds spread by 0.022,
    and the report said the grid should grow: grown (75 points), batch 32 scored worse in the grid."""
    from reservoir.studies.frontier.report import _edges

    point = {"cell": "lstm-s-lr0.003-b8", "family": "lstm", "size": "s", "learning_rate": 3e-3, "batch_size": 8,
             "budget": 1e12, "val_bpc": 2.0, "seed": 1337, "envelope_seed": False}
    steps = [{**point, "cell": "lstm-s-lr0.003-b4", "batch_size": 4, "val_bpc": 1.982},
             {**point, "cell": "lstm-s-lr0.003-b2", "batch_size": 2, "val_bpc": 2.1}]

    def report(sd):
        walks = edge_walks([point], steps, GRID, [1e12], 1337, {})
        return _edges({"families": ["lstm"], "edges": {"max_tokens_per_param": 300, "walks": walks},
                       "envelope": {"lstm": [{"budget": 1e12, "bpc_sd": sd}]}}, "##")

    within = report(0.022)
    assert "| **-0.018** (seeds' sd 0.022; grow BATCH_SIZES; then a worse step) |" in within[-3]
    assert within[-1] == ("1 of 1 edges held the point back on its first seed; the most, lstm at 1e+12 FLOPs, by "
                          "-0.018 bits/char. None by more than the envelope point's seeds' sd: within it one seed "
                          "cannot tell the step from the point, and growing the grid there may move no envelope.")
    beyond = report(0.005)[-1]
    assert beyond.endswith("1 of them by more than the envelope point's seeds' sd (lstm at 1e+12): the grid should "
                           "grow there (a grid list may grow).")
    assert report(None)[-1] == beyond  # one seed: no spread to weigh the step against
