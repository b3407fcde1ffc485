"""The device layer on real torch_xla (XLA:CPU with PJRT_DEVICE=CPU); skipped without it."""

import pytest
import torch

from reservoir import device as dev

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


def test_all_reduce_with_one_core_is_identity(xla):
    t = torch.arange(4.0, device=xla.device)
    assert torch.equal(dev.all_reduce_sum(xla, t).cpu(), torch.arange(4.0))
