"""Position encodings of the torch engine, one class per `model.pos_encoding` kind.

A kind acts in one or both of two places (docs/math/03-positions.md,
docs/derivations/positions.md):

    embed(x, pos)     x + P[pos] on the token embeddings (sinusoidal, learned)
    rotate(qk, pos)   on each head's queries and keys, stacked, inside attention (rope);
                      turns(pos, qk) gives the same turn as complex numbers, which
                      attention multiplies by (sheepop.model.qk_norm)

(`none`: neither), and digit places and term indices (`model.digit_positions`,
`model.term_positions`: `DigitPositions`) add rows chosen by each digit's place in its number
and by the number each token belongs to, computed from the token ids, on top of any kind.

`pos` is a slice (every row at positions start .. start+T-1) or an index tensor (B, T) (each
row of a left-padded batch counts from its own first real token); `table[pos]` reads either.
The NumPy engine's units are in sheepop/scratch/positions.py, its rotation in
sheepop/scratch/rope.py.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from sheepop.config.schema import ModelConfig
from sheepop.positional import (
    DIGIT_IDS,
    ROTATED_BY_DIGITS,
    place_rope_frequencies,
    rope_frequencies,
    sinusoidal_table,
    uses_digits,
)

Pos = slice | torch.Tensor


class Positions(nn.Module):
    """The identity in both places; a kind overrides what it does. `rotate` takes the queries
    and keys stacked on the head axis, (B, H + H_kv, T, d_k): one rotation turns both."""

    def embed(self, x: torch.Tensor, pos: Pos) -> torch.Tensor:
        return x

    def rotate(self, qk: torch.Tensor, pos: Pos) -> torch.Tensor:
        return qk

    def turns(self, pos: Pos, qk: torch.Tensor) -> torch.Tensor | None:
        """What `rotate` multiplies each pair of entries by, as complex numbers e^(i p omega)
        (sheepop.model.qk_norm turns in one product with them); None: no rotation."""
        return None


class SinusoidalPositions(Positions):
    """x + s * P[pos], P the fixed sinusoidal table (sheepop.positional), s = cfg.sinusoid_scale.
    Computed, not learned: a buffer, not a parameter (nothing in the checkpoint)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        table = sinusoidal_table(cfg.block_size, cfg.n_embd) * cfg.sinusoid_scale
        self.register_buffer("table", torch.from_numpy(table).float(), persistent=False)

    def embed(self, x: torch.Tensor, pos: Pos) -> torch.Tensor:
        return x + self.table[pos]


class LearnedPositions(Positions):
    """x + P[pos], P a learned (block_size, d) table: the parameter `pos_emb.weight`."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.block_size, cfg.n_embd))

    def embed(self, x: torch.Tensor, pos: Pos) -> torch.Tensor:
        return x + self.weight[pos]


class RotaryPositions(Positions):
    """RoPE: pair i = (2i, 2i+1) of every query and key head at position p turns by p omega_i,

        [x'_2i, x'_2i+1] = [x_2i cos(p omega_i) - x_2i+1 sin(p omega_i),
                            x_2i sin(p omega_i) + x_2i+1 cos(p omega_i)]
        omega_i = theta^(-2i/d_k)

    so q_m . k_n depends on m - n only (docs/derivations/positions.md). Nothing is added to the
    embeddings and nothing is learned; the angles are computed for the positions asked, so any
    position exists (a cache can slide past the context)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # float64 and not a buffer: `model.to(torch.bfloat16)` must not round the frequencies
        # (an angle p omega_i off by 0.4% at p = 1000 is a different position), and both
        # engines then compute the same angles at any position.
        self.omega = torch.from_numpy(rope_frequencies(cfg.head_dim, cfg.rope_theta))

    def _apply(self, fn, recurse=True):
        """Follow the module to its device (`.to`, `.cuda`), never to its dtype."""
        super()._apply(fn, recurse)
        self.omega = self.omega.to(fn(self.omega).device)
        return self

    def rotate(self, qk: torch.Tensor, pos: Pos) -> torch.Tensor:
        """The rotation in real arithmetic (`_turn`): the form torch.compile takes; eagerly
        attention turns by `turns` (sheepop.model.qk_norm), the same values."""
        cos, sin, _ = self._angles(pos, qk)
        return _turn(qk, cos, sin)

    def turns(self, pos: Pos, qk: torch.Tensor) -> torch.Tensor:
        """e^(i p omega_j) = cos + i sin for each pair j, (..., T, d_k / 2): the pair
        (x_2j, x_2j+1) read as x_2j + i x_2j+1 and multiplied by it is `rotate`'s turn."""
        return self._angles(pos, qk)[2]

    def _angles(self, pos: Pos, qk: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(cos, cos) and (-sin, sin) of p omega_i for each pair i, interleaved as the pairs
        are (..., T, d_k), and cos + i sin (..., T, d_k / 2), computed once per forward pass:
        every layer asks for the same positions, and in a one-token decode step these small
        operations are a noticeable share of the time (not under torch.compile, which fuses
        them)."""
        dtype = torch.promote_types(qk.dtype, torch.float32)
        compiling = torch.compiler.is_compiling()
        if not compiling:  # (the key alone would break torch.compile's graph)
            # Tensors made under inference_mode cannot enter autograd: a training step after an
            # evaluation at the same positions must not reuse them.
            key = ((pos.start, pos.stop) if isinstance(pos, slice) else pos, qk.device, dtype,
                   torch.is_inference_mode_enabled())
            last = getattr(self, "_last", None)
            if last is not None and last[0][1:] == key[1:] and _same(last[0][0], key[0]):
                return last[1]
        if isinstance(pos, slice):
            p = torch.arange(pos.start, pos.stop, device=qk.device)      # (T,)
        else:
            p = pos[:, None]                                              # (B, 1, T (, 2))
        angle = self._turns(p.to(torch.float64))                          # (..., T, d_k/2)
        cos, sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
        # (the complex form only eagerly: torch.compile takes `rotate`, and inductor compiles no
        # complex numbers)
        angles = (torch.stack((cos, cos), -1).flatten(-2),
                  torch.stack((-sin, sin), -1).flatten(-2),
                  None if compiling else torch.complex(cos, sin))
        if not compiling:
            self._last = (key, angles)
        return angles

    def _turns(self, p: torch.Tensor) -> torch.Tensor:
        """p omega_i for every position p and pair i."""
        return p[..., None] * self.omega


class PlaceRotaryPositions(RotaryPositions):
    """`rope_places`: RoPE whose position is the pair (term index n, digit place r) of each
    token (GPT.forward passes them, (B, T, 2)): pair i turns by (n, r) W
    (sheepop.positional.place_rope_frequencies), so q . k depends on (n_q - n_k, r_q - r_k)
    only: the same digit of the numbers before has offset (-1, 0), the next one (-1, +1),
    whatever the place, and no token knows its absolute place."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.omega = torch.from_numpy(place_rope_frequencies(cfg.head_dim, cfg.rope_theta))

    def _turns(self, p: torch.Tensor) -> torch.Tensor:
        return p @ self.omega


def _same(a: tuple | torch.Tensor, b: tuple | torch.Tensor) -> bool:
    """The same positions: equal (start, stop), or the very same index tensor."""
    return a is b or (isinstance(a, tuple) and isinstance(b, tuple) and a == b)


def _turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the interleaved pairs of x (..., T, d_k) by the angles whose interleaved
    (cos, cos) and (-sin, sin) are given (broadcast over the heads), in float32 at least:

        (x_2i, x_2i+1) (cos, cos) + (x_2i+1, x_2i) (-sin, sin)

    four operations (the swap, two products, the sum), back in x's dtype."""
    wide = x.to(cos.dtype)
    swapped = wide.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return (wide * cos + swapped * sin).to(x.dtype)


class DigitPositions(nn.Module):
    """Digit places (abacus embeddings, McLeish et al. 2024) and term indices, added to any
    kind above:

        x + A[row_t] + N[min(n_t, S - 1)],   row_t = min(r_t + o_b, R - 1)

    r_t the place of token t in its number (1 = the first digit written, 0 = not a digit;
    `digit_places`), n_t the number it belongs to (`term_index`), A (R, d) =
    `digit_emb.weight` (R = model.digit_positions) and N (S, d) = `digit_emb.terms` (S =
    model.term_positions), each
    learned and present when its size is not 0; o_b a random 0 .. model.digit_offset per
    sequence while training (0 at inference). Both come from the token ids, so they are the same
    for every number whatever its length: the k-th digit of every term reads row k of A. A KV
    cache carries each row's (run of digits, numbers ended) to the next call (`digit_run`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.digit_positions, cfg.n_embd)) \
            if cfg.digit_positions else None
        self.terms = nn.Parameter(torch.empty(cfg.term_positions, cfg.n_embd)) \
            if cfg.term_positions else None
        self.offset = cfg.digit_offset
        self.with_places = cfg.pos_encoding == "rope_places"
        self.turns = cfg.pos_encoding in ROTATED_BY_DIGITS  # attention turns by them

    def forward(self, x: torch.Tensor, idx: torch.Tensor, pos: Pos, cache=None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """x plus the rows, and what `rope_terms` rotates by, the term index n (B, T), or
        `rope_places`, (n, r) (B, T, 2)."""
        T = idx.shape[1]
        real = None
        if not isinstance(pos, slice):  # left padding: a row's positions end consecutive
            real = pos == pos[:, -1:] - torch.arange(T - 1, -1, -1, device=pos.device)
        state = getattr(cache, "digit_run", None) if cache is not None and cache.length else None
        places = digit_places(idx, None if state is None else state[:, 0], real)
        numbers = term_index(idx, state, real)
        if cache is not None:
            cache.digit_run = torch.stack([places[:, -1], numbers[:, -1]], dim=-1)
        if self.weight is not None:
            offset = 0
            if self.training and self.offset:
                offset = torch.randint(0, self.offset + 1, (idx.shape[0], 1), device=idx.device)
            rows = torch.clamp(places + offset, max=len(self.weight) - 1)
            x = x + self.weight[rows]
        if self.terms is not None:
            x = x + self.terms[torch.clamp(numbers, max=len(self.terms) - 1)]
        if self.with_places:
            return x, torch.stack([numbers, places], dim=-1)
        return x, numbers


def _digits(idx: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
    digit = idx < DIGIT_IDS
    return digit if real is None else digit & real


def digit_places(idx: torch.Tensor, run_before: torch.Tensor | None = None,
                 real: torch.Tensor | None = None) -> torch.Tensor:
    """sheepop.positional.digit_places in torch: r_t = c_t - (largest c_u at a non-digit u <=
    t), c_t = run_before + the digits up to t; 0 at non-digits."""
    digit = _digits(idx, real)
    count = torch.cumsum(digit.long(), dim=-1)
    if run_before is not None:
        count = count + run_before.long()[:, None]
    last_reset = torch.cummax(torch.where(digit, 0, count), dim=-1).values
    return torch.where(digit, count - last_reset, 0)


def term_index(idx: torch.Tensor, state: torch.Tensor | None = None,
               real: torch.Tensor | None = None) -> torch.Tensor:
    """sheepop.positional.term_index in torch: n_t = numbers ended before + the non-digits up
    to t that follow a digit."""
    digit = _digits(idx, real)
    before = torch.zeros_like(digit[:, :1]) if state is None else (state[:, :1] > 0)
    previous = torch.cat([before, digit[:, :-1]], dim=1)
    numbers = torch.cumsum((~digit & previous).long(), dim=-1)
    return numbers if state is None else numbers + state[:, 1:2].long()


class NoPositions(Positions):
    """`none`: nothing added, nothing turned (NoPE); positions come from the causal mask, and
    from digit places and term indices when configured."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()


# rope_terms (rope_places) is RoPE whose positions are term indices (and digit places):
# GPT.forward passes them (DigitPositions).
POSITIONS = {"sinusoidal": SinusoidalPositions, "learned": LearnedPositions,
             "rope": RotaryPositions, "rope_terms": RotaryPositions,
             "rope_places": PlaceRotaryPositions, "none": NoPositions}


def make_positions(cfg: ModelConfig) -> Positions:
    return POSITIONS[cfg.pos_encoding](cfg)


def position_modules(cfg: ModelConfig) -> dict[str, nn.Module]:
    """The modules a model registers, by name, in the checkpoint's order: the kind (`pos_emb`),
    then the digit places' and term indices' tables (`digit_emb`) when the config reads them."""
    modules: dict[str, nn.Module] = {"pos_emb": make_positions(cfg)}
    if uses_digits(cfg):
        modules["digit_emb"] = DigitPositions(cfg)
    return modules


def add_positions(model: nn.Module, x: torch.Tensor, idx: torch.Tensor, pos: Pos,
                  cache=None) -> tuple[torch.Tensor, Pos]:
    """x (the token embeddings E[idx]) plus what the modules of `position_modules` add, in
    order: the kind's P[pos], then A[place] + N[term] (from the token ids, a KV `cache`
    carrying each row's state); and the positions attention turns queries and keys by: `pos`,
    or for rope_terms / rope_places the term indices (and digit places)."""
    x = model.pos_emb.embed(x, pos)
    read_by_token = getattr(model, "digit_emb", None)
    if read_by_token is not None:
        x, numbers = read_by_token(x, idx, pos, cache)
        if read_by_token.turns:
            pos = numbers  # queries and keys turn by their number (and digit place)
    return x, pos
