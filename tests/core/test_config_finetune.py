"""Fine-tuning's settings ([finetune], [lora]) are config keys like every other: a TOML file,
`--set lora.rank=8` and finetune's flags set the same fields, `train` refuses them, and the
adapters a fine-tune trains are built from them, once (sheepop.arch.lora.LoraConfig.for_run)."""

import pytest

from sheepop.arch.lora import LoraConfig
from sheepop.cli import build_parser, main
from sheepop.cli.common import flag_values
from sheepop.config.build import build_config
from sheepop.config.schema import Config
from sheepop.errors import UserError
from sheepop.finetune.run import NEW_SECTIONS, RESUME_SECTIONS


def finetune_args(*argv):
    return build_parser().parse_args(["finetune", "base", "--data", "c.jsonl", "--out", "o",
                                      *argv])


def test_flags_set_and_settings_read_the_same_keys(tmp_path):
    args = finetune_args("--lora-rank", "4", "--lora-targets", "qkv,fc",
                         "--lora-freeze-new-tokens", "--train-on", "all")
    assert flag_values(args) == {"lora.rank": 4, "lora.targets": "qkv,fc",
                                 "lora.train_new_tokens": False, "finetune.train_on": "all"}
    from_flags = build_config(values=flag_values(args), only=NEW_SECTIONS).validate()
    toml = tmp_path / "ft.toml"
    toml.write_text('[lora]\nrank = 4\ntargets = "qkv,fc"\ntrain_new_tokens = false\n'
                    '[finetune]\ntrain_on = "all"\n[model]\nn_layer = 9\n')
    from_file = build_config(config_file=toml, only=NEW_SECTIONS).validate()
    from_set = build_config(overrides=["lora.rank=4", "lora.targets=qkv,fc",
                                       "lora.train_new_tokens=no", "finetune.train_on=all"],
                            only=NEW_SECTIONS).validate()
    for cfg in (from_flags, from_file, from_set):
        assert (cfg.lora, cfg.finetune) == (from_flags.lora, from_flags.finetune)
        assert cfg.model.n_layer == Config().model.n_layer  # the model is the base run's
    # alpha 0 is 2r; the chat tokens' rows are frozen (new_tokens 0) as asked
    model = Config().model
    assert LoraConfig.for_run(from_file.lora, model, "/base", 4) \
        == LoraConfig(4, 8.0, ("qkv", "fc"), "/base", 0)
    assert LoraConfig.for_run(build_config(overrides=["lora.rank=2", "lora.alpha=3"],
                                           only=NEW_SECTIONS).lora, model, "/b", 4) \
        == LoraConfig(2, 3.0, ("qkv", "proj"), "/b", 4)
    assert LoraConfig.for_run(Config().lora, model, "/b", 4) is None  # rank 0: full fine-tuning


@pytest.mark.parametrize("settings, message", [
    (["lora.rank=-1"], "lora.rank must be >= 0"),
    (["lora.alpha=4"], "lora.alpha and lora.train_new_tokens need lora.rank"),
    (["lora.train_new_tokens=false"], "lora.alpha and lora.train_new_tokens need lora.rank"),
    (["lora.rank=2", "lora.targets=qkv,bogus"],
     "lora.targets must be a comma-separated list of qkv, proj, fc, down, not 'qkv,bogus'"),
    (["lora.rank=2", "lora.targets="], "lora.targets must be a comma-separated list"),
    (["finetune.train_on=user"], "finetune.train_on must be one of assistant, all, not 'user'"),
])
def test_impossible_settings_are_one_clear_error(settings, message):
    with pytest.raises(UserError, match=message):
        build_config(overrides=settings, only=NEW_SECTIONS).validate()


def test_only_finetune_reads_its_sections_and_a_run_does_not_save_them(tmp_path):
    with pytest.raises(UserError, match="--set lora.rank: only model, train, data, sample"):
        build_config(overrides=["lora.rank=8"])  # sheepop train
    toml = tmp_path / "t.toml"
    toml.write_text("[lora]\nrank = 8\n")
    with pytest.raises(UserError, match=r"\[lora\] is read by sheepop finetune only"):
        build_config(config_file=toml)
    with pytest.raises(UserError, match="command line lora.rank: only train, sample"):
        build_config(values={"lora.rank": 8}, only=RESUME_SECTIONS)  # a resumed fine-tune
    cfg = build_config(overrides=["lora.rank=8"], only=NEW_SECTIONS)
    assert set(cfg.to_dict()) == {"config_version", "model", "train", "data", "sample"}
    assert Config.from_saved(cfg.to_dict(), "config.json").lora.rank == 0


def test_help_config_shows_the_values_a_finetune_runs_with(capsys):
    assert main(["finetune", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert "[lora]" in out and "[finetune]" in out
    assert "  lora.rank = 0    # rank r of the adapters" in out
    assert "  finetune.train_on = 'assistant'    # which tokens the loss counts" in out
    # a fine-tune's own defaults, not the dataclasses' (train.steps 1000, lr 0.001)
    assert "  train.steps = 300    # optimizer steps (default 1000; set by finetune)" in out
    assert "  train.lr = 0.0005    # " in out
    assert main(["finetune", "--help-config", "--lora-rank", "8"]) == 0
    out = capsys.readouterr().out
    assert "  lora.rank = 8    # " in out and "  train.lr = 0.002    # " in out


def test_a_bad_setting_is_refused_before_the_base_run_is_read(tmp_path, capsys):
    """One line, exit status 2, whether the setting comes from a file, --set or a flag; the base
    run named does not exist, so reading it would have failed with another message."""
    toml = tmp_path / "ft.toml"
    toml.write_text('[lora]\nrank = 4\ntargets = "qkv,mlp"\n')
    base = ["finetune", str(tmp_path / "no-base"), "--data", str(tmp_path / "c.jsonl"),
            "--out", str(tmp_path / "out")]
    for extra, message in [
        (["--config", str(toml)], "lora.targets must be a comma-separated list of qkv, proj, "
                                  "fc, down, not 'qkv,mlp'"),
        (["--set", "lora.alpha=8"], "lora.alpha and lora.train_new_tokens need lora.rank"),
        (["--lora-freeze-new-tokens"], "lora.alpha and lora.train_new_tokens need lora.rank"),
        (["--lora-rank", "2", "--set", "model.n_layer=9"],
         "--set model.n_layer: only train, sample, finetune, lora settings can be set here"),
    ]:
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("sheepop: error: ") and message in err, err
        assert len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()
