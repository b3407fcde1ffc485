import copy
import importlib.util
import re

import pytest

from reservoir.config import (
    SHARED_CONFIG,
    ConfigError,
    given_settings,
    help_text,
    key_comments,
    key_value,
    parse_options,
    parse_overrides,
    split_arguments,
)
from reservoir.platform import device as dev
from tests.conftest import ROOT, make_config, run_script


def test_every_key_is_documented_and_listed_in_help():
    comments = key_comments()
    undocumented = [k for k in SHARED_CONFIG if not comments.get(k)]
    assert not undocumented, f"keys without a comment in reservoir/config.py: {undocumented}"
    text = help_text()
    for key, value in SHARED_CONFIG.items():
        assert f"{key}" in text and repr(value) in text


def test_overrides_parse_literals_case_insensitively():
    config = parse_overrides(["use_tpu=true", "Batch_Size=64", "learning_rate=1e-3", "device=tpu", "RUN_NAME=abc"])
    assert config["USE_TPU"] is True and config["BATCH_SIZE"] == 64 and config["LEARNING_RATE"] == 1e-3
    assert config["RUN_NAME"] == "abc" and config["DEVICE"] == "tpu"
    assert parse_overrides(["LEARNING_RATE=1"])["LEARNING_RATE"] == 1.0  # int accepted for a float key


def test_defaults_are_not_modified_by_overrides():
    before = copy.deepcopy(SHARED_CONFIG)  # deep: a change inside a model block must show
    parse_overrides(["BATCH_SIZE=7", "ESN.units=3", "MODELS=esn"])
    config = parse_overrides([])
    config["ESN"]["units"] = 5  # a caller editing its config must not reach the defaults either
    config["MODELS"].append("lstm")
    assert SHARED_CONFIG == before


@pytest.mark.parametrize("arg, message", [
    ("BATCH_SZE=3", "did you mean BATCH_SIZE"),
    ("BATCH_SIZE=0", "must be > 0"),
    ("BATCH_SIZE=2.5", "must be an integer"),
    ("BATCH_SIZE=abc", "must be an integer"),
    ("USE_TPU=maybe", "must be True or False"),
    ("DEVICE=gpu", "must be one of"),
    ("PRECISION=fp8", "must be one of"),
    ("LEARNING_RATE=nan", "finite number"),
    ("SEED=-1", ">= 0"),
    ("BATCH_SIZE", "is not KEY=VALUE"),
    ("COOLDOWN_FRACTION=1", "COOLDOWN_FRACTION must be between 0 and 1"),
    ("COOLDOWN_FRACTION=0", "COOLDOWN_FRACTION must be between 0 and 1"),
    ("COOLDOWN_SHAPE=cosine", "COOLDOWN_SHAPE must be one of"),
    ("LR_SCHEDULE=step", "LR_SCHEDULE must be one of"),
    ("ADAM_BETA2=1", "ADAM_BETA2 must be between 0 and 1"),
    ("ADAM_BETA2_REF_TOKENS=0", "ADAM_BETA2_REF_TOKENS must be > 0"),
    ("LEARNING_RATE=0", "LEARNING_RATE must be > 0"),
    ("TRANSFORMER.recipe=llama", "must be one of 'gpt2' | '++'"),
    ("TRANSFORMER.rotary=maybe", "must be True, False or None"),
])
def test_bad_values_name_what_is_allowed(arg, message):
    with pytest.raises(ConfigError, match=message):
        parse_overrides([arg])


def _integer_settings() -> list[str]:
    """Every setting whose default is an integer (model blocks' too), as KEY or BLOCK.key."""
    keys = []
    for key, value in SHARED_CONFIG.items():
        if isinstance(value, dict):
            keys += [f"{key}.{k}" for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)]
        elif isinstance(value, int) and not isinstance(value, bool):
            keys.append(key)
    return keys


@pytest.mark.parametrize("key", [*_integer_settings(), "EVAL_TOKENS", "FINAL_EVAL_TOKENS", "TOKEN_BUDGET",
                                 "ADAM_BETA2_REF_TOKENS"])
def test_a_number_past_floats_range_is_one_line_for_every_integer_setting(key):
    """1e400 reads as infinity: int() of it raised OverflowError from deep in the parser."""
    for value in ("1e400", "-1e400"):
        with pytest.raises(ConfigError, match=f"{key.split('.')[-1]} must be an integer, got -?inf"):
            parse_overrides([f"{key}={value}"])


def test_sample_py_refuses_a_number_past_floats_range_in_one_line():
    spec = importlib.util.spec_from_file_location("sample_script", ROOT / "sample.py")
    sample = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample)
    for key, kind in (("MAX_NEW_TOKENS", int), ("TEMPERATURE", float)):
        with pytest.raises(ConfigError, match=f"{key} must be .*, got inf"):
            sample._number({key: float("inf")}, key, 1, kind, 0)


def test_use_tpu_contradicting_device_is_refused():
    with pytest.raises(ConfigError, match="contradicts"):
        parse_overrides(["USE_TPU=True", "DEVICE=cpu"])


def test_tpu_adjustments_return_a_new_config():
    config = parse_overrides(["BATCH_SIZE=10", "LEARNING_RATE=0.01", "TPU_BATCH_MULTIPLIER=3"])
    tpu = dev.adjust_config(config, "tpu")
    assert (tpu["BATCH_SIZE"], tpu["LEARNING_RATE"]) == (30, pytest.approx(0.012))
    assert config["BATCH_SIZE"] == 10


@pytest.mark.parametrize("script", ["TinyStories.py", "test_tpu_support.py"])
def test_cli_errors_are_one_line_without_traceback(script):
    r = run_script(script, "BATCH_SZE=3", check=False)
    assert r.returncode != 0
    assert r.stderr.strip() == "error: unknown config key BATCH_SZE; did you mean BATCH_SIZE?"


def test_cli_help_lists_every_key_with_default():
    r = run_script("TinyStories.py", "--help", check=False)
    assert r.returncode == 0, r.stderr
    for key, value in SHARED_CONFIG.items():
        assert key in r.stdout and f"default {value!r}" in r.stdout


def test_every_error_a_script_reports_in_one_line_shares_one_base():
    """Root scripts catch OneLineError alone: an error class of the project that does not derive from it
    would reach the user as a traceback."""
    import importlib
    import inspect
    import pkgutil

    import configs
    import reservoir
    from reservoir.platform.messages import OneLineError

    names = [m.name for m in pkgutil.walk_packages(reservoir.__path__, "reservoir.")]
    modules = [configs] + [importlib.import_module(name) for name in names]
    errors = {cls for module in modules for _, cls in inspect.getmembers(module, inspect.isclass)
              if cls.__module__ == module.__name__ and issubclass(cls, Exception) and cls.__name__.endswith("Error")}
    assert {"ConfigError", "DataError", "ResultsError", "CheckpointError", "StorageError", "DeviceError",
            "TrackingError", "BudgetError", "SweepError", "StudyError", "ModelSettingsError"} <= {
        e.__name__ for e in errors}
    assert [e.__name__ for e in errors if not issubclass(e, OneLineError)] == []


def test_one_key_value_parser_reads_settings_script_options_and_a_scripts_own_keys():
    assert key_value(" esn.Spectral_Radius = 0.9") == ("ESN", "spectral_radius", " 0.9")
    assert key_value("seq_len=64") == ("SEQ_LEN", None, "64") and key_value("results/run") is None
    own, rest = split_arguments(["model=esn", "TRIALS=3", "ESN.units=10", "results/x", "model.x=1"],
                                ("MODEL", "TRIALS"))
    assert own == {"MODEL": "esn", "TRIALS": "3"} and rest == ["ESN.units=10", "results/x", "model.x=1"]
    options = parse_options(["tokens=5", "out=a b.json", "diagnostics=yes"], ("TOKENS", "OUT", "DIAGNOSTICS"),
                            text_keys=("OUT",))
    assert options == {"TOKENS": 5, "OUT": "a b.json", "DIAGNOSTICS": True}
    for bad in (["TOKENS"], ["SEED=1"], ["TOKENS.x=1"]):
        with pytest.raises(ConfigError, match="is not one of TOKENS, OUT as KEY=VALUE"):
            parse_options(bad, ("TOKENS", "OUT"))
    assert given_settings(["esn.UNITS=1", "SEQ_LEN=2", "ESN.units=3"]) == ["ESN.units", "SEQ_LEN"]
    assert parse_overrides(["esn.units=100"])["ESN"]["units"] == 100


def test_root_scripts_import_no_other_script_and_read_key_value_through_configs():
    import ast

    scripts = {p.stem for p in ROOT.glob("*.py")}
    for script in scripts - {"configs"}:
        tree = ast.parse((ROOT / f"{script}.py").read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module}
        assert imported & scripts <= {"configs"}, f"{script}.py imports {imported & scripts - {'configs'}}"
        assert "argparse" not in imported and ".partition(\"=\")" not in (ROOT / f"{script}.py").read_text(), script


@pytest.mark.parametrize("script, args", [("sample.py", ["results/x", "COLOUR=red"]),
                                          ("compare.py", ["a", "b", "COLOUR=red"]),
                                          ("plot_results.py", ["a", "COLOUR=red"])])
def test_a_scripts_unknown_key_is_one_line_that_lists_its_keys(script, args):
    r = run_script(script, *args, check=False)
    assert r.returncode == 1 and r.stderr.startswith("error: 'COLOUR=red' is not one of ")
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_block_value_that_may_be_zero_says_so():
    with pytest.raises(ConfigError, match=r"FROZEN_RETENTION.conv_width must be >= 0, got -1"):
        parse_overrides(["FROZEN_RETENTION.conv_width=-1"])
    with pytest.raises(ConfigError, match=r"FROZEN_RETENTION.width must be > 0"):
        parse_overrides(["FROZEN_RETENTION.width=0"])


@pytest.mark.parametrize("family, said", [
    ("frozen_retention+write", "MODELS=frozen_retention FROZEN_RETENTION.write_gate=True"),
    ("transformer++", "MODELS=transformer TRANSFORMER.recipe='++'"),
])
def test_a_study_family_named_in_models_says_how_a_run_names_it(tmp_path, family, said):
    """MODELS=frozen_retention+write suggested frozen_retention, not the setting that makes it the gated family."""
    from reservoir.config import ConfigError

    with pytest.raises(ConfigError, match=re.escape(f"(a study's family: a run names it as {said})")):
        make_config(tmp_path, f"MODELS=['{family}']")


def test_help_shows_each_comment_whole_and_names_the_study_families():
    """--help cut FROZEN_RETENTION's comment at "write_gate: a trained" and TRANSFORMER's at "None parts: the
    recipe's;" (each went on on a line of its own), and named none of the gated study families."""
    from reservoir.config import help_text

    text = help_text()
    assert "write_gate: a trained gate on what enters the state (still a reservoir); forget_gate: trained " \
           "content-dependent decays (not one)" in text
    assert "None parts: the recipe's; trained 'everything' | 'embeddings' (the random-transformer control" in text
    assert "the fetch writes data/tinystories/ (DATASET=data/tinystories)" in text
    families = text.split("Study families")[1]
    assert "frozen_retention+write" in families and "MODELS=frozen_retention FROZEN_RETENTION.write_gate=True" in \
        families and "MODELS=transformer TRANSFORMER.recipe='++'" in families
    assert "--- " not in text  # a section's header is no key's comment


def test_help_gives_every_setting_of_every_built_in_block_a_line_of_its_own():
    """A plugin's block listed each setting with its comment; a built-in's (ESN, TRANSFORMER, ...) none."""
    from reservoir.config import SHARED_CONFIG, help_text

    lines = help_text().splitlines()
    for block, values in SHARED_CONFIG.items():
        if isinstance(values, dict):
            for setting in values:
                said = [line.strip() for line in lines if line.strip().startswith(f"{block}.{setting}: ")]
                assert len(said) == 1 and len(said[0]) > len(f"{block}.{setting}: ") + 8, (block, setting)
