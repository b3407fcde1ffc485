"""The one home for device logic: choosing TPU (torch_xla) / CUDA / CPU, precision,
gradient scaling, XLA step markers and data loaders.

The training loop, the models and the results ask this module for a context
(``autocast``), a scaler, a loader, a step, a transfer or a collective, and this
module answers per device. Elsewhere, code reads ``DeviceInfo`` only where the answer
differs by design (run/folders.py: XLA processes cannot broadcast a folder name), and the
reservoirs ask a tensor's own device only to pick a sparse kernel that XLA lacks.
torch_xla is imported lazily so the rest works without it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import glob
import importlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from reservoir.platform.machine import usable_cores
from reservoir.platform.messages import TAG, OneLineError, first_line, say, warn

_GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips appear on the PCI bus with Google's vendor id, and so does a GCE
# VM's virtual NIC (gVNIC, device 0x0042): a chip is known by its device id too (v2/v3, an unnamed one, v4,
# v5p, v5e, v6e; the list JAX's hardware_utils keeps)
_TPU_PCI_DEVICES = {"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f"}
PCI_DEVICES = "/sys/bus/pci/devices"


class DeviceError(OneLineError, RuntimeError):
    """An explicit device or precision request that this machine cannot honour."""


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # 'tpu' (any XLA device: a TPU, or XLA:CPU under PJRT_DEVICE=CPU) | 'cuda' | 'cpu'
    device: torch.device
    name: str  # human-readable hardware name
    precision: str  # 'fp32' | 'bf16' | 'fp16'
    world_size: int = 1  # processes (torchrun ranks, or torch_xla.launch processes)
    rank: int = 0
    mesh: object = None  # the SPMD device mesh (one 'data' axis) when TPU_PARALLEL='spmd'
    spmd_devices: int = 1  # devices one SPMD process drives

    @property
    def placed_on(self) -> str | None:
        """The device a study gave this process ('cuda:3', 'tpu chips 0,1', 'cpu'), None outside a study."""
        return os.environ.get(POINT_DEVICE_VARIABLE)

    @property
    def is_xla(self) -> bool:
        return self.kind == "tpu"

    @property
    def replicas(self) -> int:
        """Data-parallel copies of the model: the global batch is BATCH_SIZE x this (x GRAD_ACCUM)."""
        return self.world_size * self.spmd_devices

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def amp_dtype(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)

    def banner(self) -> str:
        what = {
            "tpu": "TPU detected." if self.name.startswith("TPU") else f"XLA device ({self.name}), TPU code path.",
            "cuda": f"CUDA GPU detected ({self.name}).",
            "cpu": f"{self.name}.",
        }[self.kind]
        unit = "Core" if self.is_xla else "Rank"
        spmd = f", SPMD over {self.spmd_devices} devices" if self.mesh is not None else ""
        return f"{TAG} {what} {unit} {self.rank}/{self.world_size}, device {self.device}, {self.precision}{spmd}"


# --------------------------------------------------------------------- detection


def xla_installed() -> bool:
    """torch_xla can be imported (honours an import blocked by a meta-path hook)."""
    if "torch_xla" in sys.modules:
        return sys.modules["torch_xla"] is not None
    try:
        return importlib.util.find_spec("torch_xla") is not None
    except (ImportError, ValueError):
        return False


def tpu_chips_present() -> bool:
    """Real TPU chips on this host (independent of torch_xla being installed)."""
    return tpu_chip_count() > 0


def xla_usable() -> bool:
    """torch_xla is installed *and* there is something for it to run on.

    Being importable is not enough: without TPU chips and without PJRT_DEVICE
    set, torch_xla would silently run on the CPU, which 'auto' must not pick.
    """
    if not xla_installed():
        return False
    return bool(os.environ.get("PJRT_DEVICE")) or tpu_chips_present()


_TORCH_TPU_PROBE = """
import json, torch
import torch_tpu  # noqa: F401
try:
    torch.device("tpu")  # parses only once a backend has registered the 'tpu' device type
    registered = True
except RuntimeError:
    registered = False
module = getattr(torch, "tpu", None)
count = int(module.device_count()) if registered and hasattr(module, "device_count") else 0
print(json.dumps({"tpu_device": registered, "devices": count}))
"""


def torch_tpu_status() -> dict | None:
    """TorchTPU (PyPI ``torch-tpu``, torch_xla's announced successor), for information only.

    None when it is not installed; else its version and whether importing it registers a
    ``tpu`` device. The import is probed in a child process: without libtpu it aborts the
    process that imports it (an absl CHECK failure), which must not take the caller down.
    """
    if importlib.util.find_spec("torch_tpu") is None:
        return None
    try:
        version = importlib.metadata.version("torch-tpu")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown version"
    status = {"version": version, "imported": False, "tpu_device": False, "devices": 0, "error": None}
    try:
        child = subprocess.run([sys.executable, "-c", _TORCH_TPU_PROBE], capture_output=True, text=True,
                               timeout=300)
    except subprocess.TimeoutExpired:
        return {**status, "error": "import timed out"}
    if child.returncode != 0:
        lines = [line.strip() for line in child.stderr.splitlines() if line.strip()]
        telling = [line for line in lines if any(w in line for w in ("Error", "failed", "not found", "not set"))]
        reason = (telling or lines or ["no message"])[-1]
        return {**status, "error": f"importing it failed (exit {child.returncode}): {reason[:200]}"}
    return {**status, "imported": True, **json.loads(child.stdout.strip().splitlines()[-1])}


def available_kinds() -> list[str]:
    kinds = []
    if xla_usable():
        kinds.append("tpu")
    if torch.cuda.is_available():
        kinds.append("cuda")
    kinds.append("cpu")
    return kinds


def resolve_kind(device: str = "auto", use_tpu: bool = False) -> str:
    """The device kind to use for a DEVICE / USE_TPU request (see reservoir/config.py)."""
    kinds = available_kinds()
    if device == "auto" and use_tpu:
        if "tpu" in kinds:
            return "tpu"
        fallback = "cuda" if "cuda" in kinds else "cpu"
        why = (
            "torch_xla is not installed"
            if not xla_installed()
            else "no TPU chips were found and PJRT_DEVICE is not set"
        )
        warn(
            f"a TPU was requested (USE_TPU=True) but {why}; "
            f"using {'the GPU' if fallback == 'cuda' else 'the CPU'} ({fallback}) instead. "
            "See README_TPU.md to set up torch_xla."
        )
        return fallback
    if device == "auto":
        return kinds[0]
    if device not in kinds:
        hint = ""
        if device == "tpu":
            hint = (
                " (install torch_xla: see README_TPU.md)"
                if not xla_installed()
                else " (no TPU chips found; set PJRT_DEVICE=CPU to run the XLA path on the CPU)"
            )
        raise DeviceError(f"DEVICE={device!r} is not available{hint}; available here: {', '.join(kinds)}")
    return device


def runs_on_cpu(config: dict) -> bool:
    """Whether a run of ``config`` takes the CPU: asked for, or nothing else is here (resolve_kind's answer,
    without its warning, which the run itself gives)."""
    return config["DEVICE"] == "cpu" or available_kinds() == ["cpu"]


def cuda_has_native_bf16(device: torch.device | int | None = None) -> bool:
    """bf16 in hardware: compute capability 8.0 (Ampere) or newer. ``torch.cuda.is_bf16_supported()``
    also says yes on a T4 or V100, where bf16 is emulated and slower than fp32."""
    if torch.version.hip:  # ROCm reports no CUDA capability; its own answer is about hardware
        return torch.cuda.is_bf16_supported()
    return torch.cuda.get_device_capability(device)[0] >= 8


def resolve_precision(kind: str, requested: str = "auto", device: torch.device | int | None = None) -> str:
    """The precision a run uses (docs/configuration.md, the PRECISION row): auto is bf16 on TPUs and on GPUs
    with bf16 hardware, fp16 with a grad scaler on older GPUs, fp32 on CPUs. ``device``: the GPU
    this process uses (each torchrun process asks about its own, not GPU 0)."""
    if requested == "auto":
        if kind == "tpu":
            return "bf16"
        if kind == "cuda":
            return "bf16" if cuda_has_native_bf16(device) else "fp16"
        return "fp32"
    if requested == "fp16" and kind != "cuda":
        raise DeviceError(f"PRECISION='fp16' needs a CUDA GPU; on {kind} use 'bf16' or 'fp32'")
    if requested == "bf16" and kind == "cuda" and not cuda_has_native_bf16(device):
        raise DeviceError("PRECISION='bf16' needs a GPU with bf16 hardware (compute capability 8.0+, e.g. A100, "
                          "L4, H100); on this one use 'fp16' (or 'auto') or 'fp32'")
    return requested


def adjust_config(config: dict, device_kind: str) -> dict:
    """A new config with this device's adjustments: on TPU, BATCH_SIZE x TPU_BATCH_MULTIPLIER and
    LEARNING_RATE x TPU_LR_MULTIPLIER (2x and 1.2x by default), and each model's own batch_size and
    learning_rate alike. The effective values are what the run records with its results."""
    adjusted = copy.deepcopy(config)
    if device_kind == "tpu":
        scale = {"BATCH_SIZE": lambda b: int(b * config["TPU_BATCH_MULTIPLIER"]),
                 "LEARNING_RATE": lambda lr: float(lr * config["TPU_LR_MULTIPLIER"])}
        for key, own in (("BATCH_SIZE", "batch_size"), ("LEARNING_RATE", "learning_rate")):
            if config[key] is not None:
                adjusted[key] = scale[key](config[key])
            for block in adjusted.values():  # a model's own (models.settings.model_settings) is scaled alike
                if isinstance(block, dict) and block.get(own) is not None:
                    block[own] = scale[key](block[own])
    return adjusted


def _xla():
    """torch_xla's modules, imported on first use."""
    torch_xla = importlib.import_module("torch_xla")
    runtime = importlib.import_module("torch_xla.runtime")
    xm = importlib.import_module("torch_xla.core.xla_model")
    return torch_xla, runtime, xm


def _xla_device_name(runtime) -> str:
    hw = runtime.device_type() or os.environ.get("PJRT_DEVICE", "XLA")
    if hw == "TPU":
        accel = os.environ.get("TPU_ACCELERATOR_TYPE", "")
        return f"TPU {accel}".strip()
    return f"XLA:{hw} via PJRT_DEVICE={os.environ.get('PJRT_DEVICE', '?')}"


def process_group_backend(kind: str) -> str:
    """torch.distributed's backend per tensor device: on GPUs, NCCL for CUDA tensors and gloo for the
    CPU tensors that stay on the host (the ridge fits' float64 XᵀX sums, the clock): NCCL alone
    has no CPU backend ("No backend type associated with device type cpu")."""
    return "cpu:gloo,cuda:nccl" if kind == "cuda" else "gloo"


def _distributed_rank_world(kind: str) -> tuple[int, int]:
    """Join the process group torchrun set up (NCCL on GPUs, gloo on CPUs); (rank, world size)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and not torch.distributed.is_initialized():
        if kind == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        torch.distributed.init_process_group(process_group_backend(kind))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def select_device(config: dict | None = None, process_index: int = 0) -> DeviceInfo:
    """Pick the device a run uses from DEVICE / USE_TPU / PRECISION (and TPU_PARALLEL,
    XLA_CACHE_DIR on XLA). ``process_index``: this process's index under torch_xla.launch."""
    config = config or {}
    kind = resolve_kind(config.get("DEVICE", "auto"), bool(config.get("USE_TPU", False)))
    if kind == "tpu":
        precision = resolve_precision(kind, config.get("PRECISION", "auto"))
        torch_xla, runtime, _ = _xla()
        if config.get("XLA_CACHE_DIR"):  # before any computation; processes must not share a cache
            runtime.initialize_cache(os.path.join(config["XLA_CACHE_DIR"], f"process{process_index}"))
        mesh, spmd_devices = None, 1
        if config.get("TPU_PARALLEL") == "spmd":
            mesh, spmd_devices = _spmd_mesh(runtime)
        return DeviceInfo(
            kind="tpu",
            device=torch_xla.device(),
            name=_xla_device_name(runtime),
            precision=precision,
            world_size=runtime.world_size(),
            rank=runtime.global_ordinal(),
            mesh=mesh,
            spmd_devices=spmd_devices,
        )
    rank, world = _distributed_rank_world(kind)  # sets this process's GPU first
    if kind == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        precision = resolve_precision(kind, config.get("PRECISION", "auto"), device)
        torch.backends.cudnn.benchmark = True  # fixed shapes every step: let cuDNN pick its fastest kernels
        return DeviceInfo("cuda", device, torch.cuda.get_device_name(device), precision, world, rank)
    precision = resolve_precision(kind, config.get("PRECISION", "auto"))
    threads = cpu_threads()
    return DeviceInfo("cpu", torch.device("cpu"), f"CPU ({threads} threads)", precision, world, rank)


def cpu_threads() -> int:
    """The threads a CPU run computes with, set here: OMP_NUM_THREADS where it is set, else one. The presets are
    small: on 2 cores a second thread trains the default transformer 14% faster alone, and 6x slower than one
    thread beside one two-thread job (358 s against 61 s for 6,000 steps: OpenMP's threads wait on each other
    while the other job holds a core), so one thread is what a busy machine costs a run its share for. A larger
    model on a quiet machine takes more: OMP_NUM_THREADS=N python TinyStories.py ..."""
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if given and not (given.isdigit() and int(given) > 0):
        raise DeviceError(f"OMP_NUM_THREADS={given!r}: the threads a CPU run computes with, a whole number from 1 "
                          "(unset: one)")
    threads = int(given) if given else 1
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def _spmd_mesh(runtime):
    """Switch this process to SPMD and build a 1-D 'data' mesh over every device."""
    import numpy as np

    spmd = importlib.import_module("torch_xla.distributed.spmd")
    runtime.use_spmd()
    n = runtime.global_runtime_device_count()
    return spmd.Mesh(np.arange(n), (n,), ("data",)), n


def wants_launcher(config: dict) -> bool:
    """TPU_PARALLEL='launch' on a usable XLA device (elsewhere the request falls back with the device)."""
    asks_tpu = config.get("USE_TPU") or config.get("DEVICE") == "tpu"
    return config.get("TPU_PARALLEL") == "launch" and bool(asks_tpu) and xla_usable()


def launch(fn, config: dict) -> None:
    """Run ``fn(config, process_index)`` in one process per TPU chip (torch_xla's launcher).

    On XLA:CPU this starts one process: multi-process collectives need real chips.
    """
    torch_xla = importlib.import_module("torch_xla")
    torch_xla.launch(_launched, args=(fn, config))


def _launched(index: int, fn, config: dict) -> None:
    fn(config, index)


def get_device(use_tpu: bool = False) -> torch.device:
    """The torch.device to use: XLA if ``use_tpu`` and available, else CUDA, else CPU."""
    return select_device({"USE_TPU": use_tpu}).device


# --------------------------------------------------------------------- host set-up


def enable_transparent_hugepages(info: DeviceInfo) -> None:
    """On a TPU host, turn on transparent hugepages (faster host<->TPU transfers) if we may."""
    if not (info.is_xla and tpu_chips_present()):
        return
    path = "/sys/kernel/mm/transparent_hugepage/enabled"
    try:
        with open(path) as f:
            if "[always]" in f.read():
                return
        with open(path, "w") as f:
            f.write("always")
    except OSError:
        print(f"{TAG} tip: enable transparent hugepages for faster TPU input: "
              f"sudo sh -c 'echo always > {path}'", flush=True)


# --------------------------------------------------------------------- precision


class DummyGradScaler:
    """``torch.amp.GradScaler``'s API with no scaling: bf16 and fp32 need none.

    It lets the training loop have one shape on every device.
    """

    def scale(self, outputs):
        return outputs

    def unscale_(self, optimizer) -> None:
        return None

    def step(self, optimizer, *args, **kwargs):
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None) -> None:
        return None

    def get_scale(self) -> float:
        return 1.0

    def is_enabled(self) -> bool:
        return False

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict:
            raise ValueError("DummyGradScaler has no state; got a scaler state from an fp16 run")


def scales_losses(info: DeviceInfo) -> bool:
    """Whether training scales its loss (CUDA fp16): one scale for a whole step, whatever it holds."""
    return info.kind == "cuda" and info.precision == "fp16"


def make_grad_scaler(info: DeviceInfo):
    """A real GradScaler where fp16 needs one (scales_losses), else a DummyGradScaler."""
    if scales_losses(info):
        return torch.amp.GradScaler("cuda")
    return DummyGradScaler()


def autocast(info: DeviceInfo):
    """Mixed-precision context for forward passes.

    XLA uses ``torch.autocast('xla', bfloat16)``: bf16 compute, fp32 master
    weights, no scaler. (``torch_xla.amp.autocast`` is avoided: it crashes off-TPU.)
    """
    dtype = info.amp_dtype
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(info.device.type, dtype=dtype)


# --------------------------------------------------------------------- XLA step helpers


def synchronize(info: DeviceInfo) -> None:
    """Wait for the work queued on a GPU, so that the clock read next counts finished work (CUDA
    runs ahead of the host); called where a time is taken for a budget or a rate, not every step."""
    if info.kind == "cuda":
        torch.cuda.synchronize(info.device)


def mark_step(info: DeviceInfo) -> None:
    """Cut the lazy XLA graph here and run it (a no-op off XLA)."""
    if info.is_xla:
        _xla()[0].sync()


def zero_grad(info: DeviceInfo, optimizer) -> None:
    # On XLA, set_to_none=True turns grads None -> Tensor each step, a new graph each time.
    optimizer.zero_grad(set_to_none=not info.is_xla)


def optimizer_step(info: DeviceInfo, optimizer, scaler, max_grad_norm: float = 0.0) -> None:
    """One optimizer step, gradients clipped to ``max_grad_norm`` (0: no clipping).

    Gradients are summed across XLA cores (``xm.reduce_gradients``) before
    clipping, so every core clips the same global gradient; DDP has already
    averaged them on GPU/CPU. The fp16 scaler unscales before clipping.
    """
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if info.is_xla:
        if info.world_size > 1:
            _xla()[2].reduce_gradients(optimizer)
        if max_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        return
    if max_grad_norm:
        scaler.unscale_(optimizer)
        if info.kind == "cpu":
            _clip_on_the_cpu(params, max_grad_norm)
        else:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    scaler.step(optimizer)
    scaler.update()


def _clip_on_the_cpu(params: list, max_grad_norm: float) -> None:
    """torch's clip_grad_norm_, the same numbers, without its multiply by 1.0 where the norm is within the
    limit (an operation per parameter tensor that changes nothing): reading the norm costs the CPU nothing,
    where on a GPU it would wait for the step."""
    grads = [p.grad for p in params]
    total = torch.nn.utils.get_total_norm(grads, foreach=True)
    if not max_grad_norm / (total + 1e-6) >= 1.0:  # clip_grad_norm_'s coefficient; NaN (a diverged step) clips
        torch.nn.utils.clip_grads_with_norm_(params, max_grad_norm, total, foreach=True)


def all_reduce_sum(info: DeviceInfo, tensor: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all processes (the sum of one is itself). On XLA the collective runs
    whatever the world size, so XLA:CPU exercises the code path that real chips use."""
    if info.is_xla:
        xm = _xla()[2]
        return xm.all_reduce(xm.REDUCE_SUM, tensor)
    if info.world_size == 1:
        return tensor
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
    return tensor


def broadcast_object(info: DeviceInfo, obj):
    """Rank 0's ``obj`` on every process (e.g. the run folder rank 0 created)."""
    if info.world_size == 1 or info.is_xla:  # XLA multi-core: every process derives it identically
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def max_across(info: DeviceInfo, value: float) -> float:
    """The largest of every process's ``value`` (a host number, e.g. elapsed seconds)."""
    if info.world_size == 1:
        return value
    if info.is_xla:
        return float(_xla()[2].mesh_reduce("max_across", value, max))
    box = torch.tensor([value], dtype=torch.float64, device=info.device if info.kind == "cuda" else "cpu")
    torch.distributed.all_reduce(box, op=torch.distributed.ReduceOp.MAX)
    return float(box)


def barrier(info: DeviceInfo, tag: str = "barrier") -> None:
    """Wait until every process reaches this point (no-op with one process)."""
    if info.world_size == 1:
        return
    if info.is_xla:
        _xla()[2].rendezvous(tag)
    else:
        torch.distributed.barrier()


def wrap_for_training(info: DeviceInfo, model: torch.nn.Module) -> torch.nn.Module:
    """DistributedDataParallel across torchrun processes; the model itself elsewhere
    (one device, or XLA, where ``optimizer_step`` reduces the gradients)."""
    if info.world_size == 1 or info.is_xla:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [info.device.index] if info.kind == "cuda" else None
    # buffers are a reservoir's frozen matrices, identical on every process from the same seed:
    # re-sending them before every forward (DDP's default) only costs bandwidth (torch 2.13 renamed
    # the switch; the old name still works on torch 2.9, torch_xla's)
    import inspect

    renamed = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    no_resend = {"forward_sync_buffers": False} if renamed else {"broadcast_buffers": False}
    return DistributedDataParallel(model, device_ids=device_ids, **no_resend)


_COMPILE_FAILURES_SAID: set[str] = set()  # compile failures this process has told its user of


def compile_cache_dir() -> str:
    """Where torch.compile keeps its compiled graphs on this machine (TORCHINDUCTOR_CACHE_DIR, or its default in the
    system's temporary folder): hundreds of MB after a study, outside the project."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:  # another torch's layout
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or "torch's inductor cache (TORCHINDUCTOR_CACHE_DIR)"
    return str(cache_dir())


class CompiledStep:
    """A training step's loss (the model's forward and the loss; through them, their backward) compiled by
    ``torch.compile`` on CPU and CUDA (``COMPILE=True``), static shapes: a fit's batches are one shape, so once
    warm it compiles nothing more (``recompiles`` counts what its calls compiled after warm-up). Where
    compilation fails (no C++ compiler, an operation the compiler refuses), one line says so and the fit goes on
    eager; a model's own error is still raised, by its eager call. Off (``COMPILE=False``, or XLA, which
    compiles every step already): ``step`` itself. Compiled graphs are kept in torch's cache on disk
    (``TORCHINDUCTOR_CACHE_DIR``, by default in the system's temporary folder), so a study's next point of the
    same shape compiles from it.

    ``what`` names the step in that line; ``fresh=False`` keeps the graphs compiled before it in the process
    (an evaluation's model calls, compiled beside the fit's training step); ``info`` None: not on XLA (a
    decode step, which runs on the CPU or a GPU); ``mode``: torch.compile's (``"reduce-overhead"``: on a GPU
    each call replayed as one CUDA graph)."""

    def __init__(self, step, info: DeviceInfo | None, enabled: bool, name: str, what: str = "training step",
                 fresh: bool = True, mode: str | None = None):
        self.step, self.name, self.what = step, name, what
        self.main = info is None or info.is_main_process
        on_xla = info is not None and info.is_xla
        self.wanted = bool(enabled) and not on_xla
        if enabled and on_xla and fresh:
            say(f"{name}: COMPILE=True adds nothing on XLA, which compiles every step already", info.is_main_process)
        self.compiled = None
        # a CUDA graph's outputs live in its memory pool, which its next replay writes over: a carry fed back
        # to it (a decode step's state) is copied out first, as torch's error for that case advises
        self.copies_out = mode == "reduce-overhead"
        if self.wanted:
            import torch._dynamo

            if fresh:  # the fits before this one in the process are done: their graphs would count against
                torch._dynamo.reset()  # dynamo's limit of graphs per function, past which it runs eager silently
            self.compiled = torch.compile(step, dynamic=False, mode=mode)
        self.failed: str | None = None
        self.proven = False  # a compiled call has returned
        self.compiles = 0  # graphs its calls compiled (a call's graph breaks each count)
        self.compile_seconds = 0.0  # the calls that compiled, whole
        self.shapes: set = set()  # the input shapes its calls have compiled for
        self.recompiled_shapes = 0  # calls that compiled again for shapes compiled before
        self._compiles_at_warm: int | None = None

    def __call__(self, *args, **kwargs):
        if self.compiled is None:
            return self.step(*args, **kwargs)
        before, start = _frames_compiled(), time.perf_counter()
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - any compiler failure; after the first success: the model's
            if self.proven:
                raise
            self.compiled, self.failed = None, f"{type(error).__name__}: {first_line(error)}"
            if self.failed not in _COMPILE_FAILURES_SAID:  # a missing compiler fails every step alike: said once
                _COMPILE_FAILURES_SAID.add(self.failed)
                warn(f"{self.name}: COMPILE=True could not compile its {self.what} ({self.failed}); it runs "
                     "eager, as every step that fails so in this process does (COMPILE=False runs eager without "
                     "the attempt)")
            return self.step(*args, **kwargs)
        self.proven = True
        if self.copies_out:
            out = torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, out)
        made = _frames_compiled() - before
        if made:
            shape = _shapes_of((args, kwargs))
            self.recompiled_shapes += shape in self.shapes
            self.shapes.add(shape)
            self.compiles += made
            took = time.perf_counter() - start
            self.compile_seconds += took
            say(f"{self.name}: {self.what} compiled in {took:.1f}s (torch.compile; its graphs are cached in "
                f"{compile_cache_dir()}, where a later run of the same shape reads them)", self.main,
                file=sys.stderr)  # beside the progress bars: sample.py's stdout is its stories
        return out

    def warmed_up(self) -> None:
        """Called as the fit's warm-up ends: what compiles after this is a recompilation."""
        self._compiles_at_warm = self.compiles

    def report(self) -> dict:
        """How a COMPILE=True step ran, for the fit's record: compiled or eager (and why), the recompilations
        after warm-up; nothing for an eager fit (a record without ``compiled`` trained eager)."""
        if not self.wanted:
            return {}
        after = None if self._compiles_at_warm is None else self.compiles - self._compiles_at_warm
        return {"compiled": self.compiled is not None, "compile_failed": self.failed, "recompiles": after}


def _shapes_of(value) -> tuple:
    """The shapes and dtypes of the tensors in ``value`` (nested tuples, lists, dicts), in order: what a
    static-shape graph is compiled for."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), str(value.dtype))
    if isinstance(value, dict):
        return tuple(_shapes_of(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return tuple(_shapes_of(v) for v in value)
    return ()


def _frames_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


def optimizer_options(info: DeviceInfo) -> dict:
    """Options for torch.optim.AdamW on this device: the fused kernel on CUDA (one kernel for every
    parameter instead of several per tensor); on the CPU the multi-tensor ('foreach') form, which runs the
    same per-tensor kernels in the same order as torch's default for-loop there (the same weights bit for
    bit) without a Python loop over the parameters: at the study's xs presets that loop was a twentieth of
    each step. XLA traces either form into the step's graph: the default."""
    if info.kind == "cuda":
        return {"fused": True}
    return {"foreach": True} if info.kind == "cpu" else {}


def main_process_first(info: DeviceInfo, fn, tag: str):
    """``fn()`` on the main process, then on the others once it is done: downloads, tokenizer
    training and cache writes happen once, and the other processes read what it wrote."""
    if info.world_size == 1:
        return fn()
    if info.is_main_process:
        result = fn()
        barrier(info, tag)
        return result
    barrier(info, tag)
    return fn()


def no_gradient_sync(wrapped: torch.nn.Module, skip: bool):
    """Skip DDP's all-reduce on the first micro-batches of an accumulated step."""
    if skip and hasattr(wrapped, "no_sync"):
        return wrapped.no_sync()
    return contextlib.nullcontext()


def to_cpu(info: DeviceInfo, tree):
    """A nested dict/list of tensors with every tensor on the CPU (one batched transfer on XLA)."""
    if info.is_xla:
        # xm.save's own conversion: fetches all XLA tensors in one transfer
        return _xla()[2]._maybe_convert_to_cpu(tree, convert=True)
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: to_cpu(info, v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_cpu(info, v) for v in tree)
    return tree


def rng_state(info: DeviceInfo) -> dict:
    """Every random generator a training step draws from (dropout), for checkpoints."""
    state = {"torch": torch.get_rng_state()}
    if info.kind == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(info.device)
    if info.is_xla:
        state["xla"] = int(_xla()[2].get_rng_state())
    return state


def set_rng_state(info: DeviceInfo, state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if info.kind == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], info.device)
    if info.is_xla and "xla" in state:
        _xla()[2].set_rng_state(int(state["xla"]))


def checkpoint_function(info: DeviceInfo):
    """Activation checkpointing for this device: ``fn(module_or_function, *inputs)``.

    XLA needs torch_xla's own (upstream's raises "module 'torch' has no attribute
    'xla'" there); elsewhere the non-reentrant upstream one.
    """
    if info.is_xla:
        return importlib.import_module("torch_xla.utils.checkpoint").checkpoint
    from torch.utils.checkpoint import checkpoint

    return functools.partial(checkpoint, use_reentrant=False)


def sequential_scan(fn, init, xs):
    """``carry, ys = scan(fn, init, xs)`` as a Python loop over the leading dimension of ``xs``
    (a tensor or a tuple of tensors); ``fn(carry, x) -> (carry, y)`` with y a tensor."""
    carry, ys = init, []
    for t in range(xs[0].shape[0] if isinstance(xs, tuple) else xs.shape[0]):
        carry, y = fn(carry, tuple(x[t] for x in xs) if isinstance(xs, tuple) else xs[t])
        ys.append(y)
    return carry, torch.stack(ys)


_SCAN_STAND_INS: dict[tuple, functools.partial] = {}  # (cell, mode) -> what torch_xla's scan caches traces by


def time_scan(info: DeviceInfo):
    """How recurrent models loop over time, or None for their own fused kernels (nn.LSTM) and loops.

    On XLA a Python loop over T time steps is unrolled into one graph of T cells: its compile time
    grows with SEQ_LEN (the LSTM took minutes at 128). torch_xla's ``scan`` compiles the cell once,
    as an XLA While loop. The function returned here uses it for tensors on the XLA device and a
    plain loop for any others (samples are generated on the CPU from the same model).

    ``scan`` traces its cell with AOTAutograd, in Python, on every call unless told the cell is pure;
    a step of a recurrent model (and every chunk of a stream evaluation) then spent most of its host
    time tracing. So cells are traced once: ``fn`` must be the same object from call to call (a
    module-level function, or a cached one) and pure (the tensors it needs travel in the
    carry). torch_xla keys its cache by the cell and the shapes and dtypes it sees, not by whether
    the scanned inputs need gradients or autocast is on, which change the traced graphs: each such
    mode gets a stand-in of its own.
    """
    if not scans_recurrences(info.kind):
        return None
    xla_scan = importlib.import_module("torch_xla.experimental.scan").scan

    def scan(fn, init, xs):
        leaves = xs if isinstance(xs, tuple) else (xs,)
        if leaves[0].device.type != "xla":
            return sequential_scan(fn, init, xs)
        autocast = torch.is_autocast_enabled("xla")
        mode = (fn, torch.is_grad_enabled(), tuple(x.requires_grad for x in leaves), autocast,
                autocast and torch.get_autocast_dtype("xla"))
        if mode not in _SCAN_STAND_INS:
            _SCAN_STAND_INS[mode] = functools.partial(fn)
        return xla_scan(_SCAN_STAND_INS[mode], init, xs, is_fn_pure=True)

    return scan


def compute_device(info: DeviceInfo, host_only: bool) -> torch.device:
    """Where a model runs: its device, or the CPU for models that compute on the host (n-gram counts)."""
    return torch.device("cpu") if host_only else info.device


def sampling_device(info: DeviceInfo, host_only: bool = False) -> torch.device:
    """Where samples are generated. On XLA the CPU: every generated token grows the
    sequence, a new shape and so a new compiled graph per token."""
    return torch.device("cpu") if info.is_xla else compute_device(info, host_only)


def story_end_reads(device: torch.device) -> int:
    """Tokens a story makes between the host's looks for its end (``generate``'s ``stop_every``): on the CPU
    every token (a look costs nothing there, and a token made past the end is work thrown away); elsewhere 16,
    where each look waits for the device to finish what it was given."""
    return 1 if device.type == "cpu" else 16


def xla_compile_count() -> int:
    """Graphs compiled so far in this process (torch_xla's UncachedCompile counter)."""
    metrics = importlib.import_module("torch_xla.debug.metrics")
    return int(metrics.counter_value("UncachedCompile") or 0)


# --------------------------------------------------------------------- data loaders


def loader_needed(info: DeviceInfo, num_workers: int) -> bool:
    """Whether training batches go through ``build_loader``: on XLA (MpDeviceLoader), CUDA (pinned memory),
    with several processes (each its shard) or worker processes; one CPU process gathers them itself."""
    return info.kind != "cpu" or info.world_size > 1 or num_workers > 0


def build_loader(dataset, info: DeviceInfo, batch_size: int, *, shuffle: bool = True,
                 num_workers: int = 0, seed: int = 0, drop_last: bool = True):
    """A DataLoader tuned for the device.

    XLA: fixed shapes and no host work in the step: no shuffle (datasets here
    are pre-permuted by seed), drop_last, no workers, wrapped in MpDeviceLoader
    so batches are moved to the device in the background. CUDA: pinned memory
    and persistent workers. Several processes: each reads a disjoint shard.
    """
    from torch.utils.data import DataLoader, DistributedSampler

    if info.is_xla:
        shuffle, drop_last, num_workers = False, True, 0
    sampler = None
    if info.world_size > 1:
        sampler = DistributedSampler(dataset, num_replicas=info.world_size, rank=info.rank,
                                     shuffle=shuffle, seed=seed, drop_last=True)
        shuffle = False
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        sampler=sampler,
        drop_last=drop_last,
        num_workers=num_workers,
        pin_memory=info.kind == "cuda",
        persistent_workers=num_workers > 0 and not info.is_xla,
        generator=generator,
    )
    if info.is_xla:
        parallel_loader = importlib.import_module("torch_xla.distributed.parallel_loader")
        sharding = None
        if info.mesh is not None:  # SPMD: split every batch along the mesh's 'data' axis
            spmd = importlib.import_module("torch_xla.distributed.spmd")
            sharding = spmd.ShardingSpec(info.mesh, ("data", None))
        return parallel_loader.MpDeviceLoader(loader, info.device, input_sharding=sharding)
    return loader



# --------------------------------------------------------------------- one study point per device

TPU_FIRST_PORT = 8476  # torch_xla's TPU_PROCESS_PORT; each point's process on a TPU VM takes the next one
# chips one process drives, as TPU_CHIPS_PER_PROCESS_BOUNDS (a v5e/v6e host's 2x4 chips, split in blocks)
TPU_CHIP_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}
POINT_DEVICE_VARIABLE = "RESERVOIR_POINT_DEVICE"  # the device a study gave a point, recorded in its summary


@dataclass(frozen=True)
class Slot:
    """Where one study point runs: its device(s), and the environment that confines its process to them."""

    label: str  # 'cpu', 'cuda:3', 'tpu chips 0,1', 'xla:cpu'
    env: dict

    @property
    def torch_device(self) -> str:
        """The torch device a point here trains on, as this (the study's) process names it: 'cuda' on a GPU (its
        own CUDA_VISIBLE_DEVICES set for the point), 'xla' on a TPU chip or XLA:CPU, else 'cpu'."""
        return "cuda" if self.label.startswith("cuda") else "cpu" if self.label == "cpu" else "xla"


def scans_recurrences(kind: str) -> bool:
    """Whether a point on this kind of device runs a recurrence's cell by hand through a scan (``time_scan``: XLA)
    rather than a fused kernel (nn.LSTM on a CPU or a GPU). Where it does, a fold that runs the cell by hand for
    its members costs nothing a point did not pay; where it does not, the fused kernel is faster (bench/README.md)."""
    return kind == "tpu"


# POINTS_PER_DEVICE=auto, what each kind of device measured (bench/README.md): on a TPU chip (XLA:CPU's micro
# frontier) a group of four compiled 3.5-3.8x fewer graphs and trained 2.7-4.5x as fast as a point a process, so a
# chip folds up to 8; on a CPU core a fold gains 1.2-1.5x at xs, nothing at l, and its sums differ from a point's
# alone in the last bits, so a core keeps a point, whose score then depends on no host's load (POINTS_PER_DEVICE=probe
# lets a short probe decide there); a GPU runs a point until a GPU measures a fold (bench/gpu_check.sh), or
# POINTS_PER_DEVICE=probe times one on the GPU itself
AUTO_FOLD = {"tpu": 8, "cpu": 1, "cuda": 1}


def folded_points(kind: str, sharing: int | str) -> int | str:
    """How many of a study's points one process folds into one model (reservoir/run/group.py): POINTS_PER_DEVICE
    on a CPU core or a TPU chip (``kind``: 'cpu', 'tpu'), where a process holds its device alone ('auto':
    AUTO_FOLD; 'probe': the study probes each family, size and batch, studies/frontier/folding.py). On a GPU a
    number K shares it among K processes of their own (point_slots), so none fold, unless 'probe': the study
    times folds on the GPU itself and folds what gains, a process a GPU."""
    if kind == "cuda":
        return "probe" if sharing == "probe" else AUTO_FOLD[kind]
    return AUTO_FOLD[kind] if sharing == "auto" else sharing


def point_slots(kind: str, devices: list[str], per_point: int, cores: int, sharing: int = 1) -> list[Slot]:
    """The places this host offers a study's points, one per concurrent point, from what is visible (a pure
    function: tested for hosts this machine is not). ``kind``: the points' device kind; ``devices``: the CUDA
    ordinals or TPU chips visible (for 'cpu', one entry per usable core); ``per_point``: devices one point takes
    (DEVICES_PER_POINT); ``cores``: the host's usable CPU cores, shared out among the points; ``sharing``:
    points each device holds at once (POINTS_PER_DEVICE): on a GPU (block) each its own process, as a small
    point's kernels leave most of a GPU idle while its process launches the next (with CUDA MPS the processes'
    kernels also run at once); on a CPU core or a TPU chip, one process whose points are folded into one model
    (``folded_points``), so the slots are one a core or chip block."""
    if per_point < 1:
        raise DeviceError(f"DEVICES_PER_POINT must be at least 1, got {per_point}")
    if sharing < 1:
        raise DeviceError(f"POINTS_PER_DEVICE must be at least 1, got {sharing}")
    if kind != "cuda":
        sharing = 1
    if kind == "cpu" or (kind == "tpu" and not devices):  # the CPU, or XLA:CPU (PJRT_DEVICE=CPU): a core each
        if per_point > cores:  # threads that wait on each other for cores: 25x slower measured (100 on 2 cores)
            raise DeviceError(f"DEVICES_PER_POINT={per_point} would give a point {per_point} threads on the {cores} "
                              f"cores this process may use (they would wait on each other, many times slower): "
                              f"DEVICES_PER_POINT={cores} at most")
        env = {"OMP_NUM_THREADS": str(per_point), "MKL_NUM_THREADS": str(per_point)}
        label = "cpu" if kind == "cpu" else "xla:cpu"
        return [Slot(label, {**env, POINT_DEVICE_VARIABLE: label}) for _ in range(max(1, cores // per_point))]
    what = {"cuda": "GPU", "tpu": "TPU chip"}[kind]
    if per_point > len(devices):
        raise DeviceError(f"DEVICES_PER_POINT={per_point} but this host shows {len(devices)} {what}(s) "
                          f"({', '.join(devices)}): lower DEVICES_PER_POINT")
    if kind == "tpu" and per_point not in TPU_CHIP_BOUNDS:
        raise DeviceError(f"DEVICES_PER_POINT={per_point}: a TPU point takes a block of 1, 2, 4 or 8 chips")
    groups = [devices[k:k + per_point] for k in range(0, len(devices) - per_point + 1, per_point)]
    threads = str(max(1, cores // (len(groups) * sharing)))  # the host's cores shared out: the CPU side of a step
    slots = []
    for k, group in [(k, group) for k, group in enumerate(groups) for _ in range(sharing)]:
        env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        if kind == "cuda":
            label = "cuda:" + ",".join(group) + (f" (shared by {sharing} points)" if sharing > 1 else "")
            env["CUDA_VISIBLE_DEVICES"] = ",".join(group)
        else:  # one process per chip block, as torch_xla's configure_topology and Cloud TPU's notes set them
            label, port = "tpu chips " + ",".join(group), TPU_FIRST_PORT + k
            env.update({"TPU_VISIBLE_CHIPS": ",".join(group),
                        "TPU_CHIPS_PER_PROCESS_BOUNDS": TPU_CHIP_BOUNDS[per_point], "TPU_PROCESS_BOUNDS": "1,1,1",
                        "TPU_PROCESS_PORT": str(port),
                        "TPU_PROCESS_ADDRESSES": f"localhost:{port}", "CLOUD_TPU_TASK_ID": "0"})
        slots.append(Slot(label, {**env, POINT_DEVICE_VARIABLE: label}))
    return slots


def tpu_chip_count(pci_devices: str = PCI_DEVICES) -> int:
    """Real TPU chips on this host: Google's PCI devices whose device id is a TPU's."""
    count = 0
    for folder in glob.glob(os.path.join(pci_devices, "*")):
        try:
            with open(os.path.join(folder, "vendor")) as vendor, open(os.path.join(folder, "device")) as device:
                count += vendor.read().strip() == _GOOGLE_PCI_VENDOR and device.read().strip() in _TPU_PCI_DEVICES
        except OSError:
            continue
    return count


def visible_devices(kind: str) -> list[str]:
    """The devices of ``kind`` this process may give its points: CUDA ordinals (as CUDA_VISIBLE_DEVICES
    narrows them), TPU chips (none under XLA:CPU), or one entry per usable CPU core."""
    if kind == "cuda":
        narrowed = os.environ.get("CUDA_VISIBLE_DEVICES")
        if narrowed is not None:
            return [d.strip() for d in narrowed.split(",") if d.strip()]
        return [str(k) for k in range(torch.cuda.device_count())]
    if kind == "tpu":
        narrowed = os.environ.get("TPU_VISIBLE_CHIPS")
        if narrowed:
            return [d.strip() for d in narrowed.split(",") if d.strip()]
        return [str(k) for k in range(tpu_chip_count())]
    return [str(k) for k in range(usable_cores())]


def study_slots(config: dict, workers, per_point: int = 1, sharing: int = 1) -> list[Slot]:
    """The slots a study's points run in on this host: ``workers`` 'auto' takes every one the devices give
    (``sharing`` points to a GPU); a number takes that many (on the CPU any number, said to oversubscribe
    where it does)."""
    kind = resolve_kind(config["DEVICE"], config["USE_TPU"])
    slots = point_slots(kind, visible_devices(kind), per_point, usable_cores(), sharing)
    if workers == "auto":
        return slots
    if kind == "cpu" or (kind == "tpu" and slots[0].label == "xla:cpu"):
        return [slots[0]] * workers
    if workers > len(slots):
        raise DeviceError(f"WORKERS={workers} but this host has room for {len(slots)} point(s) at once "
                          f"({', '.join(s.label for s in slots)}): use WORKERS=auto or fewer")
    return slots[:workers]
