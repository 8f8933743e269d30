"""Freed host memory goes back to the OS after a trace, not per step."""

import ctypes
import os

import numpy as np
import pytest
import tensorflow as tf
from testing import tiny_config

import keras_txl
from keras_txl import host_memory
from keras_txl.training.config import TrainConfig
from keras_txl.training.loop import Trainer
from keras_txl.training.loop import evaluate


def resident_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(host_memory._MALLOC_TRIM is None or not os.path.exists("/proc/self/statm"),
                    reason="needs glibc's malloc_trim and /proc (Linux)")
def test_release_free_memory_returns_freed_heap_pages_to_the_os():
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block = 16 * 1024  # under the mmap threshold: served from a malloc arena
    blocks = [libc.malloc(block) for _ in range(4096)]  # 64 MB
    for b in blocks:
        ctypes.memset(b, 1, block)
    pin = libc.malloc(block)  # above them: free() alone cannot shrink the heap
    ctypes.memset(pin, 1, block)
    for b in blocks:
        libc.free(b)
    before = resident_mb()
    assert keras_txl.release_free_memory() is True
    after = resident_mb()
    libc.free(pin)
    assert before - after > 32, (before, after)


def _kernel_at_least(major, minor):
    try:
        release = tuple(int(x) for x in os.uname().release.split(".")[:2])
    except (ValueError, AttributeError):
        return False
    return release >= (major, minor)


def mapping_rss_kb(path):
    """Resident kB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                inside = len(fields) > 5 and fields[5] == path
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


@pytest.mark.skipif(host_memory._MADVISE is None or not _kernel_at_least(5, 4),
                    reason="needs Linux 5.4's MADV_PAGEOUT and /proc")
def test_release_library_pages_drops_mapped_file_pages_and_keeps_their_bytes(tmp_path):
    import hashlib
    import mmap

    # A private read-only file mapping like a shared library's text, in a
    # file no other process maps (the kernel keeps pages mapped elsewhere).
    data = np.random.default_rng(0).integers(0, 256, 16 * 2**20, dtype=np.uint8).tobytes()
    path = os.path.realpath(tmp_path / "libfake.so")
    with open(path, "wb") as f:
        f.write(data)
    other = os.path.realpath(tmp_path / "other")
    os.mkdir(other)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
    try:
        digest = hashlib.sha256(mapped).hexdigest()  # every page read: resident
        assert mapping_rss_kb(path) > 15 * 1024
        assert host_memory.release_library_pages([other]) == 0  # not under it: kept
        assert mapping_rss_kb(path) > 15 * 1024
        released = host_memory.release_library_pages([str(tmp_path)])
        assert released > 8 * 2**20, released
        assert mapping_rss_kb(path) < 1024
        # Read back from the file on the next access, unchanged.
        assert hashlib.sha256(mapped).hexdigest() == hashlib.sha256(data).hexdigest() == digest
    finally:
        mapped.close()


def test_library_pages_are_released_once_at_import_unless_switched_off(monkeypatch):
    import subprocess
    import sys

    # After a trace only the C heap is trimmed: reading the library code back after
    # every trace cost more than it saved.
    calls = []
    monkeypatch.setattr(host_memory, "release_library_pages",
                        lambda directories=None: calls.append(1) or 0)
    host_memory.release_free_memory()
    assert calls == []
    # At import, in a fresh process, unless switched off. (What it releases there
    # depends on which pages the test workers share; its effect is the test above's.)
    code = ("import keras_txl.host_memory as m\n"
            "print(type(m.RELEASED_AT_IMPORT).__name__, m.RELEASED_AT_IMPORT or 0)\n")
    for value, expected in (("1", "int"), ("0", "NoneType"), ("off", "NoneType")):
        env = dict(os.environ, KERAS_TXL_RELEASE_LIBRARY_PAGES=value)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=300, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        kind, released = result.stdout.split()[-2:]
        assert kind == expected and int(released) >= 0


def test_release_library_pages_rejects_what_is_not_a_list_of_directories(tmp_path):
    with pytest.raises(ValueError, match=r"`directories` must be a list of directory paths"):
        host_memory.release_library_pages(str(tmp_path))  # one string, not a list
    with pytest.raises(ValueError, match=r"`directories` must be a list of directory paths"):
        host_memory.release_library_pages([str(tmp_path), 3])
    with pytest.raises(ValueError, match=r"`directories` must name existing directories; "
                                         r"not found: \['.*nowhere'\]"):
        host_memory.release_library_pages([str(tmp_path / "nowhere")])


def test_library_directories_hold_tensorflow():
    (directory,) = host_memory.library_directories()
    assert os.path.isfile(os.path.join(directory, "tensorflow", "__init__.py"))


def counting_release(monkeypatch):
    calls = []
    monkeypatch.setattr(host_memory, "release_free_memory", lambda: calls.append(1))
    return calls


def test_compiled_function_releases_once_per_new_trace(monkeypatch):
    calls = counting_release(monkeypatch)
    step = keras_txl.CompiledFunction(lambda x: tf.reduce_sum(x * x, axis=-1))
    x = np.arange(6, dtype="float32").reshape(2, 3)
    for _ in range(3):
        np.testing.assert_allclose(step(tf.constant(x)), (x * x).sum(-1))
    assert step.experimental_get_tracing_count() == 1 and len(calls) == 1
    step(tf.constant(x[:, :2]))  # a new shape: one more trace, one more release
    step(tf.constant(x[:, :2]))
    assert step.experimental_get_tracing_count() == 2 and len(calls) == 2
    concrete = step.get_concrete_function(tf.TensorSpec([None, 3], tf.float32))
    np.testing.assert_allclose(concrete(tf.constant(x)), (x * x).sum(-1))


def test_compiled_function_passes_tf_function_arguments(monkeypatch):
    counting_release(monkeypatch)
    spec = [tf.TensorSpec([None], tf.int32)]
    step = keras_txl.CompiledFunction(lambda x: x + 1, input_signature=spec)
    step(tf.constant([1, 2]))
    step(tf.constant([1, 2, 3]))  # the signature allows any length: no retrace
    assert step.experimental_get_tracing_count() == 1
    with pytest.raises(TypeError):
        step(tf.constant([1.0]))  # float32 does not match the int32 signature


def test_training_and_evaluation_release_after_compiling_only(monkeypatch):
    calls = counting_release(monkeypatch)
    config = tiny_config(vocabulary_size=16, num_layers=1)
    trainer = Trainer(config, TrainConfig(batch_size=2, steps=5, warmup_steps=0),
                      tf.distribute.get_strategy(), verbose=False)
    tokens = np.random.default_rng(0).integers(0, 16, 400)
    trainer.train(tokens)
    assert len(calls) == 1  # five steps, one trace
    evaluate(trainer.model, tokens[:42], batch_size=2)  # 2 streams of 20 targets: 5 x 4
    assert len(calls) == 2
    # A new step (no `reuse`) whose last segment is shorter (19 targets a
    # stream: 4 x 4 + 3): two traces, two releases.
    evaluate(trainer.model, tokens[:40], batch_size=2)
    assert len(calls) == 4


def test_keras_fit_releases_once_per_compiled_function(monkeypatch):
    from keras_txl.training.fit import train_with_fit

    calls = counting_release(monkeypatch)
    config = tiny_config(vocabulary_size=16, num_layers=1)
    # 33 tokens: 2 streams of 15 targets, 3 segments of 4 an epoch; 12 steps
    # are 4 epochs, each followed by a validation pass. The train and the
    # test function are each compiled once: two releases in all.
    tokens = np.random.default_rng(0).integers(0, 16, 33)
    valid = np.random.default_rng(1).integers(0, 16, 41)
    _, history = train_with_fit(config, TrainConfig(batch_size=2, steps=12, warmup_steps=0),
                                tf.distribute.get_strategy(), tokens, valid_tokens=valid,
                                verbose=0)
    assert len(history.history["val_loss"]) == 4
    assert len(calls) == 2


def test_tensorflow_text_is_loaded_on_first_use_only():
    # keras-hub imports tensorflow-text eagerly (117 MB of op libraries);
    # keras-txl defers it: a model without a text tokenizer never maps it,
    # nor does the word tokenizer (TensorFlow's own string ops); the first
    # use of one built on it (ours or through keras-hub's binding) does.
    import subprocess
    import sys

    code = """
import sys
import keras_txl
from testing import tiny_config

def mapped():
    with open("/proc/self/maps") as f:
        return "tensorflow_text" in f.read()

model = keras_txl.TransformerXLCausalLM(tiny_config())
model.call_with_memory([[1, 2, 3]])
import keras_hub.src.utils.tensor_utils as hub_utils
print("model", type(sys.modules["tensorflow_text"]).__name__, mapped())
from keras_txl.tokenizers import CharTokenizer
from keras_txl.tokenizers import WordTokenizer
tokenizer = WordTokenizer(vocabulary=["<eos>", "<unk>", "the", "cat"])
print("word", tokenizer.tokenize("the cat dog").numpy().tolist(), mapped())
tokenizer = CharTokenizer(vocabulary=["<unk>", "a", "b"])
print("ids", tokenizer.tokenize("abc").numpy().tolist(), mapped())
import tensorflow_text
print("hub", hub_utils.tf_text.WhitespaceTokenizer is tensorflow_text.WhitespaceTokenizer)
"""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=tests_dir + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["model"] == "_DeferredModule False"
    assert lines["word"] == "[2, 3, 1] False"
    assert lines["ids"] == "[1, 2, 0] True"
    assert lines["hub"] == "True"


def test_register_text_ops_loads_tensorflow_text():
    import subprocess
    import sys

    code = ("import sys, keras_txl\n"
            "from tensorflow.python.framework import op_def_registry\n"
            "before = op_def_registry.get('RegexSplitWithOffsets') is not None\n"
            "keras_txl.register_text_ops()\n"
            "print(type(sys.modules['tensorflow_text']).__name__, before,"
            " op_def_registry.get('RegexSplitWithOffsets') is not None)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["module", "False", "True"]
