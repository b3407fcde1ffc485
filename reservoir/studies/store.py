"""A study's point records in one file: what a study commits, and what its report and a continued study read.

    results/<study>/points.jsonl   line 1: the settings every point shares, the fields every summary record
                                   shares, and the tokenizers the points used; then one line a point: its folder
                                   (relative to the study), its own settings (config.json less the shared part)
                                   and its summary.json records (each less the shared fields)
    results/<study>/points.jsonl.gz  the same lines gzipped, once they pass GZIP_OVER bytes (a study of a thousand
                                   points holds 3-4 MB of records, 8x less gzipped; a file in git stays small)

A point's own folder (logs, samples, metrics, checkpoints) stays on the machine that ran it and is never
committed; its config.json and summary.json travel in points.jsonl with their integrity hashes, checked on
reading as the files are. A point is read from its folder where the folder has a summary, else from
points.jsonl; ``pack`` writes points.jsonl anew from both (a folder's records replace the file's when they
hold as many seeds). A config whose effective settings are its requested ones holds them once (the file is
committed, and most of its bytes would be the same settings twice).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from reservoir.platform.files import atomic_write, atomic_write_text
from reservoir.platform.messages import warn
from reservoir.run.records import (
    RecordedConfig,
    ResultsError,
    check_run_config,
    check_summary,
    finite_or_none,
    portable_config,
    read_json,
    read_run_config,
)

POINTS_FILE = "points.jsonl"
GZIPPED_POINTS_FILE = POINTS_FILE + ".gz"
GZIP_OVER = 1_000_000  # bytes of records past which a study keeps them gzipped (each file in git within 2 MB)
SKIPPED = ("logs", "comparisons", "replays")  # folders of a study that hold no points (replays: copies of points)
# where a study's points lie: <cell>/flops-<budget>[-seeds] (under controls/, contexts/, edges/ too) or references/<run>
_SAID_STRAY: set[Path] = set()  # the strays already warned of, once a process
POINT_KEY = re.compile(r"(?:[^/]+/)+flops-[^/]+|references/[^/]+")
AS_REQUESTED = "as requested_config"  # a packed config's effective_config where it equals its requested_config


def shared_part(configs: list[dict]) -> dict:
    """What every one of ``configs`` holds with the same value, key by key down nested blocks."""
    out = {}
    for key, value in configs[0].items():
        values = [c.get(key, KeyError) for c in configs]
        if all(isinstance(v, dict) for v in values):
            inner = shared_part(values)
            if inner:
                out[key] = inner
        elif all(v == value for v in values):
            out[key] = value
    return out


def own_part(config: dict, shared: dict) -> dict:
    """``config`` less what ``shared`` holds (``merged(shared, own_part(config, shared)) == config``)."""
    out = {}
    for key, value in config.items():
        if key not in shared:
            out[key] = value
        elif isinstance(value, dict) and isinstance(shared[key], dict):
            inner = own_part(value, shared[key])
            if inner or not shared[key]:
                out[key] = inner
        elif value != shared[key]:
            out[key] = value
    return out


def merged(shared: dict, own: dict) -> dict:
    out = dict(shared)
    for key, value in own.items():
        out[key] = merged(shared[key], value) if isinstance(value, dict) and isinstance(shared.get(key), dict) \
            else value
    return out


def folded(config: dict) -> dict:
    """``config`` with its effective settings said once where they are its requested ones (``unfolded`` undoes it)."""
    requested = config.get("requested_config")
    if isinstance(requested, dict) and config.get("effective_config") == requested:
        return {**config, "effective_config": AS_REQUESTED}
    return config


def unfolded(config: dict) -> dict:
    if config.get("effective_config") == AS_REQUESTED and isinstance(config.get("requested_config"), dict):
        # two blocks, not one (a copy through JSON: the records are JSON, and deepcopy took seconds of a report)
        return {**config, "effective_config": json.loads(json.dumps(config["requested_config"]))}
    return config


class PointRecords:
    """The records of the points of the study in ``path``: its point folders and its points.jsonl."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._packed: dict | None = None

    @property
    def file(self) -> Path:
        """The records file: points.jsonl.gz where the study keeps them gzipped, else points.jsonl."""
        gzipped = self.path / GZIPPED_POINTS_FILE
        return gzipped if gzipped.exists() else self.path / POINTS_FILE

    def text(self) -> str:
        """The records file's lines, gunzipped where it is gzipped; '' where there is none. Both forms at once
        are one study's records only where they hold the same lines (a write stopped before the plain copy was
        removed)."""
        plain, gzipped = self.path / POINTS_FILE, self.path / GZIPPED_POINTS_FILE
        if not gzipped.exists():
            return plain.read_text(encoding="utf-8") if plain.exists() else ""
        try:
            text = gzip.decompress(gzipped.read_bytes()).decode("utf-8")
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise ResultsError(f"{gzipped} is not gzipped text ({e}): the file is damaged; restore it (git checkout "
                               f"-- {gzipped})") from None
        if plain.exists() and plain.read_text(encoding="utf-8") != text:
            raise ResultsError(f"{self.path} holds both {POINTS_FILE} and {GZIPPED_POINTS_FILE}, with different "
                               f"records: keep one (the study writes {GZIPPED_POINTS_FILE} once its records pass "
                               f"{GZIP_OVER:,} bytes and removes {POINTS_FILE}; git status says which is committed)")
        return text

    # --- reading
    def key(self, folder: Path) -> str:
        """A point's name in the study: its folder relative to the study's ('<cell>/flops-<budget>')."""
        return Path(folder).relative_to(self.path).as_posix()

    def packed(self) -> dict:
        """{point: {"config": ..., "summary": [...]}} and the tokenizers, as points.jsonl holds them (read once)."""
        if self._packed is None:
            self._packed = {"points": {}, "tokenizers": {}}
            if self.file.exists():
                self._packed = self._read()
        return self._packed

    def _read(self) -> dict:
        damaged = (f"restore it (git checkout -- {self.file}), or delete it if the study's point folders are all "
                   "on this machine (the next run of the study's command writes it again)")
        rows = []
        for n, line in enumerate(self.text().splitlines(), start=1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise ResultsError(f"{self.file} line {n} is not JSON: the file is damaged; {damaged}") from None
        if not rows or not isinstance(rows[0], dict) or not isinstance(rows[0].get("shared_config"), dict):
            raise ResultsError(f"{self.file} does not begin with the shared settings: the file is damaged; {damaged}")
        shared_summary = rows[0].get("shared_summary") or {}  # files packed before it have none
        if not isinstance(shared_summary, dict):
            raise ResultsError(f"{self.file} line 1's shared_summary is not a JSON object: the file is damaged; "
                               f"{damaged}")
        points = {}
        for n, row in enumerate(rows[1:], start=2):
            if not (isinstance(row, dict) and isinstance(row.get("point"), str) and isinstance(row.get("config"), dict)
                    and isinstance(row.get("summary"), list) and all(isinstance(r, dict) for r in row["summary"])):
                raise ResultsError(f"{self.file} line {n} is not a point's record (point, config, summary): the "
                                   f"file is damaged; {damaged}")
            where = f"{self.file} ({row['point']})"
            config = unfolded(merged(rows[0]["shared_config"], row["config"]))
            summary = [merged(shared_summary, record) for record in row["summary"]]
            check_run_config(config, where, f"undo the edit ({damaged})")
            check_summary(summary, where, f"undo the edit ({damaged})")
            points[row["point"]] = {"config": config, "summary": summary}
        return {"points": points, "tokenizers": rows[0].get("tokenizers") or {}}

    def summary(self, folder: Path, what: str = "a point's summary") -> list[dict] | None:
        """The point's records, from its folder or points.jsonl (the folder's where it holds as many seeds);
        None where it has none yet."""
        point = self.packed()["points"].get(self.key(folder))
        if (Path(folder) / "summary.json").exists():
            here = self._folder_summary(folder, point is not None, what)
            if point is None or len(here) >= len(point["summary"]):
                return here
        return point["summary"] if point else None

    @staticmethod
    def _folder_summary(folder: Path, packed: bool, what: str = "a point's summary") -> list[dict]:
        """A point folder's summary.json, checked; an edited one is refused with what deleting it would do."""
        remedy = ("undo the edit, or delete that point's folder: points.jsonl holds its record as the run wrote it"
                  if packed else "undo the edit, or delete that point's folder and run the study's command again, "
                  "which trains the point again (until then a report lists it as not run)")
        path = Path(folder) / "summary.json"
        return check_summary(read_json(path, what), path, remedy)

    def config(self, folder: Path) -> RecordedConfig:
        """The point's config.json (checked), from its folder or points.jsonl."""
        point = self.packed()["points"].get(self.key(folder))
        if (Path(folder) / "config.json").exists() or point is None:
            return read_run_config(folder)
        return RecordedConfig(point["config"], self.file)

    def names_under(self, folder: Path) -> list[str]:
        """The names of the folders directly under ``folder`` that hold points, here or in points.jsonl."""
        prefix = self.key(folder) + "/"
        names = {key[len(prefix):].split("/")[0] for key in self.packed()["points"] if key.startswith(prefix)}
        if Path(folder).is_dir():
            names |= {p.name for p in Path(folder).iterdir() if p.is_dir() and p.name not in SKIPPED}
        return sorted(names)

    def absorb(self, records: dict[str, dict], tokenizers: dict[str, dict] | None = None) -> None:
        """Points recorded elsewhere ({point: {"config", "summary"}}, checked by whoever read them), held as
        points.jsonl holds them: where this host has no record of a point, or one with fewer seeds; and the
        tokenizers they name ({hash: tokenizer.json's content}) where this host has none of that hash, so the
        records pack to the same bytes on a host that trained none of them."""
        points = self.packed()["points"]
        for key, record in records.items():
            if key not in points or len(points[key]["summary"]) < len(record["summary"]):
                points[key] = record
        known = self.packed()["tokenizers"]
        for digest, tokenizer in (tokenizers or {}).items():
            known.setdefault(digest, tokenizer)

    def has_records(self) -> bool:
        """Whether any point of the study is recorded, here or in points.jsonl."""
        return self.file.exists() or bool(self.local_points())

    # --- writing
    def _run_folders(self) -> list[Path]:
        return sorted(p.parent for p in self.path.rglob("summary.json")
                      if not set(p.relative_to(self.path).parts) & set(SKIPPED))

    def local_points(self) -> list[Path]:
        """The point folders on this machine that have a summary (a run folder elsewhere in the study's folder, a
        copy of another run put there, is none of its points)."""
        return self._sorted_runs()[0]

    def strays(self) -> list[Path]:
        """Run folders inside the study's folder where none of its points lies: left out of its records."""
        return self._sorted_runs()[1]

    def _sorted_runs(self) -> tuple[list[Path], list[Path]]:
        """(the study's point folders here, the other run folders in its folder), from one scan of it."""
        points, strays = [], []
        for folder in self._run_folders():
            (points if POINT_KEY.fullmatch(self.key(folder)) else strays).append(folder)
        return points, strays

    def pack(self) -> Path | None:
        """points.jsonl anew from the point folders here and the records it held; written only when it changes.
        None where the study has no point yet."""
        packed = self.packed()
        points = {key: {**point, "config": portable_config(point["config"])} for key, point in packed["points"].items()}
        tokenizers = dict(packed["tokenizers"])
        here, strays = self._sorted_runs()
        for stray in strays:
            if stray not in _SAID_STRAY:
                _SAID_STRAY.add(stray)
                warn(f"{stray} holds a run where none of the study's points lies (a point is <cell>/flops-<budget> "
                     f"or references/<run>): it is left out of {self.file.name}; move it out of {self.path}")
        for folder in here:
            key = self.key(folder)
            summary = self._folder_summary(folder, key in points)
            if key in points and len(points[key]["summary"]) > len(summary):
                continue  # the file holds more of this point (more seeds) than the folder here
            config = read_json(folder / "config.json", "the run's config")
            check_run_config(config, folder / "config.json")  # checked before it is copied
            points[key] = {"config": portable_config(config), "summary": summary}  # committed: no absolute paths
            digest, tokenizer = (config.get("data") or {}).get("tokenizer_hash"), folder / "tokenizer.json"
            if digest and digest not in tokenizers and tokenizer.exists():  # one copy per corpus
                tokenizers[digest] = json.loads(tokenizer.read_text(encoding="utf-8"))
        if not points:
            return None
        configs = {key: folded(point["config"]) for key, point in points.items()}
        shared = shared_part(list(configs.values()))
        records = [record for point in points.values() for record in point["summary"]]
        shared_summary = shared_part(records) if records else {}
        lines = [{"shared_config": shared, "shared_summary": shared_summary,
                  "tokenizers": dict(sorted(tokenizers.items()))}]
        lines += [{"point": key, "config": own_part(configs[key], shared),
                   "summary": [own_part(record, shared_summary) for record in points[key]["summary"]]}
                  for key in sorted(points)]
        text = "".join(json.dumps(finite_or_none(line), ensure_ascii=False, allow_nan=False, sort_keys=True) + "\n"
                       for line in lines)  # keys sorted: the same records pack to the same bytes, however read
        plain, gzipped = self.path / POINTS_FILE, self.path / GZIPPED_POINTS_FILE
        if self.file.exists() and self.text() == text:
            pass  # unchanged records keep their file as it is, whichever form
        elif gzipped.exists() or len(text.encode("utf-8")) > GZIP_OVER:  # mtime 0: the same records, the same bytes
            atomic_write(gzipped, lambda tmp: Path(tmp).write_bytes(gzip.compress(text.encode("utf-8"), mtime=0)))
        else:
            atomic_write_text(plain, text)
        if gzipped.exists():
            plain.unlink(missing_ok=True)  # only after the gzipped copy is whole
        self._packed = {"points": points, "tokenizers": tokenizers}
        return self.file
