"""One place builds a model for inference, in either engine (docs/architecture.md).

    load(run_dir, engine, device, dtype, compile)   a trained run directory
    build(config, weights, tokenizer, ...)          weights in memory (a task, a test, a server)

Both return an `InferenceModel`: the run's `Config`, its tokenizer, and `lm`, the engine's
`CachedLM` (sheepop.generation.cached_lm) that the generation loops (sheepop.generation.generate)
drive, one sequence or a batch, with the KV cache. The tokens a model must never generate (padding,
BOS, unknown) are set here from the tokenizer, so every caller, single, batched, streamed or through
the Python API, gets the same rule. The command line, the progression task and (later) the server
all come through here; the trainer is the only other module that builds an engine's model.

`inspect(model, ids)` looks inside it on one prompt: attention weights, logit lens, next-token
distributions, positions (sheepop.arch.inspection; the server's page shows them).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sheepop import threads
from sheepop.arch.inspection import Inspection, inspection
from sheepop.arch.lora import LoraConfig, adapter_shapes, merge
from sheepop.arch.vocab import grow_vocabulary
from sheepop.checkpoint import format as checkpoint
from sheepop.checkpoint.check import check_weights_file
from sheepop.config.model_size import param_count
from sheepop.config.schema import INFERENCE_DTYPES, Config, ModelConfig
from sheepop.errors import UserError
from sheepop.generation.cached_lm import CachedLM
from sheepop.inference.engine_choice import Choice, choose
from sheepop.tokenizers import Tokenizer
from sheepop.tokenizers import loads as load_tokenizer

Weights = dict[str, np.ndarray]
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/version", "/dev/kfd")


@dataclass
class InferenceModel:
    config: Config
    tokenizer: Tokenizer | None
    lm: CachedLM
    engine: str

    def loss_sum(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """(sum of the token losses, number of counted targets) on one batch of windows; a sum
        that is not finite (weights that overflow in the forward pass) is refused in one line."""
        with np.errstate(over="ignore", invalid="ignore"):  # refused below, in one line
            total, n = self.lm.loss_sum(x, y)
        if not math.isfinite(total):
            raise UserError(f"the model's loss on this text is not finite ({total}): its weights "
                            "overflow in the forward pass, so it cannot be evaluated")
        return total, n


def never_generated(tokenizer: Tokenizer | None) -> list[int]:
    """Special tokens a model should never emit: padding, BOS and unknown (EOS stays: it ends
    generation, even when it is also the padding: SmolLM2 pads with its <|im_end|>, and banning
    it left every chat answer unable to end). They never appear as training targets, but an
    undertrained model can still give them some probability."""
    if tokenizer is None:
        return []
    return [i for i in (tokenizer.pad_id, tokenizer.bos_id, tokenizer.unk_id)
            if i is not None and i != tokenizer.eos_id]


def read_run(run_dir: str | Path, _seen: tuple[Path, ...] = ()
             ) -> tuple[Config, Tokenizer, Weights]:
    """The config, tokenizer and weights of a run directory, checked against each other before
    anything big is allocated: the config's values and sizes (`Config.validate`, which refuses
    a model this machine cannot hold), the tokenizer's ids against the model's, then the weights
    file's header (names, shapes, dtypes) against the config before a tensor is read, and last
    every tensor finite (sheepop.checkpoint.check).

    A LoRA run (`sheepop finetune --lora-rank`: a lora.json, adapters only) gives its base
    run's weights, grown to its tokenizer, with every adapted weight merged: W + (alpha/r) B A.
    """
    from sheepop.scratch.init import param_shapes  # NumPy only: names and shapes, no model

    where = str(Path(run_dir) / checkpoint.CONFIG_FILE)
    cfg = Config.from_saved(checkpoint.load_config(run_dir), where)
    try:
        cfg.validate()
    except UserError as e:
        raise UserError(f"{where}: {e}") from None
    tokenizer = load_tokenizer(checkpoint.load_tokenizer_json(run_dir),
                               str(Path(run_dir) / checkpoint.TOKENIZER_FILE))
    if tokenizer.vocab_size != cfg.model.vocab_size:
        raise UserError(f"{run_dir}: tokenizer has {tokenizer.vocab_size} ids but the model "
                        f"{cfg.model.vocab_size}")
    lora = LoraConfig.load(run_dir)
    if lora is not None:
        return cfg, tokenizer, _adapted(Path(run_dir), cfg, tokenizer, lora, _seen)
    check_weights_file(checkpoint.current_path(run_dir, checkpoint.MODEL_FILE),
                       param_shapes(cfg.model))
    weights = checkpoint.load_weights(run_dir)
    return cfg, tokenizer, weights


def _adapted(run_dir: Path, cfg: Config, tokenizer: Tokenizer, lora: LoraConfig,
             seen: tuple[Path, ...]) -> Weights:
    """A LoRA run's merged weights, from its base run (which must still be where it was)."""
    base = Path(lora.base_run)
    if not (base / checkpoint.CONFIG_FILE).is_file():
        raise UserError(f"{run_dir} holds LoRA adapters for the run {base}, which is not there "
                        "any more: restore it, or give the path in lora.json")
    if base.resolve() in seen or base.resolve() == run_dir.resolve():
        raise UserError(f"{run_dir}: lora.json's base run leads back to itself")
    base_cfg, base_tokenizer, weights = read_run(base, (*seen, run_dir.resolve()))
    mine = {**vars(cfg.model), "vocab_size": 0}
    if {**vars(base_cfg.model), "vocab_size": 0} != mine:
        raise UserError(f"{run_dir}: its model settings differ from its base run {base}'s")
    weights = grown_for(weights, base_tokenizer, tokenizer)
    check_weights_file(checkpoint.current_path(run_dir, checkpoint.MODEL_FILE),
                       adapter_shapes(cfg.model, lora))
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below
        merged = merge(weights, checkpoint.load_weights(run_dir), lora)
    for name, w in merged.items():  # each adapter finite, their product need not be
        bad = w.size - int(np.isfinite(w).sum())
        if bad:
            raise UserError(f"{run_dir}: merging the LoRA adapters (alpha {lora.alpha:g}) "
                            f"makes {bad:,} values of {name} NaN or infinite: this run cannot run")
    return merged


def grown_for(weights: Weights, base_tokenizer: Tokenizer, tokenizer: Tokenizer) -> Weights:
    """The weights of a model trained with `base_tokenizer`, grown to `tokenizer`, which
    extends it with ids at the end (the chat tokens): each new row is the mean of the rows of
    the ids the base tokenizer spells its name with (sheepop.arch.vocab)."""
    for i in range(base_tokenizer.vocab_size):
        if tokenizer.id_to_token(i) != base_tokenizer.id_to_token(i):
            raise UserError(f"the tokenizer does not extend its base: id {i} is "
                            f"{tokenizer.id_to_token(i)!r}, not {base_tokenizer.id_to_token(i)!r}")
    names = [tokenizer.id_to_token(i)
             for i in range(base_tokenizer.vocab_size, tokenizer.vocab_size)]
    return grow_vocabulary(weights, [base_tokenizer.encode(name) for name in names])


def gpu_present() -> bool:
    """Whether this machine shows a GPU driver torch could use (NVIDIA's or ROCm's device files),
    found without importing torch (~2 s): without one, device `auto` is the CPU."""
    return any(Path(p).exists() for p in GPU_DEVICE_FILES)


def choose_engine(engine: str, device: str = "auto", dtype: str = "float32",
                  compile: bool = False, model: ModelConfig | None = None,
                  threads_used: int | None = None) -> str:
    """The engine `auto` stands for, by the measured rule of sheepop.inference.engine_choice
    (torch for a GPU or compile; NumPy for bfloat16, int8 or int4 on the CPU; on the CPU in
    float32 the engine that decoded faster at the model's size and the thread count); other
    names are kept."""
    return engine if engine != "auto" else auto_choice(device, dtype, compile, model,
                                                       threads_used).engine


def engine_refusal(engine: str, compile: bool = False) -> str | None:
    """Why `engine` cannot run `compile` (one line), or None: the NumPy engine compiles no
    graph (its kernels for narrow weights, sheepop.scratch.narrow, are compiled once a machine)."""
    if engine not in ("torch", "auto") and compile:
        return "--compile needs --engine torch"
    return None


def auto_choice(device: str = "auto", dtype: str = "float32", compile: bool = False,
                model: ModelConfig | None = None, threads_used: int | None = None) -> Choice:
    """What `auto` picks and why (`threads_used` None: the count sheepop.threads set)."""
    on_cpu = device == "cpu" or (device == "auto" and not gpu_present())
    params = None if model is None else param_count(model)
    return choose(params, on_cpu, dtype, compile,
                  threads.current() if threads_used is None else threads_used)


def torch_gpt(cfg: ModelConfig, weights: Weights):
    """The torch engine's GPT around `weights`' own memory: built on the meta device (no
    parameter allocated, none initialised), then each parameter the float32 array itself
    (torch.from_numpy, no copy), as the NumPy engine holds them. A copy beside the arrays made
    a quantized model hold three versions of its matrices at once while it was built (the
    arrays, the float32 model, the quantized layers): SmolLM2 in int4 peaked at 1.77 GB
    against 1.13 GB in float32."""
    import torch

    from sheepop.arch.params import check_shapes
    from sheepop.model import GPT
    with torch.device("meta"):
        model = GPT(cfg)
    expected = {name: p.shape for name, p in model.named_parameters()}
    check_shapes({name: np.shape(w) for name, w in weights.items()}, expected, "checkpoint")
    model.load_state_dict({name: torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
                           for name, w in weights.items()}, strict=True, assign=True)
    return model


def build(config: Config, weights: Weights, tokenizer: Tokenizer | None = None,
          engine: str = "torch", device: str = "auto", dtype: str = "float32",
          compile: bool = False, consume: bool = False) -> InferenceModel:
    """A model for inference from weights in memory. `dtype` (float32 | bfloat16 | int8 | int4:
    the linear layers' weights in int8 or 4-bit groups) on either engine (torch:
    sheepop.model.quantized*; NumPy: sheepop.scratch.narrow, computing in float32); `compile`
    for the torch engine; `auto`: the engine
    `choose_engine` picks. Both engines hold the float32 arrays of `weights` themselves (no
    copy). `consume`: the engine empties `weights` as its model takes them (`load`'s own dict),
    so that a float32 matrix that is quantized or cast is freed as soon as it is replaced: no
    narrower dtype then holds more than the float32 arrays at any moment."""
    if dtype not in INFERENCE_DTYPES:
        raise UserError(f"inference dtype must be one of {', '.join(INFERENCE_DTYPES)}, "
                        f"not '{dtype}'")
    refusal = engine_refusal(engine, compile)
    if refusal:
        raise UserError(refusal)
    never = never_generated(tokenizer)
    if engine == "auto":
        choice = auto_choice(device, dtype, compile, config.model)
        print(choice.line(), file=sys.stderr)  # the start-up line: what runs, and why
        engine = choice.engine
    if engine == "numpy":
        from sheepop.scratch.lm import NumpyLM
        if dtype != "float32":  # the matrices in fewer bytes, products by compiled kernels
            from sheepop.scratch.narrow import narrow_weights, warm_kernels
            weights = narrow_weights(weights, dtype, consume=consume)
            compiled = warm_kernels(weights)
            if compiled:  # the first start on this machine: what compiling cost
                print(compiled, file=sys.stderr)
        lm: CachedLM = NumpyLM(config.model, weights, never_generate=never)
        if lm.step is not None:  # its kernels too, before the first token
            from sheepop.scratch.decode_step import warm_step_kernels
            compiled = warm_step_kernels()
            if compiled:
                print(compiled, file=sys.stderr)
    elif engine == "torch":
        import torch

        from sheepop.model import TorchLM
        from sheepop.model.device import resolve_device
        threads.apply_to_torch()  # the inter-op pool, if torch loaded after --threads
        model = torch_gpt(config.model, weights)
        if consume:  # the model holds the only references: a weight replaced below is freed
            weights.clear()
        if dtype == "int8":  # weight-only int8: a unit that wraps the linear layers
            from sheepop.model.quantized import quantize_int8
            quantize_int8(model)
        if dtype == "int4":  # 4-bit groups (GGUF Q4_1's layout), the head in int8
            from sheepop.model.quantized_int4 import quantize_int4
            quantize_int4(model)
        if dtype == "bfloat16":  # F.linear, but a loop inductor fuses under --compile
            from sheepop.model.bf16_products import fuse_bf16_products
            fuse_bf16_products(model)
        lm = TorchLM(model.to(resolve_device(device)), never_generate=never)
        if dtype == "bfloat16":
            lm.cast(torch.bfloat16)
        if compile:
            print(compile_note(lm.compile()), file=sys.stderr)
    else:
        raise UserError(f"unknown engine '{engine}'")
    return InferenceModel(config, tokenizer, lm, engine)


def compile_note(seconds: float) -> str:
    """The start-up line of `--compile`: what compiling cost, and where it is kept."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    return (f"sheepop: compile: the decode step ready in {seconds:.1f} s (one block's graph "
            f"for every layer; inductor's cache {cache_dir()} keeps it for the next start of "
            "this model shape and dtype)")


def load(run_dir: str | Path, engine: str = "torch", device: str = "auto",
         dtype: str = "float32", compile: bool = False) -> InferenceModel:
    """A model for inference from a run directory made by `sheepop train` (or `import`)."""
    config, tokenizer, weights = read_run(run_dir)
    return build(config, weights, tokenizer, engine, device, dtype, compile, consume=True)


def inspect(model: InferenceModel, ids: Sequence[int], k: int = 5,
            lens: bool = True, logits_at: Sequence[int] = (),
            layers: Sequence[int] | None = None) -> Inspection:
    """The attention weights of `layers` (default: every layer), the logit lens (`lens`) and
    the next-token distributions (top `k`) of one prompt of at most block_size tokens,
    computed by the model's own engine (sheepop.arch.inspection); the final logits of the
    positions `logits_at`."""
    ids = list(ids)
    if not 1 <= len(ids) <= model.config.model.block_size:
        raise UserError(f"a prompt to inspect holds 1 to {model.config.model.block_size} "
                        f"tokens (the context), not {len(ids)}")
    if model.engine == "numpy":
        from sheepop.scratch.capture import trace
    else:
        from sheepop.model.capture import trace
    with np.errstate(over="ignore", invalid="ignore"):  # the caller tests the result (422)
        asked = set(range(model.config.model.n_layer) if layers is None else layers)
        return inspection(trace(model.lm, ids, asked), model.config.model, ids, k, lens,
                          tuple(logits_at))
