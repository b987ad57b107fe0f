"""The torch engine's hand-written autograd Functions (issue 42's step cost): RMSNorm
(model/norm.py), QK-norm with the rotary turn (model/qk_norm.py), logit soft-capping
(model/softcap.py) and ReLU^2 (model/ffn.py). Each backward is gradient-checked in float64
(torch.autograd.gradcheck: finite differences against the written backward), each equals torch's
composite form in float32 within float32's precision, and so does a whole model of the speedrun's
recipe, loss and every gradient (the composite is what runs under torch.compile)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from sheepop.config.schema import ModelConfig
from sheepop.model import GPT
from sheepop.model.ffn import _ReluSquared, relu_squared
from sheepop.model.norm import RMSNorm, _RMSNorm
from sheepop.model.positions import RotaryPositions
from sheepop.model.qk_norm import _NormTurn, norm_and_turn
from sheepop.model.softcap import _Softcap, softcap

F32 = 2.0 ** -24  # float32's unit roundoff


def composite():
    """Every unit takes torch's composite path, as under torch.compile."""
    return mock.patch("torch.compiler.is_compiling", return_value=True)


def forward_backward(f, inputs: list[torch.Tensor], dy_seed: int = 0):
    """f's output and the gradients of sum(out * dy) for a fixed random dy."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = f(*leaves)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(dy_seed),
                     dtype=out.dtype)
    out.backward(dy)
    return out.detach(), [t.grad for t in leaves]


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, roundings: float) -> None:
    """|ours - theirs| <= roundings * float32's unit * the largest |theirs|."""
    bound = roundings * F32 * theirs.abs().max().item()
    assert (ours.float() - theirs.float()).abs().max().item() <= bound


def heads_view(dtype: torch.dtype, B: int = 2, T: int = 5, H: int = 3, d_k: int = 8
               ) -> torch.Tensor:
    """Queries and keys as attention has them: heads 0..H-1 of a (B, T, H + 1, d_k)
    projection, transposed (not contiguous)."""
    g = torch.Generator().manual_seed(3)
    return torch.randn(B, T, H + 1, d_k, generator=g, dtype=dtype).transpose(1, 2)[:, :H]


def rotary(d_k: int = 8, block: int = 16) -> RotaryPositions:
    return RotaryPositions(ModelConfig(vocab_size=10, n_embd=3 * d_k, n_head=3, block_size=block,
                                       pos_encoding="rope"))


# --- gradient checks, float64 ----------------------------------------------------------------
def test_rmsnorm_backward_is_the_gradient():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 7, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: _RMSNorm.apply(x, w, 1e-3), (x, w))


@pytest.mark.parametrize("eps,turned", [(1e-3, True), (1e-3, False), (None, True)])
def test_norm_and_turn_backward_is_the_gradient(eps, turned):
    qk = heads_view(torch.float64).requires_grad_()
    turns = rotary().turns(slice(2, 7), qk) if turned else None
    assert turns is None or turns.dtype == torch.complex128
    assert torch.autograd.gradcheck(lambda q: _NormTurn.apply(q, eps, turns), (qk,))


def test_softcap_backward_is_the_gradient():
    z = (torch.randn(4, 9, dtype=torch.float64) * 6).requires_grad_()
    assert torch.autograd.gradcheck(lambda z: _Softcap.apply(z, 3.0), (z,))


def test_relu_squared_backward_is_the_gradient():
    u = torch.randn(5, 11, dtype=torch.float64)
    u = (u + 0.05 * u.sign()).requires_grad_()  # off the kink's finite-difference step
    assert torch.autograd.gradcheck(_ReluSquared.apply, (u,))


# --- the composite's values, float32 ----------------------------------------------------------
def test_rmsnorm_equals_torchs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, 384, generator=g) * 3
    w = torch.rand(384, generator=g) + 0.5
    ours = RMSNorm(384, 1e-5)
    theirs = torch.nn.RMSNorm(384, eps=1e-5)
    with torch.no_grad():
        ours.weight.copy_(w)
        theirs.weight.copy_(w)
    (y, (dx,)), (ty, (tdx,)) = (forward_backward(m, [x]) for m in (ours, theirs))
    assert_close(y, ty, 8)
    assert_close(dx, tdx, 4 * 384)  # a mean over 384 features in another order
    assert_close(ours.weight.grad, theirs.weight.grad, 4 * 4 * 6)  # a sum over 24 rows
    assert set(dict(ours.named_parameters())) == set(dict(theirs.named_parameters()))


@pytest.mark.parametrize("pos", ["slice", "per-row"])
@pytest.mark.parametrize("eps", [1e-5, None])
def test_norm_and_turn_equals_the_norm_then_rotate(eps, pos):
    rope = rotary()
    where = slice(3, 8) if pos == "slice" else torch.tensor([[0, 1, 2, 3, 4], [4, 5, 6, 7, 8]])

    def theirs(q):
        q = F.rms_norm(q, (q.size(-1),), eps=eps) if eps is not None else q
        return rope.rotate(q, where)

    (y, (dq,)), (ty, (tdq,)) = (forward_backward(f, [heads_view(torch.float32)])
                                for f in (lambda q: norm_and_turn(q, eps, rope, where), theirs))
    assert_close(y, ty, 16)
    assert_close(dq, tdq, 4 * 8 + 16)  # a mean over d_k = 8 and the turn's two products


def test_softcap_equals_torchs_and_reads_bf16_in_float32():
    z = torch.randn(6, 50) * 40
    (y, (dz,)), (ty, (tdz,)) = (forward_backward(f, [z]) for f in
                                (lambda z: softcap(z, 15.0), lambda z: 15 * torch.tanh(z / 15)))
    assert_close(y, ty, 8)
    assert_close(dz, tdz, 8)
    low = z.bfloat16()
    capped = softcap(low, 15.0)  # computed from the bf16 values in float32, not rounded to bf16
    assert capped.dtype == torch.float32
    assert_close(capped, 15 * torch.tanh(low.float() / 15), 8)
    assert softcap(z, 0.0) is z


def test_relu_squared_equals_torchs_bit_for_bit():
    u = torch.randn(7, 33)
    (y, (du,)), (ty, (tdu,)) = (forward_backward(f, [u]) for f in
                                (relu_squared, lambda u: F.relu(u).square()))
    assert torch.equal(y, ty) and torch.equal(du, tdu)


# --- the whole recipe ----------------------------------------------------------------------
RECIPE = ModelConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=32,
                     pos_encoding="rope", norm="rmsnorm", qk_norm=True, activation="relu2",
                     logit_softcap=15.0, bias=False, dropout=0.0)


def loss_and_grads(model: GPT, x: torch.Tensor, y: torch.Tensor):
    model.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_the_recipes_loss_and_gradients_equal_the_composite_path():
    torch.manual_seed(0)
    model = GPT(RECIPE)
    with torch.no_grad():  # off the zero init, so every unit passes a gradient
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    x = torch.randint(0, RECIPE.vocab_size, (3, 16))
    y = torch.roll(x, -1, 1)
    loss, grads = loss_and_grads(model, x, y)
    with composite():
        their_loss, their_grads = loss_and_grads(model, x, y)
    assert abs(loss.item() - their_loss.item()) <= 64 * F32 * their_loss.item()
    for name, g in grads.items():
        # float32 sums over up to 48 tokens and 32 features, in another order, through 2 blocks
        # (11 roundings seen; a softcap backward without its 1 - t^2 is 23,662 off)
        assert_close(g, their_grads[name], 256), name


def test_under_bf16_autocast_the_recipe_trains_with_float32_gradients():
    """The training step's autocast (speedrun.py on a CPU with bf16 instructions): the units
    take bf16 activations, compute in float32, and the loss is the composite's within bf16's
    roundings (the composite rounds z / c, tanh and c tanh to bf16; ours only the head's z)."""
    torch.manual_seed(1)
    model = GPT(RECIPE)
    x = torch.randint(0, RECIPE.vocab_size, (3, 16))
    y = torch.roll(x, -1, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, grads = loss_and_grads(model, x, y)
        with composite():
            their_loss, their_grads = loss_and_grads(model, x, y)
    assert abs(loss.item() - their_loss.item()) <= 16 * 2.0 ** -8 * their_loss.item()
    assert all(g.dtype == torch.float32 and g.isfinite().all() for g in grads.values())
    cosine = F.cosine_similarity(torch.cat([g.flatten() for g in grads.values()]),
                                 torch.cat([g.flatten() for g in their_grads.values()]), dim=0)
    assert cosine > 0.99
