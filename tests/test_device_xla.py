"""The device layer on real torch_xla (XLA:CPU with PJRT_DEVICE=CPU); skipped without it."""

import pytest
import torch

from reservoir.platform import device as dev

pytestmark = pytest.mark.xla


@pytest.fixture(scope="module")
def xla():
    return dev.select_device({"DEVICE": "tpu"})


def test_xla_device_is_selected_with_bf16(xla):
    assert xla.is_xla and xla.device.type == "xla" and xla.precision == "bf16"
    assert xla.world_size >= 1 and 0 <= xla.rank < xla.world_size
    assert "xla:" in xla.banner()


def test_use_tpu_picks_xla_when_pjrt_device_is_set():
    assert dev.select_device({"USE_TPU": True}).kind == "tpu"
    assert dev.get_device(use_tpu=True).type == "xla"


def test_xla_autocast_computes_in_bf16_with_fp32_weights(xla):
    layer = torch.nn.Linear(8, 8).to(xla.device)
    with dev.autocast(xla):
        out = layer(torch.ones(2, 8, device=xla.device))
    assert out.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32


def test_xla_zero_grad_keeps_gradient_tensors(xla):
    layer = torch.nn.Linear(4, 1).to(xla.device)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    layer(torch.ones(1, 4, device=xla.device)).sum().backward()
    dev.optimizer_step(xla, optimizer, dev.make_grad_scaler(xla))
    dev.zero_grad(xla, optimizer)
    dev.mark_step(xla)
    assert layer.weight.grad is not None and float(layer.weight.grad.abs().sum()) == 0.0


def test_all_reduce_runs_the_xla_collective(xla, monkeypatch):
    """With one process torch_xla skips the collective unless told not to: make it run for real."""
    import torch_xla

    monkeypatch.setenv("XLA_ALWAYS_ALLREDUCE", "1")
    t = torch.arange(4.0, device=xla.device)
    reduced = dev.all_reduce_sum(xla, t)
    assert "cross_replica_sum" in torch_xla._XLAC._get_xla_tensors_text([reduced])  # the collective, in the graph
    assert torch.equal(reduced.cpu(), torch.arange(4.0) * xla.world_size)


def test_compile_true_leaves_an_xla_step_to_xla(xla, capsys):
    """XLA compiles every step already: COMPILE=True there says so once and runs the step as it is."""
    layer = torch.nn.Linear(4, 1).to(xla.device)
    step = dev.CompiledStep(layer, xla, True, "linear")
    out = step(torch.ones(2, 4, device=xla.device))
    assert step.compiled is None and step.report() == {} and out.shape == (2, 1)
    assert "COMPILE=True adds nothing on XLA" in capsys.readouterr().out
