"""The throughput workload's TensorFlow framework: MultiWorkerMirroredStrategy with a custom training loop.

Keras 3's `model.fit` fails under MultiWorkerMirroredStrategy (keras-team/keras#20585), so every step is
`strategy.run` of a GradientTape step in one `tf.function`, as TensorFlow's custom-training-loop guide writes it:
the optimizer all-reduces the gradients across workers (RING collective) before applying them. The cluster comes
from TF_CONFIG, which the launcher sets (one loopback port per worker). Each worker trains on its own synthetic
batch, softmax cross-entropy averaged over the global batch, SGD at frameworks.LEARNING_RATE: the same protocol as
the torch path.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ddlrepro.rank.models import MODELS
from ddlrepro.rank.runtime import RankContext
from ddlrepro.rank.workloads.frameworks import LEARNING_RATE, Trainer

if TYPE_CHECKING:
    import tensorflow as tf

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def strategy_for(ctx: RankContext) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy over TF_CONFIG's cluster, RING all-reduce, `ctx.threads` intra-op threads."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(ctx.threads)
    tf.config.threading.set_inter_op_parallelism_threads(ctx.threads)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if strategy.num_replicas_in_sync != ctx.world_size:
        raise RuntimeError(f"TF_CONFIG has {strategy.num_replicas_in_sync} workers, the launcher {ctx.world_size}")
    return strategy


def synthetic_batch(model: str, batch_size: int, image_size: int | None, seed: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Random channels-last images and random labels in [0, classes), fixed for the whole run."""
    import tensorflow as tf

    info = MODELS[model]
    side = image_size or info.image_size
    generator = tf.random.Generator.from_seed(seed)
    images = generator.normal((batch_size, side, side, 3))
    labels = generator.uniform((batch_size,), 0, info.num_classes, dtype=tf.int64)
    return images, labels


def tensorflow_trainer(params: dict[str, Any], ctx: RankContext) -> Trainer:
    import keras
    import tensorflow as tf

    from ddlrepro.rank.tf_models import build_keras_model

    strategy = strategy_for(ctx)
    keras.utils.set_random_seed(params.get("seed", 0))
    with strategy.scope():
        model = build_keras_model(params["model"], params.get("image_size"))
        optimizer = keras.optimizers.SGD(learning_rate=LEARNING_RATE)
    images, labels = synthetic_batch(params["model"], params["batch_size"], params.get("image_size"), ctx.rank)
    global_batch = params["batch_size"] * ctx.world_size

    def replica_step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_sample = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            loss = tf.nn.compute_average_loss(per_sample, global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def step() -> tf.Tensor:
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step), axis=None)

    settings = {"framework": "tensorflow", "strategy": "RING"}

    def parameter_sum() -> float:
        return float(sum(tf.reduce_sum(tf.cast(v, tf.float64)) for v in model.trainable_variables))

    return Trainer(step, lambda loss: float(loss.numpy()), parameter_sum, settings)
