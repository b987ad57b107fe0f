"""bfloat16 weights' products in the compiled decode step (`--dtype bfloat16 --compile`).

    y = x W^T (+ b),   W bf16 (out, in), summed in float32:  y_o = sum_i x_i float(W_oi)

With `--dtype bfloat16` (TorchLM.cast) every product is `F.linear` on bf16 tensors. Compiled,
inductor hands it to oneDNN's matmul, one primitive a call, which at one row reads the bf16
weights no faster than `F.linear` reads float32's twice as many bytes. Written as the broadcast
multiply and sum, inductor fuses the product into one C++ loop that widens each bf16 weight to
float32 in registers: every product of SmolLM2's decode step (30 layers and the head, one row,
1 thread) took 37 ms of CPU time that way against 61 ms through oneDNN (compiled) and 46 ms for
float32's `F.linear`, on the AVX-512 Xeon with bf16 instructions (docs/performance.md, "Compiled
decoding on the AVX-512 Xeon"); on the AVX2 EPYC, one layer 1.5-1.6x `F.linear` ("Compiled
decoding: inductor's C++ against the eager kernels"). So every CPU takes it.

`Bf16Linear` is a block's linear layer that computes so under torch.compile for up to
`KERNEL_ROWS` rows (a decode step; a prompt's many rows keep `F.linear`) and is `F.linear`
otherwise, the same parameters under the same names; `fuse_bf16_products(model)` puts one in
place of each block's nn.Linear. The head keeps `F.linear`: it runs outside the compiled block.
Inductor computes the compiled step's activations in float32 anyway (its default,
emulate_precision_casts off), so the compiled numbers are the float32 sums of bf16 weights.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from sheepop.model.gpt import GPT
from sheepop.model.quantized import KERNEL_ROWS


class Bf16Linear(nn.Module):
    """y = x W^T + b; under torch.compile, up to KERNEL_ROWS rows on the CPU, as the sum over
    the input of x times W widened to float32 (the loop inductor fuses)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.out_features, self.in_features = linear.weight.shape
        self.weight, self.bias = linear.weight, linear.bias  # the same Parameters

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if (rows.shape[0] <= KERNEL_ROWS and rows.device.type == "cpu"
                and torch.compiler.is_compiling()):
            y = (rows.float()[:, None, :] * self.weight.float()).sum(-1)
            y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                "fused under torch.compile")


def fuse_bf16_products(model: GPT) -> GPT:
    """Every block's nn.Linear as a `Bf16Linear` over the same parameters (in place;
    returned)."""
    names = [n for n, m in model.blocks.named_modules() if type(m) is nn.Linear]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.blocks.get_submodule(parent_name)
        setattr(parent, child, Bf16Linear(getattr(parent, child)))
    return model
