"""Losses and metrics on log-probabilities, token-weighted."""

import math

import keras
from keras import ops

from keras_txl.adaptive import pick_columns
from keras_txl.causal_lm import TokenCrossEntropy
from keras_txl.causal_lm import TokenMeanReduction

LN2 = math.log(2.0)


def token_nll(log_probs, targets):
    """(B, T, V) log-probs and (B, T) int targets -> (B, T) float32 NLL
    (picked by comparison: `keras_txl.adaptive.pick_columns`)."""
    return -pick_columns(ops.cast(log_probs, "float32"), targets)


@keras.saving.register_keras_serializable(package="keras_txl")
class TokenNLL(TokenMeanReduction, keras.losses.Loss):
    """Mean negative log-likelihood of the targets; y_pred are log-probs.

    With a `sample_weight` (one per row, (batch,), or per token), the
    weighted sum over the weights' sum, as `TokenCrossEntropy` (Keras'
    default reduction divided it by every position); under a
    `tf.distribute` strategy each replica's share of the global batch's
    mean (`TokenMeanReduction`)."""

    def __init__(self, name="token_nll", **kwargs):
        kwargs.setdefault("reduction", "mean_with_sample_weight")
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        return token_nll(y_pred, y_true)


class _MeanNLL(keras.metrics.Metric):
    def __init__(self, name, **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable((), initializer="zeros", name="total")
        self.count = self.add_variable((), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        # A weighted metric's `sample_weight` (the padding mask of strings,
        # a weight per row or per token) weights each token's NLL; it was
        # ignored, and the padding counted as text.
        nll = token_nll(y_pred, y_true)
        if sample_weight is None:
            self.total.assign_add(ops.sum(nll))
            self.count.assign_add(ops.cast(ops.size(nll), "float32"))
            return
        weights = TokenCrossEntropy.token_weights(sample_weight, y_true)
        self.total.assign_add(ops.sum(nll * weights))
        self.count.assign_add(ops.sum(weights))

    def mean(self):
        return self.total / ops.maximum(self.count, 1.0)

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)


@keras.saving.register_keras_serializable(package="keras_txl")
class BitsPerCharacter(_MeanNLL):
    """Token-weighted mean NLL in bits (bpc for character/byte models);
    as a weighted metric, each token weighted by its `sample_weight`.

    Hand-written: neither Keras nor keras-hub has a bits metric (keras-hub's
    `Perplexity` is exp of the same mean)."""

    def __init__(self, name="bpc", **kwargs):
        super().__init__(name=name, **kwargs)

    def result(self):
        return self.mean() / LN2
