"""The policy-gradient loss of `sheepop rl` (sheepop.rl.objective) and the group advantages
(sheepop.rl.groups): each term's value and gradient with numbers, the gradient against float64
finite differences and torch's autograd of the formula written plainly, and the KL estimators
against the exact KL."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sheepop.rl.groups import answer_batch, group_advantages, signal_share
from sheepop.rl.objective import PolicyLoss, policy_objective

N, T = 4, 6


def batch(seed: int = 0):
    """Log-probabilities of a policy, a sampling policy close to it (ratios 0.6 .. 1.6: some
    clipped at eps 0.2) and a reference; a mask with a prompt and padding; advantages of both
    signs."""
    rng = np.random.default_rng(seed)
    logp = np.log(rng.uniform(0.05, 0.9, (N, T)))
    old = logp - rng.uniform(-0.5, 0.5, (N, T))
    ref = logp + rng.normal(0.0, 0.4, (N, T))
    mask = np.ones((N, T), bool)
    mask[0, :2] = False
    mask[-1, -3:] = False
    return logp, old, ref, mask, np.array([1.5, -0.5, -1.0, 0.25])


def torch_loss(logp, old, ref, mask, adv, settings: PolicyLoss):
    """L of the module's docstring, term by term in torch, for autograd."""
    m = torch.from_numpy(mask)
    A = torch.from_numpy(adv)[:, None].expand_as(logp)
    rho = torch.exp(logp - torch.from_numpy(old))
    eps = settings.clip
    s = torch.minimum(rho * A, torch.clamp(rho, 1 - eps, 1 + eps) * A)
    r = torch.from_numpy(ref) - logp
    k = {"k1": -r, "k2": r * r / 2, "k3": torch.exp(r) - 1 - r}[settings.estimator]
    return ((-s + settings.kl * k) * m).sum() / m.sum()


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_the_gradient_is_the_derivative_of_the_loss(estimator):
    logp, old, ref, mask, adv = batch()
    settings = PolicyLoss(clip=0.2, kl=0.3, estimator=estimator)
    obj = policy_objective(logp, mask, adv, settings, old, ref)
    assert 0 < obj.clipped < 1  # both branches of the min are exercised
    # float64 central differences: truncation h^2 |L'''| ~ 1e-12, rounding 1e-16 / h ~ 1e-10
    h, fd = 1e-6, np.zeros_like(logp)
    for idx in np.ndindex(logp.shape):
        up, down = logp.copy(), logp.copy()
        up[idx] += h
        down[idx] -= h
        fd[idx] = (policy_objective(up, mask, adv, settings, old, ref).loss
                   - policy_objective(down, mask, adv, settings, old, ref).loss) / (2 * h)
    np.testing.assert_allclose(obj.grad, fd, rtol=0, atol=1e-8)
    t = torch.tensor(logp, requires_grad=True)
    loss = torch_loss(t, old, ref, mask, adv, settings)
    loss.backward()
    assert obj.loss == pytest.approx(loss.item(), rel=1e-12)
    np.testing.assert_allclose(obj.grad, t.grad.numpy(), rtol=1e-12, atol=1e-15)
    assert (obj.grad[~mask] == 0).all()


def test_reinforce_at_ratio_one_raises_the_good_answer_and_lowers_the_bad():
    """First update of a batch (old = logp): dL/dlogp = -A m / M, so a descent step raises the
    log-probability of an answer with A > 0 and lowers one with A < 0 (a wrong sign fails)."""
    logp = np.log(np.array([[0.5, 0.25], [0.5, 0.5]]))
    mask = np.array([[True, True], [True, False]])
    obj = policy_objective(logp, mask, np.array([2.0, -1.0]), PolicyLoss())
    np.testing.assert_allclose(obj.grad, [[-2 / 3, -2 / 3], [1 / 3, 0.0]], rtol=1e-15)
    assert obj.loss == pytest.approx(-(2 + 2 - 1) / 3)
    assert obj.surprisal == pytest.approx((np.log(2) + np.log(4) + np.log(2)) / 3)


def test_the_ratio_is_clipped_only_where_it_would_go_further():
    """A > 0: a ratio above 1 + eps gets no gradient, one below 1 - eps keeps it (pulling it up
    is allowed); A < 0 the other way round."""
    old = np.zeros((2, 2))
    logp = np.log(np.array([[1.5, 0.5], [1.5, 0.5]]))  # rho = 1.5 and 0.5
    mask = np.ones((2, 2), bool)
    obj = policy_objective(logp, mask, np.array([1.0, -1.0]), PolicyLoss(clip=0.2), old)
    np.testing.assert_allclose(obj.grad, [[0.0, -0.5 / 4], [1.5 / 4, 0.0]], rtol=1e-15)
    assert obj.clipped == 0.5
    # the clipped terms count at their clipped value: -(1.2 + 0.5 - 1.5 - 0.8) / 4
    assert obj.loss == pytest.approx(-(1.2 + 0.5 - 1.5 - 0.8) / 4)


def test_the_kl_term_pulls_towards_the_reference():
    """k3' = 1 - e^r: a token the policy likes more than the reference (r < 0) gets a positive
    gradient (descent lowers it), one it likes less a negative one; beta scales it."""
    logp = np.log(np.array([[0.5, 0.1]]))
    ref = np.log(np.array([[0.25, 0.2]]))
    obj = policy_objective(logp, np.ones((1, 2), bool), np.zeros(1),
                           PolicyLoss(kl=0.5), ref_logp=ref)
    np.testing.assert_allclose(obj.grad, [[0.5 * (1 - 0.5) / 2, 0.5 * (1 - 2.0) / 2]],
                               rtol=1e-14)
    k3 = (0.5 - 1 - np.log(0.5)) + (2.0 - 1 - np.log(2.0))
    assert obj.kl == pytest.approx(k3 / 2)
    assert obj.loss == pytest.approx(0.5 * k3 / 2)


@pytest.mark.parametrize("estimator, unbiased", [("k1", True), ("k3", True), ("k2", False)])
def test_the_estimators_expectation_under_the_policy(estimator, unbiased):
    """E_{y~p}[k(log q(y) - log p(y))] over a whole distribution: k1 and k3 give KL(p || q)
    exactly, k2 does not (it is biased; its expectation is the second-order approximation)."""
    from sheepop.rl.objective import kl_terms
    p = np.array([0.5, 0.3, 0.15, 0.05])
    q = np.array([0.2, 0.2, 0.3, 0.3])
    kl = float(np.sum(p * np.log(p / q)))
    expected = float(np.sum(p * kl_terms(np.log(q) - np.log(p), estimator)[0]))
    assert (expected == pytest.approx(kl, rel=1e-12)) is unbiased
    if estimator == "k3":  # and each sample is >= 0: e^r >= 1 + r
        assert (kl_terms(np.log(q) - np.log(p), "k3")[0] >= 0).all()


def test_the_group_mean_is_the_baseline():
    """A_i = R_i - mean(R) within each group: a group that all answered alike teaches nothing
    (without the baseline every reward-1 answer would be pushed up, the group's own mean)."""
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(group_advantages(rewards, 4),
                               [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])
    std = np.sqrt(0.75 * 0.25)
    np.testing.assert_allclose(group_advantages(rewards, 4, scale=True)[:4],
                               np.array([0.75, -0.25, -0.25, -0.25]) / (std + 1e-4))
    assert signal_share(rewards, 4) == 0.5
    assert group_advantages(rewards, 4).reshape(2, 4).sum(axis=1) == pytest.approx([0, 0])


def test_the_answer_batch_counts_the_answers_tokens_only():
    x, y = answer_batch([[5, 6, 7], [5]], [[8, 9], [3, 4, 2]], pad_id=0)
    np.testing.assert_array_equal(x, [[5, 6, 7, 8], [5, 3, 4, 0]])
    np.testing.assert_array_equal(y, [[-1, -1, 8, 9], [3, 4, 2, -1]])


def test_parts_of_a_batch_add_up_to_the_whole():
    """Rows split into micro-batches with the whole batch's token count give the whole
    batch's loss and gradient (train.grad_accum)."""
    logp, old, ref, mask, adv = batch(1)
    settings = PolicyLoss(kl=0.1)
    whole = policy_objective(logp, mask, adv, settings, old, ref)
    M = int(mask.sum())
    parts = [policy_objective(logp[s], mask[s], adv[s], settings, old[s], ref[s], tokens=M)
             for s in (slice(0, 1), slice(1, N))]
    assert sum(p.loss for p in parts) == pytest.approx(whole.loss, rel=1e-13)
    np.testing.assert_allclose(np.concatenate([p.grad for p in parts]), whole.grad, rtol=1e-15)
