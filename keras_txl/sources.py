"""`--from-preset`, the model source shared by `txl eval`/`generate`/`attention`
(keras_txl/cli.py), `txl recl` (training/recl.py) and `txl export`
(keras_txl/export/cli.py): in the model layer, so that both CLIs import it from
below them (model <- training / export <- CLI)."""

PRESET_HELP = (
    "a saved model folder: a keras-hub preset (save_to_preset, "
    "keras_txl.io.save_preset, a downloaded preset, a run's WORKDIR/model) or a "
    "keras-txl weights folder (save_pretrained), checked as from_preset checks it "
    "(limits, manifest); or a keras-hub handle (hf://..., kaggle://...). Its own "
    "tokenizer is used")


def preset_model(preset, vocabulary_file=None):
    """(model, tokenizer folder or None) of `--from-preset`: a local model
    folder read by `keras_txl.load_pretrained` (a keras-hub preset goes
    through `TransformerXLCausalLM.from_preset`'s checks), or a keras-hub
    handle through `from_preset` itself, whose tokenizer is written to a
    temporary folder (removed at exit). Errors name the flag."""
    if vocabulary_file is not None:
        raise _vocabulary_file_error("from_preset")
    from keras_txl import folders
    from keras_txl import io

    try:
        if folders.is_local_preset(preset):
            model = io.load_pretrained(preset)
            return model, io.tokenizer_directory(preset)
        if "://" not in preset:
            # keras-hub's built-in names are other architectures': its
            # "Unknown preset identifier" listed handle forms for a typo.
            from keras_txl.presets import PRESETS

            hint = (f" ({preset!r} is a keras-txl architecture, with no weights: train "
                    f"it with `txl train --preset {preset}`)" if preset in PRESETS else "")
            raise ValueError(
                f"--from-preset {preset!r} is no folder, nor a keras-hub handle "
                "(hf://OWNER/NAME, kaggle://OWNER/MODEL/keras/VARIANT): pass a saved "
                f"preset folder{hint}.")
        from keras_txl.causal_lm import TransformerXLCausalLM

        model = TransformerXLCausalLM.from_preset(preset)
    except ValueError as error:
        text = str(error).replace("`preset`", "--from-preset")
        if "--from-preset" not in text:
            text = f"--from-preset {preset!r}: {text}"
        raise ValueError(text) from None
    if model.preprocessor is None:
        return model, None
    import atexit
    import shutil
    import tempfile

    out = tempfile.mkdtemp(prefix="txl-preset-tokenizer-")
    atexit.register(shutil.rmtree, out, True)
    model.preprocessor.tokenizer.save(out)
    return model, out




# What each model source of `txl eval`/`generate`/`export` reads its
# tokenizer from, had it been given a --vocabulary-file (which only
# --from-official takes: its release holds a vocabulary in no readable form).
_OWN_TOKENIZER = {
    "workdir": ("--workdir", "the run's own tokenizer (WORKDIR/model/, as txl train wrote "
                "it); to train with a fixed vocabulary, pass --vocabulary-file to txl train "
                "with a new --workdir"),
    "from_preset": ("--from-preset", "the preset's own tokenizer (its tokenizer.json and "
                    "assets/tokenizer/)"),
    "from_hf": ("--from-hf", "no tokenizer (pass the prompt as ids: --prompt-ids)"),
    "saved_model": ("--saved-model", "the tokenizer it was exported with"),
    "tflite": ("--tflite", "the tokenizer it was exported with"),
}


def check_vocabulary_file(args):
    """--vocabulary-file with a model source other than --from-official:
    refused, naming the source and the tokenizer it uses (it was dropped
    in silence: the text read with another vocabulary than the one given)."""
    if getattr(args, "vocabulary_file", None) is None:
        return
    for name in _OWN_TOKENIZER:
        if getattr(args, name, None) is not None:
            raise _vocabulary_file_error(name)


def _vocabulary_file_error(source):
    flag, uses = _OWN_TOKENIZER[source]
    return ValueError(f"--vocabulary-file applies to --from-official only; {flag} uses "
                      f"{uses}. Leave --vocabulary-file out.")
