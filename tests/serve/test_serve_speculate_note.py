"""A run whose [sample] asks for speculative decoding: the server, whose batch does not
speculate, says so on stderr before it serves (a setting is never dropped silently)."""

from __future__ import annotations

from serve_helpers import ServerProcess, weights

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, ModelConfig
from sheepop.tokenizers import train_tokenizer


def test_the_server_says_it_does_not_speculate(tmp_path):
    tok = train_tokenizer("char", ["abcdefgh ijk.\n"])
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2,
                            n_embd=16, tie_weights=False)
    cfg.sample.speculate = 5
    checkpoint.save_checkpoint(tmp_path / "run", weights(cfg.model), cfg.to_dict(), tok.to_json())
    for speculate, said in ((5, True), (0, False)):
        if not speculate:
            cfg.sample.speculate = 0
            checkpoint.save_checkpoint(tmp_path / "run", weights(cfg.model), cfg.to_dict(),
                                       tok.to_json())
        server = ServerProcess(tmp_path / "run", "--engine", "numpy")
        try:
            notes = [line for line in server.lines if "speculate" in line]
        finally:
            assert server.stop() == 0
        assert notes == ([f"sheepop: note: sample.speculate ({speculate}) is not used by the "
                          "server: its batch advances every request one token a step "
                          "(speculative decoding is for sheepop generate and chat; "
                          "docs/inference.md)\n"] if said else [])
