"""The `txl` command's surface: help, quiet output, errors, export defaults,
what a prompt becomes, and the names in the result JSON."""

import argparse
import json
import os
import re
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from testing import REPO

import keras_txl
from keras_txl.cli import build_parser
from keras_txl.cli import main
from keras_txl.tokenizers import ByteTokenizer
from keras_txl.tokenizers import CharTokenizer
from keras_txl.tokenizers import Tokenizer
from keras_txl.tokenizers import WordTokenizer


def subcommands(parser=None):
    parser = parser or build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action


def tiny_config(**changes):
    values = dict(vocabulary_size=11, num_layers=2, hidden_dim=16, num_heads=2,
                  intermediate_dim=32, segment_length=32, memory_length=8)
    values.update(changes)
    return keras_txl.TransformerXLConfig(**values)


def quiet_env():
    """The environment of a user's shell: no TF_CPP_MIN_LOG_LEVEL (the tests' conftest sets it)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return {**env, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}


# --- help --------------------------------------------------------------------


def test_every_option_of_every_command_has_help_and_shows_its_default():
    for name, parser in subcommands().choices.items():
        text = " ".join(parser.format_help().split())
        assert parser.description, f"txl {name} --help has no description"
        for meaningless in ("None", "True", "False", "", "[]"):
            assert f"(default: {meaningless})" not in text, (name, meaningless)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"txl {name} {action.option_strings}: no help"
            default = action.default
            if action.nargs == 0 or default is None or default in ("", []):
                continue  # a switch, or nothing to show: the help says what happens without it
            shown = repr(default) if isinstance(default, str) and default != default.strip() else default
            line = " ".join(action.help.split()) + f" (default: {shown})"
            assert line in text, f"txl {name} {action.option_strings[0]}: {line!r} not in its help"


def test_top_level_help_lists_every_command():
    parser = build_parser()
    text = " ".join(parser.format_help().split())
    sub = subcommands(parser)
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert set(helps) == set(sub.choices) == {
        "prepare", "train", "eval", "export", "generate", "serve-client", "attention",
        "demo", "recl"}
    for name, help_text in helps.items():
        assert help_text and f"{name} {' '.join(help_text.split())}" in text, name
        assert name in parser.description


def test_tokenizer_default_and_word_level_bits_are_explained():
    train = subcommands().choices["train"]
    text = " ".join(train.format_help().split())
    assert "default: the corpus's own" in text
    assert "bits_per_word" in text


def test_help_of_every_command_loads_no_tensorflow():
    code = textwrap.dedent("""
        import sys, time
        from keras_txl.cli import build_parser, main
        start = time.perf_counter()
        for argv in [["--help"]] + [[c, "--help"] for c in build_parser()._subparsers._group_actions[0].choices]:
            try:
                main(argv)
            except SystemExit as e:
                assert e.code == 0, (argv, e.code)
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras"))
        print("HEAVY", heavy, "SECONDS", round(time.perf_counter() - start, 3))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=quiet_env())
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout, result.stdout[-2000:]
    assert "usage: txl export" in result.stdout and "usage: txl demo" in result.stdout


# --- tokenizers: unknown characters and the name of the bits --------------


def test_unknown_characters_and_bits_metric_of_each_tokenizer():
    char = CharTokenizer.fit(["abc abc\n"])
    assert char.unknown_characters("abéXa😀é") == ["é", "X", "😀"]
    assert char.unknown_characters("cab \n") == []
    assert char.bits_metric == "bpc"
    byte = ByteTokenizer()
    assert byte.unknown_characters("é😀") == []  # UTF-8: every byte reaches the model
    assert byte.unknown_characters("a\udce9b\udce9") == ["\udce9"]  # a Latin-1 byte, not UTF-8
    assert byte.bits_metric == "bpc"
    assert WordTokenizer.fit("a b\n").bits_metric == "bits_per_word"
    assert WordTokenizer.fit("1 2\n", add_eos=False).bits_metric == "bpc"  # symbol files
    assert Tokenizer().bits_metric == "bits_per_token"
    with pytest.raises(ValueError, match="`text` must be a str"):
        char.unknown_characters(b"abc")


@pytest.fixture(scope="module")
def char_workdir(tmp_path_factory):
    """A training-run folder with a char tokenizer that knows a, b, c, space."""
    from testing import write_char_run

    return write_char_run(tmp_path_factory.mktemp("char_run"))[0]


def test_generate_warns_once_and_prints_what_the_model_received(char_workdir, capsys, caplog):
    argv = ["generate", "--workdir", str(char_workdir), "--prompt", "abé c😀é",
            "--max-new-tokens", "3", "--temperature", "0"]
    with caplog.at_level("WARNING"):
        assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("ab<unk> c<unk><unk>"), out
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert "2 character(s) the char tokenizer does not know: 'é' '😀'" in warnings[0]
    assert "receives <unk> for each" in warnings[0]
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert main(argv[:4] + ["cab", "--max-new-tokens", "2"]) == 0
    assert capsys.readouterr().out.startswith("cab")
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


# --- txl export: the README's command ----------------------------------------


# The README's export command after `--workdir runs/ts` (tests/test_docs.py checks it is).
README_EXPORT = ["--format", "all", "--out", "exported", "--batch-size", "1", "--segment-length", "32"]


@pytest.fixture(scope="module")
def readme_export(tmp_path_factory):
    """The README's `txl export`, run as a user would: its own process, no
    TF_CPP_MIN_LOG_LEVEL, in a folder holding the training run."""
    keras.utils.set_random_seed(0)
    tmp = tmp_path_factory.mktemp("readme_export")
    model = keras_txl.TransformerXLCausalLM(tiny_config())
    keras_txl.save_pretrained(model, str(tmp / "run" / "model"))
    result = subprocess.run(
        [sys.executable, "-m", "keras_txl", "export", "--workdir", "run", *README_EXPORT],
        capture_output=True, text=True, timeout=600, env=quiet_env(), cwd=tmp)
    return model, tmp / "exported", result


def test_export_is_quiet_and_prints_the_paths_written(readme_export):
    _, out, result = readme_export
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [os.path.join("exported", "txl", "1"),
                                          os.path.join("exported", "txl.tflite")]
    # No TensorFlow start-up lines, converter lines or library log lines.
    assert result.stderr == "", result.stderr[-3000:]


def test_default_saved_model_takes_any_batch_and_segment_length(readme_export):
    model, out, result = readme_export
    assert result.returncode == 0, result.stderr[-3000:]
    serve = tf.saved_model.load(str(out / "txl" / "1")).signatures["serving_default"]
    rng = np.random.default_rng(0)
    for batch in (1, 3):
        ids = rng.integers(0, 11, (batch, 32 + 17)).astype(np.int32)
        memory = np.zeros((batch, 2, 8, 16), np.float32)
        reference_memory = None
        for segment in (ids[:, :32], ids[:, 32:]):  # 32, then a shorter last segment of 17
            got = serve(token_ids=tf.constant(segment), memory=tf.constant(memory))
            reference = model.call_with_memory(segment, reference_memory)
            assert got["log_probs"].shape == (batch, segment.shape[1], 11)
            np.testing.assert_allclose(got["log_probs"], reference["log_probs"], atol=1e-5)
            np.testing.assert_allclose(got["memory"], reference["memory"], atol=1e-5)
            memory, reference_memory = got["memory"].numpy(), reference["memory"]
    info = json.loads((out / "txl" / "1" / "assets.extra" / "export.json").read_text())
    assert info["batch_size"] is None and info["segment_length"] is None
    tflite = json.loads((out / "txl.json").read_text())  # the TFLite model is fixed
    assert tflite["batch_size"] == 1 and tflite["segment_length"] == 32


def test_export_verbose_shows_tensorflow_logs(readme_export, tmp_path):
    _, _, _ = readme_export
    run = readme_export[1].parent / "run"
    result = subprocess.run(
        [sys.executable, "-m", "keras_txl", "-v", "export", "--workdir", str(run),
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, env=quiet_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "INFO tensorflow: Assets written to" in result.stderr  # TensorFlow's own log
    assert "DEBUG keras_txl.export.saved_model: SavedModel written to" in result.stderr
    assert "DEBUG h5py" not in result.stderr  # -v is not every library's DEBUG


@pytest.mark.parametrize("argv, message", [
    (["--workdir", "{missing}", "--out", "{tmp}"], "No model in {missing}/model/"),
    (["--workdir", "{missing}", "--out", "{tmp}", "--batch-size", "1"],
     "--batch-size fixes the TFLite model's shapes, and --format saved_model writes none"),
    (["--workdir", "{missing}", "--out", "{tmp}", "--format", "tflite",
      "--saved-model-segment-length", "8"], "--saved-model-segment-length applies to the SavedModel"),
    (["--workdir", "{missing}", "--out", "{tmp}", "--format", "all", "--segment-length", "0"],
     "--segment-length must be positive, received 0."),
])
def test_export_errors_read_like_the_other_commands(tmp_path, capsys, argv, message):
    names = {"missing": str(tmp_path / "missing"), "tmp": str(tmp_path / "out")}
    argv = [a.format(**names) for a in argv]
    assert main(["export", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("txl export: error: "), err
    assert message.format(**names) in err
    assert not (tmp_path / "out").exists()


def test_os_errors_and_an_early_ctrl_c_read_like_the_other_commands(tmp_path, capsys,
                                                                     monkeypatch):
    # A folder where a file belongs (or no permission, no space) surfaced as a
    # traceback; so did Ctrl-C while TensorFlow was still loading.
    import keras_txl
    from keras_txl import cli

    def folder_for_a_file(args):
        raise IsADirectoryError(21, "Is a directory", str(tmp_path))

    monkeypatch.setattr(cli, "_eval", folder_for_a_file)
    assert main(["eval", "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("txl eval: error: [Errno 21] Is a directory: "), err

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(keras_txl, "require_tensorflow", interrupted)
    assert main(["eval", "--workdir", str(tmp_path)]) == 130
    assert capsys.readouterr().err == "txl eval: interrupted.\n"


# --- the result JSON ---------------------------------------------------------


def test_word_level_run_reports_bits_per_word_and_settings(tmp_path, capsys, caplog):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(0)
    words = "the cat sat on a mat and then it ran off".split()
    for split, lines in (("train", 300), ("valid", 40), ("test", 40)):
        (corpus / f"{split}.txt").write_text(
            "\n".join(" ".join(rng.choice(words, 8)) for _ in range(lines)) + "\n")
    workdir = tmp_path / "run"
    assert main(["train", "--data", str(corpus), "--workdir", str(workdir), "--preset", "tiny",
                 "--steps", "2", "--batch-size", "2", "--segment-length", "8",
                 "--memory-length", "8", "--set", "warmup_steps=1"]) == 0
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert json.loads((workdir / "tokenizer" / "tokenizer.json").read_text())["kind"] == "word"
    assert "bpc" not in trained and "eval_settings" not in trained
    assert trained["bits_per_word"] == pytest.approx(trained["loss"] / np.log(2))
    assert trained["settings"]["memory_length"] == 96  # the tiny preset's evaluation memory
    # The training log rows name their bits the same way.
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert rows and all("bits_per_word" in r and "bpc" not in r for r in rows)
    assert main(["eval", "--workdir", str(workdir), "--split", "valid"]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sorted(evaluated) == sorted(["split", "loss", "ppl", "bits_per_word", "tokens",
                                        "settings"])
    # A text the tokenizer does not know: every word is <unk>, and so said.
    other = tmp_path / "other"
    other.mkdir()
    for split in ("train", "valid", "test"):
        (other / f"{split}.txt").write_text("zebras graze quietly near rivers\n" * 20)
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert main(["eval", "--workdir", str(workdir), "--data", str(other),
                     "--split", "valid"]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "unknown_tokens" not in evaluated
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith("83.2% of the 119 scored tokens of "
                                                         f"--data {other} are <unk>"), warnings
    caplog.clear()
    # An unknown word reaches the model as <unk>: printed so, and said once.
    with caplog.at_level("WARNING"):
        assert main(["generate", "--workdir", str(workdir), "--prompt", "the zebra  sat",
                     "--max-new-tokens", "2", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("the <unk> sat")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["the word tokenizer does not keep the prompt exactly; the model "
                        "receives 'the <unk> sat'."]


def test_generate_no_cache_is_the_same_greedily_and_seeded_runs_repeat(char_workdir,
                                                                      capsys):
    # The help said --no-cache gives the "same output": true greedily only; a
    # seeded sample comes from another loop (the host loop, not model.generate).
    argv = ["generate", "--workdir", str(char_workdir), "--prompt", "ab c",
            "--max-new-tokens", "12"]
    outputs = []
    for flags in ([], ["--no-cache"]):
        assert main([*argv, *flags, "--temperature", "0"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    sampled = []
    for _ in range(2):
        assert main([*argv, "--no-cache", "--seed", "5"]) == 0
        sampled.append(capsys.readouterr().out)
    assert sampled[0] == sampled[1]
    from keras_txl.cli import build_parser

    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    assert "Greedy output is the same" in generate.format_help()


def test_demo_says_its_validation_runs_once_with_the_evaluation_settings(tmp_path, capsys, caplog,
                                                                         monkeypatch):
    # `txl demo` announced "validation twice: the 'eval step' log line with the
    # training settings (memory 32), the JSON line with the preset's evaluation
    # settings (memory 96)", but training runs one final validation, with the
    # evaluation settings: the log line and the JSON line are the same result.
    import keras_txl.export.saved_model as saved_model
    import keras_txl.export.tflite as tflite
    import keras_txl.generation as generation

    # Export and sampling are not what this test is about (and take tens of seconds).
    monkeypatch.setattr(saved_model, "export_saved_model", lambda *a, **k: "skipped")
    monkeypatch.setattr(tflite, "export_tflite", lambda *a, **k: "skipped")
    monkeypatch.setattr(generation, "generate_text", lambda model_dir, prompt, **k: prompt)
    with caplog.at_level("INFO"):  # the root's: `txl` sets keras_txl's to NOTSET
        assert main(["demo", "--workdir", str(tmp_path / "demo"), "--max-chars", "20000",
                     "--steps", "2", "--max-new-tokens", "1"]) == 0
    out = capsys.readouterr().out
    announced = next(line for line in out.splitlines() if line.startswith("[demo] training"))
    assert "twice" not in announced and "training settings" not in announced, announced
    assert "memory 96" in announced and "same_length True" in announced, announced
    valid = json.loads(next(line for line in out.splitlines() if '"split": "valid"' in line))
    assert valid["settings"]["memory_length"] == 96 and valid["settings"]["same_length"] is True
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("eval step")]
    assert len(logged) == 1, logged
    assert f"loss {valid['loss']:.4f}" in logged[0], (logged, valid)


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["eval"],
                                     ["export", "--out", "{tmp}/out"]])
def test_a_model_folder_given_as_workdir_names_the_workdir_to_pass(tmp_path, capsys, command):
    # `txl generate --workdir runs/demo/model` said "No model in
    # runs/demo/model/model/ and no checkpoint in ...: train first": the
    # folder is the model, and the flag wants the run that holds it.
    keras_txl.save_preset(keras_txl.TransformerXLCausalLM(tiny_config(vocabulary_size=256)),
                          str(tmp_path / "run" / "model"), tokenizer=ByteTokenizer())
    (tmp_path / "run" / "checkpoints").mkdir()
    model_dir = str(tmp_path / "run" / "model")
    argv = [a.format(tmp=tmp_path) for a in command]
    assert main([argv[0], "--workdir", model_dir, *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert (f"--workdir {model_dir!r} is a model folder, not a training workdir: pass the "
            f"workdir that holds it, --workdir {str(tmp_path / 'run')!r}") in err, err
    assert "train first" not in err
    # A preset folder of its own (save_to_preset's): the flag that reads it named.
    keras_txl.save_preset(keras_txl.TransformerXLCausalLM(tiny_config(vocabulary_size=256)),
                          str(tmp_path / "my_preset"), tokenizer=ByteTokenizer())
    assert main([argv[0], "--workdir", str(tmp_path / "my_preset"), *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert "is a model folder, not a training workdir" in err, err
    assert f"pass this folder as --from-preset {str(tmp_path / 'my_preset')!r}" in err, err


def test_a_file_that_is_no_tflite_model_is_named(tmp_path, capsys):
    # `txl generate --tflite config.json` said only "The model is not a valid
    # Flatbuffer buffer" (LiteRT's words), naming neither the flag nor the file;
    # TFLiteRunner(path) the same.
    from keras_txl.export.tflite import TFLiteRunner

    path = tmp_path / "config.json"
    path.write_text('{"not": "a model"}')
    assert main(["generate", "--tflite", str(path), "--prompt-ids", "1,2"]) == 2
    err = capsys.readouterr().err
    assert f"txl generate: error: --tflite {str(path)!r} is not a TFLite model" in err, err
    with pytest.raises(ValueError, match=f"`model_path` {re.escape(repr(str(path)))} is not a "
                                         "TFLite model"):
        TFLiteRunner(str(path))
    with pytest.raises(ValueError, match="`model_content` is not a TFLite model"):
        TFLiteRunner(model_content=b"not a flatbuffer at all")


def test_the_demo_exports_its_tflite_model_with_the_tokenizer(tmp_path, capsys, monkeypatch):
    # The demo passed its tokenizer to the SavedModel export only: its
    # WORKDIR/export/txl.tflite had no tokenizer/ beside it, so `txl generate
    # --tflite runs/demo/export/txl.tflite --prompt ...` said "this model has
    # no tokenizer".
    import keras_txl.export.saved_model as saved_model
    import keras_txl.export.tflite as tflite
    import keras_txl.generation as generation

    calls = {}
    monkeypatch.setattr(saved_model, "export_saved_model",
                        lambda *a, **k: calls.setdefault("saved_model", k) and "skipped")
    monkeypatch.setattr(tflite, "export_tflite",
                        lambda *a, **k: calls.setdefault("tflite", k) and "skipped")
    monkeypatch.setattr(generation, "generate_text", lambda model_dir, prompt, **k: prompt)
    workdir = tmp_path / "demo"
    assert main(["demo", "--workdir", str(workdir), "--max-chars", "20000", "--steps", "1",
                 "--max-new-tokens", "1"]) == 0
    expected = keras_txl.io.tokenizer_directory(str(workdir / "model"))
    assert expected is not None
    assert calls["saved_model"]["tokenizer_dir"] == expected
    assert calls["tflite"].get("tokenizer_dir") == expected, calls["tflite"]


def test_serve_client_says_no_answer_came_when_the_server_is_unreachable(capsys):
    # With no server listening, `txl serve-client generate --rest URL` said
    # "the server answered: Cannot reach ...": no server had answered, and
    # the flag to correct was not named.
    import socket

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    assert main(["serve-client", "generate", "--rest", url, "--prompt", "hi",
                 "--timeout", "5"]) == 2
    err = capsys.readouterr().err
    assert f"txl serve-client: error: --rest {url!r}: Cannot reach {url}/v1/models/txl" in err, err
    assert "answered" not in err, err


@pytest.mark.parametrize("argv, expected", [
    (["train", "--data", "c", "--workdir", "w", "--stpes", "3"],
     "txl train: error: unrecognized argument --stpes (did you mean --steps?)"),
    # The misspelt flag hid behind "one of the arguments --prompt --prompt-ids is required".
    (["generate", "--workdir", "w", "--promt", "hi"],
     "txl generate: error: unrecognized argument --promt (did you mean --prompt?)"),
    (["eval", "--workdir", "w", "--memory_length=96"],
     "txl eval: error: unrecognized argument --memory_length (did you mean --memory-length?)"),
    (["serve-client", "generate", "--rest", "u", "--prompt", "a", "--max-tokens", "5"],
     "txl serve-client: error: unrecognized argument --max-tokens (did you mean "
     "--max-new-tokens?)"),
])
def test_a_misspelt_flag_is_named_with_the_flag_meant(capsys, argv, expected):
    # Was `txl: error: unrecognized arguments: --stpes 3` under the top-level
    # usage (which lists no flag of train), or a different error altogether.
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert expected in err, err


def test_flags_argparse_accepts_are_not_taken_for_typos(tmp_path, capsys):
    # Abbreviations argparse resolves, values after `--`, and `--flag=value`.
    args = build_parser().parse_args(["train", "--data", "c", "--workdir", "w", "--step", "3"])
    assert args.steps == 3
    from keras_txl.cli import _check_flags

    _check_flags(build_parser(), ["train", "--data", "c", "--workdir", "w", "--step", "3"])
    _check_flags(build_parser(), ["-v", "eval", "--workdir=w", "--memory-length=9"])
    _check_flags(build_parser(), ["generate", "--workdir", "w", "--prompt", "x", "--", "--odd"])


# --- --from-preset: a saved preset folder as the source ----------------------


@pytest.fixture(scope="module")
def saved_preset(tmp_path_factory):
    """A tiny byte-level model saved with keras-hub's `save_to_preset`, the
    same model as a training run's WORKDIR/model, and a text to score."""
    from keras_txl.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor

    keras.utils.set_random_seed(0)
    tmp = tmp_path_factory.mktemp("saved_preset")
    model = keras_txl.TransformerXLCausalLM(
        tiny_config(vocabulary_size=256, segment_length=16),
        preprocessor=TransformerXLCausalLMPreprocessor(ByteTokenizer(), sequence_length=16))
    model.save_to_preset(str(tmp / "preset"))
    keras_txl.save_preset(model, str(tmp / "run" / "model"))
    (tmp / "text.txt").write_text("the cat sat on the mat. " * 12)
    return model, tmp


def test_eval_and_generate_read_a_saved_preset_folder(saved_preset, capsys):
    # `txl eval/generate/export` took no saved preset (save_to_preset, a
    # downloaded one): --workdir wanted a training run. --from-preset reads
    # it, with its own tokenizer, and gives what the same model gives.
    _, tmp = saved_preset
    results = {}
    for flag, source in (("--from-preset", tmp / "preset"), ("--workdir", tmp / "run")):
        assert main(["eval", flag, str(source), "--data", str(tmp / "text.txt"),
                     "--split", "train", "--memory-length", "12"]) == 0
        results[flag] = json.loads(capsys.readouterr().out)
    preset, workdir = results["--from-preset"], results["--workdir"]
    assert preset["tokens"] == workdir["tokens"] > 200
    assert preset["loss"] == pytest.approx(workdir["loss"], abs=1e-6)
    assert preset["bpc"] == pytest.approx(workdir["bpc"], abs=1e-6)
    assert preset["settings"]["memory_length"] == 12
    outputs = {}
    for flag, source in (("--from-preset", tmp / "preset"), ("--workdir", tmp / "run")):
        assert main(["generate", flag, str(source), "--prompt", "the cat",
                     "--max-new-tokens", "12", "--temperature", "0"]) == 0
        outputs[flag] = capsys.readouterr().out
    assert outputs["--from-preset"] == outputs["--workdir"]
    assert outputs["--from-preset"].startswith("the cat")
    assert len(outputs["--from-preset"].rstrip("\n")) >= len("the cat")


def test_export_reads_a_saved_preset_folder_with_its_tokenizer(saved_preset, tmp_path, capsys):
    model, tmp = saved_preset
    out = tmp_path / "exports"
    assert main(["export", "--from-preset", str(tmp / "preset"), "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [str(out / "txl" / "1")]
    serve = tf.saved_model.load(str(out / "txl" / "1")).signatures["serving_default"]
    ids = np.random.default_rng(0).integers(0, 256, (2, 16)).astype(np.int32)
    got = serve(token_ids=tf.constant(ids), memory=tf.zeros((2, 2, 8, 16)))
    reference = keras_txl.TransformerXLCausalLM.from_preset(
        str(tmp / "preset")).call_with_memory(ids, None)
    np.testing.assert_allclose(got["log_probs"], reference["log_probs"], atol=1e-5)
    np.testing.assert_allclose(got["log_probs"], model.call_with_memory(ids, None)["log_probs"],
                               atol=1e-5)
    # The preset's tokenizer went with it: the SavedModel takes text.
    assert (out / "txl" / "1" / "assets.extra" / "tokenizer" / "tokenizer.json").is_file()


def test_attention_and_recl_read_a_saved_preset_folder(saved_preset, tmp_path, capsys):
    # `txl attention` and `txl recl` took only training runs; --from-preset
    # gives what the same model gives from --workdir(s).
    _, tmp = saved_preset
    summaries, printed = {}, {}
    for flag, source in (("--from-preset", tmp / "preset"), ("--workdir", tmp / "run")):
        out = tmp_path / flag.strip("-")
        assert main(["attention", flag, str(source), "--text", str(tmp / "text.txt"),
                     "--out", str(out), "--layers", "all", "--heads", "1"]) == 0
        printed[flag] = [os.path.relpath(p, out) for p in capsys.readouterr().out.split()]
        summaries[flag] = json.loads((out / "insight.json").read_text())
    assert printed["--from-preset"] == printed["--workdir"]
    assert "attention_layer1_head1.png" in printed["--workdir"]
    preset, workdir = summaries["--from-preset"], summaries["--workdir"]
    assert preset.keys() == workdir.keys() and preset["segment"] == workdir["segment"]
    for key in ("loss_with_memory", "loss_without_memory"):
        np.testing.assert_allclose(preset[key], workdir[key], atol=1e-5)
    results = {}
    for flag, source in (("--from-preset", tmp / "preset"), ("--workdirs", tmp / "run")):
        out = tmp_path / f"recl{flag}.json"
        assert main(["recl", flag, f"a={source}", f"b={source}", "--data",
                     str(tmp / "text.txt"), "--split", "train", "--contexts", "2", "4",
                     "8", "--targets", "16", "--out", str(out)]) == 0
        results[flag] = capsys.readouterr().out, json.loads(out.read_text())
    (line, preset), (same, workdir) = results["--from-preset"], results["--workdirs"]
    assert line == same  # the RECL line and its table
    np.testing.assert_allclose(preset["mean_bpc"]["a"], workdir["mean_bpc"]["a"], atol=1e-5)
    assert preset["models"]["a"]["from_preset"] == f"{tmp / 'preset'}"
    assert workdir["models"]["a"]["workdir"] == f"{tmp / 'run'}"
    # One source, and a preset holds no prepared text.
    for argv in (["attention", "--from-preset", str(tmp / "preset"), "--workdir",
                  str(tmp / "run"), "--text", str(tmp / "text.txt"), "--out", str(tmp_path)],
                 ["recl", "--from-preset", str(tmp / "preset"), "--workdirs",
                  str(tmp / "run")]):
        with pytest.raises(SystemExit):
            main(argv)
        assert re.search("argument --(workdir|workdirs): not allowed with argument "
                         "--from-preset", capsys.readouterr().err)
    assert main(["recl", "--from-preset", str(tmp / "preset")]) == 2
    assert ("txl recl: error: --from-preset needs --data (the text to score)"
            in capsys.readouterr().err)
    missing = str(tmp_path / "no" / "preset")
    assert main(["attention", "--from-preset", missing, "--text", str(tmp / "text.txt"),
                 "--out", str(tmp_path / "x")]) == 2
    assert f"error: --from-preset {missing!r}: no such folder" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"],
                                     ["eval", "--data", "{tmp}/text.txt"],
                                     ["export", "--out", "{tmp}/out"]])
def test_from_preset_errors_name_the_flag_and_the_folder(saved_preset, tmp_path, capsys, command):
    _, tmp = saved_preset
    name, *rest = [a.format(tmp=tmp) for a in command]
    # One source: with another, argparse names both.
    with pytest.raises(SystemExit):
        main([name, "--from-preset", str(tmp / "preset"), "--workdir", str(tmp / "run"), *rest])
    assert "--workdir: not allowed with argument --from-preset" in capsys.readouterr().err
    missing = str(tmp_path / "no" / "preset")
    assert main([name, "--from-preset", missing, *rest]) == 2
    assert f"error: --from-preset {missing!r}: no such folder" in capsys.readouterr().err
    assert main([name, "--from-preset", "tiny", *rest]) == 2
    err = capsys.readouterr().err
    assert "--from-preset 'tiny' is no folder, nor a keras-hub handle" in err, err
    assert "train it with `txl train --preset tiny`" in err, err
    # A broken preset: a weights file cut short is refused by its manifest.
    broken = tmp_path / "broken"
    import shutil

    shutil.copytree(tmp / "preset", broken)
    weights = broken / "model.weights.h5"
    weights.write_bytes(weights.read_bytes()[:-100])
    assert main([name, "--from-preset", str(broken), *rest]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"txl {name}: error: "), err
    assert f"{weights} has {weights.stat().st_size} bytes, {broken / 'manifest.json'} says" in err, err
    # Its tokenizer is its own: --vocabulary-file is --from-official's.
    assert main([name, "--from-preset", str(tmp / "preset"), "--vocabulary-file",
                 str(tmp / "text.txt"), *rest]) == 2
    assert ("--vocabulary-file applies to --from-official only; --from-preset uses the preset's "
            "own tokenizer") in capsys.readouterr().err
