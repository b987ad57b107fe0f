"""Activation patching on SmolLM2-135M (issue 46): "The capital of France is" against "The capital
of Italy is", " Paris" against " Rome". The grid has a row per block asked and a column per
token, the last block's output at the last position scores exactly 1 (the clean run), a position
before the changed token scores exactly 0 (causal attention: its values are the same in both
passes), and the changed token's stream in block 0 carries most of the difference."""

import numpy as np
import pytest

from sheepop.inference.hooked_engines import hooked_engine
from sheepop.inference.load import load
from sheepop.inference.patching import contrast, patch_grid

pytestmark = [pytest.mark.real_model, pytest.mark.usefixtures("one_torch_thread")]


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_smollm2_patching_grid_shape_and_the_clean_run(smollm2_run, engine):
    model = load(smollm2_run, engine=engine, device="cpu")
    tok = model.tokenizer
    c = contrast(tok.encode("The capital of France is"), tok.encode("The capital of Italy is"),
                 tok.encode(" Paris")[0], tok.encode(" Rome")[0], model.config.model.vocab_size)
    assert len(c.clean) == 5 and c.clean[3] != c.corrupted[3]
    grid = patch_grid(hooked_engine(model), c, "positions", layers=[0, 29])
    assert grid.scores.shape == (2, 5)
    assert grid.scores[-1, -1] == 1.0
    assert np.array_equal(grid.scores[:, :3], np.zeros((2, 3)))
    assert grid.clean > 0 > grid.corrupted  # " Paris" wins on France, " Rome" on Italy
    assert grid.scores[0, 3] > 0.5
