"""Training through Keras `compile` / `fit` with the stateful model.

The memory lives in the model's per-replica variable and is carried from
batch to batch (each batch row continues the same text stream), reset at
every epoch start and around evaluation by `ResetMemory`. Use this path
for the default and Mirrored strategies; Keras 3's `fit` is broken under
MultiWorkerMirroredStrategy (shared/TF_NOTES.md section 3): use the custom
loop (`keras_txl.training.loop.Trainer`) there.

Note: Keras clips gradients per replica before summing them, so with
`clip_norm` and several replicas `fit` is not bit-equal to one device;
the custom loop is (it sums, then clips).

mixed_float16: the optimizer is the set-up's `LossScaleOptimizer` (Keras'
`compile` keeps it, its train step scales the loss). An update it skips
does not advance `optimizer.iterations`, which numbers `fit`'s checkpoints:
they count applied updates.
"""

import logging
import os

import keras
import numpy as np
import tensorflow as tf
from keras_hub.metrics import Perplexity  # on log-probs as logits: log_softmax is the identity on them

from keras_txl import host_memory
from keras_txl.causal_lm import ResetMemory
from keras_txl.io import save_preset
from keras_txl.training.checkpoint import CheckpointManager
from keras_txl.training.checkpoint import assign_tensors
from keras_txl.training.data import LMBatches
from keras_txl.training.data import lm_dataset
from keras_txl.training.loop import StopOnSignals
from keras_txl.training.loop import TrainingInterrupted
from keras_txl.training.metrics import BitsPerCharacter
from keras_txl.training.metrics import TokenNLL
from keras_txl.training.optimizers import setup_model_and_optimizer
from keras_txl.training.strategy import resolve_jit_compile
from keras_txl.training.strategy import strategy_jit_scope

logger = logging.getLogger(__name__)


class ReleaseCompilationMemory(keras.callbacks.Callback):
    """Returns what compiling Keras' train and test functions freed to the OS.

    The `fit` counterpart of `keras_txl.CompiledFunction`: `fit` traces its
    train function at the first batch and its test function at the first
    validation batch; after each, `release_free_memory()` runs once.
    """

    def __init__(self):
        super().__init__()
        self.released = set()

    def _once(self, phase):
        if phase not in self.released:
            self.released.add(phase)
            host_memory.release_free_memory()

    def on_train_batch_end(self, batch, logs=None):
        self._once("train")

    def on_test_batch_end(self, batch, logs=None):
        self._once("test")


class CheckpointCallback(keras.callbacks.Callback):
    """Atomic checkpoints (model, optimizer, memory, step) every N steps."""

    def __init__(self, manager, every, model_config, train_config):
        super().__init__()
        self.manager = manager
        self.every = every
        self.model_config = model_config
        self.train_config = train_config
        self.step = 0

    def on_train_batch_end(self, batch, logs=None):
        self.step = int(self.model.optimizer.iterations.numpy())
        if self.every and self.step % self.every == 0:
            self.save()

    def save(self):
        memory = self.model.memory.numpy()
        return self.manager.save(
            self.step, self.model, self.model.optimizer, memory,
            {"model_config": self.model_config.to_dict(),
             "train_config": self.train_config.to_dict(), "loop": "fit"},
        )


class StopOnSignal(keras.callbacks.Callback):
    """Ends `fit` after the current step once SIGINT/SIGTERM arrived (the
    flag `StopOnSignals` sets; the same handling as the custom loop)."""

    def __init__(self, signals):
        super().__init__()
        self.signals = signals

    def on_train_batch_end(self, batch, logs=None):
        if self.signals.received:
            self.model.stop_training = True


def train_with_fit(model_config, train_config, strategy, train_tokens,
                   valid_tokens=None, workdir=None, tokenizer=None, verbose=1):
    """Trains with `model.fit`; returns (model, keras History).

    Epochs are passes over the training text; `train_config.steps` is the
    total number of optimizer steps (the last epoch may be partial).
    """
    replicas = strategy.num_replicas_in_sync
    B, T = train_config.batch_size, model_config.segment_length
    if B % replicas:
        raise ValueError(
            f"batch_size={B} is not divisible by the {replicas} replicas of "
            f"the strategy; use a multiple of {replicas}."
        )
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        raise ValueError(
            "Keras fit is broken under MultiWorkerMirroredStrategy in Keras 3 "
            "(tensorflow/tensorflow#72388); use loop='custom'."
        )
    # Global batches: Keras distributes each one by rows, in order, so
    # replica r keeps rows [r*b, (r+1)*b) of every batch, its own streams.
    # (No `repeat=True`: an epoch of `fit` is one pass over the text,
    # `.repeat()` below chains the passes.)
    train_ds = lm_dataset(train_tokens, B, T, num_replicas=replicas,
                          name="The train split")
    per_epoch = LMBatches(len(train_tokens), B, T).steps_per_epoch
    # Keras compiles the function strategy.run runs on each replica: XLA
    # with one replica, or with several when all are GPUs
    # (keras_txl.training.strategy.jit_compile_scope).
    # "auto" (resolve_jit_compile: on GPUs and TPUs) only with one replica:
    # Keras' compiled step applies the update inside the replica function,
    # where TensorFlow's merge_call for the optimizer's step counter fails on
    # GPUs (the custom loop applies it outside, training/loop.py).
    requested = train_config.jit_compile is True or (
        resolve_jit_compile(train_config.jit_compile, strategy) and replicas == 1)
    jit = requested and (
        replicas == 1 or strategy_jit_scope(strategy) == "replica")
    if requested and not jit:
        logger.warning(
            "jit_compile is not used under %s on CPU (XLA cannot reach the "
            "other replicas' variables, shared/TF_NOTES.md section 2); it is "
            "used when every replica is a GPU.", type(strategy).__name__)
    model, optimizer = setup_model_and_optimizer(
        model_config, train_config, strategy, clip_gradients=True,
        stateful=True, batch_size=B // replicas,
    )
    with strategy.scope():
        model.compile(
            optimizer=optimizer, loss=TokenNLL(),
            metrics=[Perplexity(from_logits=True, name="ppl"), BitsPerCharacter()],
            weighted_metrics=None, jit_compile=jit,
        )
    valid_ds = None
    if valid_tokens is not None:
        valid_ds = lm_dataset(valid_tokens, B, T, num_replicas=replicas,
                              name="The valid split")
    callbacks = [ResetMemory(), ReleaseCompilationMemory()]
    manager = checkpoint = None
    initial_epoch = 0
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        model_config.to_json(os.path.join(workdir, "config.json"))
        manager = CheckpointManager(
            os.path.join(workdir, "checkpoints"), train_config.keep_checkpoints
        )
        # The newest intact checkpoint: a damaged newest one is skipped with a
        # warning (verified against its manifest), as in the custom loop.
        found = manager.newest_intact()
        if found:
            latest, tensors, state = found
            with strategy.scope():
                assign_tensors(tensors, model, model.optimizer, source=latest)
            initial_epoch = int(state["step"]) // min(per_epoch, train_config.steps)
            logger.info("Resumed from %s (epoch %d).", latest, initial_epoch)
        checkpoint = CheckpointCallback(
            manager, train_config.checkpoint_every, model_config, train_config)
        callbacks.append(checkpoint)
        callbacks.append(keras.callbacks.TensorBoard(
            os.path.join(workdir, "tensorboard"), update_freq=train_config.log_every))
    # A Keras "epoch" is one pass over the text (or all the steps, if fewer).
    chunk = min(per_epoch, train_config.steps)
    epochs = int(np.ceil(train_config.steps / chunk))
    with StopOnSignals() as signals:
        history = model.fit(
            train_ds.repeat(), epochs=epochs, steps_per_epoch=chunk,
            initial_epoch=initial_epoch, validation_data=valid_ds, shuffle=False,
            callbacks=callbacks + [StopOnSignal(signals)], verbose=verbose,
        )
    path = None
    if checkpoint is not None:
        checkpoint.step = int(model.optimizer.iterations.numpy())
        path = checkpoint.save()
        save_preset(model, os.path.join(workdir, "model"), tokenizer=tokenizer)
    if signals.received:
        raise TrainingInterrupted(signals.received, int(model.optimizer.iterations.numpy()),
                                  train_config.steps, path)
    return model, history
