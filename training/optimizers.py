"""Adam with TensorFlow's fused update kernel.

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

import keras
import tensorflow as tf


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
