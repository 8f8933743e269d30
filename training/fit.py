"""Training through Keras `compile` / `fit` with the stateful model.

The memory lives in the model's per-replica variable and is carried from
batch to batch (each batch row continues the same text stream), reset at
the start of every pass over the text (a Keras epoch) and around
evaluation by `FitSteps`, a `ResetMemory`. Use this path
for the default and Mirrored strategies; Keras 3's `fit` is broken under
MultiWorkerMirroredStrategy (shared/TF_NOTES.md section 3): use the custom
loop (`keras_txl.training.loop.Trainer`) there.

Note: Keras clips gradients per replica before summing them, so with
`clip_norm` and several replicas `fit` is not bit-equal to one device;
the custom loop is (it sums, then clips).

Steps: `train_config.steps` train steps (batches), counted here, not by
`optimizer.iterations`, and checkpoints are numbered by them, as in the
custom loop. mixed_float16: the optimizer is the set-up's
`LossScaleOptimizer` (Keras' `compile` keeps it, its train step scales the
loss); an update it skips is still a step (the batch was read) but does not
advance `optimizer.iterations`, which drives the learning-rate schedule.

Resuming: a checkpoint records the data position (`loop.data_position`)
and the memory of every replica; a resumed run is refused or warned about
by the custom loop's checks (`loop.check_model_config`,
`check_train_config`, `check_data_position`), then continues at the same
segment of the text with the restored memory: the same steps on the same
batches as an uninterrupted run.
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
from keras_txl.training.checkpoint import tokenizer_record
from keras_txl.training.data import LMBatches
from keras_txl.training.data import lm_dataset
from keras_txl.training.loop import StopOnSignals
from keras_txl.training.loop import TrainingInterrupted
from keras_txl.training.loop import check_data_position
from keras_txl.training.loop import check_model_config
from keras_txl.training.loop import check_train_config
from keras_txl.training.loop import checked_tokens
from keras_txl.training.loop import data_position
from keras_txl.training.loop import drop_metrics_after
from keras_txl.training.loop import write_failed
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


class FitSteps(ResetMemory):
    """Counts `fit`'s train steps from the resumed one and keeps the memory
    right: a Keras epoch that starts a pass over the text starts from a zero
    memory, but the first one of a run resumed inside a pass continues with
    the restored memory (`ResetMemory` zeroes it at every epoch start).
    Ends `fit` at step `total`, or after the current step once SIGINT/SIGTERM
    arrived (the flag `StopOnSignals` sets; the same handling as the custom
    loop)."""

    def __init__(self, step, total, steps_per_epoch, signals):
        super().__init__()
        self.step = step
        self.total = total
        self.steps_per_epoch = steps_per_epoch
        self.signals = signals

    def on_epoch_begin(self, epoch, logs=None):
        if self.step % self.steps_per_epoch == 0:
            self.model.reset_memory()

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step >= self.total or self.signals.received:
            self.model.stop_training = True


class CheckpointCallback(keras.callbacks.Callback):
    """Atomic checkpoints (model, optimizer, memory, step, data position)
    every N steps, at the last step and at a step a signal stops: written
    at the end of the step, before Keras' validation zeroes the memory."""

    def __init__(self, manager, strategy, every, total, steps, state):
        super().__init__()
        self.manager = manager
        self.strategy = strategy
        self.every = every
        self.total = total
        self.steps = steps  # the FitSteps callback, which runs before this one
        self.state = state  # step -> the checkpoint's state dict
        self.saved = None  # (step, path) of the last checkpoint written

    def on_train_batch_end(self, batch, logs=None):
        step = self.steps.step
        if ((self.every and step % self.every == 0) or step == self.total
                or self.steps.signals.received):
            self.save()

    def save(self):
        step = self.steps.step
        path = self.manager.save(step, self.model, self.model.optimizer,
                                 memory_numpy(self.model, self.strategy),
                                 self.state(step))
        self.saved = (step, path)
        return path


def memory_numpy(model, strategy):
    """The stateful memory of every local replica, (B, L, M, D): replica r's
    rows [r*b, (r+1)*b), the layout of the custom loop's checkpoints (the
    variable itself reads as the first replica's only)."""
    parts = strategy.experimental_local_results(model.memory.value)
    return np.concatenate([np.asarray(p.numpy()) for p in parts])


def set_memory(model, strategy, memory):
    """Puts `memory_numpy`'s array back, each replica its own rows."""
    parts = strategy.experimental_local_results(model.memory.value)
    for part, rows in zip(parts, np.split(memory, len(parts))):
        part.assign(rows)


def fit_calls(start, total, steps_per_epoch):
    """The `model.fit` calls that run steps [start, total), as
    (initial_epoch, epochs, steps_per_epoch, start_segment) tuples.

    A Keras epoch is one pass over the text (validation and the memory reset
    come at its ends), but every epoch of one `fit` call has the same
    length: a pass begun before a resume, and a last pass cut short by
    `total`, each get a call of their own (so Keras' progress shows the
    steps they run).
    """
    calls = []
    step = start
    while step < total:
        epoch, segment = divmod(step, steps_per_epoch)
        passes = (total - step) // steps_per_epoch
        if segment == 0 and passes:
            calls.append((epoch, epoch + passes, steps_per_epoch, 0))
            step += passes * steps_per_epoch
        else:
            length = min(steps_per_epoch - segment, total - step)
            calls.append((epoch, epoch + 1, length, segment))
            step += length
    return calls


class StepTensorBoard(keras.callbacks.TensorBoard):
    """Keras' TensorBoard callback, its per-batch summaries at the run's
    step: Keras counts batches from 0 at every `fit` call, so a resumed run
    would write them over the first steps' (`_global_train_batch` is the
    count Keras 3's callback increments before each batch)."""

    def __init__(self, steps, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps = steps

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self._global_train_batch = self.steps.step


def train_with_fit(model_config, train_config, strategy, train_tokens,
                   valid_tokens=None, workdir=None, tokenizer=None, verbose=1):
    """Trains with `model.fit`; returns (model, keras History).

    Runs `train_config.steps` steps in all: a Keras epoch is one pass over
    the training text, the last one partial when the steps end inside a
    pass. With a `workdir` holding a checkpoint it resumes: the custom
    loop's checks first (nothing in the workdir changes if one refuses),
    then from the checkpoint's step at the same place in the text. The
    History holds the epochs of this call (a resumed pass's metrics cover
    its steps after the checkpoint).
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
    V = model_config.vocabulary_size
    train_tokens = checked_tokens(train_tokens, V, "train_tokens")
    if valid_tokens is not None:
        valid_tokens = checked_tokens(valid_tokens, V, "valid_tokens")
    layout = LMBatches(len(train_tokens), B, T, num_replicas=replicas,
                       name="The train split")
    per_epoch = layout.steps_per_epoch
    data_key = getattr(train_tokens, "key", None)
    manager = found = None
    if workdir:
        manager = CheckpointManager(
            os.path.join(workdir, "checkpoints"), train_config.keep_checkpoints
        )
        # The newest intact checkpoint: a damaged newest one is skipped with a
        # warning (verified against its manifest), as in the custom loop.
        found = manager.newest_intact()
        if found:
            latest, _, state = found
            check_model_config(latest, state.get("model_config"), model_config)
            check_train_config(latest, state.get("train_config") or {}, train_config,
                               state.get("precision"))
            check_data_position(latest, state.get("data"), layout, data_key)
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
    step = 0
    if found:
        latest, tensors, state = found
        with strategy.scope():
            assign_tensors(tensors, model, model.optimizer, source=latest)
            memory = tensors.get("memory")
            if memory is not None and memory.shape == memory_numpy(model, strategy).shape:
                set_memory(model, strategy, memory)
            elif int(state["step"]) % per_epoch:
                # Written before checkpoints held every replica's memory.
                logger.warning("%s holds no memory for %d replicas of batch %d: "
                               "the resumed pass continues from a zero memory.",
                               latest, replicas, B // replicas)
        step = int(state["step"])
        if workdir:  # one process (no MultiWorker with fit): the chief
            drop_metrics_after(workdir, step)  # rows a custom-loop run logged past it
        logger.info("Resumed from %s at step %d (segment %d of pass %d).", latest,
                    step, step % per_epoch, step // per_epoch + 1)
    total = train_config.steps
    with StopOnSignals() as signals:
        steps = FitSteps(step, total, per_epoch, signals)
        callbacks = [steps, ReleaseCompilationMemory()]
        checkpoint = None
        if workdir:
            model_config.to_json(os.path.join(workdir, "config.json"))
            with open(os.path.join(workdir, "train_config.json"), "w") as f:
                f.write(train_config.to_json() + "\n")  # as the custom loop

            recorded = tokenizer_record(tokenizer)

            def state_at(at):
                return {"model_config": model_config.to_dict(),
                        "train_config": train_config.to_dict(), "loop": "fit",
                        "precision": model.dtype_policy.name,
                        "data": data_position(layout, at, data_key), **recorded}

            checkpoint = CheckpointCallback(
                manager, strategy, train_config.checkpoint_every, total, steps, state_at)
            callbacks.append(checkpoint)
            callbacks.append(StepTensorBoard(
                steps, os.path.join(workdir, "tensorboard"),
                update_freq=train_config.log_every))
        history = None
        for initial_epoch, epochs, steps_per_epoch, segment in fit_calls(
                step, total, per_epoch):
            # The same ordered segments as the custom loop, from the resumed one.
            train_ds = lm_dataset(train_tokens, B, T, num_replicas=replicas,
                                  repeat=True, start_segment=segment,
                                  name="The train split")
            part = model.fit(
                train_ds, epochs=epochs, steps_per_epoch=steps_per_epoch,
                initial_epoch=initial_epoch, validation_data=valid_ds, shuffle=False,
                callbacks=callbacks, verbose=verbose,
            )
            if history is None:
                history = part
            else:
                history.epoch += part.epoch
                for key, values in part.history.items():
                    history.history.setdefault(key, []).extend(values)
            if signals.received:
                break
    if history is None:  # no step to run
        history = keras.callbacks.History()
        history.set_model(model)
        history.on_train_begin()
    path = None
    if checkpoint is not None:
        if checkpoint.saved and checkpoint.saved[0] == steps.step:
            path = checkpoint.saved[1]  # written before the validation
        elif found and int(found[2]["step"]) == steps.step:
            path = found[0]  # no step ran: resumed at or past `steps`
        else:  # a signal during a validation, at the end of a pass
            checkpoint.set_model(model)
            path = checkpoint.save()
        folder = os.path.join(workdir, "model")
        try:
            save_preset(model, folder, tokenizer=tokenizer)
        except OSError as e:
            raise write_failed(f"the model folder {folder}", steps.step, manager, e) from e
    if signals.received:
        raise TrainingInterrupted(signals.received, steps.step, total, path)
    return model, history
