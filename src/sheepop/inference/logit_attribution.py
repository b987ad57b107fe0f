"""Direct logit attribution (docs/experiments.md): each part of the model's share of one token's
logit at the prompt's last position, read at the engine's hook points
(sheepop.inference.hooked_engines).

Without U-net skips the residual stream leaving the last block is a sum of what each part
wrote into it (dropout off):

    h_L = h_0 + sum_l (a_l + f_l),   a_l = sum_h o_(l,h) W_proj[:, h]^T + b_proj

h_0 the embedding (embed), o_(l,h) head h's output (blocks.l.attn.heads) with W_proj[:, h]
its d_k columns of block l's output projection, f_l the feed-forward's output (blocks.l.ffn.out,
its bias in it). The final norm is linear in h once its scale is frozen at h_L's own (the
norm unit's own statistics, sheepop.scratch.norm's `moments`):

    layernorm   Norm_f(h) = gamma * (h - mean(h)) s + beta,   s = 1 / sqrt(var(h_L) + eps)
    rmsnorm     Norm_f(h) = gamma * h s,                      s = 1 / sqrt(mean(h_L^2) + eps)

so the logit z_t = Norm_f(h_L) . W_head[t] + b_head[t] is the sum of the shares

    share(c) = s (c - mean(c)) . (gamma * W_head[t])   (rmsnorm: c, not c - mean(c))

of every part c (the embedding, each head, each attention's b_proj, each feed-forward), plus
beta . W_head[t] (final_norm.bias) and b_head[t] (head.bias). The shares are computed in
float64 from the float32 values, so they sum to the engine's own logit within float32's
rounding of the pass. Soft-capped logits (c tanh(z / c)) and U-net skips (a block's output
added again further up) are not such sums and are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sheepop.errors import UserError
from sheepop.inference.hooked_engines import HookedEngine
from sheepop.scratch.norm import NORMS


@dataclass
class LogitShares:
    """Each part's share of the logit of `token` at the prompt's last position."""
    token: int
    names: list[str]      # "embed", "blocks.l.attn.head.h", "blocks.l.attn.bias",
    shares: np.ndarray    # "blocks.l.ffn", "final_norm.bias", "head.bias"
    logit: float          # the engine's own z_t

    def by_name(self) -> dict[str, float]:
        return dict(zip(self.names, self.shares.tolist()))


def logit_shares(engine: HookedEngine, ids: Sequence[int], token: int) -> LogitShares:
    """The direct logit attribution of `token`'s logit at the last position of `ids`."""
    cfg, w = engine.cfg, engine.weights
    if cfg.logit_softcap:
        raise UserError("direct logit attribution splits a logit into a sum: a soft-capped "
                        "logit (model.logit_softcap) is not one")
    if cfg.unet_skips:
        raise UserError("direct logit attribution needs the residual stream to be a sum of "
                        "each part's output once: model.unet_skips adds some twice")
    if not 0 <= token < cfg.vocab_size:
        raise UserError(f"token {token} is outside the vocabulary (0..{cfg.vocab_size - 1})")
    L, H, dk = cfg.n_layer, cfg.n_head, cfg.head_dim
    points = (["embed", f"blocks.{L - 1}.resid_out"]
              + [f"blocks.{i}.{p}" for i in range(L) for p in ("attn.heads", "ffn.out")])
    z, values = engine.values(ids, points)
    last = lambda point: values[point][0, -1].astype(np.float64)  # noqa: E731
    head_row = w.get("head.weight", w["tok_emb.weight"])[token].astype(np.float64)
    direction = head_row * w["ln_f.weight"].astype(np.float64)   # gamma * W_head[t]
    # the norm's own statistics of h_L (sheepop.scratch.norm): the mean it removes (None for
    # a norm that removes none) and the variance or mean square it divides by
    mean, spread = NORMS[cfg.norm].moments(last(f"blocks.{L - 1}.resid_out"))
    s = float(1.0 / np.sqrt(spread.item() + cfg.ln_eps))
    centred = mean is not None

    def share(c: np.ndarray) -> float:
        return s * float(((c - c.mean()) if centred else c) @ direction)

    names, shares = ["embed"], [share(last("embed"))]
    for i in range(L):
        w_proj = w[f"blocks.{i}.attn.proj.weight"].astype(np.float64)     # (d, H d_k)
        heads = values[f"blocks.{i}.attn.heads"][0, :, -1].astype(np.float64)  # (H, d_k)
        for h in range(H):
            names.append(f"blocks.{i}.attn.head.{h}")
            shares.append(share(w_proj[:, h * dk:(h + 1) * dk] @ heads[h]))
        if f"blocks.{i}.attn.proj.bias" in w:
            names.append(f"blocks.{i}.attn.bias")
            shares.append(share(w[f"blocks.{i}.attn.proj.bias"].astype(np.float64)))
        names.append(f"blocks.{i}.ffn")
        shares.append(share(last(f"blocks.{i}.ffn.out")))
    if "ln_f.bias" in w:
        names.append("final_norm.bias")
        shares.append(float(w["ln_f.bias"].astype(np.float64) @ head_row))
    if "head.bias" in w:
        names.append("head.bias")
        shares.append(float(w["head.bias"][token]))
    return LogitShares(token, names, np.array(shares), float(z[token]))
