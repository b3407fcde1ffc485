"""ESN end-to-end fit throughput (state harvest + readout fit), harvest throughput, ridge-fit peak
memory and stream-evaluated bits/char: ReservoirNLP vs reservoirpy 0.4.2, on the same characters.

    .venv-bench/bin/python bench/bench_esn.py            # both sides, one process each
    python bench/bench_esn.py ours                       # only ours
    python bench/bench_esn.py ESN.fit_stride=2           # our side with other ESN settings
    .venv-bench/bin/python bench/bench_esn.py units=10000 train_chars=50000 rc_connectivity=0.001  # 10,000 units
    python bench/bench_esn.py draw 4096 10000 32768      # drawing a reservoir: seconds and peak RSS, each apart
    python bench/bench_esn.py readout 2000 32768         # a softmax readout, one pass over the whole slices

Data: the first 200k characters of ../shared/data/tinystories/TinyStories-train-sample.txt
(training) and the first 100k of TinyStories-valid-sample.txt (evaluation), char level.
Both models have 1000 units (``units=``), spectral radius 0.9, leak rate 0.3; both get the same
one-parameter probability-floor calibration so both have a real cross-entropy. ``train_chars=`` shortens the
training text (reservoirpy holds a sequence's every state in float64: 200k x 10,000 is 16 GB);
``rc_connectivity=`` is reservoirpy's recurrent density (its default 0.1; 10/units gives it our 10 connections a
unit). Validation is read in chunks of VAL_CHUNK characters, the state carried, on both sides.
Peak memory is the growth of the process's peak RSS during the fit. End to end is what a user
waits for: ours is ``fit_ridge`` (harvest, XᵀX, solve and the probability-floor calibration),
theirs ``esn.fit`` (harvest and ridge; its calibration is not counted). The validation text is
read as one stream, the state carried through it.
"""

import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "data" / "tinystories"
TRAIN_CHARS, VAL_CHARS, STREAMS = 200_000, 100_000, 250
VAL_CHUNK = 5_000  # validation characters a call: a 10,000-unit reservoir's states for all 100k are 4-8 GB
BENCH_KEYS = {"units": 1000, "train_chars": TRAIN_CHARS, "rc_connectivity": 0.1}  # lower case: the bench's own


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load(train_chars: int = TRAIN_CHARS):
    from reservoir.data.tokenizers import CharTokenizer

    train_text = (SHARED / "TinyStories-train-sample.txt").read_text()[:train_chars]
    val_text = (SHARED / "TinyStories-valid-sample.txt").read_text()[:VAL_CHARS]
    tok = CharTokenizer.train([train_text])
    return tok, tok.encode(train_text), tok.encode(val_text)


def bits_per_char(log_probs_of_targets: np.ndarray) -> float:
    return float(-log_probs_of_targets.mean() / math.log(2))


def ours(overrides=(), units: int = 1000, train_chars: int = TRAIN_CHARS) -> dict:
    from configs import parse_overrides
    from reservoir.models import build_model
    tok, train, val = load(train_chars)
    # reservoirpy's settings (SHARED_CONFIG's ESN is tuned otherwise since): the two sides compared alike
    config = parse_overrides([f"ESN.units={units}", "ESN.spectral_radius=0.9", "ESN.leak_rate=0.3",
                              "ESN.input_scaling=1.0", "ESN.ridge=1.0", *overrides])
    model = build_model("esn", tok.vocab_size, config)
    per = (len(train) - 1) // STREAMS  # the training text as STREAMS contiguous streams advanced together
    x = torch.from_numpy(train[: STREAMS * per].reshape(STREAMS, per))
    y = torch.from_numpy(train[1: STREAMS * per + 1].reshape(STREAMS, per))
    rss0 = _rss_mb()
    chunk = 100  # time steps per chunk: the fit never holds more than STREAMS x chunk states
    calib = STREAMS // 10  # streams held out to fit the probability floor
    start = time.perf_counter()
    batches = ((x[calib:, i:i + chunk], y[calib:, i:i + chunk]) for i in range(0, per, chunk))
    info = model.fit_ridge(batches, [(x[:calib, :1000], y[:calib, :1000])], carry_state=True, washout=20)
    fit_s = time.perf_counter() - start
    peak = _rss_mb() - rss0
    start = time.perf_counter()
    model.reservoir(x)
    harvest_s = time.perf_counter() - start
    v = len(val) - 1
    vx, vy = torch.from_numpy(val[:v]).view(1, -1), torch.from_numpy(val[1:]).view(1, -1)
    pieces, state = [], None
    with torch.no_grad():
        for i in range(0, v, VAL_CHUNK):
            logits, state = model.forward_stream(vx[:, i:i + VAL_CHUNK], state)
            pieces.append(logits.log_softmax(-1).gather(-1, vy[:, i:i + VAL_CHUNK, None]).squeeze(-1))
    logp = torch.cat(pieces, dim=1).numpy()
    return {"side": "ReservoirNLP", "harvest_chars_per_s": STREAMS * per / harvest_s, "fit_s": fit_s,
            "fit_chars_per_s": STREAMS * per / fit_s,
            "fit_peak_mb": peak, "bpc": bits_per_char(logp), **info}


def theirs(units: int = 1000, train_chars: int = TRAIN_CHARS, rc_connectivity: float = 0.1) -> dict:

    from reservoirpy.nodes import Reservoir, Ridge

    from reservoir.models.ridge import fit_probability_floor, floor_logits

    tok, train, val = load(train_chars)
    eye = np.eye(tok.vocab_size, dtype=np.float32)
    x, y = eye[train[:-1]], eye[train[1:]]
    settings = dict(sr=0.9, lr=0.3, rc_connectivity=rc_connectivity, seed=0)
    reservoir = Reservoir(units, **settings)
    readout = Ridge(ridge=1e-2)
    esn = reservoir >> readout
    start = time.perf_counter()
    Reservoir(units, **settings).run(x[:20000])  # harvest alone, on a twin reservoir
    harvest_s = time.perf_counter() - start
    rss0 = _rss_mb()
    start = time.perf_counter()
    esn.fit(x, y)
    fit_s = time.perf_counter() - start
    peak = _rss_mb() - rss0
    scores = torch.from_numpy(np.concatenate([np.asarray(esn.run(eye[val[i:min(i + VAL_CHUNK, len(val) - 1)]]))
                                              for i in range(0, len(val) - 1, VAL_CHUNK)]))  # the state carried
    targets = torch.from_numpy(val[1:])
    floor = fit_probability_floor(scores[:20000], targets[:20000])
    logp = floor_logits(scores, floor).log_softmax(-1).gather(-1, targets.view(-1, 1)).squeeze(-1).numpy()
    return {"side": "reservoirpy 0.4.2", "harvest_chars_per_s": 20000 / harvest_s, "fit_s": fit_s,
            "fit_chars_per_s": len(x) / fit_s,
            "fit_peak_mb": peak, "bpc": bits_per_char(logp), "prob_floor": floor}


def draw(units: int) -> dict:
    """One ESN reservoir of ``units`` drawn and scaled to its spectral radius, as a run draws it (one thread)."""
    from reservoir.models.reservoirs import Reservoir

    torch.set_num_threads(1)
    before, start = _rss_mb(), time.perf_counter()
    Reservoir(77, units, 0.9, 0.3, 1.0, 0.1, 0.0, 10, 0.1, seed=1337)
    return {"units": units, "seconds": round(time.perf_counter() - start, 1),
            "peak_rss_mb": round(_rss_mb()), "rss_growth_mb": round(_rss_mb() - before)}


def readout(units: int) -> dict:
    """An ESN of ``units`` with a softmax readout, trained by TinyStories.py for one pass over the whole training
    slice (its features harvested in streams, reservoir/run/harvest.py), evaluated as the default run evaluates;
    in a process of its own, one thread: wall time, training tokens/s, FLOPs, bits/char and peak RSS."""
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        args = ["MODELS=esn", "ESN.readout=softmax", f"ESN.units={units}", f"DATASET={SHARED}",
                "FLOP_BUDGET=1.953125e13", "TOKEN_BUDGET=933888", "EVAL_POINTS=1", "PLOTS=False", "SAMPLE_TOKENS=0",
                f"RESULTS_DIR={out}", "RUN_NAME=r", f"CACHE_DIR={out}/cache"]
        start = time.perf_counter()
        r = subprocess.run([sys.executable, str(ROOT / "TinyStories.py"), *args], capture_output=True, text=True,
                           env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
        wall = time.perf_counter() - start
        if r.returncode:
            return {"units": units, "failed": r.stderr[-1500:]}
        record = json.loads((Path(out) / "r" / "summary.json").read_text())[0]
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"units": units, "wall_s": round(wall), "train_s": round(record["train_seconds"]),
            "tokens_per_s": round(record["tokens_per_second"]), "train_flops": record["train_flops"],
            "epochs": record["epochs"], "bpc": round(record["val_bpc"], 3), "peak_rss_mb": round(peak)}


def main(argv):
    if argv and argv[0] == "readout":  # each size in a process of its own: peak RSS is a process's
        for units in argv[1:]:
            print(json.dumps(readout(int(units))), flush=True)
        return
    if argv and argv[0] == "draw":  # each size in a process of its own: peak RSS is a process's
        if len(argv) == 2:
            print(json.dumps(draw(int(argv[1]))))
            return
        for units in argv[1:]:
            r = subprocess.run([sys.executable, __file__, "draw", units], capture_output=True, text=True)
            print(r.stdout.strip() or r.stderr[-2000:])
        return
    if not SHARED.is_dir():
        sys.exit(f"bench needs the TinyStories slices at {SHARED}")
    bench = {**BENCH_KEYS, **{k: type(BENCH_KEYS[k])(v) for k, _, v in (a.partition("=") for a in argv)
                              if k in BENCH_KEYS}}
    overrides = [a for a in argv if "=" in a and a.partition("=")[0] not in BENCH_KEYS]
    if argv and argv[0] in ("ours", "theirs"):
        sizes = {"units": bench["units"], "train_chars": bench["train_chars"]}
        print(json.dumps(ours(overrides, **sizes) if argv[0] == "ours" else
                         theirs(**sizes, rc_connectivity=bench["rc_connectivity"])))
        return
    sides, fit_speed = ["ours", "theirs"], {}
    for side in sides:
        r = subprocess.run([sys.executable, __file__, side, *argv], capture_output=True, text=True)
        if r.returncode:
            print(f"{side}: failed\n{r.stderr[-2000:]}")
            continue
        res = json.loads(r.stdout.strip().splitlines()[-1])
        fit_speed[side] = res["fit_chars_per_s"]
        print(f"{res['side']:18s} end to end {res['fit_chars_per_s'] / 1e3:6.1f}k chars/s ({res['fit_s']:5.1f} s) | "
              f"harvest {res['harvest_chars_per_s'] / 1e3:6.1f}k chars/s | peak +{res['fit_peak_mb']:6.0f} MB | "
              f"{res['bpc']:.3f} bits/char")
    if len(fit_speed) == 2:
        print(f"end-to-end fit: {fit_speed['ours'] / fit_speed['theirs']:.1f}x reservoirpy's")


if __name__ == "__main__":
    main(sys.argv[1:])
