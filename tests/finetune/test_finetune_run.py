"""`sheepop finetune` end to end on a tiny base run: full and LoRA, both engines; adapters-only
checkpoints rebuilt from the base run; the merged export; exact resume; bad data."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from variants import ALL_LORA_TARGETS, llama

from sheepop.arch.lora import LoraConfig, merge
from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.config.model_size import param_count
from sheepop.finetune.run import finetune
from sheepop.inference import load as inference
from sheepop.tokenizers.chat_format import CHAT_SPECIALS

CHATS = [{"messages": [{"role": "user", "content": f"what comes after {n}?"},
                       {"role": "assistant", "content": f"{n + 1}"}]} for n in range(30)]
CHATS += [{"prompt": f"upper {w}", "completion": w.upper()}
          for w in ("fox", "dog", "lazy", "quick", "brown", "over")]


@pytest.fixture
def base(tmp_path, tiny_config, tiny_trainer):
    """A 2-layer char model trained 12 steps on the tiny text, and a conversations file."""
    root = tmp_path / "finetune"
    cfg = tiny_config("torch", dropout=0.0)
    cfg.set("model.block_size", 32)
    tiny_trainer(cfg, root / "base").run()
    chats = root / "chats.jsonl"
    chats.write_text("".join(json.dumps(c) + "\n" for c in CHATS) + "not json\n")
    return root


SETTINGS = ["train.batch_size=4", "train.eval_batches=1", "train.eval_interval=3",
            "train.log_interval=1", "train.warmup_steps=1", "train.device=cpu",
            "train.dtype=float32"]


def lora_settings(rank: int, alpha: float, targets) -> list[str]:
    """The [lora] settings as --set strings, the way every caller gives them."""
    return [f"lora.rank={rank}", f"lora.alpha={alpha}", f"lora.targets={','.join(targets)}"]


def run_finetune(base, out, steps=6, engine="torch", lora=(), resume=False):
    """`lora`: the [lora] settings of a new run (a resumed one keeps its own)."""
    lines = []
    summary = finetune(str(base / "base"), str(base / "chats.jsonl"), out,
                       overrides=SETTINGS + ["train.decay_steps=6", *([] if resume else lora)],
                       values={"train.steps": steps, "train.engine": engine},
                       resume=resume, log=lines.append, progress=False)
    return summary, lines


def losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows]


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_lora_saves_only_adapters_and_loads_through_its_base(base, tmp_path, engine):
    summary, lines = run_finetune(base, tmp_path / "lora", engine=engine,
                                  lora=lora_settings(4, 8, ("qkv", "fc")))
    assert summary.steps == 6
    assert any(line.startswith("LoRA rank 4, alpha 8 on qkv, fc: ") for line in lines), lines
    assert any("skipped" in line and "line 37" in line for line in lines), lines
    saved = checkpoint.load_weights(tmp_path / "lora")
    # the adapters, and the rows of the 4 chat tokens (the tiny model's head is tied)
    assert saved and all(name.endswith((".lora_A", ".lora_B")) for name in saved
                         if name != "tok_emb.new_rows")
    assert saved["tok_emb.new_rows"].shape == (4, tiny_width(base))
    run_lora = LoraConfig.load(tmp_path / "lora")
    assert run_lora.base_run == str((base / "base").resolve()) and run_lora.new_tokens == 4

    # The adapted model, unmerged (the trainer's engine, adapters from the checkpoint), gives
    # the logits of the merged weights that every command loads.
    cfg, tokenizer, merged = inference.read_run(tmp_path / "lora")
    assert [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size - 4,
                                                    tokenizer.vocab_size)] == list(CHAT_SPECIALS)
    from sheepop.train.engine_torch import TorchEngine
    grown = inference.grown_for(checkpoint.load_weights(base / "base"),
                                inference.read_run(base / "base")[1], tokenizer)
    unmerged = TorchEngine(cfg.model, cfg.train, grown, lora=LoraConfig.load(tmp_path / "lora"),
                           adapters=saved)
    x = np.random.default_rng(0).integers(0, tokenizer.vocab_size, (2, 20))
    with torch.no_grad():
        want = unmerged.model(torch.from_numpy(x))[0].numpy()
    for kind in ("torch", "numpy"):
        got = np.stack([inference.build(cfg, merged, tokenizer, kind).lm.full(row) for row in x])
        np.testing.assert_allclose(got, want[:, -1], atol=2e-5)
    # Training moved the adapters and the new tokens' rows, not the base weights.
    assert np.abs(saved[next(n for n in saved if n.endswith("lora_B"))]).max() > 0
    assert np.abs(saved["tok_emb.new_rows"] - grown["tok_emb.weight"][-4:]).max() > 1e-4
    np.testing.assert_array_equal(merged["tok_emb.weight"][:-4], grown["tok_emb.weight"][:-4])


def tiny_width(base) -> int:
    return inference.read_run(base / "base")[0].model.n_embd


def test_lora_counts_the_model_as_chat_does_and_its_adapters_beside_it(base, tmp_path, capsys):
    """finetune said 'model: N parameters' with the adapters inside N, chat N without them."""
    assert main(["finetune", str(base / "base"), "--data", str(base / "chats.jsonl"), "--out",
                 str(tmp_path / "lora"), "--lora-rank", "2", "--steps", "1", "--no-progress",
                 *(a for s in SETTINGS for a in ("--set", s))]) == 0
    out, err = capsys.readouterr()
    model = inference.load(tmp_path / "lora", "numpy")
    chat_count = param_count(model.config.model)  # what chat's banner says
    assert f"model: {chat_count:,} parameters (" in out + err
    saved = sum(w.size for w in checkpoint.load_weights(tmp_path / "lora").values())
    assert f": {saved:,} adapter parameters (" in out + err  # what the run saved: adapters


def test_lora_can_keep_the_new_tokens_frozen(base, tmp_path, capsys):
    code = main(["finetune", str(base / "base"), "--data", str(base / "chats.jsonl"), "--out",
                 str(tmp_path / "frozen"), "--lora-rank", "2", "--lora-freeze-new-tokens",
                 "--steps", "2", "--no-progress", *(a for s in SETTINGS for a in ("--set", s))])
    assert code == 0, capsys.readouterr().err
    assert LoraConfig.load(tmp_path / "frozen").new_tokens == 0
    assert all(n.endswith((".lora_A", ".lora_B"))
               for n in checkpoint.load_weights(tmp_path / "frozen"))
    assert main(["finetune", str(base / "base"), "--data", str(base / "chats.jsonl"), "--out",
                 str(tmp_path / "bad"), "--lora-freeze-new-tokens"]) == 2
    assert "lora.alpha and lora.train_new_tokens need lora.rank" in capsys.readouterr().err


def test_merged_export_is_a_plain_run_with_the_same_logits(base, tmp_path, capsys):
    run_finetune(base, tmp_path / "lora", lora=lora_settings(2, 4, ("qkv", "proj", "down")))
    assert main(["export", str(tmp_path / "lora"), str(tmp_path / "plain"), "--merge-lora"]) == 0
    assert not (tmp_path / "plain" / "lora.json").exists()
    a, b = inference.load(tmp_path / "lora"), inference.load(tmp_path / "plain")
    ids = a.tokenizer.encode("what comes after 7?")
    np.testing.assert_allclose(a.lm.full(ids), b.lm.full(ids), atol=1e-6)
    capsys.readouterr()
    assert main(["export", str(tmp_path / "plain"), str(tmp_path / "again"), "--merge-lora"]) == 2
    assert "has no LoRA adapters" in capsys.readouterr().err


@pytest.mark.parametrize("lora", [(), lora_settings(4, 8, ("qkv",))], ids=["full", "lora"])
def test_an_interrupted_finetune_resumes_exactly(base, tmp_path, lora):
    run_finetune(base, tmp_path / "whole", steps=6, lora=lora)
    run_finetune(base, tmp_path / "parts", steps=3, lora=lora)  # the same schedule: 6 steps
    run_finetune(base, tmp_path / "parts", steps=6, lora=lora, resume=True)
    np.testing.assert_allclose(losses(tmp_path / "parts"), losses(tmp_path / "whole"),
                               rtol=1e-6)


def test_the_base_runs_time_limit_and_decay_length_do_not_carry_over(base, tmp_path):
    """A base pretrained with a time limit and a short decay: the fine-tune runs its own
    schedule (all its steps, the cosine over them), not the base's."""
    config_file = base / "base" / checkpoint.CONFIG_FILE
    config = json.loads(config_file.read_text())
    config["train"].update(max_minutes=1e-6, decay_steps=2)
    config_file.write_text(json.dumps(config))
    summary = finetune(str(base / "base"), str(base / "chats.jsonl"), tmp_path / "ft",
                       overrides=SETTINGS, values={"train.steps": 5}, log=lambda *_: None,
                       progress=False)
    assert summary.steps == 5
    train = checkpoint.load_config(tmp_path / "ft")["train"]
    assert (train["max_minutes"], train["decay_steps"]) == (0.0, 0)


def test_the_chat_tokens_grow_the_vocabulary_from_their_spelling(base):
    from sheepop.finetune.run import base_model
    cfg, tokenizer, weights, added = base_model(base / "base")
    _, base_tokenizer, base_weights = inference.read_run(base / "base")
    assert added == 4 and cfg.model.vocab_size == base_tokenizer.vocab_size + 4
    user = tokenizer.token_to_id("<|user|>")
    spelled = base_tokenizer.encode("<|user|>")
    np.testing.assert_allclose(weights["tok_emb.weight"][user],
                               base_weights["tok_emb.weight"][spelled].mean(0), rtol=1e-6)
    np.testing.assert_array_equal(weights["tok_emb.weight"][:base_tokenizer.vocab_size],
                                  base_weights["tok_emb.weight"])


def test_a_file_without_usable_conversations_is_refused(base, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "wizard", "content": "hi"}]}\nnot json\n')
    code = main(["finetune", str(base / "base"), "--data", str(bad), "--out",
                 str(tmp_path / "run"), "--steps", "2", "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no usable" in err.lower(), err
    assert not (tmp_path / "run" / checkpoint.MODEL_FILE).exists()


def test_lora_adapters_load_in_peft_onto_the_exported_base(tmp_path, capsys, tiny_config,
                                                            tiny_trainer):
    """A Llama-shaped base, LoRA on every target, exported with --adapters: transformers +
    peft compute the logits sheepop computes for the LoRA run."""
    import peft
    import transformers
    cfg = tiny_config("torch", dropout=0.0)
    for key, value in {"block_size": 32, **llama(n_kv_head=1)}.items():
        cfg.set(f"model.{key}", value)
    tiny_trainer(cfg, tmp_path / "base").run()
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    finetune(str(tmp_path / "base"), str(tmp_path / "chats.jsonl"), tmp_path / "lora",
             overrides=SETTINGS + lora_settings(4, 8, ALL_LORA_TARGETS),
             values={"train.steps": 4, "train.lr": 0.05}, log=lambda *_: None, progress=False)
    assert main(["export", str(tmp_path / "lora"), str(tmp_path / "hf"), "--to", "hf-llama",
                 "--adapters"]) == 0
    assert "and its PEFT adapter to" in capsys.readouterr().out
    ours = inference.load(tmp_path / "lora")
    ids = np.random.default_rng(1).integers(0, ours.tokenizer.vocab_size, (2, 12))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        base = hf(torch.from_numpy(ids)).logits.numpy()[:, -1]
        model = peft.PeftModel.from_pretrained(hf, tmp_path / "hf" / "adapter").eval()
        theirs = model(torch.from_numpy(ids)).logits.numpy()[:, -1]
    np.testing.assert_allclose(theirs, np.stack([ours.lm.full(row) for row in ids]), atol=1e-4)
    assert np.abs(theirs - base).max() > 1e-3  # the adapters were applied


def test_a_lora_runs_best_and_kept_checkpoints_load_through_its_base(base, tmp_path, capsys):
    # best/ and checkpoints/step-N/ hold adapters only, as the run does: each names the base
    # run in its own lora.json, so `--best` and a kept checkpoint load like the run itself.
    out = tmp_path / "lora"
    finetune(str(base / "base"), str(base / "chats.jsonl"), out,
             overrides=SETTINGS + lora_settings(2, 4, ("qkv",))
             + ["train.decay_steps=6", "train.keep_last=2", "train.checkpoint_interval=3"],
             values={"train.steps": 6}, log=lambda line: None, progress=False)
    kept = sorted((out / checkpoint.KEPT_DIR).glob("step-*"))
    assert [p.name for p in kept] == ["step-0000003", "step-0000006"]
    _, base_tokenizer, base_weights = inference.read_run(base / "base")
    for folder in (out / checkpoint.BEST_DIR, *kept):
        assert LoraConfig.load(folder) == LoraConfig.load(out)
        _, tokenizer, merged = inference.read_run(folder)
        want = merge(inference.grown_for(base_weights, base_tokenizer, tokenizer),
                     checkpoint.load_weights(folder), LoraConfig.load(out))
        assert merged.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(merged[name], want[name])
    np.testing.assert_array_equal(inference.read_run(kept[-1])[2]["blocks.0.attn.qkv.weight"],
                                  inference.read_run(out)[2]["blocks.0.attn.qkv.weight"])
    assert main(["generate", str(out), "--best", "--prompt", "what", "--max-new-tokens", "3",
                 "--temperature", "0"]) == 0
    assert "the best checkpoint of" in capsys.readouterr().err


@pytest.mark.parametrize("lora", [(), lora_settings(4, 8, ("qkv", "fc"))], ids=["full", "lora"])
def test_a_base_with_its_own_chat_template_trains_on_the_assistants_tokens(tmp_path, lora):
    """A base whose tokenizer ships SmolLM2's ChatML template: no sheepop chat token is added
    (the vocabulary, the weights' rows and the template stay), every example is rendered by
    that template, and the only targets that count are each answer, <|im_end|> and its line
    break; the fine-tune trains and the result chats through the same template."""
    from chatml import chatml_tokenizer

    from sheepop.arch import IGNORE_INDEX
    from sheepop.config.schema import Config, ModelConfig
    from sheepop.data.conversations import read_conversations
    from sheepop.tokenizers.chat_format import chat_ids, turn_end
    tok = chatml_tokenizer()
    cfg = Config()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=128, n_layer=1, n_head=2,
                            n_embd=32, dropout=0.0)
    rng = np.random.default_rng(0)
    from sheepop.scratch.init import param_shapes
    w = {k: (rng.normal(size=s) * 0.1).astype(np.float32) for k, s in
         param_shapes(cfg.model).items()}
    checkpoint.save_checkpoint(tmp_path / "base", w, cfg.to_dict(), tok.to_json())
    chats = [{"messages": [{"role": "user", "content": f"what comes after {n}?"},
                           {"role": "assistant", "content": f"{n + 1}"}]} for n in range(12)]
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))

    data = read_conversations(tmp_path / "chats.jsonl", tok, 128)
    E = tok.special_tokens["<|im_end|>"]
    for chat, (x, y) in zip(chats, data.examples):
        answer = chat["messages"][1]["content"]
        assert [int(v) for v in y if v != IGNORE_INDEX] == tok.encode(answer) + [E] + \
            tok.encode("\n")
        assert x.tolist() == chat_ids(tok, chat["messages"])[0][:-1]

    lines = []
    summary = finetune(str(tmp_path / "base"), str(tmp_path / "chats.jsonl"), tmp_path / "ft",
                       overrides=SETTINGS + ["train.decay_steps=4", *lora],
                       values={"train.steps": 4, "train.engine": "torch"},
                       log=lines.append, progress=False)
    assert summary.steps == 4
    assert any(line.endswith("conversations through the model's own chat template (360 ids)")
               for line in lines), lines
    model = inference.load(tmp_path / "ft", "numpy")
    assert model.tokenizer.to_json() == tok.to_json()
    assert model.config.model.vocab_size == tok.vocab_size
    assert turn_end(model.tokenizer).eos_id == E
    if lora:
        assert LoraConfig.load(tmp_path / "ft").new_tokens == 0
        assert "tok_emb.new_rows" not in checkpoint.load_weights(tmp_path / "ft")
    rows = [json.loads(line) for line in (tmp_path / "ft" / "metrics.jsonl").read_text()
            .splitlines()]
    assert all(np.isfinite(r["loss"]) for r in rows if "loss" in r)


def test_help_config_shows_what_a_finetune_of_the_base_would_use(base, capsys):
    """The base's config.json is a saved run (its format keys are not sections): read as a
    bare config, `--help-config BASE_RUN` stopped at its 'format' key."""
    from sheepop.cli import main
    assert main(["finetune", str(base / "base"), "--help-config", "--lora-rank", "4"]) == 0
    out = capsys.readouterr().out
    for line in ("model.block_size = 32", "lora.rank = 4"):
        assert f"\n  {line}" in out, line


def test_the_held_out_conversations_can_come_from_their_own_file(base, tmp_path):
    """finetune.val_data: the validation loss is that file's conversations', and every usable
    conversation of DATA trains (36 of them: the 'not json' line is skipped)."""
    held = base / "held.jsonl"
    held.write_text("".join(json.dumps({"prompt": f"upper {w}", "completion": w.upper()}) + "\n"
                            for w in ("jumps", "the")))
    lines = []
    finetune(str(base / "base"), str(base / "chats.jsonl"), tmp_path / "run",
             overrides=[*SETTINGS, f"finetune.val_data={held}"], values={"train.steps": 3},
             log=lines.append, progress=False)
    assert any("conversations: 36 train, 2 held out" in line for line in lines), lines
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
            .splitlines()]
    assert any("val_loss" in r for r in rows)
