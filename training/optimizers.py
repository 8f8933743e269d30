"""Adam with TensorFlow's fused update kernel, and the training set-up.

`setup_model_and_optimizer` is the one place both training loops (the
custom loop and `fit`) build their model and optimizer: seed, precision
policy, strategy scope, `FusedAdam` on the warm-up + cosine schedule.

Keras' `Adam.update_step` writes the update as a dozen element-wise ops per
variable (each a pass over the variable, with temporaries); TensorFlow's
`ResourceApplyAdam` does the same arithmetic in one kernel. Same variables
(`adam/m_*`, `adam/v_*`, `iterations`), same formula, so checkpoints of the
two are interchangeable:

    alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)
    m += (g - m) * (1 - beta_1)
    v += (g^2 - v) * (1 - beta_2)
    w -= alpha * m / (sqrt(v) + epsilon)

Measured on the throughput benchmark's configuration (5.2 M parameters):
see docs/benchmarks.md.
"""

import logging

import keras
import tensorflow as tf

from keras_txl import TransformerXLCausalLM
from keras_txl.host import auto_precision
from keras_txl.host import gpu_auto_precision
from keras_txl.training.schedules import learning_rate_schedule

logger = logging.getLogger(__name__)


@keras.saving.register_keras_serializable(package="keras_txl")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` whose update is one fused TensorFlow kernel.

    Takes the arguments of `keras.optimizers.Adam`. `amsgrad=True` falls
    back to the Keras update (the fused kernel has no AMSGrad form).
    """

    def __init__(self, *args, name="adam", **kwargs):
        # Keras' name, so the slot variables keep Keras' paths.
        super().__init__(*args, name=name, **kwargs)

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        momentum = self._momentums[index]
        velocity = self._velocities[index]
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        handle = lambda v: v.handle  # noqa: E731  (Keras or tf.Variable)
        return tf.raw_ops.ResourceApplyAdam(
            var=handle(variable),
            m=handle(momentum),
            v=handle(velocity),
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype),
            use_locking=False,
        )


def resolve_precision(precision):
    """The Keras dtype policy for `TrainConfig.precision`.

    "auto" on a GPU follows its compute capability
    (`keras_txl.host.gpu_auto_precision`): "mixed_bfloat16" from 8.0 (bf16
    tensor cores, no loss scaling needed), "mixed_float16" on 7.x (fp16
    tensor cores only, with loss scaling), "float32" below. On a CPU it is
    "mixed_bfloat16" with AMX tiles, or AVX512_BF16 on an AMD Zen 4 or Zen 5
    (`keras_txl.host.auto_precision`, after any `ONEDNN_MAX_CPU_ISA` cap),
    and "float32" elsewhere, where bf16 was measured slower than float32
    (emulated without bf16 instructions, and with AVX512_BF16 on Intel
    Xeons). "auto" never picks mixed_float16 on a CPU: TensorFlow's CPU
    float16 kernels are emulated.
    """
    if precision != "auto":
        if precision == "mixed_float16" and not tf.config.list_physical_devices("GPU"):
            logger.warning(
                "precision=mixed_float16 on a host without a GPU: float16 is "
                "emulated on CPUs (slower than float32); it is meant for "
                "GPUs of compute capability 7.x.")
        return precision
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        capability = tf.config.experimental.get_device_details(gpus[0]).get(
            "compute_capability")
        chosen = gpu_auto_precision(capability)
    else:
        chosen = auto_precision()
    logger.info("precision=auto: %s on this host.", chosen)
    return chosen


def loss_scale_optimizer(optimizer):
    """The `keras.optimizers.LossScaleOptimizer` wrapping `optimizer`, or None
    where it is not wrapped (float32 and mixed_bfloat16 runs)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer
    return None


def inner_optimizer(optimizer):
    """The optimizer that updates the weights (`FusedAdam`): the optimizer
    itself, or the one a `LossScaleOptimizer` wraps."""
    scaler = loss_scale_optimizer(optimizer)
    return scaler.inner_optimizer if scaler is not None else optimizer


def setup_model_and_optimizer(
    model_config, train_config, strategy, clip_gradients=True, **model_kwargs
):
    """The one model + optimizer + precision set-up of both training loops.

    In this order (the order fixes the initial weights): the seed
    (`train_config.seed`), then, under the precision policy
    (`train_config.precision`) and the strategy's scope, the model and the
    optimizer, whose variables are built at once. The global policy is
    restored afterwards, so models made later (evaluation copies, exports)
    are float32 again.

    The optimizer is `FusedAdam` (`train_config.adam_epsilon`) on
    `learning_rate_schedule` (`learning_rate`, `warmup_steps`, `steps`,
    `min_lr_ratio`). With `clip_gradients` it also clips by global norm
    (`clip_norm`, Keras' `global_clipnorm`: per replica, before the
    cross-replica sum); the custom loop clips the summed gradients itself
    and passes `clip_gradients=False`.

    Loss scaling: under `"mixed_float16"` the optimizer is
    `keras.optimizers.LossScaleOptimizer(FusedAdam(...),
    initial_scale=train_config.initial_loss_scale)` (dynamic: halved and the
    update skipped when the gradients overflow, doubled after 2,000 good
    steps). It unscales the gradients before the inner `FusedAdam` sees them,
    so `global_clipnorm` clips unscaled gradients. `fit` uses it as is
    (Keras wraps only an optimizer that is not one already); the custom loop
    calls its `scale_loss` and `apply_gradients`. Its scale and counter are
    optimizer variables, saved in checkpoints. `"float32"` and
    `"mixed_bfloat16"` have no loss scaling: bfloat16 has float32's
    exponent range, so gradients do not underflow.

    Args:
        model_config: `TransformerXLConfig`.
        train_config: `TrainConfig`.
        strategy: a `tf.distribute.Strategy`.
        clip_gradients: bool. Clip in the optimizer (the `fit` path).
        **model_kwargs: passed to `TransformerXLCausalLM` (e.g.
            `stateful=True, batch_size=b` for `fit`).

    Returns:
        `(model, optimizer)`.
    """
    keras.utils.set_random_seed(train_config.seed)
    previous = keras.mixed_precision.global_policy()
    precision = resolve_precision(train_config.precision)
    if precision == "mixed_float16" and isinstance(strategy, tf.distribute.TPUStrategy):
        raise ValueError(
            "precision='mixed_float16' is not for TPUs (they compute bfloat16): "
            "use precision='mixed_bfloat16' under TPUStrategy.")
    keras.mixed_precision.set_global_policy(precision)
    try:
        with strategy.scope():
            model = TransformerXLCausalLM(model_config, **model_kwargs)
            optimizer = FusedAdam(
                learning_rate_schedule(
                    train_config.learning_rate,
                    train_config.warmup_steps,
                    train_config.steps,
                    train_config.min_lr_ratio,
                ),
                epsilon=train_config.adam_epsilon,
                global_clipnorm=(
                    train_config.clip_norm if clip_gradients else 0.0
                ) or None,
            )
            if precision == "mixed_float16":
                optimizer = keras.optimizers.LossScaleOptimizer(
                    optimizer, initial_scale=train_config.initial_loss_scale)
            optimizer.build(model.trainable_variables)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    return model, optimizer
