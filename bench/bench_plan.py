"""What PLAN=True said a stage of a study would take, against what its points spent.

    python bench/bench_plan.py results/frontier-shakespeare 3.125e12 --since 2026-11-28T20:20

A copy of the study's records (points.jsonl, gzipped or not, beside its study file) loses the grid points this
host trained at that budget and above (those whose record started at or after --since), so the stage stands as it
did before they ran; the study's own recorded command (WORKERS=1 unless --workers) then plans it, probing here as
PLAN=True does, and the plan's "left to train" at that budget is set against the wall seconds the removed
first-seed points recorded. Run it on an otherwise idle machine, on the host that trained them: the probe times
this host now. The study itself is not touched.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from configs import split_arguments  # noqa: E402
from reservoir.platform.machine import MachineLoad  # noqa: E402
from reservoir.studies.frontier import FRONTIER_KEYS, FrontierStudy, measure_cells  # noqa: E402
from reservoir.studies.frontier.grid import study_command  # noqa: E402
from reservoir.studies.frontier.plan import estimate, probe_cells, recorded_cells  # noqa: E402
from reservoir.studies.frontier.records import note_records  # noqa: E402
from reservoir.studies.ladder import STUDY_KEYS  # noqa: E402
from reservoir.studies.store import PointRecords  # noqa: E402

STAGE_FOLDERS = ("edges/", "controls/", "contexts/", "references/")  # not the grid's: the plan does not price them


def budget_of(point: str) -> float | None:
    name = point.rpartition("/")[2]
    if not name.startswith("flops-"):
        return None
    return float(name.removeprefix("flops-").removesuffix("-seeds"))


def stage_copy(source: Path, copy: Path, budget: float, since: str) -> list[dict]:
    """``copy`` holds ``source``'s study without the grid points trained since ``since`` at ``budget`` and above;
    returns the removed first-seed summaries at ``budget`` (what the stage spent)."""
    copy.mkdir(parents=True)
    records = PointRecords(source)
    if not records.file.is_file():
        sys.exit(f"{source} holds no points.jsonl[.gz]: give a study's folder")
    shutil.copyfile(source / "frontier-study.json", copy / "frontier-study.json")
    header, *lines = records.text().splitlines()
    kept, spent = [header], []
    for line in lines:
        record = json.loads(line)
        point, trained = record["point"], budget_of(record["point"])
        if (trained is None or trained < 0.99 * budget or point.startswith(STAGE_FOLDERS)
                or record["config"].get("started", "") < since):
            kept.append(line)
        elif abs(trained - budget) < 0.01 * budget and not point.endswith("-seeds"):
            spent += [{"point": point, **s} for s in record["summary"][:1]]
    (copy / "points.jsonl").write_text("\n".join(kept) + "\n", encoding="utf-8")
    note_records(copy, PointRecords(copy), check=False)
    return spent


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, help="a study's folder (points.jsonl[.gz], frontier-study.json)")
    parser.add_argument("budget", type=float, help="the grid budget whose stage is planned, e.g. 3.125e12")
    parser.add_argument("--since", required=True, help="the first start (ISO time) of the points this host trained")
    parser.add_argument("--workers", type=int, default=1, help="points at once, as the study ran them")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if not (args.study / "frontier-study.json").is_file():
            sys.exit(f"{args.study} holds no frontier-study.json: give a study's folder")
        recorded = json.loads((args.study / "frontier-study.json").read_text(encoding="utf-8"))
        spent = stage_copy(args.study, Path(tmp) / recorded["study"], args.budget, args.since)
        command = shlex.split(study_command(recorded))[2:]  # past "python scaling.py"
        own, settings = split_arguments([*command, f"WORKERS={args.workers}", f"RESULTS_DIR={tmp}"],
                                        (*STUDY_KEYS, *FRONTIER_KEYS, "FRONTIER"))
        own.pop("FRONTIER", None)
        study = FrontierStudy.from_args(own, settings)
        measure = measure_cells(study)
        probe = probe_cells(study, measure.data)
        try:
            with MachineLoad() as load:
                stage = planned_stage(study, measure, probe, args.budget)
                families = sorted({s["point"].rpartition("/")[0].rsplit("-", 3)[0] for s in spent})
                by_family = {f: planned_stage(study, measure, only(probe, f), args.budget) for f in families}
        finally:
            probe.close()
    wall = sum(s.get("wall_seconds") or 0.0 for s in spent)
    print(f"{recorded['study']} at {args.budget:.3g} FLOPs: planned {stage['points_left']} points, "
          f"{stage['seconds_left']:.0f} device-s; its {len(spent)} points spent {wall:.0f} s "
          f"(plan / spent {stage['seconds_left'] / wall:.2f})" if wall else "no points spent at that budget")
    for family, planned in by_family.items():
        mine = sum(s.get("wall_seconds") or 0.0 for s in spent if s["point"].startswith(family + "-"))
        print(f"  {family}: planned {planned['seconds_left']:.0f} s, spent {mine:.0f} s"
              + (f" ({planned['seconds_left'] / mine:.2f})" if mine else ""))
    print(f"probe load: {json.dumps(load.report())}")
    return 0


def planned_stage(study, measure, seconds_per_step, budget: float) -> dict:
    plan = estimate(study, measure, seconds_per_step, 1, recorded_cells(study))
    return next(s for s in plan["stages"] if s["stage"] == f"{budget:.3g} FLOPs")


def only(probe, family: str):
    """``probe`` for ``family``'s cells, nothing for the others': the plan's share of one family (probed once)."""
    def seconds_per_step(cell) -> float:
        return probe(cell) if cell.family == family else 0.0

    seconds_per_step.besides_training = lambda cell: probe.besides_training(cell) if cell.family == family else 0.0
    return seconds_per_step


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
