"""`sheepop train DATA --init-from RUN_DIR`: a new run from another run's model, tokenizer and
weights (sheepop.train.init_from). Its first evaluation is the source model's loss computed
through sheepop.inference.load, in both engines; step 0 and a fresh optimizer; the source untouched;
a LoRA run starts from its merged weights; the context lowered (a learned table cut) or raised
(rope only); an imported Hugging Face Llama keeps learning; the refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from sheepop.checkpoint import format as checkpoint
from sheepop.data.windows import eval_windows
from sheepop.errors import UserError
from sheepop.inference import load as inference
from sheepop.schedule import lr_for
from sheepop.train.init_from import init_config, open_source
from sheepop.train.start import setup

# The tiny source model reads TINY_TEXT's characters (tests/conftest.py); this text uses the
# same ones in another order, so nothing maps to <|unk|>.
NEW_TEXT = "the lazy dog jumps over the quick brown fox. the fox sleeps. " * 40
SETTINGS = ["train.batch_size=4", "train.eval_batches=3", "train.eval_interval=2",
            "train.log_interval=1", "train.checkpoint_interval=0", "train.warmup_steps=2",
            "train.lr=3e-3", "train.device=cpu", "train.dtype=float32"]


@pytest.fixture(autouse=True)
def torch_on_one_thread(one_torch_thread):
    """Tiny models: one torch thread (why: tests/conftest.py, `one_torch_thread`)."""


@pytest.fixture
def source(tmp_path, tiny_config, tiny_trainer) -> Path:
    """A 2-layer char model trained 12 steps (torch) on the tiny text."""
    run = tmp_path / "source"
    tiny_trainer(tiny_config("torch", dropout=0.0), run).run()
    return run


@pytest.fixture
def text_file(tmp_path) -> Path:
    path = tmp_path / "new.txt"
    path.write_text(NEW_TEXT)
    return path


def start(source, data, out, *settings, steps=4, engine="torch", log=None):
    """The trainer of a run started from `source` (the config built as the command line does)."""
    cfg = init_config(open_source(source, out), None, None, [*SETTINGS, *settings],
                      {"train.steps": steps, "train.engine": engine})
    return setup(str(data), cfg, out, init_from=source, progress=False,
                 log=(lambda *_: None) if log is None else log.append)


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def files_of(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file()}


def inference_loss(run_dir, engine: str, tokens: np.ndarray, block_size: int, n: int) -> float:
    """The mean loss of the run's model (sheepop.inference.load) on the evaluation windows of
    `tokens`: the windows any evaluation of those tokens uses."""
    model = inference.load(run_dir, engine=engine, device="cpu")
    pad = model.tokenizer.pad_id if model.tokenizer.pad_id is not None else 0
    x, y = eval_windows(tokens, block_size, n, pad)
    total, count = 0.0, 0
    for i in range(0, len(x), 4):
        s, c = model.loss_sum(x[i:i + 4], y[i:i + 4])
        total, count = total + s, count + c
    return total / count


# ----- the first evaluation is the source model's loss ---------------------------------------

@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_first_evaluation_is_the_source_models_loss(source, text_file, tmp_path, engine):
    lines: list[str] = []
    trainer = start(source, text_file, tmp_path / "new", engine=engine, log=lines)
    # DATA is encoded with the source's tokenizer: the text and an EOS, the last tenth held out.
    tokenizer = inference.read_run(source)[1]
    ids = np.asarray(tokenizer.encode(NEW_TEXT, add_eos=True))
    n_val = int(len(ids) * 0.1)
    np.testing.assert_array_equal(trainer.data.val, ids[len(ids) - n_val:])
    assert trainer.data.tokenizer.to_json() == tokenizer.to_json()
    expected = inference_loss(source, engine, ids[len(ids) - n_val:], 16, 3 * 4)
    first = metrics(tmp_path / "new")[0]
    assert first["step"] == 0 and "loss" not in first
    assert first["val_loss"] == pytest.approx(expected, rel=1e-6, abs=0)
    assert first["val_perplexity"] == pytest.approx(math.exp(expected), rel=1e-6)
    assert any(line.startswith(f"step 0/4  val loss {expected:.4f}") and str(source) in line
               for line in lines), lines
    trainer.run()
    rows = metrics(tmp_path / "new")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[-1]["val_loss"] < first["val_loss"]  # and it learns the new text


def test_the_two_engines_start_at_the_same_loss(source, text_file, tmp_path):
    start(source, text_file, tmp_path / "a", engine="torch")
    start(source, text_file, tmp_path / "b", engine="numpy")
    a, b = metrics(tmp_path / "a")[0], metrics(tmp_path / "b")[0]
    assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)


# ----- a new run: step 0, a fresh optimizer, the source untouched ---------------------------

@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_a_fresh_optimizer_from_step_zero_and_the_source_untouched(source, text_file, tmp_path,
                                                                   engine):
    before = files_of(source)
    assert json.loads((source / checkpoint.TRAINER_JSON).read_text())["adam_step"] == 12
    start(source, text_file, tmp_path / "new", "train.weight_decay=0", steps=1,
          engine=engine).run()
    state = json.loads((tmp_path / "new" / checkpoint.TRAINER_JSON).read_text())
    assert state["step"] == 1 and state["adam_step"] == 1
    rows = metrics(tmp_path / "new")
    cfg = init_config(open_source(source), None, None, SETTINGS, {"train.steps": 1})
    assert rows[1]["lr"] == pytest.approx(lr_for(0, cfg.train))  # the warmup's first step
    # After one step of a fresh AdamW, m = (1 - b1) g and v = (1 - b2) g^2 for every weight, so
    # |m| = (1 - b1) / sqrt(1 - b2) sqrt(v); the source's moments (12 steps) would break it.
    arrays, _ = checkpoint.load_trainer_state(tmp_path / "new")
    b1, b2 = cfg.train.beta1, cfg.train.beta2
    moments = [name for name in arrays if "tok_emb" in name]
    assert len(moments) == 2, sorted(arrays)
    m, v = (arrays[n] for n in sorted(moments, key=lambda n: "sq" in n))
    assert np.abs(m).max() > 0
    np.testing.assert_allclose(np.abs(m), (1 - b1) / math.sqrt(1 - b2) * np.sqrt(v),
                               rtol=1e-4, atol=1e-12)
    config = checkpoint.load_config(tmp_path / "new")
    assert config["init_from"] == {"path": str(source.resolve()), "step": 12}
    assert config["model"] == checkpoint.load_config(source)["model"]
    assert files_of(source) == before  # not a byte of the source changed


def test_resuming_keeps_the_record_of_where_the_run_started(source, text_file, tmp_path):
    start(source, text_file, tmp_path / "new", steps=2).run()
    cfg = checkpoint.load_config(tmp_path / "new")
    from sheepop.config.schema import Config
    resumed = Config.from_saved(cfg, "config.json")
    resumed.set("train.steps", 4)
    setup(str(text_file), resumed, tmp_path / "new", resume=True, progress=False,
          log=lambda *_: None).run()
    assert checkpoint.load_config(tmp_path / "new")["init_from"]["path"] == str(source.resolve())
    assert json.loads((tmp_path / "new" / checkpoint.TRAINER_JSON).read_text())["step"] == 4


# ----- sources: a LoRA fine-tune, a best/ folder ----------------------------------------------

def test_a_lora_run_starts_from_its_merged_weights(tmp_path, tiny_config, tiny_trainer):
    from sheepop.finetune.run import finetune
    cfg = tiny_config("torch", dropout=0.0)
    cfg.set("model.block_size", 32)  # room for a conversation in the chat template
    source = tmp_path / "source"
    tiny_trainer(cfg, source).run()
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"prompt": f"the {w}", "completion": w.upper()}) + "\n"
                             for w in ("fox", "dog", "lazy", "quick", "brown", "over")))
    finetune(str(source), str(chats), tmp_path / "lora",
             overrides=["lora.rank=4", "lora.alpha=8", "lora.targets=qkv,fc",
                        "train.batch_size=2", "train.eval_batches=1", "train.device=cpu",
                        "train.warmup_steps=1"], values={"train.steps": 4},
             log=lambda *_: None, progress=False)
    _, tokenizer, merged = inference.read_run(tmp_path / "lora")
    base = inference.grown_for(checkpoint.load_weights(source), inference.read_run(source)[1],
                               tokenizer)
    adapted = [n for n in merged if not np.array_equal(merged[n], base[n])]
    assert any(".attn." in n for n in adapted) and any(".ffn." in n for n in adapted), adapted
    text = tmp_path / "text.txt"
    text.write_text(NEW_TEXT)
    trainer = start(tmp_path / "lora", text, tmp_path / "new", steps=1)
    weights = trainer.engine.weights()
    assert sorted(weights) == sorted(merged)
    for name in merged:
        np.testing.assert_array_equal(weights[name], merged[name], err_msg=name)
    assert trainer.data.tokenizer.vocab_size == tokenizer.vocab_size  # with the chat tokens
    trainer.run()
    assert checkpoint.load_config(tmp_path / "new")["init_from"]["step"] == 4
    assert not (tmp_path / "new" / "lora.json").exists()  # a whole model now


def test_a_best_folder_is_a_source_with_its_step(source, text_file, tmp_path):
    best = json.loads((source / "best" / checkpoint.BEST_JSON).read_text())
    start(source / "best", text_file, tmp_path / "new", steps=1).run()
    assert checkpoint.load_config(tmp_path / "new")["init_from"] == {
        "path": str((source / "best").resolve()), "step": best["step"]}


# ----- the context: lowered, raised ---------------------------------------------------------

@pytest.fixture
def learned_source(tmp_path, tiny_config, tiny_trainer) -> Path:
    cfg = tiny_config("torch", dropout=0.0, steps=2)
    cfg.set("model.pos_encoding", "learned")
    cfg.set("model.block_size", 24)
    tiny_trainer(cfg, tmp_path / "learned").run()
    return tmp_path / "learned"


def test_a_lower_context_keeps_the_first_rows_of_a_learned_table(learned_source, text_file,
                                                                 tmp_path):
    table = checkpoint.load_weights(learned_source)["pos_emb.weight"]
    assert table.shape == (24, 16)
    trainer = start(learned_source, text_file, tmp_path / "new", "model.block_size=10", steps=1)
    np.testing.assert_array_equal(trainer.engine.weights()["pos_emb.weight"], table[:10])
    # The model reads only positions 0..9: its loss is the source's on 10-token windows.
    expected = inference_loss(learned_source, "torch", trainer.data.val, 10, 12)
    assert metrics(tmp_path / "new")[0]["val_loss"] == pytest.approx(expected, rel=1e-6)
    trainer.run()
    assert checkpoint.load_config(tmp_path / "new")["model"]["block_size"] == 10


def test_a_learned_table_is_never_raised(learned_source, text_file, tmp_path):
    with pytest.raises(UserError, match=r"model.block_size 32 is past the 24 rows of the run's "
                                        r"learned position table \(pos_emb.weight\)"):
        start(learned_source, text_file, tmp_path / "new", "model.block_size=32")
    assert not (tmp_path / "new" / checkpoint.MODEL_FILE).exists()


# ----- refusals ---------------------------------------------------------------------------

@pytest.mark.parametrize("setting, words", [
    ("model.n_layer=3", "the run has 2 layers, the config asks for 3 (model.n_layer)"),
    ("model.n_embd=32", "the run has width 16, the config asks for 32 (model.n_embd)"),
    ("model.pos_encoding=rope", "pos_encoding = 'sinusoidal', the config asks for 'rope' "
                                "(model.pos_encoding)"),
    ("data.tokenizer=bpe", "the run's tokenizer comes with its model (data.tokenizer is "
                           "'char', the config asks for 'bpe')"),
])
def test_settings_that_change_the_model_are_refused_by_name(source, setting, words):
    with pytest.raises(UserError, match="only model.dropout and model.block_size may be set"
                       if setting.startswith("model.") else "leave data.tokenizer unset") as e:
        init_config(open_source(source), None, None, [setting])
    assert words in str(e.value)


def test_dropout_and_a_lower_context_may_be_set(source):
    cfg = init_config(open_source(source), "tiny", None, ["model.dropout=0.2",
                                                          "model.block_size=8"])
    assert (cfg.model.dropout, cfg.model.block_size, cfg.model.n_layer) == (0.2, 8, 2)
    assert cfg.train.lr == 2e-3  # the preset's [train], not its [model]


def test_sources_that_are_not_runs_and_the_source_as_the_output(source, text_file, tmp_path):
    with pytest.raises(UserError, match="no such run directory"):
        open_source(tmp_path / "nowhere")
    with pytest.raises(UserError, match="not a run directory"):
        open_source(tmp_path)
    before = files_of(source)
    with pytest.raises(UserError, match="are the same directory"):
        start(source, text_file, source / ".." / source.name)
    with pytest.raises(UserError, match="--init-from starts a new run and --resume continues"):
        setup(str(text_file), open_source(source).config, tmp_path / "new", resume=True,
              init_from=source)
    assert files_of(source) == before and not (tmp_path / "new").exists()


def test_prepared_data_must_hold_the_sources_tokenizer(source, text_file, tmp_path):
    from sheepop.data.ingest import PrepareOptions, prepare
    prepare(PrepareOptions(inputs=[str(text_file)], out=str(tmp_path / "bpe"), tokenizer="bpe",
                           vocab_size=300, workers=1, progress=False))
    with pytest.raises(UserError, match=r"bpe\.?\S* was prepared with a bpe tokenizer, but the "
                                        r"model of .* reads char ids: prepare the text again"):
        start(source, tmp_path / "bpe", tmp_path / "a")
    other = tmp_path / "other.txt"
    other.write_text(NEW_TEXT + "a comma, a colon: more characters than the source's")
    prepare(PrepareOptions(inputs=[str(other)], out=str(tmp_path / "char"), tokenizer="char",
                           workers=1, progress=False))
    with pytest.raises(UserError, match=r"another char tokenizer \(\d+ ids\) than the model"):
        start(source, tmp_path / "char", tmp_path / "b")
    # Prepared with the run's own tokenizer.json, as the message says: accepted.
    prepare(PrepareOptions(inputs=[str(text_file)], out=str(tmp_path / "same"),
                           tokenizer=str(source / checkpoint.TOKENIZER_FILE), workers=1,
                           progress=False))
    trainer = start(source, tmp_path / "same", tmp_path / "c", steps=1)
    assert trainer.data.source["kind"] == "prepared"


def test_text_the_tokenizer_lacks_is_warned_about(source, tmp_path):
    text = tmp_path / "other.txt"
    text.write_text("THE LAZY DOG! " * 50)  # capitals and '!' are not in the tiny vocabulary
    lines: list[str] = []
    trainer = start(source, text, tmp_path / "new", steps=1, log=lines)
    unk = trainer.data.tokenizer.unk_id
    count = sum(int(np.count_nonzero(a == unk)) for a in (trainer.data.train, trainer.data.val))
    assert count == 50 * len("THELAZYDOG!")
    assert (f"warning: {count:,} characters of the data are not in the vocabulary, encoded as "
            "the unknown token (e.g. 'T' x50, 'H' x50, 'E' x50, 'L' x50, 'A' x50, ...)") in lines


# ----- the real model ------------------------------------------------------------------------

# A made-up paragraph (the model cannot know it), repeated: the validation windows hold the same
# text as the training ones, so "falling" means the model is learning this text.
STORY = ("In the village of Oberwald the shepherd Anneli counts her sheep every evening: "
         "Wolke, Flocke, Nebel and the black ram Kasimir, who always comes last. ")


@pytest.mark.real_model
def test_smollm2_keeps_training_on_a_small_text(smollm2_run, tmp_path, capsys):
    """3 steps of --init-from SmolLM2-135M (30 layers, width 576, 49,152 ids) on the CPU, 2
    windows of 32 tokens a step: the loss is finite and falls on the training text."""
    import time
    text = tmp_path / "story.txt"
    text.write_text(STORY * 24)
    source = open_source(smollm2_run, tmp_path / "new")
    assert source.config.model.n_layer == 30 and source.step is None
    cfg = init_config(source, None, None, [
        "model.block_size=32", "train.batch_size=2", "train.eval_batches=2",
        "train.eval_interval=3", "train.log_interval=1", "train.checkpoint_interval=0",
        "train.warmup_steps=1", "train.lr=1e-4", "train.min_lr=1e-4", "train.device=cpu",
        "train.dtype=float32", "data.val_fraction=0.2"], {"train.steps": 3})
    lines: list[str] = []
    clock = time.perf_counter()
    trainer = setup(str(text), cfg, tmp_path / "new", init_from=smollm2_run, progress=False,
                    log=lines.append)
    started = time.perf_counter() - clock
    clock = time.perf_counter()
    trainer.run()
    trained = time.perf_counter() - clock
    rows = metrics(tmp_path / "new")
    losses = [r["loss"] for r in rows if "loss" in r]
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    per_step = 2 * 32 / rows[-1]["tokens_per_sec"]
    with capsys.disabled():
        print(f"\nSmolLM2 --init-from, 3 steps of 2 x 32 tokens on the CPU: start-up "
              f"{started:.1f} s (import read, data, step-0 evaluation), {per_step:.2f} s a step, "
              f"{trained:.1f} s in all; train loss {losses[0]:.3f} -> {losses[-1]:.3f}, val loss "
              f"{vals[0]:.3f} -> {vals[-1]:.3f}")
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert len(vals) == 2 and vals[1] < vals[0] - 0.1, vals
    assert losses[-1] < losses[0], losses
    assert checkpoint.load_config(tmp_path / "new")["init_from"] == {
        "path": str(smollm2_run.resolve()), "step": None}
