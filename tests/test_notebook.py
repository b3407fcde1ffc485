"""notebooks/TinyStories_TPU.ipynb runs top to bottom (on the CPU here: USE_TPU falls back with a warning)."""

import pytest

from tests.conftest import ROOT, TINY

nbformat = pytest.importorskip("nbformat")

NOTEBOOK = ROOT / "notebooks" / "TinyStories_TPU.ipynb"


def with_parameters(nb, **values):
    """Papermill's convention: a cell after the one tagged 'parameters' overrides its values."""
    index = next(i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", []))
    source = "\n".join(f"{name} = {value!r}" for name, value in values.items())
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))
    return nb


@pytest.mark.slow  # CI runs it apart (pytest -m slow); the README's command leaves it out
def test_notebook_runs_top_to_bottom(tmp_path):
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), "commit it without outputs"
    settings = [*TINY, "PLOTS=True", "MODELS=ngram,transformer", "MAX_STEPS=10", "EVAL_EVERY=5",
                f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'cache'}"]
    nb = with_parameters(nb, INSTALL=False, REPO_DIR=str(ROOT), USE_TPU=True, TIME_BUDGET_S=30, SETTINGS=settings)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", []))
    images = [out for cell in nb.cells for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]
    assert "0 failed" in text  # test_tpu_support.py's closing line
    assert "validation bits/char" in text  # the run's closing table
    from reservoir.run.plots import PLOTS

    assert len(images) == len(PLOTS)  # every plot of the run, shown inline
    runs = list((tmp_path / "results").iterdir())
    assert len(runs) == 1 and (runs[0] / "summary.json").exists()
    assert text.count("Once upon a time") >= 2  # sample.py's two stories
