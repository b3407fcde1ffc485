"""sample.py: stories from a run folder alone, equal to what the run itself wrote."""

import json
import shutil

import pytest
import torch

from reservoir.data.tokenizers import CharTokenizer
from reservoir.run.sampling import SampleSettings, decode_story, write_stories
from reservoir.run.trained import load_trained
from tests.conftest import ALL_MODELS, run_cli, run_script, trained_and_moved

MODELS = ALL_MODELS
SEPARATOR = "\n" + "-" * 40 + "\n"


def sample(*args, check=True):
    return run_script("sample.py", *args, check=check)


@pytest.mark.parametrize("model", MODELS)
def test_sample_from_checkpoint_equals_the_runs_own_samples(every_model_run, model):
    summary = {r["model"]: r for r in json.loads((every_model_run / "summary.json").read_text())}
    written = [s["text"] for s in summary[model]["samples"]]
    proc = sample(every_model_run, f"MODEL={model}", "STOP_AT_END=True")
    assert proc.stdout.rstrip("\n").split(SEPARATOR) == written
    assert f"{model} at step" in proc.stderr and "finished" in proc.stderr


@pytest.mark.xla
def test_sample_with_the_xla_device(tmp_path):
    """DEVICE=tpu: the device layer picks XLA and generates on the CPU, so the stories are the run's."""
    run = trained_and_moved(tmp_path, ["transformer"])  # the XLA suite's one sampling test: one model is enough
    summary = {r["model"]: r for r in json.loads((run / "summary.json").read_text())}
    proc = sample(run, "MODEL=transformer", "DEVICE=tpu", "STOP_AT_END=True")
    assert proc.stdout.rstrip("\n").split(SEPARATOR) == [s["text"] for s in summary["transformer"]["samples"]]
    assert "on cpu" in proc.stderr


@pytest.mark.xla
def test_a_story_on_an_xla_device_is_read_by_the_host_once():
    """Where every host read waits for the device (XLA's lazy tensors here, a GPU alike), a story of known length
    is read once, its tokens chosen on the device; while it looks for its end, once every ``stop_every`` tokens.
    The stories are the CPU's."""
    import torch_xla
    import torch_xla.debug.metrics as metrics

    from reservoir.config import parse_overrides
    from reservoir.models import build_model

    model = build_model("lstm", 40, parse_overrides(["LSTM.hidden=32"])).eval()
    on_cpu = model.generate(torch.arange(6), 20, generator=torch.Generator().manual_seed(1))
    device = torch_xla.device()
    model.to(device)
    for options, reads in (({}, 1), ({"stop_id": 99, "stop_every": 5}, 4)):  # 99: a token the vocabulary lacks
        metrics.clear_all()
        story = model.generate(torch.arange(6, device=device), 20, generator=torch.Generator().manual_seed(1),
                               **options)
        assert torch.equal(story, on_cpu), options
        assert metrics.metric_data("TransferFromDeviceTime")[0] == reads, options


def test_samples_continue_past_story_ends_as_blank_lines(every_model_run):
    model, tokenizer, _ = load_trained(every_model_run, "ngram")
    for seed in range(50):  # a seed whose first story ends within the token budget
        settings = SampleSettings(max_new_tokens=600, temperature=1.0, top_k=None, seed=seed, stop_at_end=True)
        stopped = write_stories(model, tokenizer, ["Once upon a time"], settings, torch.device("cpu"))[0][1]
        if len(stopped) < len("Once upon a time") + 600:
            break
    else:
        pytest.fail("no story ended within 600 tokens in 50 seeds")
    settings = SampleSettings(max_new_tokens=600, temperature=1.0, top_k=None, seed=seed, stop_at_end=False)
    going_on = write_stories(model, tokenizer, ["Once upon a time"], settings, torch.device("cpu"))[0][1]
    assert going_on.startswith(stopped)  # the same generator, carried on past the end of the story
    assert going_on[len(stopped):].startswith("\n\n") and len(going_on) > len(stopped) + 2  # the end: a blank line
    assert "<|endoftext|>" not in going_on


def test_prompt_file_and_num_samples(every_model_run, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\n\nTom and his\n", encoding="utf-8")
    out = sample(every_model_run, "MODEL=lstm", f"PROMPT=FILE:{prompts}", "NUM_SAMPLES=2", "MAX_NEW_TOKENS=20",
                 "STOP_AT_END=True", "SEED=7").stdout.rstrip("\n").split(SEPARATOR)
    assert len(out) == 4
    assert [s[:16] for s in out[:2]] == ["Once upon a time"] * 2 and all(s.startswith("Tom and his") for s in out[2:])
    assert out[0] != out[1]  # two draws, not one story twice


def test_default_model_is_the_runs_best(every_model_run):
    summary = json.loads((every_model_run / "summary.json").read_text())
    best = min(summary, key=lambda r: r["val_bpc"])["model"]
    assert f"{best} at step" in sample(every_model_run, "NUM_SAMPLES=1", "MAX_NEW_TOKENS=5").stderr


@pytest.mark.parametrize("args, message", [
    (["MODEL=gpt"], "not a model of this run"),
    (["MODEL=esn", "TOP_K=0"], "TOP_K must be >= 1"),
    (["COLOUR=red"], "is not one of MODEL"),
    (["PROMPT=FILE:/nonexistent/prompts.txt"], "cannot read it"),
    (["DEVICE=tpu"], "DEVICE='tpu' is not available"),
])
def test_bad_input_is_one_line(every_model_run, args, message):
    proc = sample(every_model_run, *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_bad_run_folder_or_missing_checkpoint_is_one_line(every_model_run, tmp_path):
    proc = sample(tmp_path / "nothing-here", check=False)
    assert proc.returncode != 0 and "not a folder" in proc.stderr and "Traceback" not in proc.stderr
    copy = tmp_path / "copy"
    shutil.copytree(every_model_run, copy)
    (copy / "checkpoints" / "esn.pt").unlink()
    proc = sample(copy, "MODEL=esn", check=False)
    assert proc.returncode != 0 and "esn.pt is not in this copy" in proc.stderr and "Traceback" not in proc.stderr
    (copy / "tokenizer.json").unlink()
    proc = sample(copy, "MODEL=lstm", check=False)
    assert proc.returncode != 0 and "tokenizer.json is missing" in proc.stderr and "Traceback" not in proc.stderr
    proc = sample(check=False)
    assert proc.returncode != 0 and "run folder" in proc.stderr


def test_decode_shows_story_ends_as_blank_lines():
    tok = CharTokenizer("abc .")
    ids = tok.encode("ab.<|endoftext|>ca")
    assert decode_story(tok, ids) == "ab.\n\nca"


def test_a_prompt_with_characters_outside_the_vocabulary_is_warned_about(tmp_path):
    run_cli(tmp_path, "MODELS=ngram", "MAX_STEPS=2", "RUN_NAME=s")
    proc = run_script("sample.py", tmp_path / "results" / "s", "PROMPT=Once upon a tîme€", "MAX_NEW_TOKENS=5")
    warnings = [line for line in proc.stderr.splitlines() if "not in this run's vocabulary" in line]
    assert len(warnings) == 1 and "'î', '€'" in warnings[0] and "shown as '?'" in warnings[0]
    plain = run_script("sample.py", tmp_path / "results" / "s", "PROMPT=Once upon a time", "MAX_NEW_TOKENS=5")
    assert "vocabulary" not in plain.stderr

