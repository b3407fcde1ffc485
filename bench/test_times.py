"""Where the test suites' time goes: docs/testing.md's table, per test file, from the suites' own records.

    RESERVOIR_TEST_TIMES=quick.json python -m pytest           # the quick suite, recording per file
    RESERVOIR_TEST_TIMES=slow.json python -m pytest -m slow    # the slow one
    python bench/test_times.py quick.json slow.json            # rewrites the table in docs/testing.md
    python bench/test_times.py quick.json slow.json --print    # prints it alone (CI)

The root conftest.py records, per file, the seconds its tests took (set-up, call and tear-down) and the Python
processes they started themselves (an audit hook on subprocess.Popen; a process started by such a process is
not counted). The table lies between the page's two test-times markers; the rest of the page is left as it is.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "testing.md"
START, END = "<!-- test-times: start -->", "<!-- test-times: end -->"


def table(quick: dict, slow: dict) -> str:
    """Markdown: one row per file, slowest quick file first, then the totals."""
    files = sorted(set(quick) | set(slow), key=lambda f: (-quick.get(f, {}).get("seconds", 0), f))
    lines = ["| file | quick: tests | seconds | Python processes | slow: tests | seconds | Python processes |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]

    def cells(entry: dict | None) -> str:
        if not entry:
            return " |  | "
        return f"{entry['tests']} | {entry['seconds']:.0f} | {entry['processes']}"

    for name in files:
        lines.append(f"| `{name}` | {cells(quick.get(name))} | {cells(slow.get(name))} |")

    def total(records: dict) -> dict:
        return {k: sum(r[k] for r in records.values()) for k in ("tests", "seconds", "processes")}

    lines.append(f"| all | {cells(total(quick))} | {cells(total(slow)) if slow else ' |  | '} |")
    return "\n".join(lines)


def with_table(page: str, made: str) -> str:
    """``page`` with ``made`` between its markers, the rest unchanged."""
    if START not in page or END not in page:
        raise ValueError(f"{PAGE.relative_to(ROOT)} has no {START} ... {END} markers to put the table between")
    before, rest = page.split(START, 1)
    after = rest.split(END, 1)[1]
    return f"{before}{START}\n{made}\n{END}{after}"


def main(argv: list[str]) -> int:
    files = [a for a in argv if a != "--print"]
    if not 1 <= len(files) <= 2:
        sys.exit(__doc__)
    try:
        records = [json.loads(Path(a).read_text()) for a in files]
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"error: cannot read the suite's times ({e}); run the suite with RESERVOIR_TEST_TIMES=FILE first")
    made = table(records[0], records[1] if len(records) > 1 else {})
    if "--print" not in argv:
        try:
            PAGE.write_text(with_table(PAGE.read_text(encoding="utf-8"), made), encoding="utf-8")
        except ValueError as e:
            sys.exit(f"error: {e}")
    print(made)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
