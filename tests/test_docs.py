"""The README and docs/: a guide a newcomer reads in minutes, every code block of it run (conftest.py), and
words that speak of the project, never of how it was built."""

import re

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "README_TPU.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"python", "bash"}  # the blocks conftest.py's Sybil runs
SHOWN = {"", "text"}  # printed output and trees: shown, not run


def fences(text: str) -> list[tuple[int, str, str]]:
    """(line, language, the line above) of every fenced block."""
    lines, found, inside = text.splitlines(), [], False
    for n, line in enumerate(lines):
        if line.startswith("```"):
            if not inside:
                found.append((n + 1, line[3:].strip(), lines[n - 1] if n else ""))
            inside = not inside
    return found


def test_the_readme_is_a_guide_of_at_most_250_lines_with_its_reference_in_docs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for page in ("configuration", "runs", "studies", "hardware", "testing", "design"):
        assert f"(docs/{page}.md)" in readme and (ROOT / "docs" / f"{page}.md").exists(), page
    # the TPU guide at the top level, where the project's design names it, and linked from both guides
    assert "(README_TPU.md)" in readme and "(../README_TPU.md)" in (ROOT / "docs" / "hardware.md").read_text()
    assert (ROOT / "README_TPU.md").read_text().startswith("# TPUs (torch_xla)")
    glossary = readme.index("## Words this page uses")
    for word in ("envelope", "wsd", "N_opt", "compute multiplier", "budget"):
        assert readme.index(f"**{word}**") > glossary
        first_use = min(m.start() for m in re.finditer(re.escape(word), readme))
        assert first_use >= glossary, f"{word!r} is used before the glossary defines it"


def test_every_code_block_is_run_or_shown_and_every_skip_says_why():
    for page in PAGES:
        for line, language, above in fences(page.read_text()):
            assert language in RUN | SHOWN, f"{page.name}:{line}: a ```{language} block runs nowhere"
            if "skip:" in above:
                assert re.fullmatch(r'<!-- skip: next "[^"]{20,}" -->', above), f"{page.name}:{line}: say why"


def test_the_docs_speak_of_the_project_not_of_how_it_was_built():
    history = re.compile(r"(?<![\w/])#\d{2,}\b|\bissues?\b|\bsessions?\b|hardening \d", re.IGNORECASE)
    for page in [*PAGES, ROOT / "bench" / "README.md", ROOT / "results" / "README.md"]:
        for n, line in enumerate(page.read_text().splitlines(), start=1):
            assert not history.search(line), f"{page.relative_to(ROOT)}:{n}: {line.strip()}"


def test_the_readme_has_a_row_for_every_family_it_shows_and_counts_as_the_registry_does():
    """The README never said what frozen_retention or reservoir_attention is, and said "Ten models (the default run
    trains eight)" beside a headline of nine families and a study of ten."""
    from reservoir.config import parse_overrides
    from reservoir.models import build_model, model_names
    from reservoir.models.registry import STUDY_FAMILIES, class_of

    readme = (ROOT / "README.md").read_text()
    table = readme.split("<!-- families -->\n", 1)[1].split("<!-- /families -->", 1)[0].splitlines()[2:]
    rows = {cells[1].strip(): cells[3].strip() for cells in (line.split("|") for line in table)}
    classes = {cells[1].strip(): cells[5].strip() for cells in (line.split("|") for line in table)}
    assert classes == {family: class_of(family) for family in rows}  # as each family declares its class
    assert readme.index("<!-- families -->") < readme.index("## What we found")  # before the findings
    headline = readme.split("<!-- headline: results/frontier-tinystories -->\n", 1)[1].split("<!-- /headline -->")[0]
    shown = {line.split("|")[1].strip().split(" (")[0] for line in headline.splitlines()[2:] if line.strip()}
    study = re.search(r"FAMILIES=(\S+)", readme).group(1).split(",")
    assert shown and shown <= set(rows) and set(study) <= set(rows) and set(STUDY_FAMILIES) <= set(rows)
    config = parse_overrides([])
    for family, trained in rows.items():  # what is trained, as the registry's models say it themselves
        model, options = STUDY_FAMILIES.get(family, (family, {}))
        block = {**config[model.upper()], **options}
        assert build_model(model, 60, {**config, model.upper(): block}).trained == trained, family
    counted = re.search(r"(\w+) models in all\. The table's (\w+) rows are the (\w+)\s+study families", readme)
    numbers = {"eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14}
    assert numbers[counted.group(1)] == len(model_names()) and numbers[counted.group(2)] == len(rows)
    assert numbers[counted.group(3)] == len(STUDY_FAMILIES)
    assert set(model_names()) - set(rows) == {"deep_esn", "nvar"} and "`deep_esn`" in readme and "`nvar`" in readme
