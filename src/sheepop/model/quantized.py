"""int8 weights in the torch engine: a linear layer whose weight is int8 with one bf16 scale per
output channel, and the model surgery that puts it in place (the mathematics:
sheepop.arch.quantize; docs/performance.md, "Weights in fewer bytes").

    y = bf16( bf16(x) q^T * s ) + b          q int8 (out, in), s bf16 (out,), b float32

`quantize_int8(model)` swaps every block's nn.Linear for an `Int8Linear` and the head for an
`Int8Head` (the same unit over the head's matrix: for a tied head, a quantized copy of the
embedding, which itself stays float32 for the lookups), as sheepop.model.lora swaps them for
adapters. Nothing else in the model changes: norms, biases, positions, the embedding and the KV
cache stay float32.

Why bf16 activations: on the CPU, torch's weight-only int8 kernel
(`aten._weight_int8pack_mm`) is fast with bf16 inputs only (with float32 ones it was 4x
slower than the float32 product itself, measured here) and gives a bf16 result. For more than
`KERNEL_ROWS` rows (a prompt, a large batch) the kernel loses to a float32 product of the
dequantized weight, so those rows take that path, rounded the same way: both paths compute
the same numbers up to the order of the float32 sums.

Under torch.compile (`--compile`), on a CPU whose torch kernels are AVX2's (`WORDS_LOOP_PAYS`),
up to `KERNEL_ROWS` rows run `Int8Linear._words_product` instead of the kernel: the same
formula written as a loop inductor turns into C++ that reads the int8 weights 32 at a time
(2.2x the kernel's decode speed on SmolLM2's shape there, given the conditions in
docs/performance.md, "Compiled decoding"); elsewhere the compiled step calls the kernel, as
the eager one does. Inductor drops the code's roundings
to bf16 there (its default, emulate_precision_casts off), so compiled results are x q^T s in
float32, within a bf16 step of the kernel's: greedy tokens can part where two logits nearly
tie. (Rounding by integer arithmetic on the bits, which inductor keeps, made the compiled step
3x slower than eager: measured on 4 layers.)
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from sheepop.arch.quantize import quantize_rows
from sheepop.model.gpt import GPT, Head

KERNEL_ROWS = 8
"""The most rows (tokens x sequences) the int8 kernel takes; measured on the AVX2 CPU, 1
thread, a 1536 x 576 weight: it beats the row-major float32 product up to 8 rows (1.8x at 1
row) and loses from 16 (0.75x at 16, 0.55x at 512). So a step of more than 8 sequences (serve's
batches) runs the dequantized product: no faster than float32, only smaller in memory."""


WORDS_LOOP_PAYS = torch.backends.cpu.get_cpu_capability() == "AVX2"
"""Whether a compiled step reads int8 weights through `Int8Linear._words_product` (inductor's
C++ loop) rather than torch's kernel. Measured at 1 thread, every product of SmolLM2's decode
step (30 layers and the head, 135 MB of int8): on the AVX2 EPYC the loop took 0.45x the
kernel's time; on the AVX-512 Xeon (avx512_bf16, AMX), where torch's kernel runs its AVX-512
form, 2.3x (77 against 33 ms of CPU time; docs/performance.md, "Compiled decoding on the
AVX-512 Xeon"). Without vectors (ATEN_CPU_CAPABILITY=default) it was not measured: the kernel."""


KERNEL_WIDTH_STEP = 16
"""The input widths torch's int8 kernel computes on every CPU are multiples of this (see
`int8_kernel_takes`)."""


def int8_kernel_takes(rows: torch.Tensor, q: torch.Tensor) -> bool:
    """Whether `aten._weight_int8pack_mm(rows, q, s)` gives bf16(rows q^T s) on every CPU torch
    may dispatch it to, which a machine does not choose (torch 2.x,
    aten/src/ATen/native/cpu/int8mm_kernel.cpp; docs/performance.md, "Weights in fewer bytes"):

    - AVX-512: each step reads 16 columns of a row of x and of q, with no tail loop, through
      aligned loads (32 bytes of x, 16 of q): the width K a multiple of 16, x's and q's storage
      32- and 16-byte aligned. A width of 8 mod 16 reads 8 values past each row: 1e37 or a
      segmentation fault (issue 41, measured on an AVX-512 machine at K = 40).
    - AVX2: 8 columns a step, x 16-byte aligned: K a multiple of 8.
    - without vectors (ATEN_CPU_CAPABILITY=default): any K.

    So K % 16 == 0, x contiguous (the kernel reads rows K apart; torch checks only the last
    stride) and both storages aligned: the condition that holds on all three, taken on every
    CPU so that a model computes the same path, hence the same numbers, wherever it runs. The
    output count N too is held to a multiple of 16: the source read takes 4 outputs at a time
    with a tail, but the machine that failed (issue 41) failed at N = 24 and K = 40 together,
    and the issue read it as 16 output channels at a time; a model's N (SmolLM2's 576, 1536,
    49,152; GPT-2's 768, 2304, 3072) meets it, so the guard costs nothing real."""
    shapes = (rows.shape[-1] % KERNEL_WIDTH_STEP == 0 and q.shape[0] % KERNEL_WIDTH_STEP == 0
              and rows.is_contiguous())
    if torch.compiler.is_compiling():
        # data_ptr cannot be traced (each layer's product broke the graph in two); compiled,
        # the rows are a buffer of inductor's (interleaved: a copy), aligned to 64 bytes as
        # every CPU allocation of torch's is, and so is q, a buffer the model owns
        return shapes
    return shapes and rows.data_ptr() % 32 == 0 and q.data_ptr() % 16 == 0


class Int8Linear(nn.Module):
    """y = bf16(bf16(x) q^T * s) + b, in the dtype of x. `q` and `scale` are buffers (no
    gradient: this layer is for inference); the bias stays a float32 Parameter.

    When the input width is a multiple of 4, `q`'s columns are stored interleaved (`interleave`):
    stored column 4j + k is column k n + j of the weight, n = in / 4, so that the 4 bytes of
    32-bit word j are column j of each quarter. The eager paths interleave x the same way (a
    copy of one row of activations: the products are unchanged); the compiled one reads the
    words (`_words_product`).

    torch's int8 kernel runs only where `int8_kernel_takes` says it computes its formula on
    every CPU (an input width that is a multiple of 16); other widths take the dequantized
    product, on every CPU alike."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.interleaved = self.in_features % 4 == 0
        q = q.to(torch.int8)
        self.register_buffer("q", (interleave(q) if self.interleaved else q).contiguous())
        self.register_buffer("scale", scale.to(torch.bfloat16).contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(),
                                                           requires_grad=False)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None
                    ) -> Int8Linear:
        """The layer for float weight W (out, in): q, s = quantize_rows(W)."""
        q, scale = quantize_rows(weight.detach().float().cpu().numpy())
        layer = cls(torch.from_numpy(q), torch.from_numpy(scale), bias)
        return layer.to(weight.device)

    def read(self) -> tuple[torch.Tensor, ...]:
        """The tensors a product with one token reads (weight_bytes_read)."""
        return self.q, self.scale

    def quantized(self) -> torch.Tensor:
        """q (out, in) int8 in the weight's own column order."""
        return deinterleave(self.q) if self.interleaved else self.q

    def dequantized(self) -> torch.Tensor:
        """s[:, None] * q in float32 (out, in), in the weight's own column order."""
        return self.quantized().float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        few = rows.shape[0] <= KERNEL_ROWS and rows.device.type == "cpu"
        if few and self.interleaved and WORDS_LOOP_PAYS and torch.compiler.is_compiling():
            y = self._words_product(rows)
        else:
            stored = interleave(rows) if self.interleaved else rows
            if few and int8_kernel_takes(stored, self.q):
                y = torch.ops.aten._weight_int8pack_mm(stored, self.q, self.scale)
            else:
                y = (F.linear(stored.float(), self.q.float()) * self.scale.float()
                     ).to(torch.bfloat16)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def _words_product(self, rows: torch.Tensor) -> torch.Tensor:
        """bf16(x q^T * s) written as the loop inductor fuses (under torch.compile only):

            y_o = s_o sum_j sum_k x[k n + j] byte_k(word[o, j])

        with byte k sign-extended by shifts of the 32-bit word (k = 0 the lowest: the words
        are read little-endian). On an AVX2 CPU torch's int8 kernel converts the weights more
        slowly than memory delivers them; this loop reads 8 words at a time and converts them
        in registers (docs/performance.md, "Compiled decoding"). The words are the int8
        buffer viewed as float32 first: inductor loads a float32 input a vector at a time, an
        int32 one through a copy (measured 3x slower)."""
        n = self.in_features // 4
        words = self.q.view(torch.float32).view(torch.int32)  # (out, n)
        xs = rows.float()[:, None, :]  # (rows, 1, in)
        total = 0
        for k in range(4):
            byte = (words << (24 - 8 * k)) >> 24
            total = total + xs[..., k * n:(k + 1) * n] * byte.float()
        return (total.sum(-1) * self.scale.float()).to(torch.bfloat16)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def interleave(t: torch.Tensor) -> torch.Tensor:
    """Columns (..., in) reordered so that column 4j + k holds column k n + j (n = in / 4)."""
    *lead, width = t.shape
    return t.reshape(*lead, 4, width // 4).transpose(-1, -2).reshape(*lead, width)


def deinterleave(t: torch.Tensor) -> torch.Tensor:
    """The inverse of `interleave`."""
    *lead, width = t.shape
    return t.reshape(*lead, width // 4, 4).transpose(-1, -2).reshape(*lead, width)


class Int8Head(Int8Linear):
    """The output head with its matrix in int8: logits = Int8Linear(x), its buffers and bias
    under the head's own names (head.q, head.bias). A tied head quantizes a copy of the
    embedding and ignores the float table the model passes it (`tied`: which of the two)."""

    tied = False

    @classmethod
    def of(cls, head: Head, tied_weight: torch.Tensor) -> Int8Head:
        layer = cls.from_weight(tied_weight if head.weight is None else head.weight, head.bias)
        layer.tied = head.weight is None
        return layer

    def forward(self, x: torch.Tensor, tied_weight: torch.Tensor | None = None
                ) -> torch.Tensor:
        return super().forward(x)


def quantize_int8(model: GPT) -> GPT:
    """Every block's linear layer and the head in int8 (in place; returned). The model then
    runs for inference only."""
    names = [n for n, m in model.blocks.named_modules() if isinstance(m, nn.Linear)]
    for name in names:  # by name: a float32 layer is freed once replaced, if nothing else
        parent_name, _, child = name.rpartition(".")  # holds it (sheepop.inference.load)
        parent = model.blocks.get_submodule(parent_name)
        module = getattr(parent, child)
        setattr(parent, child, Int8Linear.from_weight(module.weight, module.bias))
        del module
    model.head = Int8Head.of(model.head, model.tok_emb.table())
    return model


def weight_bytes_read(model: GPT) -> int:
    """The bytes of every parameter and quantized weight, in the dtypes they are stored in, but the
    token embedding's when the head does not read it (a lookup reads one row a token): what one
    decode step reads. (A learned position table is counted whole: 0.6% of GPT-2's; rotary
    tables, computed buffers read a row at a time, are not.)"""
    head_reads_table = isinstance(model.head, Head) and model.head.weight is None
    seen = set() if head_reads_table else {id(model.tok_emb.weight)}
    total = 0
    quantized = [t for m in model.modules() if hasattr(m, "read") for t in m.read()]
    for t in [*model.parameters(), *quantized]:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total
