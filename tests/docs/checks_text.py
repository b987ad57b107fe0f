"""Recomputing the worked examples of docs/math parts 1-3: text, tokens, windows, embeddings and
positions. Each check takes the example's inputs and returns every value it can verify."""

from __future__ import annotations

import math

import numpy as np
import torch
from float_tolerance import float32_tolerance

from sheepop.config.schema import ModelConfig
from sheepop.data.dataset import encode_documents, split_tokens
from sheepop.data.ingest.normalize import normalize_text
from sheepop.data.windows import chunk_starts, window
from sheepop.model.gpt import GPT
from sheepop.positional import sinusoidal_table
from sheepop.scratch.layers import embedding_forward
from sheepop.scratch.positions import sinusoidal_positions_forward
from sheepop.tokenizers import train_tokenizer


def normalize(v):
    out = normalize_text(v["text"])
    return {"normalized": out, "chars_before": len(v["text"]), "chars_after": len(out)}


def char_tokenizer(v):
    tok = train_tokenizer("char", [v["corpus"]])
    ids = tok.encode(v["text"])
    return {"n_vocab": tok.vocab_size, "chars": tok.chars, "ids": ids, "decoded": tok.decode(ids)}


def word_tokenizer(v):
    tok = train_tokenizer("word", [v["corpus"]])
    ids = tok.encode(v["text"])
    return {"words": tok.words, "ids": ids, "decoded": tok.decode(ids)}


def bpe_tokenizer(v):
    tok = train_tokenizer("bpe", [v["corpus"]], vocab_size=int(v["vocab_size"]),
                          special_tokens=["<|eos|>"])
    return {"merges": [[tok.id_to_token(a), tok.id_to_token(b)] for a, b in tok.merges],
            "encode_aaab": tok.encode("aaab"), "encode_space_aab": tok.encode(" aab")}


def digits_tokenizer(v):
    return {"ids": train_tokenizer("digits", ["0"]).encode(v["text"])}


def documents(v):
    tok = train_tokenizer("char", [v["corpus"]])
    stream = encode_documents(tok, v["documents"])
    train, val = split_tokens(stream, float(v["val_fraction"]))
    return {"stream": stream, "train": train, "val": val}


def windows(v):
    tokens = np.asarray(v["tokens"], dtype=np.int64)
    T, pad = int(v["block_size"]), int(v["pad_id"])
    out = {}
    for stride in (3, 4):
        starts = chunk_starts(len(tokens), T, stride)
        out[f"starts_stride_{stride}"] = starts
        x, y = window(tokens, int(starts[-1]), T, pad)
        out[f"x_at_{starts[-1]}"], out[f"y_at_{starts[-1]}"] = x, y
    return out


def _embedding_model(E: np.ndarray) -> GPT:
    V, d = E.shape
    model = GPT(ModelConfig(vocab_size=V, n_embd=d, n_layer=1, n_head=1, block_size=4,
                            pos_encoding="learned"))
    with torch.no_grad():
        model.tok_emb.weight.copy_(torch.from_numpy(E))
    return model


def embedding(v):
    E = np.asarray(v["E"], dtype=np.float64)
    ids = np.asarray(v["ids"], dtype=np.int64)
    onehot = np.eye(E.shape[0])[ids]
    lookup, _ = embedding_forward(ids, E)  # scratch engine
    torch_rows = _embedding_model(E.astype(np.float32)).tok_emb(torch.from_numpy(ids))
    np.testing.assert_allclose(torch_rows.detach().numpy(), lookup, rtol=0,  # E in float32
                               atol=float32_tolerance(1, 1, np.abs(E).max()))
    return {"onehot": onehot, "onehot_times_E": onehot @ E, "lookup": lookup}


def sinusoidal(v):
    n, d = int(v["n_positions"]), int(v["d"])
    P = sinusoidal_table(n, d)
    cfg = ModelConfig(vocab_size=3, n_embd=d, n_layer=1, n_head=1, block_size=n)
    scale = cfg.sinusoid_scale
    scratch_rows, _ = sinusoidal_positions_forward({}, cfg, slice(0, n), np.float64)  # s * P
    torch_rows = GPT(cfg).pos_emb.table[:n]
    np.testing.assert_allclose(torch_rows.numpy(), scratch_rows, rtol=0,  # s P in float32
                               atol=float32_tolerance(1, 1, np.abs(scratch_rows).max()))
    i = np.arange(d // 2)
    return {"P": P, "scale": scale, "sP": scratch_rows,
            "wavelengths": 2 * math.pi * 10000.0 ** (2 * i / d),
            "row_norm_squared": (P ** 2).sum(axis=1),
            "scaled_row_norm_squared": (scratch_rows ** 2).sum(axis=1)}


def rotation(v):
    pos, k, d = int(v["pos"]), int(v["k"]), int(v["d"])
    P = sinusoidal_table(pos + k + 1, d)
    omega = 1.0 / 10000.0 ** (2 * int(v["pair"]) / d)
    R = np.array([[math.cos(k * omega), math.sin(k * omega)],
                  [-math.sin(k * omega), math.cos(k * omega)]])
    pair = slice(2 * int(v["pair"]), 2 * int(v["pair"]) + 2)
    return {"R": R, "p_pos": P[pos, pair], "R_times_p_pos": R @ P[pos, pair],
            "p_pos_plus_k": P[pos + k, pair]}


def scale_balance(v):
    """Mean squares of an embedding entry and of a table entry, over the tiny preset's table."""
    d = int(v["d"])
    cfg = ModelConfig(vocab_size=3, n_embd=d, block_size=128)
    unscaled = float(np.mean(sinusoidal_table(cfg.block_size, d) ** 2))
    scaled = float(np.mean(sinusoidal_positions_forward({}, cfg, slice(0, cfg.block_size),
                                                        np.float64)[0] ** 2))
    e2 = float(v["embedding_std"]) ** 2
    return {"unscaled_mean_square": unscaled, "scale": cfg.sinusoid_scale,
            "scaled_mean_square": scaled, "embedding_mean_square": e2,
            "unscaled_ratio": unscaled / e2, "scaled_ratio": scaled / e2}


CHECKS = {
    "normalize": (("text",), normalize),
    "char_tokenizer": (("corpus", "text"), char_tokenizer),
    "word_tokenizer": (("corpus", "text"), word_tokenizer),
    "bpe_tokenizer": (("corpus", "vocab_size"), bpe_tokenizer),
    "digits_tokenizer": (("text",), digits_tokenizer),
    "documents": (("corpus", "documents", "val_fraction"), documents),
    "windows": (("tokens", "block_size", "pad_id"), windows),
    "embedding": (("E", "ids"), embedding),
    "sinusoidal": (("n_positions", "d"), sinusoidal),
    "rotation": (("pos", "k", "d", "pair"), rotation),
    "scale_balance": (("d", "embedding_std"), scale_balance),
}
