"""The element-wise convention (reservoir/run/elementwise.py): every float op a training step executes, counted by a
rule per op, against hand counts of a diagonal scan, an LSTM cell and AdamW's update; its products are the FLOP
convention's, its per-sequence work linear in the batch, and every rule stated in docs/configuration.md."""

import re

import pytest
import torch
from torch.nn import functional as F

from reservoir.config import parse_overrides
from reservoir.models import build_model
from reservoir.models.reservoirs import diagonal_scan
from reservoir.run import elementwise, flops
from tests.conftest import ROOT

B, T, U = 3, 8, 5


def test_a_diagonal_scan_of_t_steps_costs_what_the_hand_count_says():
    """Hillis-Steele over T = 8: strides 1, 2, 4; each adds λ^d·h (a complex multiply, 6 real ops, and the add,
    2) to the T − d positions past the stride, and squares λ^d (5 ops a unit)."""
    x_re, x_im = torch.randn(B, T, U), torch.randn(B, T, U)
    with elementwise.ElementwiseCounter() as count:
        diagonal_scan(x_re, x_im, torch.rand(U), torch.rand(U))
    assert count.flops == sum(8 * (T - d) * B * U + 5 * U for d in (1, 2, 4)) and not count.uncounted


def test_an_lstm_cell_costs_what_the_hand_count_says():
    """Per hidden unit and sequence: the two biases (4 gates each), the gates' sum (4), three sigmoids and a tanh,
    c' = f·c + i·g (3), tanh(c') and o·tanh(c') (2): 21; the products are the FLOP convention's."""
    hidden, inputs = 7, 4
    cell = torch.nn.LSTMCell(inputs, hidden)
    with torch.no_grad(), elementwise.ElementwiseCounter() as count, flops.counter() as products:
        cell(torch.randn(B, inputs))
    assert count.flops == 21 * hidden * B and not count.uncounted
    assert products.get_total_flops() == 2 * B * 4 * hidden * (inputs + hidden)


def test_adamw_s_update_costs_what_the_hand_count_says():
    """Per element: the decoupled decay (1, decayed groups only), m's lerp (3), v's scale and addcmul (1 + 3), √v,
    its bias correction and ε (3), the addcdiv (3); and the step counter (1 a tensor)."""
    decayed, plain = torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(10))
    optimizer = torch.optim.AdamW([{"params": [decayed], "weight_decay": 0.1}, {"params": [plain],
                                   "weight_decay": 0.0}], foreach=False)
    for steps in (1, 2):  # the first step creates the moments (no arithmetic); the second is the same arithmetic
        decayed.grad, plain.grad = torch.randn(3, 4), torch.randn(10)
        with elementwise.ElementwiseCounter() as count:
            optimizer.step()
        assert count.flops == 14 * 12 + 1 + 13 * 10 + 1 and not count.uncounted, steps


def test_fused_attention_is_charged_its_softmax_over_the_full_square_forward_and_backward():
    heads, dim = 2, 4
    q, k, v = (torch.randn(B, heads, T, dim, requires_grad=True) for _ in range(3))
    with elementwise.ElementwiseCounter() as forward:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    loss = out.sum()
    with elementwise.ElementwiseCounter() as backward:
        loss.backward()
    assert forward.flops == 6 * B * heads * T * T and not forward.uncounted
    assert backward.flops == 5 * B * heads * T * T and not backward.uncounted


def test_a_float_op_no_rule_names_is_counted_per_output_element_and_listed():
    with elementwise.ElementwiseCounter() as count:
        torch.special.bessel_j0(torch.randn(6))
        torch.arange(5) * 2  # integers: not float work
    assert count.flops == 6 and dict(count.uncounted) == {"aten.special_bessel_j0": 1}


@pytest.mark.parametrize("family, options", [("transformer", ["TRANSFORMER.recipe='++'"]), ("lstm", []),
                                             ("linear_reservoir", []), ("frozen_retention", [])])
def test_a_step_s_products_are_the_flop_convention_s_and_its_work_per_sequence_is_linear(family, options):
    config = parse_overrides(["SEQ_LEN=16", *options])
    model = build_model(family, 30, config)
    two = elementwise.training_step(model, 30, 16, weight_decay=0.1, grad_clip=1.0)
    four = elementwise.training_step(model, 30, 16, weight_decay=0.1, grad_clip=1.0, sequences=(3, 6))
    assert two.products(8) == pytest.approx(flops.sgd_step(model, 30, 8, 16, 1).per_step, rel=1e-12)
    assert four.elementwise_per_sequence == pytest.approx(two.elementwise_per_sequence, rel=1e-12)
    assert four.elementwise_per_step == pytest.approx(two.elementwise_per_step, rel=1e-12)
    assert two.flops(8) > two.products(8) and not two.uncounted
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert two.elementwise_per_step > 13 * trained  # AdamW's 13-14 a parameter, and the clip's norm and multiply


def test_every_rule_is_stated_in_the_configuration_reference():
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("### The element-wise convention")[1].split("\n## ")[0]
    stated = set(re.findall(r"`([a-z_0-9]+)`", section))
    rules = {*elementwise.RULES_BY_OUTPUT, *elementwise.RULES_BY_INPUT}
    assert rules <= stated, sorted(rules - stated)
