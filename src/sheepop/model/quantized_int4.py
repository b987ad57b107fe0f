"""4-bit weights in GGUF Q4_1's layout in the torch engine, `--dtype int4` (docs/performance.md,
"Weights in fewer bytes").

    W_j ~ low + d q_j, q in [0, 15], per group of 32 weights of a row (sheepop.arch.quantize)
    y = bf16( bf16(x) W~^T ) + b

torch's CPU kernel (`aten._weight_int4pack_mm_for_cpu`) computes with (q - 8) s + z per group,
so s = d and z = low + 8 d, both stored in bf16 (its inputs are bf16): that rounding is the
only change to a model imported from Q4_1 blocks (whose float32 weights give back the same
blocks). For more than `KERNEL_ROWS` rows the dequantized weight is multiplied in float32, as
in the int8 layer (sheepop.model.quantized). The kernel needs the outputs in multiples of 16
and the inputs in multiples of 32: `quantize_int4` refuses other shapes by name. The head
stays as the int8 layer makes it (GGUF files keep it in 8 bits too: SmolLM2's is Q8_0).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from sheepop.arch.quantize import GROUP, quantize_groups
from sheepop.errors import UserError
from sheepop.model.gpt import GPT
from sheepop.model.quantized import KERNEL_ROWS, Int8Head


class Int4Linear(nn.Module):
    """y = bf16(bf16(x) W~^T) + b with W~ = (q - 8) s + z per group of 32 (buffers)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q, d, low = quantize_groups(weight.detach().float().cpu().numpy())
        q = torch.from_numpy(q).to(torch.int32)
        d, low = torch.from_numpy(d), torch.from_numpy(low)
        scale_zero = torch.stack([d.t(), (low + 8 * d).t()], dim=-1).to(torch.bfloat16)
        self.register_buffer("packed",
                             torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
        self.register_buffer("scale_zero", scale_zero.contiguous())  # (in / 32, out, 2)
        self.register_buffer("q", (q - 8).to(torch.int8))  # for the many-row path
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(),
                                                           requires_grad=False)

    def read(self) -> tuple[torch.Tensor, ...]:
        """The tensors a product with one token reads (weight_bytes_read)."""
        return self.packed, self.scale_zero

    def dequantized(self) -> torch.Tensor:
        """(q - 8) s + z in float32 (out, in), s and z as the kernel reads them (bf16)."""
        s, z = self.scale_zero.float().unbind(-1)  # (in / 32, out) each
        groups = self.q.float().reshape(self.out_features, -1, GROUP)
        return (groups * s.t()[..., None] + z.t()[..., None]).reshape(self.out_features, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if rows.shape[0] <= KERNEL_ROWS and rows.device.type == "cpu":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, GROUP,
                                                           self.scale_zero)
        else:
            y = F.linear(rows.float(), self.dequantized()).to(torch.bfloat16)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)


def quantize_int4(model: GPT) -> GPT:
    """Every block's linear layer in 4-bit groups, the head in int8 (in place; returned)."""
    shapes = {n: m.weight.shape for n, m in model.blocks.named_modules()
              if isinstance(m, nn.Linear)}
    for name, (out, width) in shapes.items():
        if out % 16 or width % GROUP:
            raise UserError(f"4-bit weights: blocks.{name} is {out} x {width}; the kernel "
                            f"takes outputs in multiples of 16 and inputs in multiples of "
                            f"{GROUP}")
    for name in shapes:  # by name: a float32 layer is freed once replaced, if nothing else
        parent_name, _, child = name.rpartition(".")  # holds it (sheepop.inference.load)
        parent = model.blocks.get_submodule(parent_name)
        module = getattr(parent, child)
        setattr(parent, child, Int4Linear(module.weight, module.bias))
        del module
    model.head = Int8Head.of(model.head, model.tok_emb.table())
    return model
