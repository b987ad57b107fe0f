"""A narrower dtype never holds more memory than float32 (issue 41, section 4: SmolLM2 in int4
peaked at 1.77 GB against float32's 1.13 GB, because the float32 model was built beside the
checkpoint's arrays and the quantized layers beside both).

Each dtype is loaded in a fresh process (`sheepop.inference.load.load`, the torch engine), its
peak resident memory counted from just before the load (the kernel's VmHWM, reset through
/proc/self/clear_refs once torch and the dtype's kernels have run on a model of 0.1 MB), on a
model of W = 50 MB of float32 weights. The bound: int4, int8 and bfloat16 peak at most
float32's peak plus W / 16 (3 MB; between the dtypes after the fix, and between two runs of
one, the peaks differed by under 0.4 MB). Before the fix int4 peaked 34-40 MB (0.7-0.8 W) above
float32, the float32 model and every quantized layer held beside the checkpoint's arrays; int8
and bfloat16 2-3 MB above (here the reading of the file, 2 W, sets the peak, which their
building stayed under).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sheepop.checkpoint import format as checkpoint
from sheepop.config.schema import Config, ModelConfig
from sheepop.scratch.init import param_shapes
from sheepop.tokenizers import train_tokenizer

PEAK = """
import json, sys
import numpy as np
import torch
torch.set_num_threads(1)
from sheepop.config.schema import Config, ModelConfig
from sheepop.inference.load import build, load
from sheepop.scratch.init import param_shapes

def kib(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])

# The dtype's code first, on a model of 0.1 MB: its kernels' libraries are not the weights'
cfg = Config()
cfg.model = ModelConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=32)
small = build(cfg, {k: np.full(s, 0.01, np.float32) for k, s in param_shapes(cfg.model).items()},
              None, "torch", "cpu", sys.argv[2])
small.lm.prefill([1, 2, 3]), small.lm.decode(4)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS: the peak of what follows
before = kib("VmRSS")
model = load(sys.argv[1], "torch", "cpu", sys.argv[2])
print(json.dumps({"peak": (kib("VmHWM") - before) * 1024}))
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, int]:
    """A run whose linear layers take every dtype (widths multiples of 32), and its bytes."""
    tok = train_tokenizer("char", ["abcdefgh ijk.\n"])
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=4, n_head=8,
                            n_embd=512, tie_weights=False)
    rng = np.random.default_rng(0)
    w = {k: (rng.normal(size=s) * 0.02).astype(np.float32)
         for k, s in param_shapes(cfg.model).items()}
    path = tmp_path_factory.mktemp("memory") / "run"
    checkpoint.save_checkpoint(path, w, cfg.to_dict(), tok.to_json())
    return path, sum(v.nbytes for v in w.values())


def peak(run: Path, dtype: str) -> int:
    """Bytes of resident memory the load of `run` in `dtype` added at its peak."""
    done = subprocess.run([sys.executable, "-c", PEAK, str(run), dtype], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])["peak"]


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux /proc only")
def test_no_narrower_dtype_peaks_above_float32(run):
    path, nbytes = run
    assert nbytes > 48e6
    float32 = peak(path, "float32")
    for dtype in ("int4", "int8", "bfloat16"):
        assert peak(path, dtype) <= float32 + nbytes / 16, (dtype, float32, nbytes)
