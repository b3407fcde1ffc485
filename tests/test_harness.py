"""The tests' own machinery: a root script run in the test process as its own process would run it, and the
table of where the suites' time goes (bench/test_times.py)."""

import importlib.util
import os
import signal

import pytest
import torch

from tests.conftest import ROOT, run_in_process

SCRIPT = '''
import os, signal, sys, warnings
import torch

def main(argv):
    os.environ["CHANGED_BY_THE_SCRIPT"] = "1"
    os.chdir("/")
    signal.signal(signal.SIGTERM, lambda *a: None)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print("to stdout", os.environ.get("GIVEN"))
    print("to stderr", file=sys.stderr)
    warnings.warn("a warning the script raises")
    if argv == ["raise"]:
        raise RuntimeError("not caught")
    if argv == ["exit-message"]:
        raise SystemExit("error: one line")
    if argv == ["child"]:  # a study's point: a process of its own that writes to the terminal it was given
        import subprocess
        subprocess.run([sys.executable, "-c", "import sys; print('the child says why', file=sys.stderr)"])
        print("after the child", file=sys.stderr)
        return 0
    return int(argv[0]) if argv else 0
'''


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("script") / "a_root_script.py"
    path.write_text(SCRIPT)
    return path


def test_a_script_in_this_process_says_and_exits_as_its_own_process_would(script):
    done = run_in_process(str(script), ["3"], env={"GIVEN": "here"})
    assert done.returncode == 3 and done.stdout == "to stdout here\n"
    assert "to stderr" in done.stderr and "UserWarning: a warning the script raises" in done.stderr
    raised = run_in_process(str(script), ["raise"])
    assert raised.returncode == 1 and "Traceback" in raised.stderr and "RuntimeError: not caught" in raised.stderr
    said = run_in_process(str(script), ["exit-message"])
    assert said.returncode == 1 and said.stderr.endswith("error: one line\n")
    child = run_in_process(str(script), ["child"])  # what the script's own processes print is its output too
    assert child.stderr.index("the child says why") < child.stderr.index("after the child")


def test_what_a_script_changes_in_its_process_is_put_back(script):
    handler, threads, cwd = signal.getsignal(signal.SIGTERM), torch.get_num_threads(), os.getcwd()
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    run_in_process(str(script), ["0"], env={"GIVEN": "here"})
    assert "CHANGED_BY_THE_SCRIPT" not in os.environ and "GIVEN" not in os.environ
    assert os.getcwd() == cwd and signal.getsignal(signal.SIGTERM) is handler
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.rand(3), expected)  # the script's seed did not move this process's random stream


def _test_times():
    spec = importlib.util.spec_from_file_location("test_times", ROOT / "bench" / "test_times.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_suites_times_table_sorts_files_by_time_and_replaces_only_its_own_part_of_the_page():
    times = _test_times()
    quick = {"tests/test_a.py": {"tests": 3, "seconds": 10.4, "processes": 2},
             "tests/test_b.py": {"tests": 5, "seconds": 40.0, "processes": 0}}
    slow = {"tests/test_a.py": {"tests": 1, "seconds": 99.0, "processes": 4}}
    made = times.table(quick, slow)
    rows = made.splitlines()
    assert rows[2] == "| `tests/test_b.py` | 5 | 40 | 0 |  |  |  |"
    assert rows[3] == "| `tests/test_a.py` | 3 | 10 | 2 | 1 | 99 | 4 |"
    assert rows[4] == "| all | 8 | 50 | 2 | 1 | 99 | 4 |"
    page = f"# Tests\n\nbefore\n{times.START}\nold table\n{times.END}\nafter\n"
    assert times.with_table(page, made) == f"# Tests\n\nbefore\n{times.START}\n{made}\n{times.END}\nafter\n"
    with pytest.raises(ValueError, match="markers"):
        times.with_table("# a page without its markers\n", made)


def test_the_times_of_tests_run_two_at_a_time_are_those_of_one_at_a_time(tmp_path):
    """With pytest-xdist the processes start in the workers: each writes its part, the run that started them adds
    the parts up (the process boundary is the subject: pytest's own workers)."""
    import json
    import subprocess
    import sys

    tests = tmp_path / "tests"
    tests.mkdir()
    starts = "import subprocess, sys\n\ndef test_{0}():\n" + "    subprocess.run([sys.executable, '-c', 'pass'])\n"
    (tests / "test_one.py").write_text(starts.format("one"))
    (tests / "test_two.py").write_text(starts.format("two") + "    subprocess.run([sys.executable, '-c', 'pass'])\n"
                                       "\n\ndef test_three():\n    pass\n")
    found = {}
    for workers in ("0", "2"):
        times = tmp_path / f"times-{workers}.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RESERVOIR_TEST_TIMES": str(times)}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                               "-n", workers, "--dist", "loadfile", str(tests)], cwd=tmp_path, capture_output=True,
                              text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        found[workers] = {name: (entry["tests"], entry["processes"])
                          for name, entry in json.loads(times.read_text()).items()}
        assert not list(tmp_path.glob("*.parts"))  # the workers' parts were added up and removed
    assert found["2"] == found["0"] == {"tests/test_one.py": (1, 1), "tests/test_two.py": (2, 2)}


def test_a_docs_block_of_root_scripts_alone_runs_in_this_process_and_any_other_with_bash():
    import conftest as pages  # the root conftest.py: how README's and docs' blocks run

    block = ('python TinyStories.py DATASET=synthetic PROMPT="Once upon a time"   # a comment\n'
             "python sample.py results/demo MODEL=lstm \\\n    NUM_SAMPLES=2\n")
    assert pages._root_script_commands(block) == [
        ["TinyStories.py", "DATASET=synthetic", "PROMPT=Once upon a time"],
        ["sample.py", "results/demo", "MODEL=lstm", "NUM_SAMPLES=2"]]
    for shell in ("python scaling.py REPORT=results | tail -3", "python scaling.py REPORT=results > out.txt",
                  "OMP_NUM_THREADS=1 python probes.py", "python -m reservoir.data.fetch shakespeare",
                  "python bench/test_times.py a.json", "python scaling.py REPORT=$HOME", "cd results && ls",
                  "python nosuch.py"):
        assert pages._root_script_commands(f"python sample.py --help\n{shell}\n") is None, shell
