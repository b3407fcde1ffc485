"""A researcher's own family, in a file outside the package: what PLUGINS loads, records and refuses.

docs/extending.md runs the worked family end to end (a run, a sample, a micro frontier and its report, with
Sybil); these tests hold what a run records of the plugin and the one-line refusal of each bad one."""

import json
import os
import re
from pathlib import Path

import pytest

from reservoir.models.registry import PluginError, presets
from reservoir.run.records import portable_config
from tests.conftest import ROOT, run_cli, run_script


def worked_family() -> str:
    """The plugin docs/extending.md writes (its heredoc), so the page and these tests use one family."""
    page = (ROOT / "docs" / "extending.md").read_text()
    return re.search(r"cat > my_models.py <<'EOF'\n(.*?)\nEOF\n", page, re.S).group(1) + "\n"


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "elsewhere" / "my_models.py"
    path.parent.mkdir()
    path.write_text(worked_family())
    return path


def test_a_run_records_its_plugin_by_hash_and_says_when_the_file_has_changed(tmp_path, plugin):
    import hashlib

    run_cli(tmp_path, f"PLUGINS={plugin}", "MODELS=leaky_tanh,ngram", "LEAKY_TANH.units=16", "MAX_STEPS=5",
            "RUN_NAME=mine")
    run = tmp_path / "results" / "mine"
    recorded = json.loads((run / "config.json").read_text())
    assert recorded["plugins"] == {str(plugin): hashlib.sha256(plugin.read_bytes()).hexdigest()}
    committed = portable_config(recorded)  # as a study's records carry it: the plugin from the repository
    assert f'"{plugin}' not in json.dumps(committed)  # (its relative path ends with the same characters)
    assert committed["effective_config"]["PLUGINS"] == [os.path.relpath(plugin, ROOT)]
    summary = json.loads((run / "summary.json").read_text())
    assert [(r["model"], r["trained"]) for r in summary] == [("leaky_tanh", "input+readout"), ("ngram", "counts")]
    assert summary[0]["params_total"] > summary[0]["params_trainable"]  # the reservoir's frozen weights count
    sampled = run_script("sample.py", run, "MAX_NEW_TOKENS=5", "PROMPT=Once")
    assert "has changed since" not in sampled.stderr
    compared = run_script("compare.py", f"{run}:leaky_tanh", f"{run}:ngram", f"OUT={tmp_path / 'ab.json'}")
    assert json.loads((tmp_path / "ab.json").read_text())["a"]["model"] == "leaky_tanh", compared.stdout
    plugin.write_text(plugin.read_text() + "# an edit\n")
    edited = run_script("sample.py", run, "MAX_NEW_TOKENS=5", "PROMPT=Once")
    assert f"was trained with plugin {plugin} has changed since" in edited.stderr
    plugin.unlink()
    gone = run_script("sample.py", run, "MAX_NEW_TOKENS=5", "PROMPT=Once", check=False)
    assert gone.returncode == 1
    assert f"trained families from a plugin: PLUGINS names '{plugin}', which is neither a .py file" in gone.stderr


def test_a_plugins_family_gets_its_settings_checked_like_a_built_in_ones(tmp_path, plugin):
    typo = run_cli(tmp_path, f"PLUGINS={plugin}", "MODELS=leaky_tanh", "LEAKY_TANH.unit=16", check=False)
    assert "unknown hyper-parameter LEAKY_TANH.unit; did you mean LEAKY_TANH.units?" in typo.stderr
    refused = run_cli(tmp_path, f"PLUGINS={plugin}", "MODELS=leaky_tanh", "LEAKY_TANH.spectral_radius=3",
                      check=False)
    assert refused.stderr.strip() == "error: LEAKY_TANH: spectral_radius must stay below 2"
    unnamed = run_cli(tmp_path, "MODELS=leaky_tanh", check=False)  # without PLUGINS, no such model
    assert "unknown model 'leaky_tanh' in MODELS" in unnamed.stderr
    assert not (tmp_path / "results").exists()


BAD_PLUGINS = {
    "an error while it loads": ("import torch\n\nraise RuntimeError('no GPU')\n",
                                "failed to load (line 3: raise RuntimeError('no GPU')): RuntimeError: no GPU"),
    "a name a built-in has": (worked_family().replace('name="leaky_tanh"', 'name="lstm"'),
                              "family 'lstm' is already declared by the built-in families: give yours another name"),
    "a name that is a run setting": (worked_family().replace('name="leaky_tanh"', 'name="seed"'),
                                     "would take the settings block SEED, which is a run setting already"),
    "no size presets": (worked_family().replace('sizes={"xs": {"units": 32}, "s": {"units": 64}, '
                                                '"m": {"units": 128}}', "sizes={}"),
                        "family 'leaky_tanh' declares no size presets"),
    "a setting without a default": (worked_family().replace('"units": (64, "reservoir units")',
                                                            '"units": (None, "reservoir units")'),
                                    "LEAKY_TANH.units has no default: every setting needs one"),
    "a setting without its comment": (worked_family().replace('"units": (64, "reservoir units")', '"units": 64'),
                                      "LEAKY_TANH.units is declared as 64: declare each setting as (default, "),
    "a class no one knows": (worked_family().replace("kind=RESERVOIR", 'kind="semi-frozen"'),
                             "family 'leaky_tanh' has kind='semi-frozen'; one of 'reservoir', 'frozen transition', "
                             "'trained' (reservoir: a trained readout"),
    "a class for a family it does not make": (worked_family().replace("kind=RESERVOIR", 'kind={"gru": "trained"}'),
                                              "family 'leaky_tanh' gives a class to 'gru', which is not one of its "
                                              "study families (leaky_tanh)"),
}


@pytest.mark.parametrize("case", BAD_PLUGINS)
def test_a_bad_plugin_is_refused_in_one_line_before_anything_is_written(tmp_path, case):
    source, said = BAD_PLUGINS[case]
    path = tmp_path / "bad.py"
    path.write_text(source)
    proc = run_cli(tmp_path, f"PLUGINS={path}", "MODELS=lstm", "MAX_STEPS=2", check=False)
    assert proc.returncode == 1
    assert said in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("plugin, said", [
    ("os", "PLUGINS names 'os', a module built into Python: a plugin is the .py file"),
    ("math", "PLUGINS names 'math', a module built into Python: a plugin is the .py file"),
    ("/etc/hostname", "PLUGINS names '/etc/hostname', not a Python file (.py): a plugin is the .py file"),
    ("json", "plugin json declares no family (it ran, as any import does, and registered none)"),
])
def test_a_plugin_that_is_not_a_python_file_or_declares_no_family_is_one_line(tmp_path, plugin, said):
    """PLUGINS=os ended in "FileNotFoundError: 'frozen'", PLUGINS=/etc/passwd in "AttributeError: 'NoneType' object
    has no attribute 'loader'", and PLUGINS=math (a module that declares no family) was accepted without a word."""
    if plugin.startswith("/") and not Path(plugin).is_file():
        pytest.skip(f"{plugin} is not on this machine")
    proc = run_cli(tmp_path, f"PLUGINS={plugin}", "MODELS=lstm", "MAX_STEPS=2", check=False)
    assert proc.returncode == 1 and said in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "results").exists()


def test_a_missing_plugin_file_is_refused_in_one_line(tmp_path):
    proc = run_cli(tmp_path, f"PLUGINS={tmp_path / 'nowhere.py'}", "MODELS=lstm", check=False)
    assert proc.stderr.strip() == (f"error: PLUGINS names '{tmp_path / 'nowhere.py'}', which is neither a .py file "
                                   "here nor an importable module: give the path of the file that declares your "
                                   "family (PLUGINS=my_models.py)")


def test_probes_and_a_sweep_take_a_plugins_family(tmp_path, plugin):
    probes = run_script("probes.py", f"PLUGINS={plugin}", "FAMILIES=leaky_tanh", "TASKS=copying", "STEPS=5",
                        "LEARNING_RATES=4e-3", "WORKERS=1", f"RESULTS_DIR={tmp_path}")
    records = [json.loads(line) for line in (tmp_path / "probes" / "probes.jsonl").read_text().splitlines()]
    # probed at its three smallest presets (xs, s, m: 32, 64, 128 units), each holding its units as state
    assert sorted(r["state_size"] for r in records if r["family"] == "leaky_tanh") == [32, 64, 128]
    assert "| leaky_tanh | " in (tmp_path / "probes" / "probes.md").read_text()
    assert "probes.md" in probes.stdout + probes.stderr
    run_script("sweep.py", "MODEL=leaky_tanh", "TRIALS=1", "SWEEP_NAME=mine", f"PLUGINS={plugin}",
               "DATASET=synthetic", "SYNTHETIC_STORIES=300", "SEQ_LEN=32", "MAX_STEPS=5", "EVAL_POINTS=1",
               "FINAL_EVAL_TOKENS=4096", "PLOTS=False", "SAMPLE_TOKENS=0", f"RESULTS_DIR={tmp_path}",
               f"CACHE_DIR={tmp_path / 'cache'}")
    best = json.loads((tmp_path / "sweeps" / "mine" / "best.json").read_text())
    assert set(best["best_params"]) == {"LEARNING_RATE", "WEIGHT_DECAY"}  # a gradient-fitted family's default space


def test_a_state_size_function_that_fails_is_one_line(tmp_path, plugin):
    plugin.write_text(worked_family().replace("    check=lambda", "    state_size=lambda model, length: 1 / 0,\n"
                                                                  "    check=lambda"))
    proc = run_script("probes.py", f"PLUGINS={plugin}", "FAMILIES=leaky_tanh", "TASKS=copying", "STEPS=2",
                      "LEARNING_RATES=4e-3", "WORKERS=1", f"RESULTS_DIR={tmp_path}", check=False)
    assert proc.returncode == 1
    assert (f"error: plugin {plugin}: the state_size of 'leaky_tanh' failed at length "
            in proc.stderr) and "ZeroDivisionError" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_study_records_the_code_of_each_plugin_family_and_refuses_other_code(tmp_path, plugin, plugins_forgotten):
    """A study continued (another host, another day) with a plugin file that changed would mix two codes in one
    envelope: its study file holds each plugin family's file hash, and another one is refused in one line."""
    import hashlib

    from reservoir.config import split_arguments
    from reservoir.studies.frontier import FRONTIER_KEYS, FrontierStudy
    from reservoir.studies.frontier.study import study_changes
    from reservoir.studies.ladder import STUDY_KEYS

    own, settings = split_arguments([f"PLUGINS={plugin}", "FAMILIES=leaky_tanh,transformer++", "SIZES=xs",
                                     "STUDY=mine", "DATASET=synthetic", f"RESULTS_DIR={tmp_path}"],
                                    (*STUDY_KEYS, *FRONTIER_KEYS))
    content = FrontierStudy.from_args(own, settings).study_content({})
    digest = hashlib.sha256(plugin.read_bytes()).hexdigest()
    # named by its path from the repository, as the study's other places are: the study file names no machine
    named = os.path.relpath(plugin, ROOT)
    assert content["plugins"] == {"leaky_tanh": {"plugin": named, "sha256": digest}}  # transformer++: built in
    assert f"PLUGINS={named}" in content["settings"] and f'"{plugin}' not in json.dumps(content)
    assert f"={plugin}" not in json.dumps(content)
    assert study_changes(content, content) == []
    before = {**content, "plugins": {"leaky_tanh": {"plugin": named, "sha256": "0" * 64}}}
    assert study_changes(before, content) == [
        f"code of leaky_tanh (plugin {named}: SHA-256 000000000000 there, {digest[:12]} here; restore the file its "
        "points were trained with)"]


SPECTRAL_FAMILY = '''
import torch
from torch import nn

from reservoir.models import Family, LanguageModel, register


class Spectral(LanguageModel):
    """Mixes along time with a fixed causal filter applied by FFT: products torch's FLOP counter does not see."""

    def __init__(self, vocab_size, block):
        super().__init__()
        self.embed, self.readout = nn.Embedding(vocab_size, block["width"]), nn.Linear(block["width"], vocab_size)

    def forward(self, ids):
        x = self.embed(ids)
        length = 2 * x.shape[1]
        decay = torch.exp(-torch.arange(x.shape[1], dtype=x.dtype) / 4.0)
        mixed = torch.fft.irfft(torch.fft.rfft(x, n=length, dim=1) * torch.fft.rfft(decay, n=length)[None, :, None],
                                n=length, dim=1)[:, : x.shape[1]]
        return self.readout(mixed)


register(Family(name="spectral", build=lambda v, block, config: Spectral(v, block),
                settings={"width": (16, "channels"), "learning_rate": (3e-3, "rate"), "batch_size": (8, "batch")},
                sizes={"xs": {"width": 16}}, FLOPS))
'''


def test_an_op_the_flop_counter_misses_is_said_until_the_family_declares_its_cost(tmp_path):
    path = tmp_path / "spectral.py"
    # each FFT charged 10 FLOPs per input number (an illustration, not a law)
    cost = "lambda x, *args, out_val=None, **kwargs: 10 * x.numel()"
    path.write_text(SPECTRAL_FAMILY.replace("FLOPS", f"flops={{op: {cost} for op in ('_fft_r2c', '_fft_c2r', "
                                                     "'_fft_c2c')}"))
    quiet = run_cli(tmp_path, f"PLUGINS={path}", "MODELS=spectral", "MAX_STEPS=2", "RUN_NAME=declared")
    assert "FLOPs of Spectral" not in quiet.stderr
    path.write_text(SPECTRAL_FAMILY.replace(", FLOPS", ""))
    said = run_cli(tmp_path, f"PLUGINS={path}", "MODELS=spectral", "MAX_STEPS=2", "RUN_NAME=undeclared")
    assert "FLOPs of Spectral leave out aten._fft_c2c (1 calls), aten._fft_c2r (1 calls), aten._fft_r2c" in said.stderr
    assert "Family(flops={'<op name>': formula})" in said.stderr

    def per_token(run):
        return json.loads((tmp_path / "results" / run / "summary.json").read_text())[0]["flops_per_token"]

    assert per_token("declared") > per_token("undeclared")


def test_size_presets_written_as_a_table_are_refused_when_a_row_misses_a_column():
    assert presets(("units", "width"), xs=(128, 48), s=(192, 64)) == {"xs": {"units": 128, "width": 48},
                                                                     "s": {"units": 192, "width": 64}}
    with pytest.raises(PluginError, match="a value for each of units, width"):
        presets(("units", "width"), xs=(128,))


def test_each_family_declares_what_it_leaves_untrained_and_a_study_compares_the_frozen_ones_as_reservoirs(
        plugin, plugins_forgotten):
    """Two classes answer to "reservoir": a trained readout over fixed features (the ESNs, NVAR, the linear
    reservoir, reservoir attention) and a network that trains every projection and freezes only its recurrence's
    transition (frozen retention, the deep linear reservoir). A forget gate trains the transition: a control. A
    plugin's family declares its own class, and a study then compares it as the built-in ones."""
    from reservoir.models.registry import FROZEN_TRANSITION, RESERVOIR, TRAINED, class_of, load_plugins
    from reservoir.studies.frontier.grid import RESERVOIR_FAMILIES

    assert {f: class_of(f) for f in ("esn", "deep_esn", "nvar", "linear_reservoir", "reservoir_attention",
                                     "reservoir_attention+write")} == dict.fromkeys(
        ("esn", "deep_esn", "nvar", "linear_reservoir", "reservoir_attention", "reservoir_attention+write"), RESERVOIR)
    assert {f: class_of(f) for f in ("frozen_retention", "frozen_retention+write", "deep_linear_reservoir")} == \
        dict.fromkeys(("frozen_retention", "frozen_retention+write", "deep_linear_reservoir"), FROZEN_TRANSITION)
    assert {class_of(f) for f in ("frozen_retention+forget", "transformer", "transformer++", "lstm", "ngram")} == \
        {TRAINED}
    assert sorted(RESERVOIR_FAMILIES) == sorted(["frozen_retention", "reservoir_attention", "deep_linear_reservoir",
                                                 "linear_reservoir", "frozen_retention+write",
                                                 "reservoir_attention+write", "esn+softmax", "esn+mlp"])
    assert {class_of(f) for f in ("esn+softmax", "esn+mlp")} == {RESERVOIR}
    assert "leaky_tanh" not in RESERVOIR_FAMILIES
    load_plugins([str(plugin)])
    assert class_of("leaky_tanh") == RESERVOIR and "leaky_tanh" in RESERVOIR_FAMILIES
