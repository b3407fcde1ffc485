"""A study's records in one file (points.jsonl): what a study commits, what REPORT and a continued study read."""

import gzip
import json
import os
import re
import shlex
import shutil
from pathlib import Path

import pytest

from reservoir.run.records import ResultsError
from reservoir.studies.frontier.report import write_from_records
from reservoir.studies.store import AS_REQUESTED, POINTS_FILE, PointRecords, merged, own_part, shared_part
from tests.conftest import (
    NO_TEXT,
    ROOT,
    SHAKESPEARE_TEXT,
    TINYSTORIES_TEXT,
    committed_copy,
    run_in_process,
    run_script,
    tracked,
)

FIXTURE = ROOT / "tests" / "fixtures" / "studies"  # a micro study's point folders (tests/fixtures/make_studies.sh)
OUTPUTS = ("REPORT.md", "micro/frontier.json", "micro/frontier.md", "micro/frontier.png")
MICRO_GRID = {"STUDY": "micro", "FAMILIES": "transformer++,linear_reservoir", "SIZES": "xs", "LEARNING_RATES": "4e-3",
              "BATCH_SIZES": "8", "BUDGETS": "3e9,6e9", "LEAD_BUDGET": "1.2e10", "REFERENCES": "True",
              "CONTROLS": "True", "MIN_STEPS": "20", "MAX_TOKENS_PER_PARAM": "1000",
              "ENVELOPE_SEEDS": "2"}  # the micro study's own command (tests/fixtures/make_studies.sh)


@pytest.fixture
def studies(tmp_path):
    folder = tmp_path / "results"
    shutil.copytree(FIXTURE, folder)
    return folder


def records_only(study):
    """The study as a clone holds it: points.jsonl, the study file, its report and comparisons; no point folders."""
    for folder in [p for p in study.iterdir() if p.is_dir() and p.name != "comparisons"]:
        shutil.rmtree(folder)


def test_the_shared_and_own_parts_of_configs_merge_back_to_each_config():
    configs = [{"a": 1, "block": {"x": 1, "y": 2}, "empty": {}, "only": {"k": 1}},
               {"a": 1, "block": {"x": 1, "y": 3}, "empty": {}, "only": 5, "extra": [1]}]
    shared = shared_part(configs)
    assert shared == {"a": 1, "block": {"x": 1}}
    for config in configs:
        assert merged(shared, own_part(config, shared)) == config
    assert own_part(configs[0], shared) == {"block": {"y": 2}, "empty": {}, "only": {"k": 1}}


def test_points_jsonl_says_what_its_records_share_once_and_reads_back_as_the_runs_wrote_them(studies):
    """Settings run as requested, and summary fields every record shares, are not repeated a point a line; a file
    packed before that (each point whole) still reads the same."""
    study = studies / "micro"
    written = {folder.relative_to(study).as_posix(): json.loads((folder / "summary.json").read_text())
               for folder in PointRecords(study).local_points()}
    PointRecords(study).pack()
    head, *rows = [json.loads(line) for line in (study / POINTS_FILE).read_text().splitlines()]
    assert head["shared_summary"]["flops_convention"] and head["shared_config"]["effective_config"] == AS_REQUESTED
    said_once = {key for key, value in head["shared_summary"].items() if not isinstance(value, dict)}
    assert said_once and all(not said_once & set(record) for row in rows for record in row["summary"])
    records_only(study)
    read = PointRecords(study).packed()["points"]
    assert written and {key: read[key]["summary"] for key in written} == written  # integrity checked on reading
    whole = [{"point": key, "config": point["config"], "summary": point["summary"]} for key, point in read.items()]
    (study / POINTS_FILE).write_text("".join(json.dumps(line) + "\n" for line in [{"shared_config": {}}, *whole]))
    assert PointRecords(study).packed()["points"] == read


def test_a_study_of_records_alone_rebuilds_its_report_byte_for_byte_and_skips_every_finished_point(studies):
    from reservoir.studies.frontier.study import FrontierStudy, measure_cells

    run_script("scaling.py", f"REPORT={studies}")  # from the point folders; writes points.jsonl
    before = {name: (studies / name).read_bytes() for name in OUTPUTS}
    assert (studies / "micro" / POINTS_FILE).exists()
    records_only(studies / "micro")
    run_script("scaling.py", f"REPORT={studies}")
    assert {name: (studies / name).read_bytes() for name in OUTPUTS} == before
    # the study's own command goes on from the records: every point of every stage is finished
    settings = json.loads((studies / "micro" / "frontier-study.json").read_text())["settings"]
    study = FrontierStudy.from_args(dict(MICRO_GRID), [*settings, f"RESULTS_DIR={studies}"])
    asked = []
    study.run(lambda jobs, workers, finished, **_: asked.extend(jobs) or [0] * len(jobs), measure_cells(study))
    assert asked == []
    assert [p.name for p in (studies / "micro").iterdir() if p.is_dir()] == ["comparisons"]


def test_an_edited_record_in_points_jsonl_is_one_line(studies):
    run_script("scaling.py", f"REPORT={studies}")
    records_only(studies / "micro")
    path = studies / "micro" / POINTS_FILE
    lines = path.read_text().splitlines()
    point = json.loads(lines[1])
    point["summary"][0]["val_bpc"] = 0.5
    path.write_text("\n".join([lines[0], json.dumps(point), *lines[2:]]) + "\n")
    edited = re.escape(f"{POINTS_FILE} ({point['point']}): the record of ") + ".* was edited.*git checkout"
    with pytest.raises(ResultsError, match=edited):
        PointRecords(studies / "micro").packed()
    path.write_text(lines[0] + "\n{not json\n")
    proc = run_script("scaling.py", f"REPORT={studies}", check=False)
    assert proc.returncode != 0 and "line 2 is not JSON" in proc.stderr and "Traceback" not in proc.stderr


def test_a_point_folder_here_with_more_seeds_replaces_its_record_and_one_with_fewer_does_not(studies):
    store = PointRecords(studies / "micro")
    store.pack()
    seeds = studies / "micro" / "linear_reservoir-xs-lr0.004-b8" / "flops-1.20e10-seeds"
    key = seeds.relative_to(studies / "micro").as_posix()
    full = json.loads((seeds / "summary.json").read_text())
    assert len(full) == 1 and len(store.packed()["points"][key]["summary"]) == 1
    (seeds / "summary.json").write_text("[]")  # a folder here that holds less than the file: the file's stays
    again = PointRecords(studies / "micro")
    again.pack()
    assert len(again.packed()["points"][key]["summary"]) == 1 and len(again.summary(seeds)) == 1


def test_a_comparison_of_cells_the_envelope_has_left_is_made_again_and_reported_as_earlier(studies, capsys):
    """A study whose grid grew kept the paired comparison of its earlier envelope (written once), and its report
    set it beside the new envelope as the comparison of the two (Tiny Shakespeare's, grown to batch 4: A − B of
    2.370 against 2.329 under an envelope of 2.344 against 2.312): the study makes it again, and until it can (no
    checkpoints here) the report says whose it is and what the envelope is now."""
    from reservoir.studies.frontier.study import FrontierStudy

    file = studies / "micro" / "comparisons" / "flops-6.00e09-linear_reservoir-vs-transformer++.json"
    comparison = json.loads(file.read_text())
    comparison["a"]["runs"] = [r.replace("-b8/", "-b16/") for r in comparison["a"]["runs"]]  # another cell's
    file.write_text(json.dumps(comparison))
    held = file.read_bytes()
    own = {"STUDY": "micro", "FAMILIES": "transformer++,linear_reservoir", "SIZES": "xs", "LEARNING_RATES": "4e-3",
           "BATCH_SIZES": "8", "BUDGETS": "3e9,6e9", "LEAD_BUDGET": "1.2e10", "ENVELOPE_SEEDS": "2"}
    study = FrontierStudy.from_args(own, ["DATASET=synthetic", f"RESULTS_DIR={studies}"])
    assert study.compare_at_the_top(study.budgets) is None  # made again, but its checkpoints are not here
    said = capsys.readouterr().out
    assert "is of linear_reservoir-xs-lr0.004-b16 and transformer++-xs-lr0.004-b8, no longer the envelope there" in said
    assert "made again of linear_reservoir-xs-lr0.004-b8 and transformer++-xs-lr0.004-b8" in said
    assert "no paired comparison at 6e+09 FLOPs" in said and file.read_bytes() == held  # kept as it was
    assert run_in_process("scaling.py", [f"REPORT={studies}"]).returncode == 0
    text = (studies / "REPORT.md").read_text()
    earlier = text.index("**Of earlier envelope points** (results/micro/linear_reservoir-xs-lr0.004-b16/")
    assert text.index("Paired comparison at 6e+09 FLOPs") < earlier < text.index("Paired comparison at 1.2e+10")
    assert "the envelope there is now linear_reservoir-xs-lr0.004-b8 against transformer++-xs-lr0.004-b8" in text
    assert text.count("Of earlier envelope points") == 1  # the lead budget's is of its envelope
    report = json.loads((studies / "micro" / "frontier.json").read_text())
    assert [c.get("envelope_cells_now") for c in report["comparisons"]] == \
        [["linear_reservoir-xs-lr0.004-b8", "transformer++-xs-lr0.004-b8"], None]


@pytest.mark.parametrize("folders", ["without checkpoints", "not here"])
def test_a_study_whose_points_trained_elsewhere_says_why_it_cannot_compare_and_goes_on(studies, capsys, folders):
    """Records travel in git, point folders and checkpoints do not: on a new machine the paired comparison cannot
    score the points, and the study says so in one line and goes on to its stages."""
    from reservoir.studies.frontier.study import FrontierStudy

    if folders == "not here":
        PointRecords(studies / "micro").pack()
        records_only(studies / "micro")
    shutil.rmtree(studies / "micro" / "comparisons")
    own = {"STUDY": "micro", "FAMILIES": "transformer++,linear_reservoir", "SIZES": "xs", "LEARNING_RATES": "4e-3",
           "BATCH_SIZES": "8", "BUDGETS": "3e9,6e9", "LEAD_BUDGET": "1.2e10", "ENVELOPE_SEEDS": "2"}
    study = FrontierStudy.from_args(own, ["DATASET=synthetic", f"RESULTS_DIR={studies}"])
    assert study.compare_at_the_top(study.budgets) is None
    said = capsys.readouterr().out
    assert "no paired comparison at 6e+09 FLOPs" in said and "checkpoints" in said
    # whether the folder came without its checkpoints or not at all: the same line, and what trains them here
    assert "is not on this machine (REPLAY=True trains it again here)" in said
    assert not (studies / "micro" / "comparisons").exists()



def test_a_point_trained_again_beside_its_edge_steps_serves_where_its_replay_would(studies, capsys):
    """EDGES=True trains a point recorded on another machine again here (edges/<cell>/<budget>: its settings and
    first seed, from step 0), as REPLAY=True would: the stages that read checkpoints (contexts, the paired
    comparison) read that copy instead of training a third; its score against the record is said and kept."""
    from reservoir.run.checkpoint import CheckpointError, checkpoint_file
    from reservoir.studies.frontier.edges import edge_folder, parse_cell
    from reservoir.studies.frontier.study import FrontierStudy

    micro = studies / "micro"
    PointRecords(micro).pack()
    records_only(micro)
    own = {"STUDY": "micro", "FAMILIES": "transformer++,linear_reservoir", "SIZES": "xs", "LEARNING_RATES": "4e-3",
           "BATCH_SIZES": "8", "BUDGETS": "3e9,6e9", "ENVELOPE_SEEDS": "2"}
    study = FrontierStudy.from_args(own, ["DATASET=synthetic", f"RESULTS_DIR={studies}"])
    cell = parse_cell("transformer++-xs-lr0.004-b8")

    def no_training(*_):
        raise AssertionError("a point with a copy here is not trained again")

    with pytest.raises(CheckpointError, match="REPLAY=True trains it again here"):
        study.on_this_machine([(cell, 6e9, False)], no_training)
    beside = edge_folder(micro, cell, 6e9)  # the point's folder as the edges stage trained it here
    shutil.copytree(FIXTURE / "micro" / cell.name / "flops-6.00e09", beside)
    summary = json.loads((beside / "summary.json").read_text())
    summary[0]["val_bpc"] += 0.01  # another processor's kernels
    (beside / "summary.json").write_text(json.dumps(summary))
    checkpoint = checkpoint_file(beside, "transformer", 1337, [1337])
    checkpoint.parent.mkdir()
    checkpoint.write_bytes(b"")  # its presence is what is asked here; the slow stage tests load real ones
    assert study.on_this_machine([(cell, 6e9, False)], no_training) == [beside]
    point = f"{cell.name}/flops-6.00e09"
    assert f"the copy beside its edge steps of {point} (seed 1337) scores" in capsys.readouterr().out
    row = study.replayed[(point, 1337)]
    assert row["copy"] == f"edges/{point}" and row["replayed_val_bpc"] == pytest.approx(row["recorded_val_bpc"] + 0.01)
    with pytest.raises(CheckpointError):  # the other seeds have no copy beside the edges: still a replay's
        study.on_this_machine([(cell, 6e9, True)], no_training)


def test_a_paired_comparison_says_where_its_copies_were_trained():
    from reservoir.studies.frontier.analysis import report_from_records
    from reservoir.studies.frontier.report import format_study

    report = report_from_records(ROOT / "results" / "frontier-tinystories")
    replayed = next(c for c in report["comparisons"] if c.get("replays"))
    assert "them (REPLAY=True; the records came from another)" in format_study(report, "frontier.png")
    replayed["replays"][0]["copy"] = f"edges/{replayed['replays'][0]['point']}"
    assert "them (REPLAY=True, or EDGES=True beside their edge steps; the" in format_study(report, "frontier.png")


def test_the_context_table_says_how_many_tokens_each_row_trained_on():
    """At one FLOP budget a longer window buys fewer tokens: each row says its own, as its point's record has it."""
    from reservoir.studies.frontier.analysis import report_from_records
    from reservoir.studies.frontier.report import format_study

    study = ROOT / "results" / "frontier-shakespeare"
    report, store = report_from_records(study), PointRecords(study)
    text = format_study(report, "frontier.png")
    tokens = {}
    for row in report["contexts"]["rows"].values():
        record = next(r for r in store.summary(study / row["point"]) if r["seed"] == row["seed"])
        tokens[row["seq_len"], row["family"]] = row["train_tokens"]
        assert row["train_tokens"] == record["train_tokens"]
        assert f"| {row['family']} | {row['seq_len']} | {record['train_tokens']:,} | " in text
    assert tokens[512, "transformer++"] < tokens[128, "transformer++"]


def test_the_committed_studies_rebuild_their_report_byte_for_byte_from_points_jsonl(tmp_path):
    """results/ as a clone has it (records only): REPORT.md, every frontier.json/.md/.png come out as committed."""
    committed = ROOT / "results"
    copy = committed_copy(tmp_path / "results")  # what git tracks: never a user's own runs and studies beside it
    # from the folder above, as the committed report was made: its paths are relative (REPORT=results)
    proc = run_in_process("scaling.py", ["REPORT=results"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    outputs = ["REPORT.md", *(f"{study.name}/{name}" for study in sorted(copy.glob("frontier-*"))
                              for name in ("frontier.json", "frontier.md", "frontier.png", "frontier-time.png",
                                           PointRecords(study).file.name))]
    assert len(outputs) == 11
    changed = [name for name in outputs if (copy / name).read_bytes() != (committed / name).read_bytes()]
    assert changed == []



def test_a_report_names_the_same_folders_whatever_folder_it_is_run_from(studies, tmp_path, monkeypatch):
    """REPORT=<an absolute path>, or a run from another folder, wrote that machine's paths into every grid point of
    frontier.json and into REPORT.md's first line: the committed report changed with where it was made."""
    from reservoir.platform import files

    monkeypatch.setattr(files, "REPOSITORY", studies.parent)  # the checkout whose results/ these studies are
    monkeypatch.chdir(studies.parent)
    write_from_records(Path("results"))
    before = {name: (studies / name).read_bytes() for name in OUTPUTS}
    assert b'"folder":"results/micro/' in before["micro/frontier.json"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for given in (str(studies), os.path.relpath(studies, elsewhere)):
        write_from_records(Path(given))
        assert [name for name in OUTPUTS if (studies / name).read_bytes() != before[name]] == [], given


def test_a_report_s_figures_stay_the_same_files_under_another_matplotlib(studies, monkeypatch):
    """Matplotlib versions render their own pixels (3.9.4 and 3.11.2 differ in 7-13% of a committed figure's) and
    wrote their version into every PNG: the committed figures changed with the matplotlib a reader installed. A
    figure names the data and code it was drawn from, and is kept where they are the same."""
    import matplotlib

    figures = [name for name in OUTPUTS if name.endswith(".png")]
    write_from_records(studies)
    before = {name: (studies / name).read_bytes() for name in OUTPUTS}
    assert all(b"Matplotlib version" not in before[name] for name in figures)
    monkeypatch.setitem(matplotlib.rcParams, "axes.facecolor", "0.85")  # another matplotlib, other pixels
    write_from_records(studies)
    assert [name for name in OUTPUTS if (studies / name).read_bytes() != before[name]] == []
    from reservoir.studies.curves import drawn_from
    from reservoir.studies.frontier.report import plot_frontier

    png = studies / "micro" / "frontier.png"
    png.unlink()  # drawn again here: the pixels differ, what it was drawn from does not
    write_from_records(studies)
    assert png.read_bytes() != before["micro/frontier.png"] and drawn_from(png) is not None
    report = json.loads((studies / "micro" / "frontier.json").read_text())
    drawn = drawn_from(png)
    plot_frontier({**report, "study": "micro-renamed"}, png)  # other data: drawn again
    assert drawn_from(png) not in (None, drawn)
    import inspect

    def no_sources(_):
        raise OSError("could not get source code")

    monkeypatch.setattr(inspect, "getsource", no_sources)  # installed as bytecode alone: drawn all the same
    plot_frontier(report, png)
    assert drawn_from(png) not in (None, drawn)

def test_the_committed_records_name_no_machine():
    """What a reader clones names data by a path relative to the repository, never one machine's layout."""
    import re

    absolute = re.compile(r"(?<![\w.~:])/(?:work|home|root|tmp|Users|mnt|data|srv|scratch)/")
    for path in tracked("results"):  # what a clone holds, not what else a user keeps in results/
        if path.suffix in (".json", ".jsonl", ".md"):
            found = absolute.search(path.read_text(encoding="utf-8"))
            assert found is None, f"{path}: {path.read_text(encoding='utf-8')[found.start():found.start() + 80]}"



def test_every_committed_comparison_is_of_its_study_s_envelope_now():
    """A committed report compares the envelope it shows: the grown Tiny Shakespeare study kept three comparisons of
    its earlier envelope ("Of earlier envelope points"), one of a family it no longer compared, which its command
    then never made again."""
    for report in sorted((ROOT / "results").glob("*/frontier.json")):
        comparisons = json.loads(report.read_text())["comparisons"]
        stale = [(c["family_a"], c["budget"], c["envelope_cells_now"]) for c in comparisons
                 if c.get("envelope_cells_now")]
        assert stale == [], f"{report.parent.name}: comparisons of an earlier envelope (run its command, REPLAY=True)"


def test_no_committed_report_says_a_measurement_is_of_an_earlier_envelope():
    """The grown Tiny Shakespeare study's generation costs were of its earlier envelope, and REPORT said so ("Measured
    before the envelope moved") with no test to notice: each such line asks for a command the records still need."""
    stale = ("Measured before the envelope moved", "Not measured: ", "Of earlier envelope points",
             "the grid should grow")
    reports = sorted((ROOT / "results").glob("*/frontier.md")) + [ROOT / "results" / "REPORT.md"]
    said = [(report.relative_to(ROOT).as_posix(), line) for report in reports if report.is_file()
            for line in stale if line in report.read_text()]
    assert said == [], "run the command each line names, then python scaling.py REPORT=results"


def test_the_committed_records_stay_small():
    """Records travel in the repository: every file under results/ at most 2 MB, all of them at most 10 MB (a
    growing study's uncompressed copy of its records was 2.8 MB)."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0 or not listed.stdout.strip():
        pytest.skip("not a git checkout")
    sizes = {name: (ROOT / name).stat().st_size for name in listed.stdout.splitlines() if (ROOT / name).is_file()}
    assert [name for name, size in sizes.items() if size > 2_000_000] == []
    assert sum(sizes.values()) <= 10_000_000


def test_an_edited_point_says_what_deleting_its_folder_does(tmp_path):
    study = tmp_path / "micro"
    shutil.copytree(FIXTURE / "micro", study)
    point = study / "transformer++-xs-lr0.004-b8" / "flops-6.00e09"
    records = json.loads((point / "summary.json").read_text())
    records[0]["val_bpc"] = 0.5
    (point / "summary.json").write_text(json.dumps(records))
    with pytest.raises(ResultsError, match="run the study's command again, which trains the point again"):
        PointRecords(study).summary(point)  # points.jsonl does not hold it: deleting the folder means re-training


def _documented_study_command(page: str = "README.md", study: str = "frontier-tinystories") -> list[str]:
    """A page's command for a committed study, its continuation lines joined."""
    text = (ROOT / page).read_text(encoding="utf-8").replace("\\\n", " ")
    line = next(line for line in text.splitlines() if f"scaling.py FRONTIER=True STUDY={study} " in line)
    return shlex.split(line.split("python scaling.py", 1)[1])


def _study_from(args: list[str], results: Path):
    from reservoir.config import split_arguments
    from reservoir.studies.frontier.grid import FRONTIER_KEYS
    from reservoir.studies.frontier.study import FrontierStudy
    from reservoir.studies.ladder import STUDY_KEYS

    own, settings = split_arguments([*args, f"RESULTS_DIR={results}"], (*STUDY_KEYS, *FRONTIER_KEYS, "FRONTIER"))
    own.pop("FRONTIER", None)
    return own, settings, lambda: FrontierStudy.from_args(own, settings)


DOCUMENTED = [("README.md", "frontier-tinystories"), ("docs/studies.md", "frontier-tinystories"),
              ("docs/configuration.md", "frontier-shakespeare")]


def _distinct_commands() -> list[tuple[str, str]]:
    """(the pages that give it, joined by '+'; the study) for each distinct documented command: pages that
    give one command are one case, since what runs is the command (a minute or two on the TinyStories study)."""
    pages: dict = {}
    for page, name in DOCUMENTED:
        pages.setdefault((name, tuple(_documented_study_command(page, name))), []).append(page)
    return [("+".join(found), name) for (name, _), found in pages.items()]


def test_pages_that_give_one_study_s_command_are_tested_once_and_every_page_is_tested():
    cases = _distinct_commands()
    assert sorted(p for pages, _ in cases for p in pages.split("+")) == sorted(p for p, _ in DOCUMENTED)
    for pages, name in cases:
        commands = {tuple(_documented_study_command(page, name)) for page in pages.split("+")}
        assert len(commands) == 1, (pages, commands)


@pytest.mark.parametrize("page, name", DOCUMENTED)
def test_a_documented_study_command_is_the_committed_study_s_own(tmp_path, page, name):
    """Run on the committed study, the README's command rewrote its stages (EDGES, CONTEXTS) as False, and the
    next report lost the sections they had found; a page's command without the grid's grown batches is refused:
    each page's command must be the study's own, stages and grid and all."""
    from reservoir.studies.frontier.grid import FREE, _placeless, parse_stages, portable_settings

    shutil.copytree(ROOT / "results" / name, tmp_path / name)
    recorded = json.loads((tmp_path / name / "frontier-study.json").read_text())
    own, settings, build = _study_from(_documented_study_command(page, name), tmp_path)
    study = build()
    assert parse_stages(own, study.budgets, study.grid) == recorded["stages"]  # named in the command itself
    assert study.budgets == recorded["budgets"]
    assert {k: v for k, v in study.grid.items() if k not in FREE} == \
        {k: v for k, v in recorded["grid"].items() if k not in FREE}
    assert _placeless(portable_settings(study.settings)) == _placeless(recorded["settings"])


TEXTS = {"frontier-tinystories": (TINYSTORIES_TEXT, "tinystories"),
         "frontier-shakespeare": (SHAKESPEARE_TEXT.parent, "shakespeare")}


@pytest.mark.parametrize("pages, name", _distinct_commands())
def test_a_documented_study_command_on_the_committed_study_changes_none_of_its_files(tmp_path, pages, name):
    """On a fresh clone the README's command, run on the committed TinyStories study (nothing left to train),
    rewrote its study file (WORKERS 2 as 'auto', a host's own setting) and dropped the measured generation cost
    from frontier.json and frontier.md: git status was no longer clean. On a host whose processor no record names
    (an AMD EPYC), the command trained the points beside the ended edge walks again (minutes to hours each), while
    PLAN=True said 0 left: here on a pretended processor, PLAN says nothing is left (without minutes of probing)
    and the command trains nothing and writes no file but its (ignored) lock."""
    text, folder = TEXTS[name]
    if not any(text.glob("*.txt")):
        pytest.skip(NO_TEXT)
    committed = ROOT / "results" / name
    # a lock left by a study command run in this checkout is no part of the committed study (git ignores it)
    shutil.copytree(committed, tmp_path / "results" / name, ignore=shutil.ignore_patterns(".lock"))
    recorded = sorted(p.relative_to(committed) for p in committed.rglob("*") if p.name != ".lock")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / folder).symlink_to(text)
    elsewhere = {"RESERVOIR_PRETEND_PROCESSOR": "AMD EPYC 7B13 (a processor no record names)"}
    command = _documented_study_command(pages.split("+")[0], name)
    plan = run_in_process("scaling.py", [*command, "PLAN=True"], env=elsewhere, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert "Nothing left to train" in plan.stdout and "| edge walks (" in plan.stdout
    assert "Columns: points, the stage's runs" in plan.stdout and "left, what the study's records" in plan.stdout
    assert sorted(p.relative_to(tmp_path / "results" / name) for p in (tmp_path / "results" / name).rglob("*")) == \
        recorded  # "nothing written": not even a lock
    assert all(row.split("|")[-3].strip() == "0" for row in plan.stdout.splitlines() if row.startswith("| ")
               and not row.startswith(("| stage", "| ---"))), plan.stdout  # every stage's points left: 0
    proc = run_in_process("scaling.py", command, env=elsewhere, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "to train" in proc.stdout and "started" not in proc.stdout and "steps beyond to train" not in proc.stdout
    assert re.findall(r": [1-9]\d* (?:runs|points|steps beyond) to train", proc.stdout) == []
    written = {p.relative_to(tmp_path / "results" / name).as_posix() for p in (tmp_path / "results" / name).rglob("*")
               if p.is_file()}
    assert written - {".lock"} == {p.as_posix() for p in recorded if (committed / p).is_file()}
    changed = sorted(p.name for p in committed.iterdir() if p.is_file() and p.name != ".lock"  # a run's (ignored)
                     and (tmp_path / "results" / name / p.name).read_bytes() != p.read_bytes())
    assert changed == []


def test_a_plan_counts_the_cells_a_study_holds_first_seed_records_of_at_each_budget(studies):
    from reservoir.studies.frontier.plan import recorded_cells

    args = ["STUDY=micro", "FAMILIES=transformer++,linear_reservoir", "SIZES=xs", "LEARNING_RATES=4e-3",
            "BATCH_SIZES=8", "BUDGETS=3e9,6e9", "LEAD_BUDGET=1.2e10", "REFERENCES=True", "CONTROLS=True",
            "MIN_STEPS=20", "MAX_TOKENS_PER_PARAM=1000", "ENVELOPE_SEEDS=2", "DATASET=synthetic"]
    study = _study_from(args, studies)[2]()
    expected = {(f, b): 1 for f in ("transformer++", "linear_reservoir") for b in (3e9, 6e9)}
    assert recorded_cells(study) == expected  # the envelope's extra seeds and the lead budget are not the grid's
    PointRecords(studies / "micro").pack()
    records_only(studies / "micro")
    assert recorded_cells(_study_from(args, studies)[2]()) == expected  # a clone: points.jsonl alone


def test_a_continued_study_keeps_its_recorded_stages_and_refuses_to_turn_one_off(tmp_path):
    from reservoir.studies.frontier.grid import FrontierError

    shutil.copytree(ROOT / "results" / "frontier-tinystories", tmp_path / "frontier-tinystories")
    recorded = json.loads((tmp_path / "frontier-tinystories" / "frontier-study.json").read_text())["stages"]
    fewer = [a for a in _documented_study_command() if not a.startswith(("EDGES=", "CONTEXTS=", "LEAD_BUDGET="))]
    assert _study_from(fewer, tmp_path)[2]().stages == recorded  # left out: the recorded stages go on
    _, _, build = _study_from([*fewer, "EDGES=False"], tmp_path)
    with pytest.raises(FrontierError, match="records EDGES=True; continuing it with EDGES=False would drop") as refused:
        build()
    from reservoir.studies.frontier.grid import study_command

    recorded_command = study_command(json.loads((ROOT / "results" / "frontier-tinystories" /
                                                 "frontier-study.json").read_text()))
    assert recorded_command in str(refused.value) and "CONTEXTS=True EDGES=True" in recorded_command


def test_a_continued_study_may_add_leaders_but_not_drop_one(tmp_path):
    """A family that joined a study through a grown FAMILIES list could not join its leaders: any LEADERS other than
    the recorded list was refused, though more leaders drop nothing the study found (the new leader's lead-budget
    points, every seed, are added beside the recorded ones)."""
    from reservoir.studies.frontier.grid import FrontierError

    shutil.copytree(ROOT / "results" / "frontier-tinystories", tmp_path / "frontier-tinystories")
    recorded = json.loads((tmp_path / "frontier-tinystories" / "frontier-study.json").read_text())
    command = _documented_study_command()
    families = f"FAMILIES={','.join(recorded['grid']['FAMILIES'])}"
    leaders = [*recorded["stages"]["leaders"],
               next(f for f in recorded["grid"]["FAMILIES"] if f not in recorded["stages"]["leaders"])]
    grown = [a for a in command if not a.startswith(("FAMILIES=", "LEADERS="))]
    study = _study_from([*grown, families, f"LEADERS={','.join(leaders)}"], tmp_path)[2]()
    assert study.stages["leaders"] == leaders
    assert {k: v for k, v in study.stages.items() if k != "leaders"} == \
        {k: v for k, v in recorded["stages"].items() if k != "leaders"}
    fewer = [f for f in leaders if f != "lstm"]
    _, _, build = _study_from([*grown, families, f"LEADERS={','.join(fewer)}"], tmp_path)
    dropped = re.escape(f"records LEADERS={','.join(recorded['stages']['leaders'])}; continuing")
    with pytest.raises(FrontierError, match=dropped) as refused:
        build()
    assert "python scaling.py FRONTIER=True STUDY=frontier-tinystories" in str(refused.value)



def test_a_host_that_joins_a_shared_study_late_is_given_its_study_file_and_records(studies, tmp_path):
    """A new host (an empty RESULTS_DIR) running the other hosts' command after points were recorded was refused
    ("frontier-study.json is missing ... restore it"): the records it pulled were written before the study file."""
    from reservoir.studies.frontier.study import FrontierStudy, measure_cells

    own = {"STUDY": "micro", "FAMILIES": "transformer++,linear_reservoir", "SIZES": "xs", "LEARNING_RATES": "4e-3",
           "BATCH_SIZES": "8", "BUDGETS": "3e9,6e9", "LEAD_BUDGET": "1.2e10", "REFERENCES": "True",
           "CONTROLS": "True", "MIN_STEPS": "20", "MAX_TOKENS_PER_PARAM": "1000", "ENVELOPE_SEEDS": "2",
           "STUDY_STORAGE": f"sqlite:///{tmp_path / 'shared.db'}", "HEARTBEAT": "1"}
    settings = json.loads((studies / "micro" / "frontier-study.json").read_text())["settings"]
    asked = []

    def run_points(jobs, workers, finished, more=None, ended=None):
        asked.extend(jobs)
        while more is not None and (job := more()) is not None:  # a shared stage asks for its points one by one
            asked.append(job)
        return [0] * len(jobs)

    first = FrontierStudy.from_args(dict(own), [*settings, f"RESULTS_DIR={studies}"])
    first.run(run_points, measure_cells(first))  # the first host: every point recorded, now in the database too
    late = tmp_path / "late-host"
    joined = FrontierStudy.from_args(dict(own), [*settings, f"RESULTS_DIR={late}"])
    joined.run(run_points, measure_cells(joined))
    assert asked == []  # nothing left to train
    assert (late / "micro" / "frontier-study.json").is_file()
    here, there = (PointRecords(folder / "micro").packed()["points"] for folder in (late, studies))
    assert here.keys() == there.keys() and here  # the late host holds every record the first one made


def test_points_jsonl_and_its_study_file_name_each_other_so_an_older_or_missing_records_file_is_one_line(tmp_path):
    """Any earlier commit's points.jsonl beside today's study file was read silently (six edge walks 'not run
    yet'), and a deleted one said 'run it first' (days of training) instead of how to restore it."""
    from reservoir.studies.frontier.analysis import report_from_records

    study = tmp_path / "frontier-tinystories"
    shutil.copytree(ROOT / "results" / "frontier-tinystories", study)
    noted = json.loads((study / "frontier-study.json").read_text())["records"]
    store = PointRecords(study)
    records, lines = store.file, store.text().splitlines(keepends=True)
    assert noted["points"] == len(lines) - 1  # the committed study file names its committed records
    older = "".join(lines[:-1]).encode("utf-8")  # an older file: one point fewer, in the committed file's form
    records.write_bytes(gzip.compress(older) if records.suffix == ".gz" else older)
    with pytest.raises(ResultsError, match=f"holds {noted['points'] - 1} of the {noted['points']} points the "
                                           "frontier-study.json beside it records .*git checkout"):
        report_from_records(study)
    records.unlink()
    with pytest.raises(ResultsError, match=f"is missing, but frontier-study.json records {noted['points']} points in "
                                           "it: restore it"):
        report_from_records(study)


def test_the_plan_benchmark_plans_exactly_the_stage_points_it_took_out_of_a_copy_of_the_records(studies, capsys):
    """bench/bench_plan.py sets a stage's plan against what its points spent: the plan must price the very points
    taken out of the copy (every first-seed grid point there), and the study itself stays as it was."""
    import importlib.util

    PointRecords(studies / "micro").pack()
    before = {p: p.read_bytes() for p in (studies / "micro").rglob("*") if p.is_file()}
    spec = importlib.util.spec_from_file_location("bench_plan", ROOT / "bench" / "bench_plan.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main([str(studies / "micro"), "6e9", "--since", "2000-01-01"]) == 0
    said = capsys.readouterr().out
    found = re.search(r"at 6e\+09 FLOPs: planned (\d+) points, (\d+) device-s; its (\d+) points spent (\d+) s", said)
    assert found, said
    planned, points = int(found[1]), int(found[3])
    recorded = [r for r in PointRecords(studies / "micro").packed()["points"]
                if r.endswith("/flops-6.00e09") and r.count("/") == 1]  # the grid's, not a control's
    assert planned == points == len(recorded) > 0 and int(found[2]) > 0 and int(found[4]) > 0
    shares = re.findall(r"^  ([\w+]+): planned (\d+) s, spent (\d+) s", said, re.MULTILINE)
    assert sorted(f for f, _, _ in shares) == ["linear_reservoir", "transformer++"]
    assert abs(sum(int(p) for _, p, _ in shares) - int(found[2])) <= len(shares)  # each family's share, rounded
    assert abs(sum(int(w) for _, _, w in shares) - int(found[4])) <= len(shares)
    assert {p: p.read_bytes() for p in (studies / "micro").rglob("*") if p.is_file()} == before



def test_records_past_a_megabyte_are_kept_gzipped_and_read_noted_and_reported_as_the_plain_ones(studies, monkeypatch):
    """A finished study of a thousand points holds 3-4 MB of records; a file in git stays within 2 MB, so past
    GZIP_OVER the study keeps them gzipped: read, noted and reported as the same lines plain. Records that do not
    change keep their form (a committed study's command changes none of its files)."""
    import gzip
    import hashlib

    from reservoir.studies import store

    study, gzipped = studies / "micro", studies / "micro" / store.GZIPPED_POINTS_FILE
    write_from_records(studies)
    plain = (study / POINTS_FILE).read_text()
    before = {name: (studies / name).read_bytes() for name in OUTPUTS}
    monkeypatch.setattr(store, "GZIP_OVER", 1000)
    write_from_records(studies)
    assert (study / POINTS_FILE).read_text() == plain and not gzipped.exists()

    (study / POINTS_FILE).unlink()  # written anew from the point folders: past GZIP_OVER, gzipped
    write_from_records(studies)
    assert not (study / POINTS_FILE).exists() and gzip.decompress(gzipped.read_bytes()).decode() == plain
    noted = json.loads((study / "frontier-study.json").read_text())["records"]
    assert noted["file"] == store.GZIPPED_POINTS_FILE and noted["sha256"] == hashlib.sha256(plain.encode()).hexdigest()
    first = gzipped.read_bytes()
    records_only(study)
    write_from_records(studies)
    assert {name: (studies / name).read_bytes() for name in OUTPUTS} == before and gzipped.read_bytes() == first

    (study / POINTS_FILE).write_text(plain)  # both forms, the same lines (a write stopped before the plain went)
    assert PointRecords(study).pack() == gzipped and not (study / POINTS_FILE).exists()
    (study / POINTS_FILE).write_text("".join(plain.splitlines(keepends=True)[:-1]))
    with pytest.raises(ResultsError, match="holds both points.jsonl and points.jsonl.gz, with different records: "
                                           "keep one"):
        PointRecords(study).packed()
    (study / POINTS_FILE).unlink()
    gzipped.write_bytes(first[: len(first) // 2])
    with pytest.raises(ResultsError, match="points.jsonl.gz is not gzipped text .*damaged; restore it"):
        PointRecords(study).packed()
    gzipped.unlink()
    with pytest.raises(ResultsError, match=re.escape(f"git checkout -- {gzipped}")):  # the name it was written as
        write_from_records(studies)


def test_a_point_is_in_points_jsonl_as_soon_as_it_finishes_not_when_its_stage_ends(studies, tmp_path, capsys):
    """A stage runs for hours (31 points at TinyStories' 1.95e13): points.jsonl was written only when it ended, so
    records committed while it ran, or left by a machine that died, lacked every point finished since."""
    from reservoir.studies.frontier.study import FrontierStudy

    write_from_records(studies)  # points.jsonl holds every point of the micro study
    study_path = studies / "micro"
    settings = json.loads((study_path / "frontier-study.json").read_text())["settings"]
    study = FrontierStudy.from_args(dict(MICRO_GRID), [*settings, f"RESULTS_DIR={studies}"])
    points = ["transformer++-xs-lr0.004-b8/flops-6.00e09", "linear_reservoir-xs-lr0.004-b8/flops-6.00e09"]
    for point in points:  # not trained yet: no folder here, no line in points.jsonl
        shutil.move(study_path / point, tmp_path / point.replace("/", "_"))
    records = study_path / POINTS_FILE
    records.write_text("".join(line for line in records.read_text().splitlines(keepends=True)
                               if not any(f'"point": "{point}"' in line for point in points)))
    seen = []

    def run_points(jobs, workers, finished, ended=None, **_):
        for k, (folder, _args) in enumerate(jobs):  # each point trains, then ends, then the next starts
            shutil.move(tmp_path / study.store.key(folder).replace("/", "_"), folder)
            if ended:
                ended(k, 0)
            seen.append(set(PointRecords(study_path).packed()["points"]))  # the file as a commit would take it
        return [0] * len(jobs)

    study._run_all([(study_path / point, []) for point in points], run_points, 6e9)
    assert points[0] in seen[0] and points[1] not in seen[0] and set(points) <= seen[1]

    for point in points:  # again, the first point's summary edited: said as it ends, the next point still runs
        shutil.move(study_path / point, tmp_path / point.replace("/", "_"))
    summary = tmp_path / points[0].replace("/", "_") / "summary.json"
    summary.write_text(summary.read_text().replace('"val_bpc": ', '"val_bpc": 0.5, "was": ', 1))
    seen.clear()
    with pytest.raises(ResultsError, match="summary.json"):  # refused when the stage ends
        study._run_all([(study_path / point, []) for point in points], run_points, 6e9)
    assert len(seen) == 2 and "points.jsonl not brought up to date" in capsys.readouterr().err


def test_a_study_file_is_the_same_wherever_the_study_is_run_from(studies, tmp_path):
    """A study's folder is wherever it lies: RESULTS_DIR went into the study file's settings, so the same study
    continued from another folder (another machine, or a grown copy moved into results/) rewrote its study file."""
    from reservoir.studies.frontier.study import FrontierStudy, measure_cells

    write_from_records(studies)
    records_only(studies / "micro")
    settings = json.loads((studies / "micro" / "frontier-study.json").read_text())["settings"]
    elsewhere, written = tmp_path / "elsewhere", None
    for results in (studies, elsewhere):  # nothing left to train: the study file is written as it was
        if results == elsewhere:
            shutil.copytree(studies / "micro", elsewhere / "micro")
        study = FrontierStudy.from_args(dict(MICRO_GRID), [*settings, f"RESULTS_DIR={results}",
                                                           f"CACHE_DIR={results / 'cache'}"])
        study.run(lambda jobs, workers, finished, **_: [0] * len(jobs), measure_cells(study))
        written = written or (studies / "micro" / "frontier-study.json").read_bytes()
        assert (results / "micro" / "frontier-study.json").read_bytes() == written, results


def test_a_plan_counts_every_stage_s_points_as_the_study_s_command_starts_them(tmp_path, monkeypatch):
    """PLAN=True said "left to train: 0 s" on the committed study (listing the edge walks as not planned) while the
    command went on to train 9 steps beyond the grid's edges. With a reference, a control and an edge step's
    records gone, on a processor no record names, the plan's points left, stage by stage, are the points the
    command starts."""
    from reservoir.studies.frontier.edges import EDGE_FOLDER, edge_folder, parse_cell
    from reservoir.studies.frontier.plan import estimate, left_to_train, recorded_cells, unprobed
    from reservoir.studies.frontier.study import measure_cells

    text, _ = TEXTS["frontier-tinystories"]
    if not any(text.glob("*.txt")):
        pytest.skip(NO_TEXT)
    monkeypatch.setenv("RESERVOIR_PRETEND_PROCESSOR", "AMD EPYC 7B13 (a processor no record names)")
    shutil.copytree(ROOT / "results" / "frontier-tinystories", tmp_path / "frontier-tinystories")
    study = _study_from([*_documented_study_command(), f"DATASET={text}", f"CACHE_DIR={tmp_path / 'c'}"],
                        tmp_path)[2]()
    points = study.store.packed()["points"]
    walk = next(w for w in study.edge_walks() if not w["trained_beside"] and w["steps"])
    step = edge_folder(study.path, parse_cell(walk["steps"][0]["cell"]), walk["budget"])
    gone = [next(k for k in points if k.startswith(stage)) for stage in ("references/", "controls/")]
    gone.append(study.store.key(step))
    for key in gone:
        del points[key]
    measure = measure_cells(study)
    plan = estimate(study, measure, unprobed, 1, recorded_cells(study))
    planned = {s["stage"].split(" (")[0]: s["points_left"] for s in plan["stages"] if s["points_left"]}
    assert planned == {"references": 1, "controls": 1, "edge walks": 2} and left_to_train(plan) == 4
    # a later stage's points count as a grid budget's do, recorded or not (its row read 0 when all were recorded)
    totals = {s["stage"].split(" (")[0]: s["points"] for s in plan["stages"] if s.get("after_grid")}
    assert totals["references"] == 10 and totals["controls"] == 6 and totals["draws"] == 3, totals

    started: list[Path] = []

    class Repeated(Exception):
        """The edge stage asked for the same steps again (nothing recorded them): every stage has spoken."""

    def recorder(jobs, *args, **kwargs):
        folders = [Path(folder) for folder, _ in jobs]
        if set(folders) & set(started):
            raise Repeated
        started.extend(folders)
        return [0] * len(jobs)

    with pytest.raises(Repeated):
        study.run(recorder, measure)
    stages = {"references": "references", "controls": "controls", EDGE_FOLDER: "edge walks"}
    counted: dict = {}
    for folder in started:
        stage = stages[folder.relative_to(study.path).parts[0]]
        counted[stage] = counted.get(stage, 0) + 1
    assert counted == planned



STAGES = {"grid": None, "seeds": r"-seeds$", "lead budget": r"^[^/]+-lr[^/]+/flops-4\.00e13$",
          "references": r"^references/", "controls": r"^controls/", "contexts": r"^contexts/", "edges": None}


@pytest.mark.slow  # CI runs it apart (pytest -m slow): the committed study's 150 step costs counted once
def test_every_stage_that_trains_stops_the_study_with_its_points_exit_code(tmp_path, monkeypatch):
    """Every stage hands its points to the one runner a study is given (studies/runner.run_points, whose stop is
    tested with real signals in tests/test_study_faults.py): with one point of a stage missing from the records
    and that point stopped by SIGTERM (143), the study stops there with 143, every other record kept."""
    from reservoir.studies.frontier import FrontierExit
    from reservoir.studies.frontier.edges import edge_folder, parse_cell
    from reservoir.studies.frontier.study import measure_cells
    from reservoir.studies.ladder import point_name

    text, _ = TEXTS["frontier-tinystories"]
    if not any(text.glob("*.txt")):
        pytest.skip(NO_TEXT)
    monkeypatch.setenv("RESERVOIR_PRETEND_PROCESSOR", "Intel(R) Xeon(R) Processor")  # the records' own: no twins
    report = json.loads((ROOT / "results" / "frontier-tinystories" / "frontier.json").read_text())
    grid_top = max(b for b in report["budgets"] if b != report["lead_budget"])
    top = next(p for p in report["envelope"]["transformer++"] if p["budget"] == grid_top)
    measure = None
    for stage, pattern in STAGES.items():  # each on a fresh copy: a stopped stage packs the records it holds
        results = tmp_path / stage
        shutil.copytree(ROOT / "results" / "frontier-tinystories", results / "frontier-tinystories")
        study = _study_from([*_documented_study_command(), f"DATASET={text}", f"CACHE_DIR={tmp_path / 'c'}"],
                            results)[2]()
        if measure is None:  # the same settings and data for every copy: the step costs counted once
            measure, corpus = measure_cells(study), study.corpus
        study.corpus = corpus  # what measure_cells reads from the data, for the study file
        points = study.store.packed()["points"]
        if stage == "grid":  # an envelope point (a cell live at that budget, not an edge step recorded beside it)
            gone = f"{top['cell']}/{point_name(grid_top)}"
        elif stage == "edges":  # a walk's first step (a later one's walk ends before it)
            walk = next(w for w in study.edge_walks() if not w["trained_beside"] and w["steps"])
            gone = study.store.key(edge_folder(study.path, parse_cell(walk["steps"][0]["cell"]), walk["budget"]))
        else:
            gone = next(k for k in sorted(points) if re.search(pattern, k))
        del points[gone]
        started: list[str] = []

        def stopped(jobs, *args, started=started, study=study, **kwargs):
            started.extend(Path(folder).relative_to(study.path).as_posix() for folder, _ in jobs)
            return [143] * len(jobs)

        with pytest.raises(FrontierExit) as ended:
            study.run(stopped, measure)
        assert ended.value.code == 143 and gone in started, (stage, gone, started[:5])
        assert "stopped (exit code 143" in str(ended.value) and "every finished point is kept" in str(ended.value)


def test_a_run_copied_into_a_study_s_folder_is_left_out_of_its_records(tmp_path, capsys):
    """A copy of the default run put inside results/frontier-tinystories/ went into its points.jsonl as a point
    on the next REPORT (875 points became 876): a run folder where none of the study's points lies is said and
    left out."""
    study = tmp_path / "micro"
    shutil.copytree(FIXTURE / "micro", study)
    shutil.copytree(study / "transformer++-xs-lr0.004-b8" / "flops-3.00e09", study / "my-run")
    shutil.copytree(study / "references" / "ngram-3", study / "controls" / "ngram-3")  # no budget in its name
    store = PointRecords(study)
    assert store.strays() == [study / "controls" / "ngram-3", study / "my-run"]
    store.pack()
    keys = set(PointRecords(study).packed()["points"])
    assert "my-run" not in keys and "controls/ngram-3" not in keys and "references/ngram-3" in keys
    assert "transformer++-xs-lr0.004-b8/flops-3.00e09" in keys and len(keys) == len(list(FIXTURE.rglob("summary.json")))
    said = capsys.readouterr().err
    assert f"{study / 'my-run'} holds a run where none of the study's points lies" in said
    assert f"move it out of {study}" in said
