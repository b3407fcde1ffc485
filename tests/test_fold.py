"""Folded points (reservoir/run/fold.py): K same-shape models as one, each member trained as it would be
alone. Tolerances: float32, the fold's batched products sum in another order than a member's own, so a
member's losses and weights after a few AdamW steps agree within 1e-4, not bit for bit."""

import pytest
import torch
from torch.nn import functional as F

from reservoir.config import parse_overrides
from reservoir.models import build_model
from reservoir.run import fold as folding
from reservoir.run.train import adamw, decayed_names, learning_rate
from reservoir.studies.frontier.grid import FAMILIES, Cell

VOCAB, BATCH, SEQ = 31, 2, 16
TOLERANCE = 1e-4


def members(family: str, seeds, **settings) -> tuple[dict, list]:
    model_name = FAMILIES[family][0]
    config = parse_overrides([*Cell(family, "xs", 1e-3, BATCH).settings(), f"SEQ_LEN={SEQ}",
                              *(f"{key}={value}" for key, value in settings.items())])
    models = [build_model(model_name, VOCAB, {**config, "SEED": seed}) for seed in seeds]
    for model in models:
        model.eval()  # dropout off: the fold's random masks are not a member's own
    return config, models


def batches(count: int, steps: int) -> torch.Tensor:
    """[steps, count, BATCH, SEQ + 1]: each member its own batches, of a text a model learns in a few steps
    (counting on from a random start)."""
    starts = torch.randint(0, VOCAB, (steps, count, BATCH, 1), generator=torch.Generator().manual_seed(1))
    return (starts + torch.arange(SEQ + 1)) % VOCAB


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_folds_or_says_why_not(family):
    """A family folds into one model that gives each member its own logits, or fold refuses in a line."""
    torch.manual_seed(0)
    _, models = members(family, [0, 1, 2])
    ids = batches(3, 1)[0, :, :, :-1]
    reason = folding.why_not_fold(models)
    if reason:
        with pytest.raises(folding.CannotFold, match="cannot fold"):
            folding.fold(models)
        assert "\n" not in reason
        return
    folded = folding.fold(models)
    with torch.no_grad():
        logits = folded(ids.flatten(0, 1)).view(3, BATCH, SEQ, VOCAB)
        for k, model in enumerate(models):
            torch.testing.assert_close(logits[k], model(ids[k]), atol=TOLERANCE, rtol=TOLERANCE)


class BareWeight(torch.nn.Module):
    """A model whose weight sits in no module a fold knows: nothing tells the fold how it is used."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 4)
        self.scale = torch.nn.Parameter(torch.ones(4))
        self.head = torch.nn.Linear(4, VOCAB)

    def forward(self, ids):
        return self.head(self.embed(ids) * self.scale)


def test_the_trained_families_fold_a_seeds_draw_folds_alone_and_a_bare_weight_says_why_not():
    """The attention, retention and LSTM families fold whatever their seeds; a family whose frozen draw is its
    seed's folds the members of one seed; a weight outside every module a fold holds is refused in a line."""
    reasons = {family: folding.why_not_fold(members(family, [0, 1])[1]) for family in FAMILIES}
    folds = {family for family, reason in reasons.items() if reason is None}
    assert set(ANY_SEEDS) <= folds
    bare = folding.why_not_fold([BareWeight(), BareWeight()])
    assert "BareWeight has weights outside the modules a fold holds" in bare and "(scale)" in bare
    for family in ONE_SEED:
        assert "differs between its members' seeds" in reasons[family]
        assert folding.why_not_fold(members(family, [0, 0])[1]) is None, family
    assert "differs between its members' seeds" in reasons["esn+softmax"]


def train_alone(model, config, ids, steps: int, lr: float, weight_decay: float, beta2: float) -> list[float]:
    optimizer = adamw(model, {**config, "LEARNING_RATE": lr, "WEIGHT_DECAY": weight_decay}, beta2, {"foreach": True})
    losses = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate({**config, "LEARNING_RATE": lr}, step, step / steps)
        x, y = ids[step, :, :-1], ids[step, :, 1:]
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config["GRAD_CLIP"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, optimizer


def train_folded(folded, optimizer, config, ids, steps: int, peaks: torch.Tensor, first: int = 0,
                 active=None) -> list[list[float]]:
    count = peaks.shape[0]
    losses = []
    for step in range(first, first + steps):
        share = learning_rate({**config, "LEARNING_RATE": 1.0}, step, step / (first + steps))
        optimizer.lr = peaks * share
        x, y = ids[step, :, :, :-1].flatten(0, 1), ids[step, :, :, 1:].flatten(0, 1)
        loss = folding.member_losses(folded(x), y, count)
        loss.sum().backward()
        optimizer.clip(config["GRAD_CLIP"])
        optimizer.step(active)
        optimizer.zero_grad()
        losses.append(loss.tolist())
    return losses


# the families trained by gradient steps over windows that fold: whatever their seeds, or (their frozen draws
# being the seed's) the members of one seed, as a grid cell's rates are
ANY_SEEDS = ["transformer", "transformer++", "frozen_retention", "frozen_retention+write", "frozen_retention+forget",
             "lstm"]
ONE_SEED = ["linear_reservoir", "deep_linear_reservoir", "reservoir_attention", "reservoir_attention+write"]


@pytest.mark.parametrize("family", ANY_SEEDS + ONE_SEED)
def test_a_folded_member_trains_as_its_point_alone(family):
    """Three members, each its own learning rate, weight decay and β2 (and seed, where the family folds any
    seeds), with gradients clipped: every member's losses and weights after the steps are its point's alone.
    (The rates stay below 3e-2, where frozen retention's training is chaotic here: weights nudged by 1e-7 move
    its loss by 0.1 within 8 steps.)"""
    steps, lrs, decays, beta2s = 12, [3e-3, 1e-2, 6e-3], [0.01, 0.1, 0.3], [0.95, 0.99, 0.9]
    seeds = [0, 1, 2] if family in ANY_SEEDS else [0, 0, 0]
    config, models = members(family, seeds, GRAD_CLIP=0.5, WARMUP_STEPS=3, LR_SCHEDULE="cosine")
    ids = batches(3, steps)
    folded = folding.fold(models)
    optimizer = folding.MemberAdamW(folded, decayed_names(models[0]), torch.tensor(lrs), decays, beta2s)
    folded_losses = train_folded(folded, optimizer, config, ids, steps, torch.tensor(lrs))
    for k, model in enumerate(models):
        alone, _ = train_alone(model, config, ids[:, k], steps, lrs[k], decays[k], beta2s[k])
        assert alone[0] > 0 and alone[-1] < alone[0]  # it learnt something: the comparison is not of idle weights
        assert [losses[k] for losses in folded_losses] == pytest.approx(alone, rel=TOLERANCE)
    trained = [build_model(FAMILIES[family][0], VOCAB, {**config, "SEED": 0}) for _ in models]
    folding.write_back(folded, trained)
    for mine, theirs in zip(trained, models, strict=True):
        for (name, p), q in zip(mine.named_parameters(), theirs.parameters(), strict=True):
            torch.testing.assert_close(p, q, atol=TOLERANCE, rtol=TOLERANCE, msg=name)


def test_a_members_state_is_its_points_checkpoint_both_ways():
    """Member k's weights and AdamW moments, written back, continue alone as its point would; a fold rebuilt
    from its members' states continues as the fold itself."""
    steps, lrs = 6, torch.tensor([3e-3, 1e-2])
    config, models = members("transformer++", [0, 1], GRAD_CLIP=1.0, WARMUP_STEPS=2, LR_SCHEDULE="cosine")
    ids = batches(2, 2 * steps)
    folded = folding.fold(models)
    decayed = decayed_names(models[0])
    optimizer = folding.MemberAdamW(folded, decayed, lrs, 0.1, 0.95)
    train_folded(folded, optimizer, config, ids, steps, lrs)
    folding.write_back(folded, models)
    points = [adamw(m, {**config, "WEIGHT_DECAY": 0.1}, 0.95, {"foreach": True}) for m in models]
    for k, (model, point) in enumerate(zip(models, points, strict=True)):
        point.load_state_dict(optimizer.member_state(k, model, point))
    saved = [({n: p.clone() for n, p in m.state_dict().items()}, p.state_dict())
             for m, p in zip(models, points, strict=True)]

    ahead = train_folded(folded, optimizer, config, ids, steps, lrs, first=steps)  # the fold goes on
    rebuilt_models = [build_model(FAMILIES["transformer++"][0], VOCAB, {**config, "SEED": 5}) for _ in models]
    rebuilt_points = []
    for model, (weights, moments) in zip(rebuilt_models, saved, strict=True):
        model.load_state_dict(weights)
        point = adamw(model, {**config, "WEIGHT_DECAY": 0.1}, 0.95, {"foreach": True})
        point.load_state_dict(moments)
        rebuilt_points.append(point)
    refolded = folding.fold(rebuilt_models)  # resumed from its members' checkpoints
    again = folding.MemberAdamW(refolded, decayed, lrs, 0.1, 0.95)
    for k, (model, point) in enumerate(zip(rebuilt_models, rebuilt_points, strict=True)):
        again.load_member_state(k, model, point)
    assert int(again.step_count[1]) == steps
    resumed = train_folded(refolded, again, config, ids, steps, lrs, first=steps)
    assert sum(resumed, []) == pytest.approx(sum(ahead, []), rel=1e-6)

    model, point = rebuilt_models[1], rebuilt_points[1]  # member 1 alone, from the same checkpoint
    model.load_state_dict(saved[1][0])
    point = adamw(model, {**config, "WEIGHT_DECAY": 0.1}, 0.95, {"foreach": True})
    point.load_state_dict(saved[1][1])
    for step in range(steps, 2 * steps):
        for group in point.param_groups:
            group["lr"] = learning_rate({**config, "LEARNING_RATE": float(lrs[1])}, step, step / (2 * steps))
        loss = F.cross_entropy(model(ids[step, 1, :, :-1]).flatten(0, 1), ids[step, 1, :, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config["GRAD_CLIP"])
        point.step()
        point.zero_grad(set_to_none=True)
        assert loss.item() == pytest.approx(ahead[step - steps][1], rel=TOLERANCE)


def test_a_stopped_member_stands_still_and_the_others_go_on():
    """A member taken out of the steps (it diverged) keeps its weights and moments; the others' steps are
    theirs alone."""
    steps, lrs = 5, torch.tensor([3e-3, 1e-2, 6e-3])
    config, models = members("transformer++", [0, 1, 2], GRAD_CLIP=1.0, WARMUP_STEPS=2, LR_SCHEDULE="cosine")
    ids = batches(3, steps)
    folded = folding.fold(models)
    optimizer = folding.MemberAdamW(folded, decayed_names(models[0]), lrs, 0.01, 0.95)
    before = [p[1].clone() for p in optimizer.params]
    active = torch.tensor([True, False, True])
    losses = train_folded(folded, optimizer, config, ids, steps, lrs, active=active)
    assert all(torch.equal(p[1], b) for p, b in zip(optimizer.params, before, strict=True))
    assert optimizer.step_count.tolist() == [steps, 0, steps]
    alone, _ = train_alone(models[2], config, ids[:, 2], steps, float(lrs[2]), 0.01, 0.95)
    assert [row[2] for row in losses] == pytest.approx(alone, rel=TOLERANCE)


def test_a_member_whose_gradient_is_not_finite_harms_no_other():
    """A member whose loss is NaN (it diverged) takes no step; the others step as they would alone."""
    config, models = members("transformer++", [0, 1], GRAD_CLIP=1.0, WARMUP_STEPS=1, LR_SCHEDULE="cosine")
    ids = batches(2, 1)
    folded = folding.fold(models)
    with torch.no_grad():
        folded.get_submodule(next(n for n, m in folded.named_modules()
                                  if isinstance(m, folding.FoldedLinear))).weight[0].fill_(float("nan"))
    optimizer = folding.MemberAdamW(folded, decayed_names(models[0]), torch.tensor([1e-2, 1e-2]), 0.01, 0.95)
    losses = folding.member_losses(folded(ids[0, :, :, :-1].flatten(0, 1)), ids[0, :, :, 1:].flatten(0, 1), 2)
    finite = torch.isfinite(losses)
    assert finite.tolist() == [False, True]
    losses.where(finite, 0.0).sum().backward()
    optimizer.clip(config["GRAD_CLIP"])
    optimizer.step(finite)
    assert all(torch.isfinite(p[1]).all() for p in optimizer.params)  # the other member stepped, finite
    assert all(torch.isfinite(m).all() and torch.isfinite(v).all()  # no NaN in anyone's moments
               for m, v in zip(optimizer.exp_avg, optimizer.exp_avg_sq, strict=True))
    assert optimizer.step_count.tolist() == [0, 1]


def test_the_hardware_guide_says_which_families_fold_as_fold_decides():
    """docs/hardware.md's table of the families that fold agrees with what a study folds, family by family, on
    a CPU core and on an XLA device."""
    from reservoir.studies.frontier.folding import _folds
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "hardware.md").read_text()
    table = text[text.index("| family | folds | why not |"):].split("\n\n")[0].splitlines()[2:]
    said = {}
    for row in table:
        families, folds = (cell.strip() for cell in row.strip("|").split("|")[:2])
        said.update({family.strip(): {"yes": ("any", "any"), "one seed": ("seed", "seed"), "on XLA": (None, "any"),
                                      "no": (None, None)}[folds] for family in families.split(",")})
    assert set(said) == set(FAMILIES)
    for family, folds in said.items():
        assert (_folds(family, "xs", BATCH, False), _folds(family, "xs", BATCH, True)) == folds, family
