"""HELD=True's walks (reservoir/studies/frontier/held.py): each envelope point one step along each setting the grid
holds, a step that beats it by more than its seeds' sd trained on the other seeds, and the envelope taking one that
holds there; on the committed micro study's records, in this process."""

import json
import math
import shutil

import pytest

from reservoir.config import parse_overrides
from reservoir.run.records import signed
from reservoir.studies.frontier.edges import parse_cell
from reservoir.studies.frontier.grid import Cell
from reservoir.studies.frontier.held import held_axes, held_folder, held_steps, held_walk, held_walks, step_held
from reservoir.studies.frontier.records import read_study_file
from tests.conftest import ROOT
from tests.test_study_records import _study_from

FIXTURE = ROOT / "tests" / "fixtures" / "studies" / "micro"
MICRO = ["STUDY=micro", "FAMILIES=transformer++,linear_reservoir", "SIZES=xs", "LEARNING_RATES=4e-3",
         "BATCH_SIZES=8", "BUDGETS=3e9,6e9", "LEAD_BUDGET=1.2e10", "REFERENCES=True", "CONTROLS=True", "MIN_STEPS=20",
         "MAX_TOKENS_PER_PARAM=1000", "ENVELOPE_SEEDS=2", "DATASET=synthetic", "SYNTHETIC_STORIES=300", "SEQ_LEN=32",
         "EVAL_TOKENS=2048", "FINAL_EVAL_TOKENS=4096", "TRAIN_EVAL_TOKENS=4096", "SAMPLE_TOKENS=20", "WARMUP_STEPS=5"]
POINT = Cell("transformer++", "xs", 4e-3, 8)


def beta2(value: float, cell: Cell = POINT, tokens: int = 256) -> Cell:
    """A β2 step: ``value`` per ``tokens`` (the micro study's largest batch, 8 x 32 tokens)."""
    return step_held(step_held(cell, "adam_beta2", value), "adam_beta2_tokens", tokens)


def test_a_step_sets_one_held_setting_in_its_name_and_its_settings():
    step = step_held(POINT, "adam_beta2", 0.99)
    assert step.name == "transformer++-xs-lr0.004-b8-beta2_0.99" and parse_cell(step.name) == step
    both = step_held(step_held(Cell("lstm", "s", 3e-3, 2), "weight_decay", 0.1), "dropout", 0.2)
    assert parse_cell(both.name) == both and both.name.endswith("-b2-wd0.1-drop0.2")
    config = parse_overrides([*step_held(step, "dropout", 0.1).settings(), "WEIGHT_DECAY=0.3"])
    assert (config["ADAM_BETA2"], config["TRANSFORMER"]["dropout"], config["WEIGHT_DECAY"]) == (0.99, 0.1, 0.3)
    assert "held" not in POINT.record() and step.record()["held"] == {"adam_beta2": 0.99}
    per_token = beta2(0.95, tokens=2048)
    assert per_token.name.endswith("-beta2_0.95-per2048") and parse_cell(per_token.name) == per_token
    assert parse_overrides(per_token.settings())["ADAM_BETA2_REF_TOKENS"] == 2048


def test_adam_s_beta2_is_stepped_per_token_where_it_changes_the_point_s_own():
    """From a β2 of 0.95 a step: per the tokens of a step at the grid's largest batch (16 x 128), 0.95 raises the
    β2 of a smaller batch only (batch 2: 0.95 ** (256 / 2048) = 0.9936); 0.99 and 0.999 raise every batch's."""
    config = parse_overrides([])
    small, largest = Cell("lstm", "s", 6e-3, 2), Cell("lstm", "l", 6e-3, 16)
    assert held_steps(small, "adam_beta2", config, 16) == [beta2(v, small, 2048) for v in (0.95, 0.99, 0.999)]
    assert held_steps(largest, "adam_beta2", config, 16) == [beta2(v, largest, 2048) for v in (0.99, 0.999)]
    assert parse_overrides(beta2(0.95, small, 2048).settings())["ADAM_BETA2"] == 0.95
    # a study that holds β2 per token already steps it on from there
    own = parse_overrides(["ADAM_BETA2_REF_TOKENS=1024", "ADAM_BETA2=0.99"])
    assert held_steps(small, "adam_beta2", own, 16) == [beta2(0.999, small, 1024)]
    assert held_steps(small, "weight_decay", config, 16) == [step_held(small, "weight_decay", v)
                                                              for v in (0.1, 0.3, 1.0)]


def test_dropout_is_walked_only_where_the_model_has_it():
    config = parse_overrides([])
    assert held_axes(POINT, config) == ["adam_beta2", "weight_decay", "dropout"]
    assert held_axes(Cell("lstm", "s", 3e-3, 2), config) == ["adam_beta2", "weight_decay"]  # one layer: none between
    assert held_axes(Cell("esn+softmax", "s", 3e-3, 2), config) == ["adam_beta2", "weight_decay"]
    assert held_axes(Cell("lstm", "s", 3e-3, 2), parse_overrides(["LSTM.layers=2"]))[-1] == "dropout"


def test_a_step_within_the_seeds_spread_ends_its_walk_and_one_beyond_it_asks_for_the_other_seeds():
    firsts = {0.99: 1.95, 0.999: 1.90}

    ladder = [step_held(POINT, "adam_beta2", v) for v in (0.99, 0.999)]

    def walk(sd, means):
        def value(c):
            return dict(c.held)["adam_beta2"]

        return held_walk(POINT, ladder, {"bpc": 2.0, "mean": 2.01, "sd": sd}, "adam_beta2",
                         lambda c: firsts.get(value(c)), lambda c: means.get(value(c)))

    within = walk(0.08, {})
    assert (within["end"], within["next"], within["moved"]) == ("within the seeds' sd", None, 0.0)
    asks = walk(0.02, {})
    assert asks["end"] == "seeds not run yet" and asks["next_seeds"] and asks["next"] == step_held(POINT, "adam_beta2",
                                                                                                    0.99)
    # held on its seeds: walked on to 0.999, which beats it too, and past the ladder's end
    on = walk(0.02, {0.99: 1.96, 0.999: 1.93})
    assert [s["value"] for s in on["steps"]] == [0.99, 0.999] and on["end"] == "no value beyond"
    assert on["best_cell"].endswith("-beta2_0.999") and on["moved"] == pytest.approx(1.93 - 2.01)
    lost = walk(0.02, {0.99: 2.02})  # its first seed beat the point; its mean does not
    assert lost["end"] == "not on its seeds" and lost["moved"] == 0.0 and lost["next"] is None
    assert walk(0.02, {0.99: math.inf})["end"] == "not on its seeds"  # a diverged seed
    first_diverged = held_walk(POINT, ladder, {"bpc": 2.0, "mean": 2.01, "sd": 0.02}, "adam_beta2", lambda c: math.inf,
                               lambda c: None)
    assert first_diverged["end"] == "worse" and first_diverged["steps"][0]["val_bpc"] is None


@pytest.fixture
def micro(tmp_path):
    """The committed micro study with HELD=True (its records name no processor: each point is trained again beside
    its steps)."""
    shutil.copytree(FIXTURE, tmp_path / "micro")
    study = _study_from([*MICRO, "HELD=True"], tmp_path)[2]()
    recorded = read_study_file(study.path)["plan"]
    study.write_study_file({cell: {float(b): why for b, why in row.items()} for cell, row in recorded.items()})
    return study


def _record(study, cell: Cell, budget: float, val_bpc=None, seeds: bool = False) -> None:
    """``cell``'s point at ``budget`` as if trained here: the envelope point's record, its score ``val_bpc`` (None:
    the point's own)."""
    source, folder = study.folder(POINT, budget, seeds), held_folder(study.path, cell, budget, seeds)
    folder.mkdir(parents=True)
    shutil.copy(source / "config.json", folder / "config.json")
    summary = json.loads((source / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps([signed({**r, "val_bpc": r["val_bpc"] if val_bpc is None
                                                             else val_bpc}) for r in summary]))


def test_the_plan_lists_the_held_walks_points_as_the_command_starts_them(micro):
    from reservoir.studies.frontier.plan import after_grid_stages

    walks = micro.held_walks()
    # each family's point at the grid's top budget and the lead budget; dropout for the transformer alone
    assert sorted((w["family"], w["budget"], w["axis"]) for w in walks) == sorted(
        (f, b, a) for b in (6e9, 1.2e10) for f, axes in (("transformer++", ("adam_beta2", "weight_decay", "dropout")),
                                                         ("linear_reservoir", ("adam_beta2", "weight_decay")))
        for a in axes)
    started = []

    def run_points(jobs, *args, **kwargs):
        started.extend(jobs)
        raise SystemExit("stopped after the first round")

    with pytest.raises(SystemExit):
        micro._run_held(run_points)
    jobs = micro.held_jobs(walks)
    assert [(folder, args) for folder, args in started] == [(job.folder, job.args) for job in jobs]
    assert all(job.folder.parent.parent == micro.path / "held" for job in jobs)
    # each walk's first step, and each point once beside them (its record names no processor)
    expected = {held_folder(micro.path, c, w["budget"]) for w in walks for c in (w["next"], parse_cell(w["cell"]))}
    assert sorted(job.folder for job in jobs) == sorted(expected)
    step = beta2(0.99)  # the point's batch is the grid's largest: 0.95 per its tokens would be no step
    args = next(a for f, a in started if f == held_folder(micro.path, step, 6e9))
    assert {"ADAM_BETA2=0.99", "ADAM_BETA2_REF_TOKENS=256", "FLOP_BUDGET=6000000000.0"} <= set(args)
    rows = after_grid_stages(micro, lambda cell: (1e7, 50_000, 256), lambda cell: 0.01, lambda cell: 1.0, True)
    (held,) = [r for r in rows if r["stage"].startswith("held settings walked")]
    assert held["points_left"] == len(started) and held["stage"].endswith(f"{len(walks)} open: their next points)")


def test_a_step_that_holds_on_its_seeds_moves_the_envelope_and_the_report_says_so(micro):
    from reservoir.studies.frontier.analysis import report_from_records
    from reservoir.studies.frontier.report import _held, headline_gaps

    before = report_from_records(micro.path)
    point = next(p for p in before["envelope"]["transformer++"] if p["budget"] == 6e9)
    step = beta2(0.99)
    _record(micro, POINT, 6e9)  # the point trained again here, beside its steps: as recorded
    _record(micro, step, 6e9, point["bpc"] - 0.5)  # beats the point by far more than its seeds' sd
    (walk,) = [w for w in micro.held_walks() if w["budget"] == 6e9 and w["axis"] == "adam_beta2"
               and w["family"] == "transformer++"]
    assert walk["next"] == step and walk["next_seeds"] and walk["trained_beside"] and walk["bpc_mean"] is None
    jobs = micro.held_jobs([walk])  # the step's other seeds, and the point's here to set them against
    assert [j.folder for j in jobs] == [held_folder(micro.path, POINT, 6e9, True), held_folder(micro.path, step, 6e9,
                                                                                               True)]
    assert all("SEEDS=1338" in j.args for j in jobs)
    _record(micro, POINT, 6e9, seeds=True)
    _record(micro, step, 6e9, point["bpc"] - 0.4, seeds=True)
    after = report_from_records(micro.path)
    moved = next(p for p in after["envelope"]["transformer++"] if p["budget"] == 6e9)
    assert (moved["cell"], moved["held"]) == (step.name, {"adam_beta2": 0.99, "adam_beta2_tokens": 256})
    assert moved["bpc_mean"] == pytest.approx(point["bpc"] - 0.45)
    assert after["held"]["moves"] == [{"family": "transformer++", "budget": 6e9, "cell": step.name}]
    others = [(f, p["budget"], p["cell"]) for f, ps in after["envelope"].items() for p in ps if p is not moved]
    assert others == [(f, p["budget"], p["cell"]) for f, ps in before["envelope"].items() for p in ps if p is not point]
    # what the later stages read stays the grid's: their cells are grid cells, their points the grid's folders
    grid = next(p for p in micro.report(views=False)["envelope"]["transformer++"] if p["budget"] == 6e9)
    assert grid["cell"] == POINT.name and POINT in micro.leaders()
    assert after["comparisons"] == before["comparisons"] and not any("envelope_cells_now" in c
                                                                     for c in after["comparisons"])
    text = "\n".join(_held(after, "##"))
    assert "The envelope takes: transformer++ at 6e+09 FLOPs, transformer++-xs-lr0.004-b8-beta2_0.99-per256." in text
    # REPORT's line under the headline: the gap after the walks, before them, and what β2's walks alone did to it
    line, lead = headline_gaps(after, [after])  # the grid's top budget, then the lead budget
    reservoir = next(p for p in after["envelope"]["linear_reservoir"] if p["budget"] == 6e9)["bpc_mean"]
    now, was = reservoir / moved["bpc_mean"] - 1, reservoir / point["bpc_mean"] - 1
    assert f"at 6e+09 FLOPs (linear_reservoir) is {now:+.1%} from transformer++, against {was:+.1%}" in line
    assert f"by Adam's β2 {100 * (now - was):+.1f}, weight decay +0.0 and dropout +0.0 percentage points" in line
    assert "takes transformer++ Adam's β2 0.99 per 256 tokens, every other point the grid's settings." in line
    assert "at 1.2e+10 FLOPs" in lead and "takes no step" in lead and "5 of its 5 walks there are not" in lead
    assert "takes no step" in headline_gaps(before, [before])[0]
    assert f"| 0.99 per 256 tokens: {point['bpc'] - 0.5:.3f}, mean {point['bpc'] - 0.45:.3f} ± 0.071 |" in text
    # the walk goes on from the step that held: the next value, on the first seed
    (walk,) = [w for w in held_walks(micro.records(), [], micro.grid, [6e9], 1337,
                                     lambda c, b: parse_overrides(["SEQ_LEN=32"]))
               if w["family"] == "transformer++" and w["axis"] == "adam_beta2"]
    assert walk["next"] == step  # without the stage's rows, the first step is next again
    walks = micro.held_walks()
    assert next(w for w in walks if w["budget"] == 6e9 and w["axis"] == "adam_beta2" and w["family"] ==
                "transformer++")["next"] == beta2(0.999)


def test_a_study_without_the_stage_keeps_its_study_file_as_it_was(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "micro")
    study = _study_from(MICRO, tmp_path)[2]()
    content = study.study_content({})
    assert "held" not in content["stages"] and "HELD=True" not in " ".join(study.settings)
    with_stage = _study_from([*MICRO, "HELD=True"], tmp_path)[2]()
    assert with_stage.study_content({})["stages"]["held"] is True


def test_held_names_the_families_it_walks_and_a_continued_study_keeps_what_it_recorded(micro, tmp_path):
    from reservoir.studies.frontier.grid import FrontierError, study_command

    fresh = tmp_path / "fresh"  # the committed study, its file without the stage
    shutil.copytree(FIXTURE, fresh / "micro")
    named = _study_from([*MICRO, "HELD=linear_reservoir"], fresh)[2]()
    assert {w["family"] for w in named.held_walks()} == {"linear_reservoir"}
    assert "HELD=linear_reservoir" in study_command(named.study_content({}))
    with pytest.raises(FrontierError, match="HELD names 'lstm', not one of the study's FAMILIES"):
        _study_from([*MICRO, "HELD=lstm"], fresh)[2]()
    # a study file that records HELD=True: a command that leaves it out keeps it; one that drops it, or walks fewer
    # families, is refused
    assert _study_from(MICRO, tmp_path)[2]().stages["held"] is True
    for narrower in ("HELD=False", "HELD=linear_reservoir"):
        with pytest.raises(FrontierError, match="records HELD=True; continuing it with HELD=.* would drop"):
            _study_from([*MICRO, narrower], tmp_path)[2]()


def test_a_folder_under_held_that_names_no_cell_is_refused_in_one_line(micro):
    from reservoir.studies.frontier.analysis import report_from_records
    from reservoir.studies.frontier.grid import FrontierError

    (micro.path / "held" / "not-a-cell").mkdir(parents=True)
    with pytest.raises(FrontierError, match="not-a-cell is not a point of the held settings' walks"):
        report_from_records(micro.path)


@pytest.mark.slow  # a micro study and its walks end to end: about a minute of points, each its own process
def test_the_held_stage_trains_each_step_as_its_settings_say_and_a_second_run_trains_nothing(tmp_path):
    """HELD=True on a micro study held at a poor β2 (0.7): round 1 trains each walk's first step, a step that beats
    its point by more than the seeds' sd trains on the other seed and is walked on; every step's record requested
    the setting its name says, the envelope takes exactly the walks' steps that held, and the same command again
    trains nothing."""
    from reservoir.studies.frontier.analysis import report_from_records
    from tests.conftest import run_script

    args = ["FRONTIER=True", "STUDY=held", "FAMILIES=transformer++", "SIZES=xs", "LEARNING_RATES=4e-3",
            "BATCH_SIZES=4,8", "BUDGETS=3e9,6e9", "MIN_STEPS=20", "MAX_TOKENS_PER_PARAM=1000", "ENVELOPE_SEEDS=2",
            "HELD=True", "ADAM_BETA2=0.7", "DATASET=synthetic", "SYNTHETIC_STORIES=300", "SEQ_LEN=32",
            "EVAL_TOKENS=2048", "FINAL_EVAL_TOKENS=4096", "SAMPLE_TOKENS=0", "WARMUP_STEPS=5", "WORKERS=1",
            f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'c'}"]
    proc = run_script("scaling.py", *args, timeout=900)
    assert "the held settings, round 1:" in proc.stdout
    study = tmp_path / "results" / "held"
    report = report_from_records(study)
    walks = report["held"]["walks"]
    assert sorted(w["axis"] for w in walks) == ["adam_beta2", "dropout", "weight_decay"]
    for w in walks:
        assert w["next"] is None and w["steps"]  # every walk ended
        best, best_mean = w["val_bpc"], w["bpc_mean"]  # each step is set against the walk's best so far
        for step in w["steps"]:
            cell = parse_cell(step["cell"])
            config = json.loads((held_folder(study, cell, 6e9) / "config.json").read_text())["requested_config"]
            keys = {"adam_beta2": "ADAM_BETA2", "adam_beta2_tokens": "ADAM_BETA2_REF_TOKENS",
                    "weight_decay": "WEIGHT_DECAY"}
            for axis, value in cell.held:
                held = config["TRANSFORMER"]["dropout"] if axis == "dropout" else config[keys[axis]]
                assert held == pytest.approx(value)
            beat = step["val_bpc"] is not None and step["val_bpc"] < best - w["bpc_sd"]
            assert (step["bpc_mean"] is not None) == beat  # the other seed trained where, and only where, it beat
            if beat and step["bpc_mean"] < best_mean:
                best, best_mean = step["val_bpc"], step["bpc_mean"]
        assert w["best_mean"] == best_mean
    moves = {(m["family"], m["budget"]): m["cell"] for m in report["held"]["moves"]}
    assert moves == {(w["family"], w["budget"]): w["best_cell"] for w in walks if w["moved"] < 0}
    top = {p["budget"]: p["cell"] for p in report["envelope"]["transformer++"]}
    assert top[6e9] == moves.get(("transformer++", 6e9), walks[0]["cell"])
    again = run_script("scaling.py", *args, timeout=900)
    assert "the held settings, round" not in again.stdout and "started" not in again.stdout
