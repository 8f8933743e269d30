"""The custom training loop: a `tf.function` step run by `strategy.run`.

Works the same under the default, Mirrored, MultiWorkerMirrored and TPU
strategies. The memory is explicit loop state (one tensor per replica,
never copied to the host between steps), fed to the stateless core and
replaced by the new memory it returns, exactly as the TPU version of the
official code carries its `cache`.

Exactness across strategies: gradients are summed over replicas first,
then clipped by their global norm (the paper's 0.25), then applied, so a
step on R replicas equals a step on one device with the same global batch.

mixed_float16: the loss is scaled and the gradients handed to Keras'
`LossScaleOptimizer`, which unscales them, skips the update when they
overflowed and adjusts the scale. Such a skip is normal, not a bad step for
the non-finite guard (`on_non_finite`), which still acts on a non-finite
loss and leaves the loss scale as it was before the step it handles.

Shape legend: B global batch, b = B / R per-replica batch, T segment,
L layers, M memory, D hidden_dim.
"""

import json
import logging
import math
import os
import signal
import threading
import time

import keras
import numpy as np
import tensorflow as tf

from keras_txl.fusion import fused_kernels
from keras_txl.host import xla_evaluation_pays
from keras_txl.host_memory import CompiledFunction
from keras_txl.io import save_preset
from keras_txl.training.checkpoint import CheckpointManager
from keras_txl.training.checkpoint import assign_tensors
from keras_txl.training.checkpoint import tokenizer_record
from keras_txl.training.data import LMBatches
from keras_txl.training.data import distributed_lm_dataset
from keras_txl.training.data import lm_dataset
from keras_txl.training.metrics import LN2
from keras_txl.training.optimizers import inner_optimizer
from keras_txl.training.optimizers import loss_scale_optimizer
from keras_txl.training.optimizers import setup_model_and_optimizer
from keras_txl.training.progress import TrainingProgress
from keras_txl.training.schedules import learning_rate_schedule
from keras_txl.training.strategy import is_chief
from keras_txl.training.strategy import resolve_jit_compile
from keras_txl.training.strategy import strategy_jit_scope

logger = logging.getLogger(__name__)

# The largest loss whose perplexity exp(loss) is a finite float32 (what
# tf.summary stores): above it the perplexity is reported as inf.
MAX_FINITE_PPL_LOSS = math.log(np.finfo(np.float32).max)  # 88.72


def perplexity(loss):
    """exp(loss), or inf where it would overflow float32 (never raises)."""
    if not math.isfinite(loss):
        return float("nan") if math.isnan(loss) else float("inf")
    return math.exp(loss) if loss <= MAX_FINITE_PPL_LOSS else float("inf")


class TrainingInterrupted(Exception):
    """Training stopped on SIGINT/SIGTERM after a step; the checkpoint and
    the model folder of that step were written."""

    def __init__(self, signal_name, step, total, checkpoint):
        self.signal_name = signal_name
        self.step = step
        self.total = total
        self.checkpoint = checkpoint
        super().__init__(
            f"Stopped on {signal_name} after step {step} of {total}; "
            f"checkpoint {checkpoint or '(none: no workdir)'}."
        )


class EvaluationStopped(Exception):
    """`evaluate(..., stop=...)` ended before the end of the text because
    `stop()` returned true (the trainer's SIGINT/SIGTERM flag)."""


class StopOnSignals:
    """Turns SIGINT/SIGTERM into a flag read after each step, and after
    each segment of an evaluation (main thread only; elsewhere signals keep
    their default behaviour).

    A second SIGINT/SIGTERM exits the process at once (exit 130 / 143),
    even while the main thread is blocked inside a TensorFlow op (a
    MultiWorker collective waiting for a lost peer, a stuck input op):
    Python runs signal handlers only between bytecodes of the main thread,
    so the handler above cannot see that second signal until the op
    returns. Python's C-level handler still writes every signal number to
    the wakeup fd (`signal.set_wakeup_fd`) at once; a thread reading it
    counts them. Exiting there loses only the step in flight: checkpoints,
    the model folder and metrics.jsonl are written whole or not at all."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self):
        self.received = None
        self._previous = {}
        self._wakeup = None  # (read fd, write fd, the wakeup fd we replaced)

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.received:
            logger.warning("%s again: exiting now.", name)
            return
        self.received = name
        logger.warning("%s: stopping after the current step (writing a checkpoint and the "
                       "model folder). Send it again to exit at once; the checkpoints already "
                       "written are kept.", name)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                number = getattr(signal, name)
                self._previous[number] = signal.signal(number, self._handle)
            self._watch_second_signal()
        return self

    def _watch_second_signal(self):
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # the C handler must never block
        try:
            replaced = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except (ValueError, OSError):  # pragma: no cover - main thread checked above
            os.close(read_fd)
            os.close(write_fd)
            return
        self._wakeup = (read_fd, write_fd, replaced)
        threading.Thread(target=self._count_signals, args=(read_fd, replaced),
                         name="txl-second-signal", daemon=True).start()

    @classmethod
    def _count_signals(cls, read_fd, replaced):
        numbers = {getattr(signal, name) for name in cls.SIGNALS}
        seen = 0
        try:
            while True:
                data = os.read(read_fd, 64)
                if not data:  # __exit__ closed the write end
                    return
                if replaced >= 0:  # whoever had the wakeup fd still gets its bytes
                    try:
                        os.write(replaced, data)
                    except OSError:
                        pass
                for number in data:
                    if number not in numbers:
                        continue
                    seen += 1
                    if seen >= 2:
                        name = signal.Signals(number).name
                        # Not `logging`: the main thread may hold its lock.
                        os.write(2, (f"{name} again: exiting now, without waiting for the "
                                     "current step. The checkpoints already written are "
                                     "complete; the same command resumes from the newest."
                                     "\n").encode())
                        os._exit(130 if number == signal.SIGINT else 143)
        finally:
            os.close(read_fd)

    def __exit__(self, *exc):
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        if self._wakeup is not None:
            _, write_fd, replaced = self._wakeup
            signal.set_wakeup_fd(replaced)
            os.close(write_fd)  # the watching thread reads EOF and ends
            self._wakeup = None
        return False


# --- resuming: one set of checks for both loops ---------------------------
def checkpoint_step(path):
    """The step in a checkpoint folder's name (`ckpt-00000050`: 50), or 0."""
    name = os.path.basename(os.path.normpath(path))
    digits = name.rsplit("-", 1)[-1]
    return int(digits) if digits.isdigit() else 0


def check_model_config(path, saved, model_config):
    """Refuses checkpoint `path` written for another model config (`saved`,
    its `model_config` dict; None for checkpoints that did not record it),
    naming every key that differs with both values."""
    if saved is None:
        return
    # Through JSON, as state.json stored it (tuples read back as lists).
    current = json.loads(json.dumps(model_config.to_dict()))
    if saved == current:
        return
    missing = "(not set)"
    changed = ", ".join(
        f"{key} {saved.get(key, missing)!r} -> {current.get(key, missing)!r}"
        for key in sorted(set(saved) | set(current))
        if saved.get(key, missing) != current.get(key, missing))
    raise ValueError(
        f"{path} was written for another model config: {changed} (checkpoint "
        "-> this run). Pass the checkpoint's values to resume it, or train in "
        "a new --workdir."
    )


def check_train_config(path, saved, train_config, trained_in=None):
    """Refuses a resume that would silently change the data stream (another
    batch size); says what a changed step count does to the schedule and
    lists the other changed training settings. `saved`: the checkpoint's
    `train_config` dict; `trained_in`: the precision its steps computed in
    (the state's "precision", the model's dtype policy; None in checkpoints
    before the twenty-fifth session), which `precision="auto"` may resolve
    otherwise on this host."""
    cfg = train_config
    saved_batch = saved.get("batch_size", cfg.batch_size)
    if saved_batch != cfg.batch_size:
        raise ValueError(
            f"{path} was written with batch_size={saved_batch}; resuming "
            f"with batch_size={cfg.batch_size} would restart the memory "
            "and the position in the text. Resume with --batch-size "
            f"{saved_batch}, or train in a new --workdir."
        )
    saved_steps = saved.get("steps", cfg.steps)
    at = checkpoint_step(path)
    if at is not None and cfg.steps <= at:
        logger.warning(
            "%s is at step %d, and this run has steps=%d: nothing to train (pass "
            "--steps above %d to train on; the checkpoint is left as it is).",
            path, at, cfg.steps, at)
    elif saved_steps != cfg.steps:
        before = learning_rate_schedule(
            saved.get("learning_rate", cfg.learning_rate),
            saved.get("warmup_steps", cfg.warmup_steps),
            saved_steps,
            saved.get("min_lr_ratio", cfg.min_lr_ratio))
        after = learning_rate_schedule(cfg.learning_rate, cfg.warmup_steps,
                                       cfg.steps, cfg.min_lr_ratio)
        logger.warning(
            "%s was trained for a schedule of %d steps; this run has "
            "steps=%d, so the cosine learning-rate schedule is stretched "
            "to end at step %d (at the checkpoint's step the learning "
            "rate goes from %.3g to %.3g). Pass --steps %d to keep the "
            "original schedule.", path, saved_steps, cfg.steps, cfg.steps,
            float(before(at)), float(after(at)), saved_steps,
        )
    current = cfg.to_dict()
    changed = sorted(
        k for k, v in saved.items()
        if k not in ("steps", "batch_size") and k in current and current[k] != v
    )
    if changed:
        logger.warning(
            "Resuming %s with changed training settings: %s.", path,
            ", ".join(f"{k} {saved[k]!r} -> {current[k]!r}" for k in changed),
        )
    if trained_in is not None and cfg.precision == "auto" == saved.get("precision"):
        # The same setting, another host: "auto" follows the CPU or GPU.
        from keras_txl.training.optimizers import resolve_precision

        now = resolve_precision("auto")
        if now != trained_in:
            logger.warning(
                "%s was trained in %s (precision='auto' on the host that trained it); "
                "on this host 'auto' picks %s, so the resumed steps compute in %s. Pass "
                "--precision %s to resume in the checkpoint's precision.",
                path, trained_in, now, now, trained_in)


def write_failed(what, step, checkpoints, error):
    """The error of a write that failed mid-run (a full disk): what was
    written, and the checkpoint a resume starts from (a bare "[Errno 28] No
    space left on device" named neither). `checkpoints`: the run's
    CheckpointManager, or None."""
    latest = checkpoints.latest() if checkpoints else None
    kept = (f"the newest checkpoint, {latest} (step {checkpoint_step(latest)}), "
            "is intact" if latest else "no checkpoint was written yet")
    return OSError(
        f"Writing {what} failed at step {step} ({error.strerror or error}); "
        f"{kept}: free some space and resume with the same `txl train` command.")


def drop_metrics_after(workdir, step):
    """A resume replays the steps after the checkpoint (or, with `--loop
    fit`, which logs no rows, trains them again): remove their rows from
    WORKDIR/metrics.jsonl so that each step is logged once and none is
    shown that the resumed state did not train."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = f.readlines()
    kept = []
    for line in lines:
        try:
            row_step = json.loads(line).get("step", 0)
        except (ValueError, AttributeError):
            continue  # a line cut by a kill
        if row_step <= step:
            kept.append(line if line.endswith("\n") else line + "\n")
    if len(kept) != len(lines):
        from keras_txl.io import atomic_write_bytes

        atomic_write_bytes(path, "".join(kept).encode())
        logger.info("metrics.jsonl: dropped %d row(s) logged after step %d "
                    "(they are logged again).", len(lines) - len(kept), step)


def data_position(layout, step, data_key):
    """What a checkpoint records of the train data (`state["data"]`): the
    position in every stream after `step` steps. Stream b of the train split
    is tokens [b*S, (b+1)*S); the next batch reads offset segment*T."""
    return {
        "train_tokens": layout.num_tokens,
        "streams": layout.batch_size,
        "tokens_per_stream": layout.tokens_per_stream,
        "segment": step % layout.steps_per_epoch,
        "shards_key": data_key,
    }


def check_data_position(path, saved, layout, data_key):
    """A checkpoint's data position (`saved`, its `state["data"]`; None when
    it recorded none) is only valid for the same train split: refuses one
    written while reading another. `layout`: this run's `LMBatches`."""
    if not saved:
        return
    if saved.get("train_tokens") != layout.num_tokens or (
            saved.get("shards_key") and data_key
            and saved["shards_key"] != data_key):
        raise ValueError(
            f"{path} was written while reading a train split of "
            f"{saved.get('train_tokens')} tokens (shards key "
            f"{saved.get('shards_key')}); this run's has {layout.num_tokens} "
            f"(key {data_key}), so its position in the text would not "
            "be the same. Train with the data it was written with, or in a "
            "new --workdir."
        )


# --- the trainer ---------------------------------------------------------
class Trainer:
    """Trains a `TransformerXLCausalLM` with the custom loop.

    Args:
        model_config: `TransformerXLConfig`.
        train_config: `TrainConfig`.
        strategy: a `tf.distribute` strategy.
        workdir: str or None. Checkpoints, logs, TensorBoard and the final
            model folder go here (only the chief writes).
        tokenizer: optional, saved beside the model.
    """

    def __init__(self, model_config, train_config, strategy, workdir=None,
                 tokenizer=None, verbose=True):
        self.model_config = model_config
        self.config = train_config
        self.strategy = strategy
        self.workdir = workdir
        self.tokenizer = tokenizer
        self.verbose = verbose
        # Bits per token are named after what a token is (bpc only for
        # characters and bytes; bits_per_word for a word-level run).
        self.bits_name = "bpc"
        if tokenizer is not None and os.path.isdir(tokenizer):
            from keras_txl.tokenizers import load_tokenizer

            self.bits_name = load_tokenizer(tokenizer).bits_metric
        replicas = strategy.num_replicas_in_sync
        if train_config.batch_size % replicas:
            raise ValueError(
                f"batch_size={train_config.batch_size} is not divisible by the "
                f"{replicas} replicas of the strategy; use a multiple of {replicas}."
            )
        self.per_replica_batch = train_config.batch_size // replicas
        self.chief = is_chief(strategy)
        # The step clips the gradients summed over replicas itself.
        self.model, self.optimizer = setup_model_and_optimizer(
            model_config, train_config, strategy, clip_gradients=False
        )
        self.schedule = learning_rate_schedule(  # the optimizer's, for logs
            train_config.learning_rate, train_config.warmup_steps,
            train_config.steps, train_config.min_lr_ratio,
        )
        self.step = 0
        self.memory = self._zero_memory()
        self.checkpoints = None
        if workdir:
            # Every worker reads checkpoints (resume); only the chief writes.
            self.checkpoints = CheckpointManager(
                os.path.join(workdir, "checkpoints"), train_config.keep_checkpoints
            )
        # mixed_float16: the LossScaleOptimizer (else None).
        self.loss_scaler = loss_scale_optimizer(self.optimizer)
        self.loss_scale_skips = 0  # updates skipped by loss scaling (normal)
        # Where XLA compiles the step (training.strategy.jit_compile_scope):
        # the whole step; or, under Mirrored/MultiWorker on GPUs, the replica
        # function given to strategy.run; not at all with CPU replicas.
        self.jit_scope = "none"
        if resolve_jit_compile(train_config.jit_compile, strategy):
            self.jit_scope = strategy_jit_scope(strategy)
            if self.jit_scope == "none":
                logger.warning(
                    "jit_compile is not used under %s on CPU (XLA cannot reach "
                    "the other replicas' variables, shared/TF_NOTES.md section "
                    "2); it is used when every replica is a GPU.",
                    type(strategy).__name__,
                )
        # Compiled once; the tracing's freed scratch goes back to the OS.
        self._train_step = CompiledFunction(
            self._train_step_fn, jit_compile=self.jit_scope == "step")
        self._eval_reuse = {}  # compiled evaluation steps, kept across evaluations
        self.history = []
        self.final_eval = None  # train(final_eval_settings=...)'s result

    # --- memory ---------------------------------------------------------
    def _zero_memory(self):
        shape = self.model.memory_shape(self.per_replica_batch)
        return self.strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.zeros(shape, tf.float32)
        )

    def memory_numpy(self):
        """The memory of all local replicas, (b * local replicas, L, M, D)."""
        parts = self.strategy.experimental_local_results(self.memory)
        return np.concatenate([p.numpy() for p in parts])

    def _set_memory(self, array):
        parts = np.split(array, len(self.strategy.experimental_local_results(self.memory)))

        def value_fn(ctx):
            return tf.constant(parts[ctx.replica_id_in_sync_group % len(parts)])

        self.memory = self.strategy.experimental_distribute_values_from_function(value_fn)

    # --- one step -------------------------------------------------------
    def _train_step_fn(self, inputs, targets, memory):
        cfg = self.config
        model = self.model
        # mixed_float16: Keras' LossScaleOptimizer scales the loss, then
        # unscales the gradients, skips the update when they overflowed and
        # adjusts its scale (`apply_gradients`); None otherwise.
        scaler = self.loss_scaler

        def gradients_fn(x, y, mem):
            global_tokens = float(cfg.batch_size * x.shape[-1])
            variables = model.trainable_variables
            # The scale this step's gradients carry (read before the update
            # may change it).
            loss_scale = scaler.dynamic_scale.value if scaler is not None else None
            with tf.GradientTape() as tape:
                hidden, new_memory = model.backbone(x, mem, training=True)
                loss = tf.reduce_sum(model.nll_from_hidden(hidden, y)) / global_tokens
                scaled_loss = scaler.scale_loss(loss) if scaler is not None else loss
            # Zeros, not None, for a weight the loss does not reach (an empty
            # last cluster's table and projection, as the official code builds).
            # (Not `unconnected_gradients=ZERO`: it fails on Keras variables.)
            grads = [tf.zeros(v.shape, v.dtype) if g is None else g
                     for g, v in zip(tape.gradient(scaled_loss, variables), variables)]
            context = tf.distribute.get_replica_context()
            grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
            total_loss = context.all_reduce(tf.distribute.ReduceOp.SUM, loss)
            norm = tf.linalg.global_norm(grads)
            if scaler is not None:
                norm = norm / loss_scale  # of the unscaled gradients
            # The optimizer sums over replicas again: hand it 1/R of the sum.
            scale = tf.constant(1.0 / self.strategy.num_replicas_in_sync)
            if cfg.clip_norm > 0:
                # tf.clip_by_global_norm's factor, folded into one multiply
                # (linear, so it commutes with the loss scale: still-scaled
                # gradients are clipped by the unscaled norm).
                scale *= cfg.clip_norm * tf.minimum(1.0 / norm, 1.0 / cfg.clip_norm)
            if scaler is None:
                finite = tf.logical_and(tf.math.is_finite(total_loss),
                                        tf.math.is_finite(norm))
                # Skipping: a zero update (Adam's moments still decay) and a
                # fresh memory; "stop" mode never saves after a bad step. A
                # cond rather than a select: one pass over the gradients, not
                # three.
                grads, new_memory = tf.cond(
                    finite,
                    lambda: ([g * scale for g in grads], new_memory),
                    lambda: ([tf.zeros_like(g) for g in grads],
                             tf.zeros_like(new_memory)),
                )
            else:
                # Overflowing gradients under a finite loss: the loss scale
                # was too high; the scaler skips the update and halves it (a
                # normal step of mixed_float16, the memory is good). A
                # non-finite loss is a bad step (the guard's): NaN gradients
                # make the scaler skip the update too (the weights and Adam's
                # moments stay as they were), and the memory starts afresh.
                finite_loss = tf.math.is_finite(total_loss)
                nan = tf.constant(float("nan"))
                # An infinite norm makes the clip factor 0, and 0 * a large
                # finite gradient is 0: keep the overflow visible to the
                # scaler (its check is on the gradients it receives).
                scale = tf.where(tf.math.is_finite(norm), scale, nan)
                grads, new_memory = tf.cond(
                    finite_loss,
                    lambda: ([g * scale for g in grads], new_memory),
                    lambda: ([tf.fill(tf.shape(g), nan) for g in grads],
                             tf.zeros_like(new_memory)),
                )
            return total_loss, norm, new_memory, grads

        def apply_fn(grads):
            self.optimizer.apply_gradients(zip(grads, model.trainable_variables))

        def replica_fn(x, y, mem):
            total_loss, norm, new_memory, grads = gradients_fn(x, y, mem)
            apply_fn(grads)
            return total_loss, norm, new_memory

        if self.jit_scope == "replica":
            # XLA on each GPU replica compiles the forward and backward passes
            # and the all-reduce (NCCL collectives, no merge_call). The update
            # runs after it, outside: Keras' optimizer counts its steps in an
            # ONLY_FIRST_REPLICA variable, whose update TensorFlow broadcasts
            # with a merge_call even where merge_call is otherwise dropped,
            # and a compiled replica function cannot merge_call ("merge_call
            # called while defining a new graph"; measured on an H100).
            compiled = tf.function(gradients_fn, jit_compile=True)
            loss, norm, new_memory, grads = self.strategy.run(
                compiled, args=(inputs, targets, memory)
            )
            self.strategy.run(apply_fn, args=(grads,))
        else:
            loss, norm, new_memory = self.strategy.run(
                replica_fn, args=(inputs, targets, memory)
            )
        first = lambda v: self.strategy.experimental_local_results(v)[0]  # noqa: E731
        return first(loss), first(norm), new_memory

    # --- training -------------------------------------------------------
    def restore(self, path=None):
        """Restores the newest intact (or the given) checkpoint; returns
        its step, or 0 when there is none.

        Every checkpoint is verified against its manifest (sha256): a
        damaged newest one is skipped with a warning for the newest intact
        one; `path` given explicitly must itself be intact. Errors name the
        file (`CheckpointError`, a ValueError). A checkpoint of another
        model config or batch size is refused here; its data position is
        checked by `train`, which knows the train split. Nothing on disk
        changes before those checks passed: the rows of metrics.jsonl
        logged after the checkpoint are dropped by `train`.
        """
        if path is not None:
            tensors, state = CheckpointManager.read(path)
        else:
            found = self.checkpoints.newest_intact() if self.checkpoints else None
            if found is None:
                self._restored_data = (None, None)
                self._metrics_kept_until = 0  # a fresh start: no stale rows
                return 0
            path, tensors, state = found
        check_model_config(path, state.get("model_config"), self.model_config)
        check_train_config(path, state.get("train_config") or {}, self.config,
                           state.get("precision"))
        with self.strategy.scope():
            assign_tensors(tensors, self.model, self.optimizer, source=path)
        multi_worker = isinstance(
            self.strategy, tf.distribute.MultiWorkerMirroredStrategy
        ) and self.strategy.extended._num_workers > 1
        if multi_worker:
            # The chief saved only its own replicas' memory.
            logger.warning("Multi-worker resume starts from a zero memory.")
            self.memory = self._zero_memory()
        elif "memory" in tensors and tensors["memory"].shape == self.memory_numpy().shape:
            self._set_memory(tensors["memory"])
        else:
            self.memory = self._zero_memory()
            data = state.get("data") if isinstance(state.get("data"), dict) else {}
            if data.get("segment", 1) != 0:
                # Mid-pass, a zero memory is not the one the text had: the
                # losses differ from an uninterrupted run (said, not silent).
                saved = tensors.get("memory")
                logger.warning(
                    "%s holds %s, and this run needs a memory of shape %s: the "
                    "resumed pass continues from a zero memory, so its losses differ "
                    "from an uninterrupted run's (a multi-worker checkpoint holds only "
                    "the chief's rows).", path,
                    "no memory" if saved is None else f"a memory of shape {saved.shape}",
                    self.memory_numpy().shape)
        self.step = int(state["step"])
        self._checkpointed_step = self.step  # on disk as it is: not rewritten
        self._restored_data = (path, state.get("data"))
        self.loss_scale_skips = int(state.get("loss_scale_skips", 0))
        self.history = list(state.get("history", []))
        self._metrics_kept_until = self.step
        logger.info("Resumed from %s at step %d.", path, self.step)
        return self.step

    def _drop_metrics_after(self, step):
        if self.workdir and self.chief:
            drop_metrics_after(self.workdir, step)

    def save_checkpoint(self):
        if not self.checkpoints or not self.chief:
            return None
        state = {
            "model_config": self.model_config.to_dict(),
            "train_config": self.config.to_dict(),
            "precision": self.model.dtype_policy.name,  # what "auto" resolved to
            "history": self.history[-1000:],
            "loss_scale_skips": self.loss_scale_skips,
        }
        if getattr(self, "_data_layout", None) is not None:
            state["data"] = data_position(self._data_layout, self.step, self._data_key)
        if not hasattr(self, "_tokenizer_record"):  # one hash per run, not per save
            self._tokenizer_record = tokenizer_record(self.tokenizer)
        state.update(self._tokenizer_record)
        path = self.checkpoints.save(
            self.step, self.model, self.optimizer, self.memory_numpy(), state
        )
        self._checkpointed_step = self.step
        return path

    def train(self, train_tokens, valid_tokens=None, steps=None,
              eval_settings=None, final_eval_settings=None):
        """Runs until `steps` (default: the config's) optimizer steps.

        `eval_settings` are `evaluate`'s keyword arguments for the periodic
        evaluations and, unless `final_eval_settings` is given, the last one
        (the config's `eval_max_segments` applies unless they set
        `max_segments`). `final_eval_settings` evaluate the whole validation
        split after the last step instead (what `txl train` reports), still
        cut short by SIGINT/SIGTERM; its result is `self.final_eval`.

        Returns the list of per-step losses of this call.
        """
        cfg = self.config
        T = self.model_config.segment_length
        total = cfg.steps if steps is None else steps
        V = self.model_config.vocabulary_size
        train_tokens = checked_tokens(train_tokens, V, "train_tokens")
        if valid_tokens is not None:
            valid_tokens = checked_tokens(valid_tokens, V, "valid_tokens")
        self._data_layout = LMBatches(len(train_tokens), cfg.batch_size, T,
                                      name="The train split")
        self._data_key = getattr(train_tokens, "key", None)
        per_epoch = self._data_layout.steps_per_epoch
        check_data_position(*getattr(self, "_restored_data", (None, None)),
                            self._data_layout, self._data_key)
        # Every resume check passed: only now is the workdir changed.
        kept_until = getattr(self, "_metrics_kept_until", None)
        if kept_until is not None:
            self._drop_metrics_after(kept_until)
            self._metrics_kept_until = None
        iterator = iter(distributed_lm_dataset(
            self.strategy, train_tokens, cfg.batch_size, T, repeat=True,
            start_segment=self.step, name="The train split",
        ))
        writer = None
        if self.workdir and self.chief:
            os.makedirs(self.workdir, exist_ok=True)
            writer = tf.summary.create_file_writer(
                os.path.join(self.workdir, "tensorboard")
            )
            self.model_config.to_json(os.path.join(self.workdir, "config.json"))
            with open(os.path.join(self.workdir, "train_config.json"), "w") as f:
                f.write(cfg.to_json() + "\n")
        losses = []
        window_start, window_tokens, window_losses = time.perf_counter(), 0, []
        first_step = self.step
        progress = TrainingProgress(total, start=self.step, enabled=self.verbose)
        with StopOnSignals() as signals, progress:
            while self.step < total:
                if self.step % per_epoch == 0:
                    self.memory = self._zero_memory()  # a new pass over the text
                inputs, targets = next(iterator)
                previous_memory = self.memory
                scaler_state = self._loss_scaler_state()
                loss, norm, self.memory = self._train_step(inputs, targets, self.memory)
                loss, norm = float(loss), float(norm)
                self.step += 1
                if self._is_bad_step(loss, norm, scaler_state):
                    if cfg.on_non_finite == "stop":
                        self._stop_non_finite(loss, norm, previous_memory, scaler_state)
                    self._restore_loss_scaler(scaler_state)
                    logger.warning("Non-finite loss at step %d: update skipped.",
                                   self.step)
                elif not math.isfinite(norm):
                    # mixed_float16: the gradients overflowed at this loss
                    # scale; the scaler skipped the update and halved it.
                    self.loss_scale_skips += 1
                    logger.info(
                        "Step %d: gradients overflowed at loss scale %g; update "
                        "skipped, the scale is halved (mixed_float16).",
                        self.step, scaler_state[0])
                losses.append(loss)
                window_losses.append(loss)
                window_tokens += cfg.batch_size * T
                progress.update(self.step, loss, float(self.schedule(self.step)),
                                cfg.batch_size * T)
                if self.step % cfg.log_every == 0 or self.step == total:
                    self._log(window_losses, window_tokens,
                              time.perf_counter() - window_start, norm, writer)
                    window_start, window_tokens, window_losses = time.perf_counter(), 0, []
                if signals.received:
                    self._stop_on_signal(signals.received, total)
                if (valid_tokens is not None and cfg.eval_every
                        and self.step % cfg.eval_every == 0 and self.step < total):
                    self._evaluate_or_stop(valid_tokens, eval_settings, writer,
                                           signals, total)
                if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                    self.save_checkpoint()
            if signals.received:  # during the last step
                self._stop_on_signal(signals.received, total)
            # The trained state is on disk before the final evaluation, which
            # may fail (an evaluation setting the split cannot take) or be
            # stopped: it must not cost the run. A checkpoint already written
            # at this step (the last step's, or the one resumed from) is
            # not written again.
            trained = self.step != first_step
            if getattr(self, "_checkpointed_step", None) != self.step:
                self.save_checkpoint()
            if trained or not self._model_folder_written():
                self.save_model()
            if valid_tokens is not None:
                final = eval_settings
                if final_eval_settings is not None:
                    final = {"max_segments": 0, **final_eval_settings}
                self.final_eval = self._evaluate_or_stop(
                    valid_tokens, final, writer if trained else None, signals, total)
        return losses

    def _model_folder_written(self):
        return bool(self.workdir) and os.path.isfile(
            os.path.join(self.workdir, "model", "config.json"))

    def save_model(self):
        """Writes the model folder (what eval, export and generate read)."""
        if self.workdir and self.chief:
            folder = os.path.join(self.workdir, "model")
            try:
                save_preset(self.model, folder, tokenizer=self.tokenizer)
            except OSError as e:
                raise self._write_failed(f"the model folder {folder}", e) from e

    def _append_metrics(self, row):
        path = os.path.join(self.workdir, "metrics.jsonl")
        try:
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
        except OSError as e:
            raise self._write_failed(path, e) from e

    def _write_failed(self, what, error):
        return write_failed(what, self.step, self.checkpoints, error)

    def _evaluate_or_stop(self, valid_tokens, eval_settings, writer, signals, total):
        """An evaluation that a SIGINT/SIGTERM cuts short (after the current
        segment) like a training step: checkpoint, model folder, stop."""
        try:
            return self._evaluate_and_log(valid_tokens, eval_settings, writer,
                                          stop=lambda: signals.received)
        except EvaluationStopped:
            self._stop_on_signal(signals.received, total)

    def _stop_on_signal(self, name, total):
        if getattr(self, "_checkpointed_step", None) == self.step and self.checkpoints:
            path = self.checkpoints.latest()  # written before the final evaluation
        else:
            path = self.save_checkpoint()
            self.save_model()
        raise TrainingInterrupted(name, self.step, total, path)

    def _stop_non_finite(self, loss, norm, previous_memory, scaler_state=None):
        """The "stop" guard: puts back the state before the bad step, writes
        it as a checkpoint (when the last one is older) and raises."""
        bad_step = self.step
        if self.loss_scaler is not None:
            # The scaler skipped the update (NaN gradients): the weights and
            # Adam's state are those before the step; only its scale moved.
            self._restore_loss_scaler(scaler_state)
        else:
            self._undo_guarded_update()
        self.memory = previous_memory
        self.step = bad_step - 1
        path = None
        if self.checkpoints and self.chief:
            latest = self.checkpoints.latest()
            if latest is None or checkpoint_step(latest) < self.step:
                try:
                    path = self.save_checkpoint() if self.step > 0 else None
                except (FloatingPointError, OSError) as e:
                    logger.error("Could not save the state before step %d: %s",
                                 bad_step, e)
            if path is None:
                found = self.checkpoints.newest_intact(warn=False) if latest else None
                path = found[0] if found else None
        kept = (f"The last good checkpoint is {path} (step {checkpoint_step(path)})."
                if path else "No checkpoint holds a good state (no workdir, or "
                "the guard tripped at the first step).")
        raise FloatingPointError(
            f"Non-finite loss ({loss}) or gradient norm ({norm}) at step "
            f"{bad_step}; stopping. {kept} Lower the learning rate, or set "
            "on_non_finite=skip to skip such steps."
        )

    # --- mixed_float16 ---------------------------------------------------
    def _loss_scaler_state(self):
        """(loss scale, good-step counter) before a step, or None (no loss
        scaling). Read on the host: the previous step has finished."""
        if self.loss_scaler is None:
            return None
        return (float(self.loss_scaler.dynamic_scale.numpy()),
                int(self.loss_scaler.step_counter.numpy()))

    def _restore_loss_scaler(self, state):
        """Puts the scaler's scale and counter back as they were before a bad
        step (the guard's steps leave no trace in the loss scale)."""
        if state is None:
            return
        with self.strategy.scope():
            self.loss_scaler.dynamic_scale.assign(state[0])
            self.loss_scaler.step_counter.assign(state[1])

    def _is_bad_step(self, loss, norm, scaler_state):
        """What the non-finite guard acts on.

        Without loss scaling: a non-finite loss or gradient norm. With it
        (mixed_float16) overflowing gradients under a finite loss are the
        scaler's business (it skips the update and halves the scale: normal,
        not a bad step), unless the scale was already at most 1, where the
        overflow cannot come from scaling.
        """
        if not math.isfinite(loss):
            return True
        if math.isfinite(norm):
            return False
        return scaler_state is None or scaler_state[0] <= 1.0

    def _undo_guarded_update(self):
        """Reverts the zero-gradient update the step applied at a bad step.

        The compiled step cannot leave the optimizer out (apply_gradients
        inside a tf.cond breaks under MirroredStrategy's merge_call), so a
        bad step applies zero gradients; with Adam that still moves the
        weights by the decayed momentum. This inverts exactly that update
        (to float rounding): m = m'/b1, v = v'/b2,
        w = w' + alpha_t m'/(sqrt(v')+eps), iterations - 1.
        """
        opt = inner_optimizer(self.optimizer)
        if not isinstance(opt, keras.optimizers.Adam) or opt.amsgrad:
            logger.warning("Cannot undo the guarded step for %s: the weights "
                           "after it are kept.", type(opt).__name__)
            return
        t = int(opt.iterations.numpy())
        lr = float(self.schedule(t - 1))
        b1, b2, eps = float(opt.beta_1), float(opt.beta_2), float(opt.epsilon)
        alpha = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        variables = self.model.trainable_variables
        with self.strategy.scope():
            for variable in variables:
                index = opt._get_variable_index(variable)
                m = opt._momentums[index].numpy()
                v = opt._velocities[index].numpy()
                w = variable.numpy()
                variable.assign(w + alpha * m / (np.sqrt(v) + eps))
                opt._momentums[index].assign(m / b1)
                opt._velocities[index].assign(v / b2)
            opt.iterations.assign(t - 1)

    def _log(self, window_losses, tokens, seconds, norm, writer):
        mean = float(np.mean(window_losses)) if window_losses else float("nan")
        lr = float(self.schedule(self.step))
        record = {
            "step": self.step, "loss": mean,
            "ppl": perplexity(mean), self.bits_name: mean / LN2, "lr": lr,
            "grad_norm": norm,
            "ms_per_step": 1000.0 * seconds / max(len(window_losses), 1),
            "tokens_per_s": tokens / max(seconds, 1e-9),
        }
        if self.loss_scaler is not None:
            record["loss_scale"] = float(self.loss_scaler.dynamic_scale.numpy())
            record["loss_scale_skips"] = self.loss_scale_skips
        self.history.append(record)
        quality = (f"{self.bits_name} {record[self.bits_name]:.3f}" if self.config.report_bpc
                   else f"ppl {record['ppl']:.1f}")
        logger.info(
            "step %d | loss %.4f | %s | lr %.2e | %.0f ms/step | %.0f tok/s",
            self.step, mean, quality, lr, record["ms_per_step"], record["tokens_per_s"],
        )
        if writer is not None:
            with writer.as_default(step=self.step):
                for key in ("loss", "ppl", self.bits_name, "lr", "grad_norm", "tokens_per_s"):
                    # float32 scalars: a finite double above float32's range
                    # (a diverged loss's ppl) is stored as inf, not an error.
                    with np.errstate(over="ignore"):
                        value = np.float32(record[key])
                    tf.summary.scalar(f"train/{key}", value)
            self._append_metrics({"split": "train", **record})

    def _evaluate_and_log(self, valid_tokens, eval_settings, writer, stop=None):
        settings = dict(eval_settings or {})
        if self.config.eval_max_segments:
            settings.setdefault("max_segments", self.config.eval_max_segments)
        result = evaluate(self.model, valid_tokens, reuse=self._eval_reuse, stop=stop,
                          **settings)
        result = {(self.bits_name if k == "bpc" else k): v for k, v in result.items()}
        result["step"] = self.step
        logger.info("eval step %d | loss %.4f | ppl %.2f | %s %.4f | %d tokens",
                    self.step, result["loss"], result["ppl"], self.bits_name,
                    result[self.bits_name], result["tokens"])
        self.history.append({"split": "valid", **result})
        if writer is not None:
            with writer.as_default(step=self.step):
                for key in ("loss", "ppl", self.bits_name):
                    tf.summary.scalar(f"valid/{key}", result[key])
            self._append_metrics({"split": "valid", **result})
        return result


# --- evaluation ------------------------------------------------------------
# "auto" XLA-compiles the evaluation step from this many keys (M + T) on.
EVAL_JIT_MIN_KEYS = 512


def eval_jit_compile(model, jit_compile="auto"):
    """Whether the evaluation step is XLA-compiled: `jit_compile` as given,
    or for "auto" from `EVAL_JIT_MIN_KEYS` keys (M + T) on, except for a
    bfloat16 model on a CPU-only host.

    A long-memory evaluation step is bound by the element-wise passes over
    its (B, N, T, K) scores (shift, sum of the terms, mask, softmax), which
    XLA fuses. On a 2-core Xeon (T = 128, batch 1, docs/benchmarks.md) the
    XLA step was 1.11x the graph-mode step at K = 512, 1.2x at K = 800 and
    1.2x-1.4x at K = 2,800-3,800. Below, it gained 1.08x at the throughput
    benchmark's K = 256 (batch 8), not worth what compiling costs there:
    ~140 MB more peak resident memory and ~1 s per segment shape. XLA's CPU
    backend does not use oneDNN's bf16 matmuls, so a bfloat16 model stays in
    graph mode there. Where TensorFlow runs Eigen's kernels instead of
    oneDNN's (`TF_ENABLE_ONEDNN_OPTS=0`), XLA's matmuls beat them and the XLA
    step wins at short memories too (1.34x-1.45x on an AVX2 AMD EPYC,
    1.6x-1.75x on an AMX Xeon; `keras_txl.host.xla_evaluation_pays`).
    On a GPU "auto" is XLA at any length: on an H100 the XLA step evaluated
    wt103_base at T = M = 150 1.73x faster than graph mode.
    """
    if jit_compile not in ("auto", True, False):
        raise ValueError(
            "`jit_compile` must be 'auto', True or False, received "
            f"jit_compile={jit_compile!r}."
        )
    if jit_compile != "auto":
        return jit_compile
    if tf.config.list_logical_devices("GPU"):
        return True
    if model.compute_dtype == "bfloat16":
        return False
    cfg = model.txl_config
    if cfg.memory_length + cfg.segment_length >= EVAL_JIT_MIN_KEYS:
        return True
    return xla_evaluation_pays()


def eval_cache(model, batch_size=1, segment_length=None, memory=None):
    """The key/value cache an evaluation starts from (`make_eval_step`'s third input).

    The memory's keys and values only (`build_cache(keep_memory=False)`):
    evaluation reads the NLL, never the memory, and sliding the memory too
    copies as much again per segment as the keys and values in float32, twice
    as much in mixed_bfloat16. `memory` None: the empty memory of
    `batch_size` rows; `segment_length` None: the model's T.
    """
    if segment_length is None:
        segment_length = model.txl_config.segment_length
    return model.build_cache(memory, batch_size=batch_size, segment_length=segment_length,
                             keep_memory=False)


def make_eval_step(model, jit_compile="auto"):
    """`step(x, y, cache) -> (per-token NLL (B, T), new cache)`, compiled.

    Evaluation reads the text in order with the memory key/value cache
    (`model.build_cache`): each segment projects only its own T positions,
    the memory's keys and values and `W_R R` are carried from the previous
    segment. Same numbers as `call_with_memory` (tests/test_generation.py),
    less work per segment. No dropout is applied (inference path).
    `jit_compile`: see `eval_jit_compile` ("auto": XLA for long memories).
    """

    jit = eval_jit_compile(model, jit_compile)

    def step(x, y, cache):
        # Without XLA for the whole step, its element-wise regions alone
        # (layer norms, masked scores) are XLA-compiled (`fused_kernels`);
        # with it they are fused anyway.
        with fused_kernels(not jit):
            out = model.call_with_cache(x, cache, targets=y)
        return out["nll"], out["cache"]

    return CompiledFunction(step, jit_compile=jit)


def checked_tokens(tokens, V, name="tokens"):
    """A split's ids, checked before a step runs: a 1-D integer array (or
    prepared shards, by their recorded largest id) of ids in [0, V). Out of
    range they would otherwise fail inside the compiled step, as a graph
    assertion's traceback, after the model was built (or, for a validation
    split, after the first stretch of training)."""
    if hasattr(tokens, "read_windows"):  # prepared shards: read by window
        if tokens.max_id >= V:
            raise ValueError(
                f"`{name}` must be ids in [0, {V}) (vocabulary_size={V}); the "
                f"shards in {tokens.folder} hold ids up to {tokens.max_id}."
            )
        return tokens
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(
            f"`{name}` must be a 1-D array of integer token ids, received shape "
            f"{tokens.shape} and dtype {tokens.dtype}."
        )
    if tokens.size and (tokens.min() < 0 or tokens.max() >= V):
        bad = int(tokens.min() if tokens.min() < 0 else tokens.max())
        raise ValueError(
            f"`{name}` must be ids in [0, {V}) (vocabulary_size={V}); found {bad}."
        )
    return tokens


def evaluate(model, tokens, batch_size=1, segment_length=None, memory_length=None,
             clamp_length=None, same_length=None, max_segments=0,
             reset_every_segment=False, reuse=None, jit_compile="auto", stop=None,
             unknown_id=None):
    """Token-weighted NLL over a whole split, the paper's way.

    The text is cut into `batch_size` streams that are read segment by
    segment with the memory carried (`reset_every_segment=True` drops it:
    the "no recurrence" ablation at evaluation). Test-time
    `memory_length`, `clamp_length` and `same_length` may differ from
    training (weights do not depend on them). The last, shorter segment of
    each stream is scored too. No dropout is applied.

    `reuse`: an optional dict the caller keeps between calls (the trainer
    does, for its periodic evaluations): the compiled step, and the copy of
    the model with other settings, are made once and reused (the copy gets
    the model's current weights each time) instead of being rebuilt and
    re-traced at every call.

    `jit_compile`: "auto" (XLA for long memories, `eval_jit_compile`),
    True or False.

    `stop`: None, or a callable checked after each segment: when it
    returns true the evaluation ends there with `EvaluationStopped` (the
    trainer passes its SIGINT/SIGTERM flag, so a signal does not wait for
    the whole split).

    `unknown_id`: None, or the tokenizer's unknown-token id: the result
    then also counts the targets that are that id (`unknown_tokens`), a
    perplexity over text the tokenizer does not know being no measure of
    the model.

    Returns:
        dict with loss (nats/token), ppl, bpc, tokens (and unknown_tokens).
    """
    cfg = model.txl_config
    changes = {}
    for key, value in (("memory_length", memory_length),
                       ("clamp_length", clamp_length),
                       ("same_length", same_length)):
        if value is not None and getattr(cfg, key) != value:
            changes[key] = value
    T = cfg.segment_length if segment_length is None else segment_length
    for name, value in (("batch_size", batch_size), ("segment_length", T)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(
                f"`{name}` must be a positive integer, received {name}={value!r}."
            )
    if (not isinstance(max_segments, int) or isinstance(max_segments, bool)
            or max_segments < 0):
        raise ValueError(
            "`max_segments` must be an integer >= 0 (0: the whole text), "
            f"received max_segments={max_segments!r}."
        )
    if stop is not None and not callable(stop):
        raise TypeError(
            f"`stop` must be None or a callable, received {type(stop).__name__}.")
    if unknown_id is not None and (
            isinstance(unknown_id, bool) or not isinstance(unknown_id, int)
            or not 0 <= unknown_id < cfg.vocabulary_size):
        raise ValueError(
            f"`unknown_id` must be None or an id in [0, {cfg.vocabulary_size}), "
            f"received unknown_id={unknown_id!r}.")
    if reuse is not None and not isinstance(reuse, dict):
        raise TypeError(
            f"`reuse` must be a dict kept by the caller (or None), received "
            f"{type(reuse).__name__}."
        )
    tokens = checked_tokens(tokens, cfg.vocabulary_size)
    # (The cached evaluation path never applies dropout: no copy needed for it.)
    key = tuple(sorted(changes.items()))
    reuse = {} if reuse is None else reuse
    source, eval_model, step = reuse.get(key, (None, None, None))
    if source is not model:  # first call, or another model: build afresh
        eval_model = model.with_settings(**changes) if changes else model
        step = make_eval_step(eval_model, jit_compile=jit_compile)
        reuse[key] = (model, eval_model, step)
    elif eval_model is not model:
        eval_model.assign_weights_from(model)  # trained since the last call
    # Every target once, the last, shorter segment included.
    segments = lm_dataset(tokens, batch_size, T, drop_remainder=False,
                          name="The evaluation text")
    if max_segments:
        segments = segments.take(max_segments)

    def fresh_cache():
        return eval_cache(eval_model, batch_size, T)

    cache = fresh_cache()
    total, count, unknown = 0.0, 0, 0
    for x, y in segments:
        if reset_every_segment:
            cache = fresh_cache()
        nll, cache = step(x, y, cache)
        total += float(tf.reduce_sum(nll))
        count += int(x.shape[0] * x.shape[1])
        if unknown_id is not None:
            unknown += int(tf.reduce_sum(tf.cast(tf.equal(y, unknown_id), tf.int32)))
        if stop is not None and stop():
            raise EvaluationStopped(f"evaluation stopped after {count} tokens")
    loss = total / count
    result = {"loss": loss, "ppl": perplexity(loss), "bpc": loss / LN2, "tokens": count}
    if unknown_id is not None:
        result["unknown_tokens"] = unknown
    return result
