"""`txl train --config FILE`: unknown sections and keys are refused, and
every problem with the file is an error naming --config and the path."""

import json
import re

import pytest

from keras_txl import TransformerXLConfig
from keras_txl.cli import main
from keras_txl.training.run import resolve_configs

MODEL = {"num_layers": 2, "hidden_dim": 16, "num_heads": 2, "head_dim": 8,
         "intermediate_dim": 32, "segment_length": 8, "memory_length": 8}


def write(tmp_path, data, name="config.json"):
    path = tmp_path / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


@pytest.mark.parametrize("data, message", [
    ({"model": MODEL, "trian": {"steps": 2}},
     r"unknown section\(s\) 'trian' \(did you mean 'train'\?\)\. "
     r"Valid: \['eval', 'model', 'train'\]"),
    ({"model": MODEL, "eval": {"memroy_length": 64}},
     r"unknown key\(s\) in \"eval\" 'memroy_length' \(did you mean 'memory_length'\?\)\. "
     r"Valid: \['batch_size', 'clamp_length', 'memory_length', 'same_length', "
     r"'segment_length'\]"),
    ({"model": MODEL, "train": {"stpes": 2}},
     r"unknown key\(s\) in \"train\" 'stpes' \(did you mean 'steps'\?\)\. Valid: \[.*'warmup_steps'"),
    ({"model": {**MODEL, "hiden_dim": 8}},
     r"unknown key\(s\) in \"model\" 'hiden_dim' \(did you mean 'hidden_dim'\?\)"),
    ({**MODEL, "num_layerz": 2},
     r"read as a model config: it has no \"model\" section\): unknown model config "
     r"key\(s\) 'num_layerz'"),
    ({"train": {"steps": 2}}, r"has the section\(s\) \['train'\] but no \"model\" section"),
    ({"model": MODEL, "train": [1]}, r"the \"train\" section must be a JSON object"),
    ({"model": MODEL, "eval": {"memory_length": "64"}},
     r"\"eval\" memory_length must be an integer >= 0\. Received: '64'"),
    ({"model": MODEL, "eval": {"batch_size": 0}}, r"\"eval\" batch_size must be an integer >= 1"),
    ({"model": MODEL, "eval": {"same_length": 1}}, r"\"eval\" same_length must be true or false"),
    ([1, 2], r"holds a JSON list; expected an object: a model config"),
    ("null", r"holds a JSON null; expected an object"),
    ('{"model": {"num_layers": 2,\n', r"is not valid JSON: Expecting property name enclosed "
     r"in double quotes at line 2 column 1\.$"),
    ("", r"is not valid JSON: Expecting value at line 1 column 1"),
    (b"\xff\xfe{}", r"is not UTF-8 text \(byte 0xff at offset 0\): expected a JSON file"),
])
def test_a_config_file_problem_names_the_file_and_the_key(tmp_path, data, message):
    path = write(tmp_path, data)
    with pytest.raises(ValueError, match=message) as info:
        resolve_configs(config_path=path)
    assert str(info.value).startswith(f"--config {path!r}")


def test_preset_and_config_together_are_refused(tmp_path):
    path = write(tmp_path, json.dumps({"model": {"num_layers": 2}}))
    with pytest.raises(ValueError, match=r"--preset 'tiny' and --config .* both give the whole "
                                         r"configuration: pass one"):
        resolve_configs("tiny", path)


def test_a_missing_file_or_a_folder_is_named(tmp_path):
    missing = str(tmp_path / "missing.json")
    with pytest.raises(ValueError, match=re.escape(f"--config {missing!r}: no such file.")):
        resolve_configs(config_path=missing)
    with pytest.raises(ValueError, match=re.escape(f"--config {str(tmp_path)!r} is a folder")):
        resolve_configs(config_path=str(tmp_path))


def test_the_documented_config_shapes_still_work(tmp_path):
    # Sections (docs/paper_claims.md), with a UTF-8 byte order mark.
    sections = {"model": {**MODEL, "vocabulary_size": 256},
                "train": {"batch_size": 16, "learning_rate": 0.001, "warmup_steps": 100,
                          "steps": 3000, "report_bpc": True},
                "eval": {"segment_length": 64, "memory_length": 64, "same_length": False,
                         "batch_size": 8}}
    path = write(tmp_path, b"\xef\xbb\xbf" + json.dumps(sections).encode(), "s.json")
    model, train, evaluation, _ = resolve_configs(
        config_path=path, overrides=["eval.clamp_length=10"])
    assert model == sections["model"]
    assert train.steps == 3000 and train.report_bpc is True
    assert evaluation == {**sections["eval"], "clamp_length": 10}
    # A plain model config, as a workdir's config.json.
    plain = TransformerXLConfig(vocabulary_size=40, **MODEL).to_dict()
    model, train, evaluation, _ = resolve_configs(config_path=write(tmp_path, plain, "p.json"))
    assert model == plain and evaluation == {} and train.steps == 1000
    # "model" alone, or with an empty "train".
    for data in ({"model": MODEL}, {"model": MODEL, "train": {}}):
        model, _, _, _ = resolve_configs(config_path=write(tmp_path, data, "m.json"))
        assert model["num_layers"] == 2


def test_txl_train_refuses_a_config_typo_before_training(tmp_path, capsys):
    path = write(tmp_path, {"model": MODEL, "trian": {"steps": 2}})
    workdir = tmp_path / "w"
    assert main(["train", "--data", str(tmp_path / "no-corpus"), "--workdir", str(workdir),
                 "--config", path]) == 2
    err = capsys.readouterr().err
    assert f"txl train: error: --config {path!r}: unknown section(s) 'trian'" in err
    assert "Traceback" not in err
    assert not (workdir / "checkpoints").exists()
    for bad in ([1], "{\n"):
        assert main(["train", "--workdir", str(workdir),
                     "--config", write(tmp_path, bad, "bad.json")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("txl train: error: --config ") and "Traceback" not in err


def test_jit_compile_is_true_false_or_auto_everywhere_it_is_set(tmp_path):
    import tensorflow as tf

    from keras_txl.cli import build_parser
    from keras_txl.training.config import TrainConfig
    from keras_txl.training.strategy import resolve_jit_compile

    assert TrainConfig().jit_compile == "auto"
    for value in (True, False, "auto"):
        assert TrainConfig(jit_compile=value).jit_compile == value
    for value in ("yes", 1, None):
        with pytest.raises(ValueError, match="`jit_compile` must be true, false or 'auto'"):
            TrainConfig(jit_compile=value)
    for text, expected in (("auto", "auto"), ("true", True), ("false", False)):
        _, train, _, _ = resolve_configs("tiny", None, [f"train.jit_compile={text}"], {})
        assert train.jit_compile == expected
    with pytest.raises(ValueError, match="--set jit_compile: expected true, false or auto"):
        resolve_configs("tiny", None, ["jit_compile=maybe"], {})
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"model": {}, "train": {"jit_compile": "sometimes"}}))
    with pytest.raises(ValueError, match="jit_compile"):
        resolve_configs(None, str(path), [], {})
    # The flags: --jit-compile, --no-jit-compile, or the config's (auto).
    parser = build_parser()
    base = ["train", "--workdir", str(tmp_path), "--preset", "tiny", "--data", "x"]
    assert parser.parse_args(base).jit_compile is None
    assert parser.parse_args(base + ["--jit-compile"]).jit_compile is True
    assert parser.parse_args(base + ["--no-jit-compile"]).jit_compile is False
    _, train, _, _ = resolve_configs("tiny", None, [], {"jit_compile": False})
    assert train.jit_compile is False
    # "auto" on this CPU host: graph mode (XLA made CPU training slower).
    cpu = tf.distribute.get_strategy()
    assert not tf.config.list_logical_devices("GPU")
    assert resolve_jit_compile("auto", cpu) is False
    assert resolve_jit_compile(True, cpu) is True and resolve_jit_compile(False, cpu) is False


def test_a_preset_config_json_is_read_as_its_model_config(tmp_path):
    # WORKDIR/model/config.json (keras-hub's backbone config) was refused as
    # "unknown model config keys class_name, config, ...".
    import keras_txl

    config = TransformerXLConfig(vocabulary_size=256, **MODEL)
    keras_txl.save_preset(keras_txl.TransformerXLCausalLM(config), str(tmp_path / "model"))
    model = resolve_configs(config_path=str(tmp_path / "model" / "config.json"))[0]
    assert TransformerXLConfig.from_dict(model) == config
    other = write(tmp_path, {"class_name": "GPT2Backbone", "config": {}}, "gpt2.json")
    with pytest.raises(ValueError, match=r"describes a 'GPT2Backbone', not a TransformerXLBackbone"):
        resolve_configs(config_path=other)


def test_the_fit_loop_refuses_what_it_would_ignore_before_anything_runs(
        tmp_path, capsys, monkeypatch):
    # `--loop fit` with --set eval_every=2 (eval_max_segments, on_non_finite,
    # report_bpc) trained without them in silence; with --strategy multi_worker
    # each task waited for its cluster (up to --cluster-timeout, 600 s), then
    # prepared the data and built the model before fit refused the strategy.
    from keras_txl.training.config import TrainConfig

    for changes, named in (({"eval_every": 2}, "eval_every=2"),
                           ({"eval_max_segments": 5}, "eval_max_segments=5"),
                           ({"on_non_finite": "skip"}, "on_non_finite='skip'"),
                           ({"report_bpc": True}, "report_bpc=True")):
        with pytest.raises(ValueError, match=re.escape(
                f"loop='fit' (--loop fit) does not read {named}: only the custom loop does")):
            TrainConfig(loop="fit", **changes)
        TrainConfig(loop="custom", **changes)
    with pytest.raises(ValueError, match=re.escape(
            "loop='fit' (--loop fit) does not run under strategy='multi_worker'")):
        TrainConfig(loop="fit", strategy="multi_worker")
    TrainConfig(loop="fit", strategy="mirrored")
    base = ["train", "--data", str(tmp_path), "--preset", "tiny", "--steps", "2",
            "--loop", "fit", "--workdir", str(tmp_path / "w")]
    assert main(base + ["--set", "eval_every=1", "--set", "eval_max_segments=3"]) == 2
    assert ("txl train: error: loop='fit' (--loop fit) does not read eval_every=1, "
            "eval_max_segments=3: only the custom loop does") in capsys.readouterr().err
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": 0}}))
    assert main(base + ["--strategy", "multi_worker", "--cluster-timeout", "30"]) == 2
    assert "does not run under strategy='multi_worker'" in capsys.readouterr().err
    assert not (tmp_path / "w" / "data").exists()


def test_eval_or_checkpoint_every_past_steps_is_warned(tmp_path, caplog):
    # --set eval_every=500 with --steps 100 was accepted in silence: no
    # evaluation before the final one, no checkpoint before the last step.
    import logging

    caplog.set_level(logging.WARNING, logger="keras_txl.training.run")
    path = write(tmp_path, {"model": MODEL, "train": {"steps": 50, "checkpoint_every": 80}})
    _, train, _, _ = resolve_configs(config_path=path, overrides=["eval_every=500"],
                                     flags={"steps": 100})
    assert train.eval_every == 500 and train.checkpoint_every == 80
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert "eval_every=500 is larger than steps=100" in warned[0]
    assert "checkpoint_every" not in warned[0]  # 80 <= 100
    caplog.clear()
    resolve_configs(config_path=path, overrides=["checkpoint_every=101"],
                    flags={"steps": 100})
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "checkpoint_every=101 is larger than steps=100" in warned[0]
    # Equal to steps, 0, or a preset's own value under a short --steps: no word.
    caplog.clear()
    resolve_configs(config_path=path, overrides=["eval_every=100", "checkpoint_every=0"],
                    flags={"steps": 100})
    resolve_configs(preset="tiny", flags={"steps": 3})
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []
