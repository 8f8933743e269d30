"""The README and docs/ are true for every command they show.

Every ```bash block of README.md and docs/*.md is read command by command:
`txl ...` (and `python -m keras_txl ...`) is parsed by the real parser (flags,
choices, types, and `txl export`'s own checks), `make X` must be a Makefile
target, `python -m M` an importable module, `python path.py` a file,
`python -c CODE` code whose imports work, `pip install` a file or extra that
exists. Usage synopses and `txl ...` in inline code use flags that exist.
Every ```python block's `keras_txl` imports, attributes and keyword arguments
exist. The cheap commands run for real: the README's Python quick start, and
its `txl eval` / `txl generate` on a tiny trained run.
"""

import argparse
import ast
import contextlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import io
import json
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
from testing import REPO

import keras_txl
from keras_txl.cli import build_parser
from keras_txl.cli import main
from keras_txl.export import cli as export_cli

DOCS = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
SHELL = ("bash", "sh", "shell")
# Commands a doc may show that this test cannot check (outside the project).
EXTERNAL = {"docker", "saved_model_cli"}


def blocks(path, languages):
    text = path.read_text(encoding="utf-8")
    return [m.group(2) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)
            if m.group(1) in languages]


def shell_commands():
    """(doc, line, tokens) of every command in the shell blocks."""
    out = []
    for path in DOCS:
        for body in blocks(path, SHELL):
            for line in body.replace("\\\n", " ").splitlines():
                tokens = shlex.split(line, comments=True)
                if tokens:
                    out.append((path.name, line.strip(), tokens))
    return out


COMMANDS = shell_commands()


def txl_argv(tokens):
    """The `txl` arguments of a command, or None if it is not one."""
    if tokens[0] == "txl":
        return tokens[1:]
    if tokens[:3] in (["python", "-m", "keras_txl"], ["python3", "-m", "keras_txl"]):
        return tokens[3:]
    return None


def parse_txl(argv):
    """Parses like `txl` would; returns (args, error text)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return build_parser().parse_args(argv), ""
        except SystemExit:
            return None, err.getvalue()


def options_of(command):
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {s for a in sub.choices[command]._actions for s in a.option_strings}


def test_the_docs_show_commands():
    docs = {doc for doc, _, _ in COMMANDS}
    assert {"README.md", "export.md", "training.md", "generation.md"} <= docs
    assert sum(txl_argv(t) is not None for _, _, t in COMMANDS) >= 10


@pytest.mark.parametrize("doc, line, tokens", [c for c in COMMANDS if txl_argv(c[2]) is not None],
                         ids=lambda v: v if isinstance(v, str) and len(v) < 40 else "")
def test_txl_commands_parse(doc, line, tokens):
    args, error = parse_txl(txl_argv(tokens))
    assert args is not None, f"{doc}: `{line}` does not parse: {error}"
    if args.command == "export":
        export_cli.check_arguments(args)  # its rules beyond argparse's


def test_other_commands_exist():
    makefile = (REPO / "Makefile").read_text()
    extras = importlib.metadata.metadata("keras-txl").get_all("Provides-Extra")
    wrong = []
    for doc, line, tokens in COMMANDS:
        if txl_argv(tokens) is not None or tokens[0] in EXTERNAL:
            continue
        if tokens[0] == "make":
            wrong += [f"{doc}: `{line}`: no target {t}" for t in tokens[1:]
                      if not re.search(rf"^{re.escape(t)}:", makefile, re.M)]
        elif tokens[0] in ("python", "python3") and tokens[1] == "-m":
            if importlib.util.find_spec(tokens[2]) is None:
                wrong.append(f"{doc}: `{line}`: no module {tokens[2]}")
        elif tokens[0] in ("python", "python3") and tokens[1] == "-c":
            wrong += [f"{doc}: `{line}`: {e}" for e in python_problems(tokens[2])]
        elif tokens[0] in ("python", "python3"):
            if not (REPO / tokens[1]).is_file():
                wrong.append(f"{doc}: `{line}`: no file {tokens[1]}")
        elif tokens[0] == "pip":
            for i, token in enumerate(tokens):
                if tokens[i - 1] == "-r" and not (REPO / token).is_file():
                    wrong.append(f"{doc}: `{line}`: no file {token}")
                extra = re.fullmatch(r"\.\[([\w,-]+)\]|'?keras-txl\[([\w,-]+)\]'?", token)
                if extra:
                    names = (extra.group(1) or extra.group(2)).split(",")
                    wrong += [f"{doc}: `{line}`: no extra {n}" for n in names if n not in extras]
        else:
            wrong.append(f"{doc}: `{line}`: not a command this test knows (output in a bash block?)")
    assert not wrong, "\n".join(wrong)


def test_flags_in_synopses_and_inline_code_exist():
    """`txl CMD ... --flag` in usage blocks and in inline code spans."""
    wrong, seen = [], 0
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        spans = re.findall(r"`(txl [^`]+)`", text)
        for body in blocks(path, ("", "text")):
            # A command continued with `\` is one command; `python -m keras_txl` is `txl`.
            body = re.sub(r"^python3? -m keras_txl ", "txl ", body.replace("\\\n", " "), flags=re.M)
            spans += re.findall(r"^txl .*(?:\n\s+[\[(-].*)*", body, re.M)
        for span in spans:
            command = span.split()[1]
            if not re.fullmatch(r"[a-z]+", command):
                continue  # `txl -v ...`, or an error message such as `txl train: error: ...`
            seen += 1
            known = options_of(command) if command in build_parser()._subparsers._group_actions[0].choices else None
            if known is None:
                wrong.append(f"{path.name}: `{span}`: no command {command}")
                continue
            wrong += [f"{path.name}: `{span[:60]}`: txl {command} has no {flag}"
                      for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", span) if flag not in known]
    assert seen >= 5
    assert not wrong, "\n".join(wrong)


# --- Python blocks -------------------------------------------------------------


def resolve(dotted):
    """The object at `a.b.c`, importing submodules as needed; raises if none."""
    parts = dotted.split(".")
    value = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        try:
            value = getattr(value, part)
        except AttributeError:
            value = importlib.import_module(".".join(parts[: i + 1]))
    return value


def python_problems(code):
    """Wrong imports, attributes and keyword arguments of keras_txl in `code`."""
    problems, names = [], {}
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if importlib.util.find_spec(alias.name.split(".")[0]) is None:
                    problems.append(f"cannot import {alias.name}")
                elif alias.name.startswith("keras_txl"):
                    try:
                        resolve(alias.name)
                    except (ImportError, AttributeError) as e:
                        problems.append(f"import {alias.name}: {e}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if importlib.util.find_spec(node.module.split(".")[0]) is None:
                problems.append(f"cannot import {node.module}")
                continue
            for alias in node.names:
                try:
                    names[alias.asname or alias.name] = resolve(f"{node.module}.{alias.name}")
                except (ImportError, AttributeError) as e:
                    problems.append(f"from {node.module} import {alias.name}: {e}")

    def dotted(node):
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return base and f"{base}.{node.attr}"
        return node.id if isinstance(node, ast.Name) else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (dotted(node) or "").startswith("keras_txl."):
            try:
                resolve(dotted(node))
            except (ImportError, AttributeError) as e:
                problems.append(f"{dotted(node)}: {e}")
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func)
        target = names.get(name) if name in names else None
        if target is None and name and name.startswith("keras_txl."):
            with contextlib.suppress(ImportError, AttributeError):
                target = resolve(name)
        if target is None or not callable(target):
            continue
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):
            continue
        if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
            continue
        problems += [f"{name}() has no argument {k.arg!r}" for k in node.keywords
                     if k.arg is not None and k.arg not in signature.parameters]
    return problems


def test_python_blocks_use_names_that_exist():
    wrong, checked = [], 0
    for path in DOCS:
        for body in blocks(path, ("python",)):
            checked += 1
            wrong += [f"{path.name}: {p}" for p in python_problems(body)]
    assert checked >= 5
    assert not wrong, "\n".join(wrong)


def test_the_checker_catches_stale_names():
    assert python_problems("from keras_txl.export.saved_model import export_saved_model\n"
                           "export_saved_model(m, 'x', fixed_shapes=True)") == [
        "export_saved_model() has no argument 'fixed_shapes'"]
    assert python_problems("import keras_txl\nkeras_txl.load_everything('x')")
    args, error = parse_txl(["export", "--workdir", "w", "--out", "o", "--fixed"])
    assert args is None and "unrecognized arguments: --fixed" in error


# --- run for real ----------------------------------------------------------------


def test_readme_keras_hub_quick_start_runs(tmp_path, monkeypatch):
    """The first Python block, verbatim, on a preset folder where `make demo` leaves one."""
    from keras_txl.tokenizers import ByteTokenizer

    code = blocks(REPO / "README.md", ("python",))[0]
    config = keras_txl.TransformerXLConfig(
        vocabulary_size=256, num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32,
        segment_length=16, memory_length=16, dropout=0.0)
    model = keras_txl.TransformerXLCausalLM(config)
    keras_txl.save_preset(model, str(tmp_path / "runs" / "demo" / "model"), tokenizer=ByteTokenizer())
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    texts = scope["texts"]
    assert len(texts) == 2 and texts[0].startswith("The history of") and texts[1].startswith("def main():")
    saved = keras_txl.TransformerXLCausalLM.from_preset(str(tmp_path / "my_preset"))
    for a, b in zip(saved.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    saved.compile(sampler="greedy")
    assert saved.generate(["The history of", "def main():"], max_length=64) == texts


def test_readme_python_quick_start_runs(tmp_path, monkeypatch):
    code = blocks(REPO / "README.md", ("python",))[1]
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert tuple(scope["out"]["log_probs"].shape) == (2, 32, scope["config"].vocabulary_size)
    assert (tmp_path / "my_model" / "model.safetensors").is_file()


def test_readme_eval_and_generate_run(tmp_path, monkeypatch, capsys):
    """The README's `txl eval` and `txl generate`, as written, on a tiny byte-level run
    in `runs/ts` (what its `txl train` lines would leave there)."""
    from keras_txl.tokenizers import ByteTokenizer

    readme = [t for doc, _, t in COMMANDS if doc == "README.md" and txl_argv(t)]
    # (The official-release `txl eval --from-official` needs a release: its flags are
    # checked with every other command's.)
    runs = [t[1:] for t in readme if t[1] in ("eval", "generate") and "--workdir" in t]
    assert [argv[0] for argv in runs] == ["eval", "generate"]
    workdir = tmp_path / "runs" / "ts"
    ByteTokenizer().save(tmp_path / "tokenizer")
    config = keras_txl.TransformerXLConfig(
        vocabulary_size=256, num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32,
        segment_length=16, memory_length=16)
    keras_txl.save_pretrained(keras_txl.TransformerXLCausalLM(config), str(workdir / "model"),
                              tokenizer=str(tmp_path / "tokenizer"))
    (workdir / "data").mkdir()
    np.save(workdir / "data" / "test.npy", ByteTokenizer().encode("ROMEO: a test text. " * 5))
    monkeypatch.chdir(tmp_path)
    assert main(runs[0]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # Every setting, the flags' and the model's (a workdir without eval_config.json).
    assert result["settings"] == {"segment_length": 16, "memory_length": 512,
                                  "clamp_length": 400, "same_length": True, "batch_size": 1,
                                  "max_segments": 0, "dtype": "float32"}
    assert result["bpc"] == pytest.approx(result["loss"] / np.log(2))
    assert main(runs[1]) == 0
    out = capsys.readouterr().out
    # 200 new bytes are at least 50 characters (UTF-8 takes up to 4 bytes for one).
    assert out.startswith("ROMEO:") and len(out.rstrip("\n")) >= len("ROMEO:") + 50


def test_from_preset_commands_run(tmp_path, monkeypatch, capsys):
    """The README's and docs/export.md's `--from-preset` commands, as written, on a tiny
    byte-level model saved with save_to_preset as `my_preset` (the quick start's name)."""
    from keras_txl.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
    from keras_txl.tokenizers import ByteTokenizer

    runs = [txl_argv(t) for doc, _, t in COMMANDS
            if doc in ("README.md", "export.md") and txl_argv(t) and "--from-preset" in t]
    assert [argv[0] for argv in runs] == ["generate", "eval", "export"]
    config = keras_txl.TransformerXLConfig(
        vocabulary_size=256, num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32,
        segment_length=16, memory_length=16)
    keras_txl.TransformerXLCausalLM(
        config, preprocessor=TransformerXLCausalLMPreprocessor(ByteTokenizer(), sequence_length=16),
    ).save_to_preset(str(tmp_path / "my_preset"))
    (tmp_path / "my_text.txt").write_text("The history of the text. " * 20, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(runs[0]) == 0
    assert capsys.readouterr().out.startswith("The history of")
    assert main(runs[1]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["split"] == "train" and result["tokens"] > 100
    assert main(runs[2]) == 0
    path = capsys.readouterr().out.strip()
    assert (tmp_path / path / "assets.extra" / "tokenizer" / "tokenizer.json").is_file(), path


def test_readme_export_command_is_the_one_tests_run():
    from test_cli import README_EXPORT

    readme = [t for doc, _, t in COMMANDS if doc == "README.md" and t[:2] == ["txl", "export"]]
    assert readme == [["txl", "export", "--workdir", "runs/ts", *README_EXPORT]]


def test_export_options_table_is_complete():
    """docs/export.md's table of `txl export` options: every row exists, every option has a row."""
    text = (REPO / "docs" / "export.md").read_text(encoding="utf-8")
    table = text[text.index("| option | meaning |"):]
    table = table[: table.index("\n\n")]
    documented = set(re.findall(r"`(--[a-z][\w-]*)", table))
    known = options_of("export") - {"-h", "--help"}
    assert documented == known, (sorted(documented - known), sorted(known - documented))


def test_inline_make_targets_and_scripts_exist():
    makefile = (REPO / "Makefile").read_text()
    wrong, seen = [], 0
    for path in DOCS:
        for span in re.findall(r"`((?:make|python) [^`]+)`", path.read_text(encoding="utf-8")):
            tokens = span.split()
            seen += 1
            if tokens[0] == "make" and not re.search(rf"^{re.escape(tokens[1])}:", makefile, re.M):
                wrong.append(f"{path.name}: `{span}`: no make target {tokens[1]}")
            if tokens[0] == "python" and tokens[1].endswith(".py") and not (REPO / tokens[1]).is_file():
                wrong.append(f"{path.name}: `{span}`: no file {tokens[1]}")
    assert seen >= 5
    assert not wrong, "\n".join(wrong)


def test_benchmark_commands_take_the_arguments_shown():
    """`python benchmarks/x.py ...` in blocks and inline code: each flag and
    stage shown is in the script's own --help (the scripts import TF lazily)."""
    shown = {}
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        lines = [" ".join(t) for _, _, t in COMMANDS] + re.findall(r"`(python [^`]+)`", text)
        for line in lines:
            tokens = line.split()
            if len(tokens) > 1 and tokens[0] in ("python", "python3") and tokens[1].startswith("benchmarks/"):
                shown.setdefault(tokens[1], []).append((path.name, tokens[2:]))
    assert len(shown) >= 4
    wrong = []
    for script, uses in shown.items():
        help_text = subprocess.run([sys.executable, str(REPO / script), "--help"], capture_output=True,
                                   text=True, timeout=120, cwd=REPO).stdout
        assert "usage:" in help_text, script
        for doc, args in uses:
            for token in args:
                word = token.split("=")[0]
                if re.fullmatch(r"--[a-z][\w-]*", word) and not re.search(rf"{word}\b", help_text):
                    wrong.append(f"{doc}: {script} has no {word}")
                elif re.fullmatch(r"[a-z]+", word) and args.index(token) == 0 and word not in help_text:
                    wrong.append(f"{doc}: {script} has no stage {word}")
    assert not wrong, "\n".join(wrong)


def test_generation_python_blocks_run(tmp_path, monkeypatch, capsys):
    """docs/generation.md's Python blocks, verbatim, on a tiny byte-level preset
    where `make demo` leaves one (`runs/demo/model`)."""
    from keras_txl.tokenizers import ByteTokenizer

    host_loop, batched, cache = blocks(REPO / "docs" / "generation.md", ("python",))[:3]
    config = keras_txl.TransformerXLConfig(
        vocabulary_size=256, num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32,
        segment_length=8, memory_length=8, dropout=0.0)
    keras_txl.save_preset(keras_txl.TransformerXLCausalLM(config),
                          str(tmp_path / "runs" / "demo" / "model"), tokenizer=ByteTokenizer())
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(host_loop, "generation.md", "exec"), scope)
    ids = scope["ids"]
    assert ids.dtype == np.int32 and ids.shape == (200,)
    # on_token printed every new id as it came, together the continuation's text.
    assert capsys.readouterr().out == scope["tokenizer"].decode(ids.tolist()) + "\n"
    scope = {}
    exec(compile(batched, "generation.md", "exec"), scope)
    assert [(a.dtype, a.shape) for a in scope["new"]] == [(np.int32, (50,))] * 2
    model = scope["model"]
    scope = {"model": model, "prompt_ids": np.array([[1, 2, 3]], np.int32),
             "next_ids": np.array([[4]], np.int32), "n": 3, "np": np}
    exec(compile(cache, "generation.md", "exec"), scope)
    assert sorted(scope["cache"]) == ["keys", "memory", "positions", "values"]
    assert all(len(v) == config.num_layers for v in scope["cache"].values())
    uncached = model.call_with_memory(np.array([[4]], np.int32), scope["memory"])["memory"]
    first = model.call_with_cache(np.array([[4]], np.int32), model.build_cache(scope["memory"]))
    np.testing.assert_allclose(first["memory"], uncached, atol=1e-5)


def test_tests_the_docs_cite_exist():
    """`tests/test_x.py::test_y`, `test_x.py::test_y`, a bare `test_y` and
    `test_y_*` in the docs name tests that exist (in that file, when named):
    reliability.md's rows are each backed by the test they cite."""
    defined = {}
    for path in (REPO / "tests").glob("*.py"):
        for name in re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(encoding="utf-8"), re.M):
            defined.setdefault(name, set()).add(path.name)
    wrong, seen = [], 0
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"(?:(?:tests/)?(test_\w+\.py)::)?(?<![\w/])(test_\w+)(?!\w|\.py)(\*?)", text):
            file, name, star = m.groups()
            seen += 1
            files = (set().union(*(f for n, f in defined.items() if n.startswith(name))) if star
                     else defined.get(name, set()))
            if not files:
                wrong.append(f"{path.name}: no test {name}{star}")
            elif file and file not in files:
                wrong.append(f"{path.name}: {name}{star} is not in tests/{file} ({sorted(files)})")
        wrong += [f"{path.name}: no file tests/{f}" for f in re.findall(r"tests/(\w+\.py)", text)
                  if not (REPO / "tests" / f).is_file()]
    assert seen >= 50
    assert not wrong, "\n".join(wrong)


def test_inline_code_names_exist():
    """`keras_txl.a.b` in inline code resolves, `keras_txl.f(x, y)` names f's
    parameters, `path.py` exists and `path.py::Name` is defined in that file."""
    wrong, seen = [], 0
    for path in DOCS:
        text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
        for double, single in re.findall(r"``(.+?)``|`([^`]+)`", text.replace("\n", " ")):
            span = double or single
            for m in re.finditer(r"(keras_txl(?:\.\w+)+)(?:\(([^()]*)\))?", span):
                if "__main__" in m.group(1):
                    continue  # importing it runs the command line
                seen += 1
                try:
                    target = resolve(m.group(1))
                except (ImportError, AttributeError) as e:
                    wrong.append(f"{path.name}: {m.group(1)}: {e}")
                    continue
                if m.group(2) is None or not callable(target):
                    continue
                parameters = inspect.signature(target).parameters
                if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
                    continue
                names = [a.strip().split("=")[0].strip().lstrip("*") for a in m.group(2).split(",")]
                wrong += [f"{path.name}: {m.group(0)}: no parameter {n!r} ({list(parameters)})"
                          for n in names if re.fullmatch(r"\w+", n) and n not in parameters]
            for file, name in re.findall(r"((?:training|export|keras_txl|tests|benchmarks|tools)"
                                         r"/[\w/]+\.py)(?:::(\w+))?", span):
                seen += 1
                source = REPO / file
                if not source.is_file():
                    wrong.append(f"{path.name}: no file {file}")
                elif name and not re.search(rf"^\s*(?:async def|def|class) {name}\b|^{name}\s*=",
                                   source.read_text(encoding="utf-8"), re.M):
                    wrong.append(f"{path.name}: {file} defines no {name}")
    assert seen >= 50
    assert not wrong, "\n".join(wrong)


def test_generation_shell_commands_run(tmp_path, monkeypatch, capsys):
    """docs/generation.md's `txl generate` and `txl attention`, as written, on
    what `make demo` leaves in runs/demo: the byte-level `tiny` preset."""
    from keras_txl.tokenizers import ByteTokenizer

    runs = [txl_argv(t) for doc, _, t in COMMANDS
            if doc == "generation.md" and txl_argv(t) and "runs/demo" in t]
    assert [argv[0] for argv in runs] == ["generate", "attention"]
    config = keras_txl.TransformerXLConfig.from_preset("tiny")
    keras_txl.save_preset(keras_txl.TransformerXLCausalLM(config),
                          str(tmp_path / "runs" / "demo" / "model"), tokenizer=ByteTokenizer())
    (tmp_path / "some.txt").write_text("Return the value of the thing. " * 10, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(runs[0]) == 0
    assert capsys.readouterr().out.startswith("Return the ")
    assert main(runs[1]) == 0
    written = json.loads((tmp_path / "pictures" / "insight.json").read_text())["files"]
    layers = runs[1][runs[1].index("--layers") + 1].split(",")
    heads = runs[1][runs[1].index("--heads") + 1].split(",")
    assert {f"attention_layer{l}_head{h}.png" for l in layers for h in heads} <= set(written)


def test_data_python_block_runs(tmp_path, monkeypatch):
    """docs/data.md's first block, verbatim (the stdlib corpus, a word tokenizer,
    ordered batches); its loop body `...` is given one batch to look at."""
    code = blocks(REPO / "docs" / "data.md", ("python",))[0]
    code = code.replace("    ...", "    shapes = (inputs.dtype, inputs.shape, targets.shape)\n    break")
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(code, "data.md", "exec"), scope)
    assert scope["train_ids"].dtype == np.int32 and scope["train_ids"].ndim == 1
    assert [str(x) for x in scope["shapes"]] == ["<dtype: 'int32'>", "(16, 64)", "(16, 64)"]
    from keras_txl.tokenizers import load_tokenizer

    loaded = load_tokenizer(tmp_path / "runs" / "demo" / "tokenizer")
    assert loaded.vocabulary_size() == 8000
    np.testing.assert_array_equal(loaded.encode(scope["corpus"].valid), scope["tokenizer"].encode(
        scope["corpus"].valid))
