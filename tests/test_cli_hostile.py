"""`txl` given hostile or careless input: each refusal is an argparse-style
`txl CMD: error: ...` line naming the flag (exit code 2, no traceback), made
before a model is built; and the three generation sources print the same
text for the same ids."""

import json
import logging
import re

import keras
import pytest
import tensorflow as tf
from testing import tiny_config

import keras_txl
from keras_txl.cli import main
from keras_txl.io import save_preset
from keras_txl.tokenizers import WordTokenizer
from keras_txl.training.config import TrainConfig

WORDS_TEXT = "the quick brown fox jumps over the lazy dog\nthe dog sat\n"


@pytest.fixture(scope="module")
def word_run(tmp_path_factory):
    """A word-level tiny run (random weights) and its exports: a SavedModel
    with the generate signature and a T = 1 TFLite file, both from `txl
    export`. Returns (workdir, export folder)."""
    folder = tmp_path_factory.mktemp("word_run")
    keras.utils.set_random_seed(0)
    tokenizer = WordTokenizer.fit([WORDS_TEXT])
    tokenizer.save(folder / "tokenizer")
    model = keras_txl.TransformerXLCausalLM(tiny_config(
        vocabulary_size=tokenizer.vocabulary_size()))
    # A keras-hub preset with its preprocessor, as training writes it: the
    # SavedModel then has the text-level generate signature.
    save_preset(model, str(folder / "run" / "model"), tokenizer=str(folder / "tokenizer"))
    out = folder / "exported"
    assert main(["export", "--workdir", str(folder / "run"), "--format", "all",
                 "--out", str(out), "--segment-length", "1"]) == 0
    return folder / "run", out


def refused(capsys, argv, pattern, command=None):
    """Runs `txl argv`; asserts exit 2 with one error line matching."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Traceback" not in captured.err
    lines = [line for line in captured.err.splitlines() if " error: " in line]
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"txl {command or argv[0]}: error: "), lines[0]
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def never_train(monkeypatch):
    """A refused `txl train` must stop before anything is built."""
    from keras_txl.training import run

    def reached(args):
        raise AssertionError("train_main ran: the check did not refuse")

    monkeypatch.setattr(run, "train_main", reached)


# === 1. the three generation sources print the same text ===


def test_saved_model_tflite_and_workdir_print_the_same_text(word_run, capsys):
    workdir, out = word_run
    texts = {}
    for source in (["--workdir", str(workdir)],
                   ["--saved-model", str(out / "txl")],
                   ["--tflite", str(out / "txl.tflite")]):
        assert main(["generate", *source, "--prompt", "the quick",
                     "--max-new-tokens", "5", "--temperature", "0"]) == 0
        captured = capsys.readouterr()
        texts[source[0]] = captured.out
        # LiteRT's XNNPACK line is hidden without -v.
        assert "XNNPACK" not in captured.err
    assert texts["--saved-model"] == texts["--workdir"] == texts["--tflite"], texts
    words = texts["--workdir"].split()
    assert words[:2] == ["the", "quick"] and len(words) >= 3, texts
    assert texts["--workdir"].startswith("the quick "), texts  # no glued word


# === 2. --max-new-tokens and the prompt against the caps ===


@pytest.mark.parametrize("source", ["--workdir", "--saved-model", "--tflite"])
def test_max_new_tokens_zero_is_refused_on_every_path(word_run, capsys, source):
    workdir, out = word_run
    path = {"--workdir": workdir, "--saved-model": out / "txl",
            "--tflite": out / "txl.tflite"}[source]
    refused(capsys, ["generate", source, str(path), "--prompt", "the",
                     "--max-new-tokens", "0"],
            r"--max-new-tokens \(`max_new_tokens`\) must be an integer in \[1, ")


def test_saved_model_caps_are_checked_up_front(word_run, capsys):
    _, out = word_run
    with open(out / "txl" / "1" / "assets.extra" / "export.json") as f:
        caps = json.load(f)["generate_caps"]
    refused(capsys, ["generate", "--saved-model", str(out / "txl"), "--prompt", "the",
                     "--max-new-tokens", str(caps["max_new_tokens"] + 1)],
            rf"--max-new-tokens .* in \[1, {caps['max_new_tokens']}\] with this "
            rf"SavedModel's generate signature .* received {caps['max_new_tokens'] + 1}")
    prompt = " ".join(["the"] * (caps["max_prompt_tokens"] + 1))
    refused(capsys, ["generate", "--saved-model", str(out / "txl"), "--prompt", prompt,
                     "--max-new-tokens", "1"],
            rf"--prompt holds {caps['max_prompt_tokens'] + 1} tokens, more than the "
            rf"{caps['max_prompt_tokens']} .*--schedule token")


def test_keras_max_new_tokens_is_bounded_before_loading(word_run, capsys):
    workdir, _ = word_run
    refused(capsys, ["generate", "--workdir", str(workdir), "--prompt", "the",
                     "--max-new-tokens", "100000000"],
            r"must be an integer in \[1, 1048575\] \(one call generates at most "
            r"1048576 = 2\*\*20 tokens.*received 100000000")


def test_empty_prompt_id_and_tflite_folder_are_named(word_run, capsys):
    workdir, out = word_run
    refused(capsys, ["generate", "--workdir", str(workdir), "--prompt-ids", "1,,2"],
            r"--prompt-ids must be comma-separated integers .*'1,,2'")
    refused(capsys, ["generate", "--tflite", str(out), "--prompt", "the"],
            r"--tflite '.*exported' is a folder: pass the .tflite file \(it holds "
            r"txl.tflite\)")
    # Named the internal `inputs[0]` before.
    refused(capsys, ["generate", "--workdir", str(workdir), "--prompt-ids", "1,999"],
            r"--prompt-ids must be ids in \[0, \d+\) .*received \[999\]")


def test_demo_and_recl_flags_name_themselves(tmp_path, word_run, capsys):
    # `txl demo --workdir FILE` was "[Errno 20] Not a directory: 'afile/corpus'";
    # `txl recl --targets 0` "The loss tables hold no tokens."
    (tmp_path / "afile").write_text("mine")
    refused(capsys, ["demo", "--workdir", str(tmp_path / "afile")],
            r"--workdir '.*afile' is not writable")
    assert (tmp_path / "afile").read_text() == "mine"
    workdir, _ = word_run
    with pytest.raises(SystemExit):
        main(["recl", "--workdirs", str(workdir), "--targets", "0"])
    assert "--targets must be an integer >= 1, received '0'" in capsys.readouterr().err


def test_schedule_token_on_a_segment_model_names_the_flag(tmp_path, word_run, capsys):
    workdir, _ = word_run
    assert main(["export", "--workdir", str(workdir), "--format", "tflite",
                 "--out", str(tmp_path), "--segment-length", "4"]) == 0
    capsys.readouterr()
    refused(capsys, ["generate", "--tflite", str(tmp_path / "txl.tflite"), "--prompt",
                     "the", "--schedule", "token"],
            r"--schedule token feeds one token at a time.*pass --schedule segment")


# === 3, 4. TrainConfig bounds ===


@pytest.mark.parametrize("changes, pattern", [
    (dict(steps=99999999999999999999), r"`steps` must be an integer in \[1, 2147483647\], "
     r"received 99999999999999999999"),
    (dict(log_every=2**31), r"`log_every` must be an integer in \[1, "),
    (dict(seed=2**32), r"`seed` must be an integer in \[0, 4294967295\]"),
    (dict(learning_rate=float("inf")), r"`learning_rate` must be a finite number > 0, "
     r"received inf"),
    (dict(clip_norm=float("nan")), r"`clip_norm` must be a finite number >= 0, received nan"),
    (dict(adam_epsilon=-1.0), r"`adam_epsilon` must be a finite number > 0, received -1.0"),
    (dict(adam_epsilon=float("nan")), r"`adam_epsilon` must be a finite number > 0"),
    (dict(adam_epsilon=float("inf")), r"`adam_epsilon` must be a finite number > 0"),
    (dict(min_lr_ratio=float("nan")), r"`min_lr_ratio` must be a finite number in \[0, 1\]"),
])
def test_train_config_bounds_every_field(changes, pattern):
    with pytest.raises(ValueError, match=pattern):
        TrainConfig(**changes)


@pytest.mark.parametrize("flags, pattern", [
    (["--set", "learning_rate=1e400"], r"`learning_rate` must be a finite number > 0, "
     r"received inf"),
    (["--set", "learning_rate=Infinity"], r"`learning_rate` must be a finite number"),
    (["--set", "clip_norm=NaN"], r"`clip_norm` must be a finite number >= 0, received nan"),
    (["--set", "adam_epsilon=-1"], r"`adam_epsilon` must be a finite number > 0"),
    # 5. lengths and bytes, refused before a model is built
    (["--memory-length", "2000000"], r"--memory-length 2000000 exceeds the limit "
     r"max_sequence_length=1048576"),
    (["--memory-length", "1000000", "--batch-size", "16"],
     r"--memory-length 1000000, .* and --batch-size 16 need a memory of 7.6 GiB .*"
     r"lower --memory-length or --batch-size"),
    (["--strategy", "tpu"], r"--strategy tpu needs --tpu"),
    # 6. flags of another strategy (they were dropped in silence)
    (["--tpu", "local"], r"--tpu applies to --strategy tpu, and this run's strategy is "
     r"'default' \(the strategy of --preset/--config/--set\): leave --tpu out, or pass "
     r"--strategy tpu\.$"),
    (["--strategy", "mirrored", "--cluster-timeout", "5"], r"--cluster-timeout applies to "
     r"--strategy multi_worker, and this run's strategy is 'mirrored' \(--strategy\)"),
])
def test_txl_train_refuses_before_building(tmp_path, capsys, monkeypatch, flags, pattern):
    never_train(monkeypatch)
    for name in ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    refused(capsys, ["train", "--data", str(tmp_path), "--workdir", str(tmp_path / "w"),
                     "--preset", "tiny", *flags], pattern)


def test_a_step_count_past_the_limit_is_refused_by_its_flag(tmp_path, capsys, monkeypatch):
    never_train(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        main(["train", "--data", str(tmp_path), "--workdir", str(tmp_path / "w"),
              "--preset", "tiny", "--steps", "99999999999999999999"])
    assert stop.value.code == 2
    assert ("txl train: error: argument --steps: --steps must be an integer in "
            "[1, 2147483647], received '99999999999999999999'") in capsys.readouterr().err


def test_txl_train_workdir_that_is_a_file(tmp_path, capsys, monkeypatch):
    never_train(monkeypatch)
    (tmp_path / "afile").write_text("x")
    refused(capsys, ["train", "--workdir", str(tmp_path / "afile"), "--preset", "tiny"],
            r"--workdir '.*afile' is a file: it must be a folder")


# === 6. SentencePiece too small ===


def test_sentencepiece_vocab_size_too_small_names_the_flag(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 50)
    refused(capsys, ["prepare", "--data", str(corpus), "--workdir", str(tmp_path / "w"),
                     "--tokenizer", "sentencepiece", "--vocab-size", "3"],
            r"`vocabulary_size`=3 \(--vocab-size\) is too small .* at least \d+ pieces")


# === 7, 8. attention, files and folders ===


def test_attention_max_segments_and_binary_text(word_run, tmp_path, capsys):
    workdir, _ = word_run
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox\n")
    for value in ("0", "-3"):
        refused(capsys, ["attention", "--workdir", str(workdir), "--text", str(text),
                         "--out", str(tmp_path), "--max-segments", value],
                rf"--max-segments must be a positive integer, received {value}")
    binary = tmp_path / "bin.bin"
    binary.write_bytes(b"abc\xa6def")
    refused(capsys, ["attention", "--workdir", str(workdir), "--text", str(binary),
                     "--out", str(tmp_path)],
            r"--text '.*bin.bin' is not UTF-8 text: byte 0xa6 at offset 3")


def test_attention_and_reading_commands_name_a_wrong_path(word_run, tmp_path, capsys):
    workdir, _ = word_run
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 4)
    attention = ["attention", "--text", str(text)]
    # --out a file: was "[Errno 17] File exists: '...'".
    refused(capsys, [*attention, "--workdir", str(workdir), "--out", str(text)],
            rf"--out {re.escape(repr(str(text)))} is a file: it must be a folder \(new or "
            r"existing\) for the pictures\.$")
    # A model folder: was "No model in .../model/model/ (train first)".
    model_dir = str(workdir / "model")
    refused(capsys, [*attention, "--workdir", model_dir, "--out", str(tmp_path / "p")],
            rf"--workdir {re.escape(repr(model_dir))} is a model folder, not a training "
            r"workdir: `txl eval/generate/export/attention --workdir` read a training run's "
            rf"WORKDIR/model/; pass this folder as --from-preset {re.escape(repr(model_dir))} "
            r"instead\.")
    # --segment out of range: was "`segment` must be in ...".
    refused(capsys, [*attention, "--workdir", str(workdir), "--out", str(tmp_path / "p"),
                     "--segment", "99"],
            r"--segment must be in \[0, \d+\) for this text .* received 99\.")
    # A file as --workdir of a reading command: was "No model in FILE/model/ ...:
    # train first".
    for argv in (["eval"], ["generate", "--prompt", "the"],
                 ["export", "--out", str(tmp_path / "e")], [*attention, "--out", "p"]):
        refused(capsys, [*argv, "--workdir", str(text)],
                rf"--workdir {re.escape(repr(str(text)))} is a file: pass a training run's "
                r"folder \(the --workdir of txl train\)\.$")
    assert not (tmp_path / "e").exists() and not (tmp_path / "p").exists()


def test_a_generation_memory_too_large_is_named_by_its_flag(word_run, capsys, monkeypatch):
    # --memory-length 99999999 ended in TensorFlow's ResourceExhaustedError
    # traceback (47.68 GiB for the tiny model's cache).
    workdir, _ = word_run
    argv = ["generate", "--workdir", str(workdir), "--prompt", "the", "--max-new-tokens", "2"]
    refused(capsys, [*argv, "--memory-length", "99999999"],
            r"--memory-length 99999999 exceeds the limit max_sequence_length=1048576")
    from keras_txl import causal_lm

    # The bytes of the memory itself: checked against the bound one call may
    # hold (made small here: the tiny model's memory is a few MB).
    monkeypatch.setattr(causal_lm, "MAX_INITIAL_MEMORY_BYTES", 1 << 20)
    config = keras_txl.load_pretrained(str(workdir / "model")).txl_config
    L, D = config.num_layers, config.hidden_dim
    gib = 4 * L * 100_000 * D / 2**30
    refused(capsys, [*argv, "--memory-length", "100000"],
            rf"--memory-length 100000 needs a memory of {gib:.1f} GiB per prompt \({L} layers "
            rf"x 100000 x hidden {D}, float32\), more than the 0 GiB one call may hold: "
            r"lower --memory-length\.$")


@pytest.mark.parametrize("flags, message", [
    (["--char-symbols", "yes"], "--char-symbols yes applies to a --data folder of "
     "train.txt/valid.txt/test.txt (there is no --data): leave it out."),
    (["--data-dir", "~/tensorflow_datasets"], "--data-dir applies to --data tfds:NAME only "
     "(there is no --data): leave it out."),
    (["--tfds-split", "valid=train[-2%:]", "--download"], "--tfds-split and --download apply "
     "to --data tfds:NAME only (there is no --data): leave them out."),
])
def test_eval_workdir_corpus_flags_without_data_are_refused(tmp_path, capsys, flags, message):
    # Without --data, txl eval --workdir scored its prepared split and
    # dropped these in silence.
    line = refused(capsys, ["eval", "--workdir", str(tmp_path / "never_read"), *flags], "")
    assert line.endswith(message), line


def test_vocabulary_file_folder_and_binary(tmp_path, capsys, monkeypatch):
    never_train(monkeypatch)
    binary = tmp_path / "vocab.bin"
    binary.write_bytes(b"the\n" * 300_000 + b"\xff")  # past the first piece read
    refused(capsys, ["prepare", "--data", str(tmp_path), "--workdir", str(tmp_path / "w"),
                     "--tokenizer", "word", "--vocabulary-file", str(binary)],
            r"--vocabulary-file '.*vocab.bin' is not UTF-8 text: byte 0xff at offset "
            r"1200000")
    refused(capsys, ["prepare", "--data", str(tmp_path), "--workdir", str(tmp_path / "w"),
                     "--tokenizer", "word", "--vocabulary-file", str(tmp_path)],
            r"--vocabulary-file '.*' is a folder: pass a text file")


@pytest.mark.parametrize("argv, source", [
    (["eval", "--split", "valid"], "--workdir uses the run's own tokenizer"),
    (["generate", "--prompt", "the"], "--workdir uses the run's own tokenizer"),
    (["export", "--out", "OUT"], "--workdir uses the run's own tokenizer"),
    (["generate", "--saved-model", "SAVED", "--prompt", "the"],
     "--saved-model uses the tokenizer it was exported with"),
    (["generate", "--tflite", "TFLITE", "--prompt", "the"],
     "--tflite uses the tokenizer it was exported with"),
])
def test_vocabulary_file_with_another_source_than_official_is_refused(
        word_run, tmp_path, capsys, monkeypatch, argv, source):
    # It was dropped in silence: the text read with the run's vocabulary.
    workdir, out = word_run
    vocabulary = tmp_path / "vocab.txt"
    vocabulary.write_text("<eos>\n<unk>\nfox\n")
    paths = {"OUT": str(tmp_path / "out"), "SAVED": str(out / "txl"),
             "TFLITE": str(out / "txl.tflite")}
    argv = [paths.get(a, a) for a in argv]
    if not any(a in ("--saved-model", "--tflite") for a in argv):
        argv += ["--workdir", str(workdir)]
    from keras_txl import io

    monkeypatch.setattr(io, "load_pretrained", lambda *a, **k: pytest.fail("model read"))
    refused(capsys, [*argv, "--vocabulary-file", str(vocabulary)],
            rf"--vocabulary-file applies to --from-official only; {re.escape(source)}.* "
            r"Leave --vocabulary-file out\.")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, message", [
    (["--top-k", "-1"], "--top-k must be an integer >= 0 (0 keeps every token), "
     "received --top-k -1."),
    (["--top-p", "0"], "--top-p must be in (0, 1] (1 keeps every token), received --top-p 0.0."),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0 (0 is greedy). "
     "Received: --temperature nan."),
    (["--seed", "-1"], "--seed must be None or an integer in [0, 2**63 - 1"),
    (["--segment-length", "0"], "--segment-length must be a positive integer. "
     "Received: --segment-length 0."),
    (["serve-client", "--timeout", "0"], "--timeout must be a finite number > 0 and <= "
     "1e+09. Received: --timeout 0.0."),
    (["serve-client", "--max-new-tokens", "0"], "--max-new-tokens must be a positive "
     "integer. Received: --max-new-tokens 0."),
    (["serve-client", "--top-k", "-2"], "--top-k must be an integer >= 0"),
    (["serve-client", "--rest", "localhost:8501"], "--rest must be an http:// or https:// "
     "server root such as 'http://localhost:8501', received 'localhost:8501'."),
])
def test_sampling_and_client_flags_are_named_as_flags(tmp_path, capsys, argv, message):
    # They named the Python arguments (`top_k` ..., received top_k=-1),
    # not the flags typed; all are refused before a model or server is reached.
    if argv[0] == "serve-client":
        rest = argv[1:] if "--rest" in argv else ["--rest", "http://127.0.0.1:9", *argv[1:]]
        argv = ["serve-client", "generate", *rest, "--prompt", "a"]
    else:
        argv = ["generate", "--workdir", str(tmp_path / "never_read"), "--prompt", "a", *argv]
    line = refused(capsys, argv, "")
    assert line.endswith(message) or message in line, line
    assert "`" not in line and not re.search(r"[a-z_]=\S", line), line


def test_a_tilde_the_shell_left_is_the_home_folder(tmp_path, capsys, monkeypatch):
    # `--workdir=~/w` (no expansion after '=') prepared into a folder named
    # '~' in the current one, and `--data=~/c` was "not found".
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    for split in ("train", "valid", "test"):
        (home / "c").mkdir(parents=True, exist_ok=True)
        (home / "c" / f"{split}.txt").write_text(WORDS_TEXT * 3)
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    assert main(["prepare", "--data=~/c", "--workdir=~/w"]) == 0
    assert json.loads(capsys.readouterr().out)["workdir"] == str(home / "w")
    assert (home / "w" / "tokenizer" / "tokenizer.json").is_file()
    assert list(cwd.iterdir()) == []
    from keras_txl.cli import _expand_home
    from keras_txl.cli import build_parser

    args = build_parser().parse_args(["recl", "--workdirs", "a=~/x", "~/y", "b=z"])
    _expand_home(args)
    assert args.workdirs == [f"a={home}/x", f"{home}/y", "b=z"]


def test_export_flag_messages(word_run, tmp_path, capsys):
    workdir, _ = word_run
    refused(capsys, ["export", "--workdir", str(workdir), "--out", str(tmp_path),
                     "--quantize", "float16", "--stateful"],
            r"--quantize float16 and --stateful apply to the TFLite model, and "
            r"--format saved_model writes none")
    import tempfile

    try:  # /sys refuses new files, as a read-only mount does
        with tempfile.TemporaryFile(dir="/sys"):
            pytest.skip("/sys is writable here")
    except OSError:
        pass
    refused(capsys, ["export", "--workdir", str(workdir), "--out", "/sys/txl-exports"],
            r"--out '/sys/txl-exports' is not writable \(in '/sys'\): \w+")


@pytest.mark.parametrize("name", ["../escaped", "a/b", "..", "."])
def test_export_name_stays_inside_out_for_every_format(word_run, tmp_path, capsys, name):
    workdir, _ = word_run
    out = tmp_path / "nested" / "out"
    for fmt in ("tflite", "saved_model", "all"):
        refused(capsys, ["export", "--workdir", str(workdir), "--out", str(out),
                         "--format", fmt, "--name", name],
                r"--name must be a plain name \(no path separators, not \. or \.\.\)")
    assert not (tmp_path / "nested").exists() or not any((tmp_path / "nested").rglob("*.tflite"))
    assert not list(tmp_path.glob("escaped*"))


def test_a_stateless_tflite_without_memory_is_refused(word_run, tmp_path, capsys):
    # LiteRT cannot run a (B, L, 0, D) memory input ("Invalid tensor size").
    from keras_txl.export.tflite import export_tflite_variants

    workdir, _ = word_run
    refused(capsys, ["export", "--workdir", str(workdir), "--out", str(tmp_path),
                     "--format", "tflite", "--memory-length", "0"],
            r"--memory-length 0 gives a stateless TFLite model a memory input with a "
            r"0-size dimension")
    model = keras_txl.TransformerXLCausalLM(tiny_config(memory_length=0))
    with pytest.raises(ValueError, match=r"A stateless TFLite model needs memory_length >= 1"):
        export_tflite_variants(model, {"none": str(tmp_path / "m0.tflite")},
                               batch_size=1, segment_length=4)
    assert not (tmp_path / "m0.tflite").exists()


def test_eval_memory_and_protocol_messages(word_run, capsys):
    workdir, _ = word_run
    (workdir / "config.json").write_text(json.dumps(tiny_config().to_dict()))
    try:
        refused(capsys, ["eval", "--workdir", str(workdir), "--memory-length", "600000",
                         "--batch-size", "1000"],
                r"--memory-length 600000 with --batch-size 1000 needs a memory of .* GiB"
                r".*lower --memory-length or --batch-size")
    finally:
        (workdir / "config.json").unlink()
    refused(capsys, ["eval", "--workdir", str(workdir), "--protocol", "paper"],
            r"--protocol paper takes the dataset from --from-official's "
            r"corpus-info.json; with --workdir or --from-preset, name the dataset: --protocol \{wt103")


def test_generation_without_a_memory_is_refused_and_the_way_out_works(tmp_path, capsys, caplog):
    # With memory_length=0 each new token saw only itself: prompts [1, 2, 3, 9],
    # [40, 50, 60, 9] and [9] all gave the same next token. Refused by name
    # everywhere generation runs, with the way to give the model a memory.
    from keras_txl.generation import generate

    tokenizer = WordTokenizer.fit([WORDS_TEXT])
    tokenizer.save(tmp_path / "tokenizer")
    model = keras_txl.TransformerXLCausalLM(tiny_config(
        vocabulary_size=tokenizer.vocabulary_size(), memory_length=0))
    save_preset(model, str(tmp_path / "run" / "model"), tokenizer=str(tmp_path / "tokenizer"))
    message = r"this model has memory_length=0: each new token would see only itself"
    with pytest.raises(ValueError, match=message + r".*model.with_settings\(memory_length=N\)"):
        model.generate([[1, 2, 3]], max_length=6)
    with pytest.raises(ValueError, match=message):
        generate(model, [1, 2, 3], 2)
    refused(capsys, ["generate", "--workdir", str(tmp_path / "run"), "--prompt-ids", "1,2,3",
                     "--max-new-tokens", "2"], message + r".*pass --memory-length N")
    assert main(["generate", "--workdir", str(tmp_path / "run"), "--prompt-ids", "1,2,3",
                 "--max-new-tokens", "2", "--memory-length", "8", "--temperature", "0"]) == 0
    longer = keras_txl.TransformerXLCausalLM.from_preset(str(tmp_path / "run" / "model"))
    longer = longer.with_settings(memory_length=8)
    longer.compile(sampler="greedy")
    expected = longer.generate([[1, 2, 3]], max_length=5, stop_token_ids=None)[0][3:]
    assert [int(t) for t in capsys.readouterr().out.split()] == list(expected)
    # An export of it gets no generate signatures, with a warning saying why.
    with caplog.at_level(logging.WARNING):
        assert main(["export", "--workdir", str(tmp_path / "run"), "--format", "saved_model",
                     "--out", str(tmp_path / "out")]) == 0
    assert "No generate signatures: this model has memory_length=0" in caplog.text
    capsys.readouterr()  # the paths the export printed
    signatures = tf.saved_model.load(str(tmp_path / "out" / "txl" / "1")).signatures
    assert "generate" not in signatures and "serving_default" in signatures
    refused(capsys, ["generate", "--saved-model", str(tmp_path / "out" / "txl"),
                     "--prompt-ids", "1,2", "--memory-length", "8"],
            r"--memory-length applies to Keras sources")


@pytest.mark.parametrize("flags, message", [
    (["--max-new-tokens", "0"], "--max-new-tokens must be an integer in [1, 1048575], received 0"),
    (["--steps", "0"], "--steps must be an integer in [1, 2147483647], received 0"),
    (["--max-chars", "-5"], "--max-chars must be an integer >= 1, received -5"),
    (["--learning-rate", "nan"], "--learning-rate must be a finite number > 0, received nan"),
    (["--learning-rate", "-0.1"], "--learning-rate must be a finite number > 0"),
])
def test_demo_checks_its_numbers_before_writing_the_corpus(tmp_path, capsys, flags,
                                                           message):
    # --max-new-tokens 0 was found after training, evaluation and export (minutes),
    # named `max_new_tokens`; a NaN --learning-rate as "--set learning_rate".
    workdir = tmp_path / "demo"
    assert main(["demo", "--workdir", str(workdir), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not workdir.exists()


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "0"], "--batch-size must be an integer >= 1, received '0'"),
    (["--segment-length", "-2"], "--segment-length must be an integer >= 1, received '-2'"),
    (["--memory-length", "-1"], "--memory-length must be an integer >= 0, received '-1'"),
    (["--max-segments", "-1"], "--max-segments must be an integer >= 0, received '-1'"),
    (["--clamp-length", "-5"], "--clamp-length must be an integer >= -1, received '-5'"),
])
def test_txl_eval_names_a_bad_size_by_its_flag_at_once(tmp_path, capsys, flags, message):
    # Were named by the evaluate() argument (`batch_size` must be ...), once
    # TensorFlow had loaded and the model had been read.
    with pytest.raises(SystemExit) as stop:
        main(["eval", "--workdir", str(tmp_path), *flags])
    assert stop.value.code == 2
    assert f"txl eval: error: argument {flags[0]}: {message}" in capsys.readouterr().err


def test_demo_takes_the_workdir_lock_before_writing_its_corpus(tmp_path, capsys):
    # `txl demo` wrote WORKDIR/corpus before any lock: a second demo on the
    # same workdir rewrote the corpus under the first one's training, and was
    # refused only afterwards, by `txl train`'s lock.
    from keras_txl.training.run import WorkdirLock

    workdir = tmp_path / "demo"
    workdir.mkdir()
    with WorkdirLock(str(workdir), command="txl demo"):
        assert main(["demo", "--workdir", str(workdir), "--max-chars", "20000",
                     "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{workdir} is in use by another `txl demo`" in err, err
    assert sorted(p.name for p in workdir.iterdir()) == ["train.lock"]
