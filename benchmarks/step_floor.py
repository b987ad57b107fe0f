"""The work kernels of one training step of the GPT shape, alone: a floor under any step.

`floor_step(shape, batch)` returns a callable that runs, on tensors made once, only the kernels
that hold the arithmetic of a step of nanoGPT's architecture (learned positions, LayerNorm, GELU
MLP 4x, biases, tied head), and nothing else:

    per layer, forward:  the 4 linear layers (addmm: x W^T + b), causal attention
                         (scaled_dot_product_attention), GELU;
    per layer, backward: each linear's input and weight gradients (2 mm) and bias gradient (a
                         sum), attention's backward, GELU's backward;
    once:                the tied head (forward mm, 2 backward mm), cross-entropy forward and
                         backward, one fused AdamW over all the parameters.

Left out, as if free: LayerNorm, residual additions, embeddings, copies, gradient clipping,
Python and autograd. Any step that computes the same function with torch's kernels (sheepop's,
nanoGPT's) runs at least this work, so `floor / nanoGPT's step` bounds how far below nanoGPT a
step built from these kernels can get on a machine. (Attention runs through autograd, whose
bookkeeping is a few microseconds of its millisecond.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from nanogpt_reference import Shape


def floor_step(shape: Shape, batch: int):
    """A callable (x, y) -> None that runs the step's work kernels once (x and y unused)."""
    C, H, T, V = shape.n_embd, shape.n_head, shape.block_size, shape.vocab_size
    N = batch * T  # rows: every token of the batch
    g = torch.Generator().manual_seed(0)

    def r(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=g) * 0.02

    linears = [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)]  # (in, out): qkv, proj, fc, proj
    layers = [[(r(o, i), r(o), r(N, i), r(N, o)) for i, o in linears]
              for _ in range(shape.n_layer)]  # weight, bias, input, output gradient
    q, k, v = (r(batch, H, T, C // H).requires_grad_() for _ in range(3))
    attn_grad = r(batch, H, T, C // H)
    pre_gelu, gelu_grad = r(N, 4 * C), r(N, 4 * C)
    wte, h, targets = r(V, C), r(N, C), torch.randint(0, V, (N,), generator=g)
    params = [t for layer in layers for w, b, _, _ in layer for t in (w, b)] + [wte]
    grads = [torch.zeros_like(p) for p in params]
    exp_avg = [torch.zeros_like(p) for p in params]
    exp_avg_sq = [torch.zeros_like(p) for p in params]
    state_steps = [torch.tensor(1.0) for _ in params]

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        for layer in layers:
            for w, b, inp, _ in layer:
                torch.addmm(b, inp, w.t())
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            F.gelu(pre_gelu)
            for w, _, inp, dout in layer:
                dout @ w  # input gradient
                dout.t() @ inp  # weight gradient
                dout.sum(0)  # bias gradient
            torch.autograd.grad(out, (q, k, v), attn_grad)
            torch.ops.aten.gelu_backward(gelu_grad, pre_gelu)
        logits = (h @ wte.t()).requires_grad_()
        loss = F.cross_entropy(logits, targets)
        (dlogits,) = torch.autograd.grad(loss, logits)
        dlogits @ wte  # head: input gradient
        dlogits.t() @ h  # head: weight gradient
        torch._fused_adamw_(params, grads, exp_avg, exp_avg_sq, [], state_steps, lr=1e-3,
                            beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8, amsgrad=False,
                            maximize=False)

    return step
