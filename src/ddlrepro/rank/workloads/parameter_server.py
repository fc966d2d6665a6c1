"""The `ps` workload: TensorFlow parameter servers (the Wikimedia study), and its one-process Keras baseline.

`mode: cluster` is `ParameterServerStrategy` with a `ClusterCoordinator` and a custom training loop: TF2's stand-in
for the Estimator the study used (removed from TensorFlow 2.16). Every role is an ordinary rank of the launcher, by
its place in the job: rank 0 the chief (the coordinator), then `ps_workers` workers, then `ps` parameter servers,
then `evaluators`. The ranks exchange their addresses over the torch process group every launcher sets up (so the
same code runs on loopback, on testbed hosts and as Slurm tasks) and each writes its TF_CONFIG from them. Workers and
parameter servers start a `tf.distribute.Server`; the chief schedules every step on whichever worker is free
(asynchronous updates, one worker's batch per update), handing it the step's sample indices: one seeded order for
the whole cluster, each epoch every sample once, as in the baseline. (Each worker holds the training set; a
per-worker shuffle cannot be seeded per worker: ParameterServerStrategy gives every worker's `dataset_fn` the same
InputContext, pipeline 0 of 1.) The chief then tells every rank which phase begins over the
torch group (`broadcast_object_list`), and each rank's host records its interface bytes at each phase's start and
end (interfaces.py), so the traffic to each parameter server is read from counters: `train` (the epochs at
`batch_size`), then `probe` (`probe_steps` more at `probe_batch_size`, after the accuracy is taken, so the epochs
compare with the baseline's). Beside them the chief records what TensorFlow moves to and from each parameter server
per step, from the variables it placed there: every variable read, every trainable one's gradient pushed.

`placement`: `round-robin` is TensorFlow's default (whole variables on one parameter server in turn);
`partitioned` shards every variable across all of them (`FixedShardsPartitioner`). A partitioned variable used
directly in a matmul fails in its gradient, so the model concatenates the shards before use.

The model: an MLP on scikit-learn's 8×8 digits (datasets.py), a trunk of `hidden` ReLU layers and a softmax top.
`trainable: top` freezes the trunk at its random initialisation (no pretrained weights exist here: labelled so);
`all` trains everything. Plain SGD. `mode: single` trains the same model (same initial weights, data, batch,
epochs, learning rate) with Keras `fit` in one process: the study's one-GPU baseline, on CPU here.
An evaluator reads the chief's final weights from the run folder (the Estimator evaluator's checkpoint) and
records the test accuracy it finds.

`fault` (a worker or parameter server killed for real, first attempt only) and `checkpoint_interval` (the chief's
checkpoints, which a retry given `resume_checkpoint` resumes from): ps_faults.py.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
import torch.distributed as dist

from ddlrepro.rank import datasets, taskenv
from ddlrepro.rank.interfaces import NodeInterfaceCounter
from ddlrepro.rank.runtime import RankContext
from ddlrepro.rank.workloads import ps_faults
from ddlrepro.records import CHECKPOINT_DIR, emit

if TYPE_CHECKING:
    import tensorflow as tf

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

CLASSES = 10
WEIGHTS_FILE = "ps-final-weights.npz"
POSITION = ("step", "epoch", "position")
ABORT = "abort"  # the chief's announcement that training failed (its own error says why)


def roles(params: dict[str, Any]) -> list[str]:
    """Every rank's role, in rank order."""
    return ["chief", *["worker"] * params["ps_workers"], *["ps"] * params["ps"], *["evaluator"] * params["evaluators"]]


def layer_sizes(params: dict[str, Any]) -> list[tuple[int, int]]:
    """(inputs, outputs) of each dense layer: the trunk, then the top."""
    widths = [64, *params["hidden"], CLASSES]
    return list(itertools.pairwise(widths))


def initial_weights(params: dict[str, Any]) -> list[np.ndarray]:
    """Glorot-uniform kernels and zero biases, seeded: the same start for the cluster and the baseline."""
    rng = np.random.default_rng(params["seed"])
    weights = []
    for fan_in, fan_out in layer_sizes(params):
        limit = math.sqrt(6 / (fan_in + fan_out))
        weights += [rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32), np.zeros(fan_out, np.float32)]
    return weights


def trainable_flags(params: dict[str, Any]) -> list[bool]:
    """Per weight: trained, or frozen with the trunk (`trainable: top`)."""
    layers = len(layer_sizes(params))
    return [params["trainable"] == "all" or index // 2 == layers - 1 for index in range(2 * layers)]


def digits(params: dict[str, Any]) -> datasets.Split:
    return datasets.digits(params["seed"], params["test_fraction"])


def flat(images: np.ndarray) -> np.ndarray:
    return images.reshape(len(images), -1)


def steps_per_epoch(params: dict[str, Any], samples: int) -> int:
    return math.ceil(samples / params["batch_size"])


def libraries(params: dict[str, Any]) -> tuple[str, ...]:
    """What the rank loads besides torch, imported before `run` while the collector waits (ddlrepro.startup)."""
    return ("tensorflow",)


def run(params: dict[str, Any], ctx: RankContext) -> None:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(ctx.threads)
    tf.config.threading.set_inter_op_parallelism_threads(ctx.threads)
    if params["mode"] == "single":
        run_single(params)
        return
    role_of = roles(params)
    if len(role_of) != ctx.world_size:
        raise RuntimeError(
            f"the point's roles {role_of} need {len(role_of)} ranks, the launcher started {ctx.world_size}"
        )
    started = psutil.Process().create_time()
    addresses, starts = exchange_addresses(started)
    imported = time.time()  # every rank is here: Python, torch and TensorFlow loaded everywhere
    tf_config = cluster_config(role_of, addresses, ctx.rank)
    os.environ["TF_CONFIG"] = json.dumps(tf_config)
    role = role_of[ctx.rank]
    emit("metric", rank=ctx.rank, metric="role_index", value=tf_config["task"]["index"], detail=role)
    counter = NodeInterfaceCounter(ctx.rank, 0)  # its host's interfaces: roles sharing a node share its counters
    if role == "chief":
        try:
            Chief(params, ctx, (min(starts), imported), counter).run()
        except ps_faults.ParameterServerLost:
            # Exit now: TensorFlow's teardown would print a page of errors about the lost task after this one,
            # pushing it out of the stderr tail the run's error shows.
            traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
    else:
        serve(params, role, counter)


def exchange_addresses(started: float) -> tuple[list[str], list[float]]:
    """Every rank's host:port for TensorFlow and its process start, gathered over the torch group."""
    address = own_address()
    with socket.socket() as probe:  # a free port on this host; released for TensorFlow's server to take
        probe.bind((address, 0))
        port = probe.getsockname()[1]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (f"{address}:{port}", started))
    return [where for where, _ in gathered], [start for _, start in gathered]


def own_address() -> str:
    """The address this host reaches the job's first rank from (MASTER_ADDR): its own on that network."""
    return taskenv.address_towards(os.environ["MASTER_ADDR"])


def cluster_config(role_of: list[str], addresses: list[str], rank: int) -> dict[str, Any]:
    """TF_CONFIG for `rank`: the cluster's chief, workers and parameter servers (an evaluator is outside it)."""
    cluster: dict[str, list[str]] = {}
    index = 0
    for each, (role, address) in enumerate(zip(role_of, addresses, strict=True)):
        if role != "evaluator":
            cluster.setdefault(role, []).append(address)
        if each == rank:
            index = sum(1 for other in role_of[:rank] if other == role)
    return {"cluster": cluster, "task": {"type": role_of[rank], "index": index}}


def next_phase() -> str:
    """The phase the chief announces (every other rank waits here)."""
    message = [None]
    dist.broadcast_object_list(message, src=0)
    return str(message[0])


def announce(phase: str) -> None:
    dist.broadcast_object_list([phase], src=0)


def serve(params: dict[str, Any], role: str, counter: NodeInterfaceCounter) -> None:
    """A worker's or parameter server's TensorFlow server while the chief trains; an evaluator's evaluation. The
    task a fault targets serves from a child process (ps_faults.py), the one the chief signals."""
    import tensorflow as tf

    server, child = None, None
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    task = resolver.task_id if role in ("worker", "ps") else 0
    if role in ("worker", "ps"):
        os.environ["GRPC_FAIL_FAST"] = "use_caller"
        if ps_faults.is_fault_target(params, role, task):
            child = ps_faults.start_server_process()
        else:
            server = tf.distribute.Server(
                resolver.cluster_spec(), job_name=resolver.task_type, task_index=task, protocol="grpc"
            )
    ps_faults.gather_servers(role, task, child.pid if child else os.getpid())  # every server listens: chief connects
    while (phase := next_phase()) not in ("done", ABORT):
        counter.record(phase)
        if role == "ps" and shutil.which("ss"):
            emit("metric", rank=dist.get_rank(), metric="tcp_bytes", value=tcp_payload_bytes(), phase=phase)
        if phase == "evaluate" and role == "evaluator":
            evaluate_checkpoint(params)
    if child:
        record_server_exit(child)
    del server


def record_server_exit(child: subprocess.Popen) -> None:
    """How the faulted task's server process ended: the signal that killed it (its number), or 0 if it was still
    serving at the end (then it is stopped here)."""
    code = child.poll()
    if code is None:
        child.kill()
        child.wait()
    killed_by = -code if code is not None and code < 0 else 0
    detail = signal.Signals(killed_by).name if killed_by else "still serving at the end"
    emit("metric", rank=dist.get_rank(), metric="fault_server_exit_signal", value=killed_by, detail=detail)


def tcp_payload_bytes() -> int:
    """What this host's applications handed to TCP and got from it (every socket's bytes sent and received, from
    `ss`; loopback left out): the bytes TensorFlow (and the torch group's few) sent, without TCP/IP headers."""
    listing = subprocess.run(["ss", "-tinH"], capture_output=True, text=True, check=True).stdout
    total, loopback = 0, False
    for line in listing.splitlines():
        if not line[:1].isspace():
            loopback = line.split()[3].startswith(("127.", "[::1]", "[::ffff:127."))
            continue
        if not loopback:
            stats = dict(item.split(":", 1) for item in line.split() if ":" in item)
            total += int(stats.get("bytes_sent", stats.get("bytes_acked", 0))) + int(stats.get("bytes_received", 0))
    return total


def evaluate_checkpoint(params: dict[str, Any]) -> None:
    """The evaluator: test accuracy of the weights the chief wrote (the Estimator evaluator's checkpoint)."""
    with np.load(Path(os.environ["DDLREPRO_RUN_DIR"]) / WEIGHTS_FILE) as stored:
        weights = [stored[f"w{index}"] for index in range(len(stored.files))]
    split = digits(params)
    emit("metric", rank=dist.get_rank(), metric="evaluator_accuracy", value=numpy_accuracy(weights, split))


def numpy_accuracy(weights: list[np.ndarray], split: datasets.Split) -> float:
    activations = flat(split.test_images)
    for index in range(0, len(weights), 2):
        activations = activations @ weights[index] + weights[index + 1]
        if index + 2 < len(weights):
            activations = np.maximum(activations, 0)
    return float(np.mean(activations.argmax(axis=1) == split.test_labels))


def shards(variable: Any) -> list[Any]:
    """A partitioned variable's shards (ShardedVariable), or the variable itself."""
    return list(getattr(variable, "variables", [variable]))


def full(variable: Any) -> tf.Tensor:
    """The whole value: a partitioned variable's shards concatenated (its gradient fails if used directly)."""
    import tensorflow as tf

    parts = shards(variable)
    return tf.concat([tf.convert_to_tensor(part) for part in parts], axis=0) if len(parts) > 1 else parts[0]


class Chief:
    """The coordinator: builds the variables on the parameter servers, schedules the steps, announces the phases."""

    def __init__(
        self, params: dict[str, Any], ctx: RankContext, since: tuple[float, float], counter: NodeInterfaceCounter
    ) -> None:
        """`since`: the first rank's process start, and when every rank had loaded its libraries."""
        self.params = params
        self.ctx = ctx
        self.first_start, self.imported = since
        self.counter = counter
        self.servers: list[tuple[str, int, str, int]] = []  # who serves each task, and where (ps_faults.py)

    def run(self) -> None:
        coordinator, variables, flags = self.place_variables()
        try:
            self.train_and_probe(coordinator, variables, flags)
        except Exception as error:
            with contextlib.suppress(RuntimeError):  # a rank already gone: the chief's own error still tells why
                announce(ABORT)  # every other rank ends quietly: the run's error is the chief's
            raise self.lost_parameter_server(error) from error

    def train_and_probe(self, coordinator: Any, variables: list[Any], flags: list[bool]) -> None:
        """Train (from the checkpoint a retry is given, if any), record, probe, announce the end."""
        params = self.params
        split = digits(params)
        step = self.step_function(coordinator.strategy, variables, flags)
        data = per_worker_data(coordinator, split)
        samples, seed = len(split.train_labels), params["seed"]
        steps = params["epochs"] * steps_per_epoch(params, samples)
        progress = Progress(params, variables, steps_per_epoch(params, samples))
        order = batches(samples, params["batch_size"], seed)
        for _ in itertools.islice(order, progress.start):  # the epoch's permutation and place in it, as checkpointed
            pass
        train_time = self.train(coordinator, step, data, order, steps, progress)
        weights = [full(variable).numpy() for variable in variables]
        self.finish_training(weights, split, steps, train_time)
        self.phase("probe_start")
        probe = batches(samples, params["probe_batch_size"], seed + 1)
        self.steps(coordinator, step, data, probe, params["probe_steps"])
        self.phase("probe_end")
        announce("done")
        emit("result", rank=0, mode="cluster", placement=params["placement"], steps=steps)

    def lost_parameter_server(self, error: BaseException) -> BaseException:
        """A parameter server's loss as an error naming its task (`/job:ps/task:k`); any other error as it is."""
        import tensorflow as tf

        ps_addresses = json.loads(os.environ["TF_CONFIG"])["cluster"]["ps"]
        task = ps_faults.lost_ps_task(error, ps_addresses) if isinstance(error, tf.errors.OpError) else None
        if task is None and not isinstance(error, tf.errors.UnavailableError):
            return error
        return ps_faults.ParameterServerLost(task, error)

    def place_variables(self) -> tuple[Any, list[Any], list[bool]]:
        """Connect to the cluster; build the model's variables on the parameter servers and record where."""
        import tensorflow as tf

        self.servers = ps_faults.gather_servers("chief", 0, os.getpid())  # every server listens
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        partitioner = None
        if self.params["placement"] == "partitioned":
            partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(self.params["ps"])
        strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        flags = trainable_flags(self.params)
        with strategy.scope():
            variables = [
                tf.Variable(value, trainable=trainable, name=f"w{index}")
                for index, (value, trainable) in enumerate(zip(initial_weights(self.params), flags, strict=True))
            ]
        self.record_placement(variables, flags)
        return coordinator, variables, flags

    def train(
        self, coordinator: Any, step: Any, data: Any, order: Iterator[np.ndarray], steps: int, progress: Progress
    ) -> float:
        """The epochs between the `train` phase marks, and the cluster's ready time (its first step done); the
        training's seconds. Between segments (see segment_ends) the fault is injected and checkpoints are saved."""
        self.phase("train_start")
        began = time.time()
        done, completed = progress.start, 0
        for stop in segment_ends(progress.start, steps, self.params):
            completed += self.steps(coordinator, step, data, order, stop - done)
            if done == progress.start:
                ready = time.time()
                emit("metric", rank=0, metric="cluster_ready_s", value=ready - self.first_start)
                emit("metric", rank=0, metric="cluster_ready_after_imports_s", value=ready - self.imported)
            done = stop
            emit("metric", rank=0, metric="steps_done", value=done)  # how far a failed attempt got
            self.between_segments(done, steps, progress)
        seconds = time.time() - began
        self.phase("train_end")
        if self.params.get("fault") or progress.manager:
            self.record_recovery(progress.start, steps, completed)
        return seconds

    def between_segments(self, done: int, steps: int, progress: Progress) -> None:
        """After `done` steps: the fault if it is due, a checkpoint if one is due (not after the last step)."""
        fault = ps_faults.active_fault(self.params)
        if fault and done == fault["at_step"]:
            what = ps_faults.deliver(fault, self.servers)
            emit("metric", rank=0, metric="fault_delivered_at_step", value=done, detail=what)
        if progress.manager and done % self.params["checkpoint_interval"] == 0 and done < steps:
            progress.save(done)

    @staticmethod
    def record_recovery(start: int, steps: int, completed: int) -> None:
        """Where this attempt resumed, the steps it was to run and ran, and the closures the coordinator ran again
        on another worker after they failed on a lost one."""
        emit("metric", rank=0, metric="resumed_from_step", value=start)
        emit("metric", rank=0, metric="steps_planned", value=steps - start)
        emit("metric", rank=0, metric="steps_completed", value=completed)
        emit("metric", rank=0, metric="closures_rescheduled", value=ps_faults.recoverable_worker_failures())

    def phase(self, phase: str) -> None:
        announce(phase)
        self.counter.record(phase)

    def finish_training(self, weights: list[np.ndarray], split: datasets.Split, steps: int, seconds: float) -> None:
        """Record the accuracy and time; hand the weights to an evaluator, if any."""
        emit("metric", rank=0, metric="accuracy", value=numpy_accuracy(weights, split))
        emit("metric", rank=0, metric="train_time_s", value=seconds)
        emit("metric", rank=0, metric="train_steps", value=steps)
        if self.params["evaluators"]:
            arrays = {f"w{i}": w for i, w in enumerate(weights)}
            np.savez(Path(os.environ["DDLREPRO_RUN_DIR"]) / WEIGHTS_FILE, **arrays)  # type: ignore[arg-type]  # numpy's stubs read **arrays as allow_pickle
            announce("evaluate")

    def record_placement(self, variables: list[Any], flags: list[bool]) -> None:
        """Per parameter server: the bytes a step reads from it (every variable) and pushes to it (gradients)."""
        read = [0] * self.params["ps"]
        pushed = [0] * self.params["ps"]
        for variable, trainable in zip(variables, flags, strict=True):
            for shard in shards(variable):
                task = tf_device_task(shard.device)
                size = int(np.prod(shard.shape)) * shard.dtype.size
                read[task] += size
                pushed[task] += size if trainable else 0
        for task in range(self.params["ps"]):
            emit("metric", rank=0, metric="ps_read_bytes_per_step", value=read[task], detail=f"ps {task}")
            emit("metric", rank=0, metric="ps_pushed_bytes_per_step", value=pushed[task], detail=f"ps {task}")

    def step_function(self, strategy: Any, variables: list[Any], flags: list[bool]) -> Any:
        """One worker's step: read every variable, push the trainable ones' SGD updates."""
        import tensorflow as tf

        rate = self.params["learning_rate"]
        trained = [shard for variable, flag in zip(variables, flags, strict=True) if flag for shard in shards(variable)]

        def replica_step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                activations = images
                for index in range(0, len(variables), 2):
                    activations = tf.matmul(activations, full(variables[index])) + full(variables[index + 1])
                    if index + 2 < len(variables):
                        activations = tf.nn.relu(activations)
                per_sample = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, activations)
                loss = tf.reduce_mean(per_sample)
            for shard, gradient in zip(trained, tape.gradient(loss, trained), strict=True):
                shard.assign_sub(rate * gradient)
            return loss

        @tf.function
        def worker_step(iterator: Any, indices: tf.Tensor) -> tf.Tensor:
            images, labels = next_batch(iterator, indices)
            return strategy.run(replica_step, args=(images, labels))

        return worker_step

    @staticmethod
    def steps(coordinator: Any, step: Any, data: Any, order: Iterator[np.ndarray], count: int) -> int:
        """`count` steps, each on whichever worker is free, each on the next batch of `order`; how many completed
        (returned their loss, on the worker first given them or, after it was lost, on another)."""
        losses = [coordinator.schedule(step, args=(data, indices)) for indices in itertools.islice(order, count)]
        coordinator.join()
        return sum(1 for loss in losses if loss.fetch() is not None)


def segment_ends(start: int, steps: int, params: dict[str, Any]) -> list[int]:
    """Where training pauses (every step before joined): after its first step (the cluster's ready time), at every
    checkpoint, at the fault's step (first attempt only) and at the end."""
    every = params.get("checkpoint_interval", 0)
    ends = {start + 1, steps, *(range(every, steps, every) if every else ())}
    fault = ps_faults.active_fault(params)
    if fault:
        ends.add(fault["at_step"])
    return sorted(end for end in ends if start < end <= steps)


class Progress:
    """The chief's checkpoint (`checkpoint_interval` steps; none if 0): the model's variables, the step, the epoch and
    the place in its permutation (plain SGD keeps no optimizer state to save). Written to the run folder's
    `checkpoint/`; read from `resume_checkpoint`, the previous failed attempt's, which the host hands a retry."""

    def __init__(self, params: dict[str, Any], variables: list[Any], per_epoch: int) -> None:
        import tensorflow as tf

        self.per_epoch = per_epoch
        self.step, self.epoch, self.position = (tf.Variable(0, dtype=tf.int64, name=name) for name in POSITION)
        self.checkpoint = tf.train.Checkpoint(
            step=self.step, epoch=self.epoch, position=self.position, **{f"w{i}": v for i, v in enumerate(variables)}
        )
        self.manager = None
        if params.get("checkpoint_interval"):
            folder = Path(os.environ["DDLREPRO_RUN_DIR"]) / CHECKPOINT_DIR
            self.manager = tf.train.CheckpointManager(self.checkpoint, str(folder), max_to_keep=1)
        self.start = self.restore(params.get("resume_checkpoint"))

    def restore(self, folder: str | None) -> int:
        """The step to resume from: the latest checkpoint in `folder` restored (0 without one)."""
        import tensorflow as tf

        latest = tf.train.latest_checkpoint(folder) if folder else None
        if latest is None:
            return 0
        self.checkpoint.restore(latest).assert_consumed()
        step = int(self.step.numpy())
        if int(self.epoch.numpy()) * self.per_epoch + int(self.position.numpy()) != step:
            raise RuntimeError(f"checkpoint {latest}: epoch and position disagree with step {step}")
        return step

    def save(self, done: int) -> None:
        self.step.assign(done)
        self.epoch.assign(done // self.per_epoch)
        self.position.assign(done % self.per_epoch)
        assert self.manager is not None
        self.manager.save(checkpoint_number=done)


def batches(samples: int, batch_size: int, seed: int) -> Iterator[np.ndarray]:
    """The training set's sample indices, batch after batch: each epoch a fresh seeded permutation in batches of
    `batch_size` (the last one smaller, as Keras `fit` does). The chief deals them to the workers: across the
    cluster every sample is seen once per epoch, whatever the number of workers."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(samples).astype(np.int32)
        yield from (order[start : start + batch_size] for start in range(0, samples, batch_size))


def per_worker_data(coordinator: Any, split: datasets.Split) -> Any:
    """Every worker's copy of the whole training set (a dataset yielding it whole, sent once with the function)."""
    import tensorflow as tf

    images, labels = flat(split.train_images), split.train_labels

    def dataset_fn() -> tf.data.Dataset:
        return tf.data.Dataset.from_tensors((images, labels)).repeat()

    return iter(coordinator.create_per_worker_dataset(dataset_fn))


def next_batch(iterator: Any, indices: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The batch `indices` picks from the worker's copy of the training set."""
    import tensorflow as tf

    images, labels = next(iterator)
    return tf.gather(images, indices), tf.gather(labels, indices)


def tf_device_task(device: str) -> int:
    """The parameter server's task index in a device name such as /job:ps/replica:0/task:1/device:CPU:0."""
    for part in device.split("/"):
        if part.startswith("task:"):
            return int(part[len("task:") :])
    raise ValueError(f"variable device {device!r} names no task")


def run_single(params: dict[str, Any]) -> None:
    """The baseline: the same model trained with Keras `fit` in this one process."""
    import keras

    split = digits(params)
    flags = trainable_flags(params)
    model = keras.Sequential([keras.Input((64,))])
    sizes = layer_sizes(params)
    for index, (_, outputs) in enumerate(sizes):
        last = index == len(sizes) - 1
        model.add(keras.layers.Dense(outputs, activation=None if last else "relu", trainable=flags[2 * index]))
    model.set_weights(initial_weights(params))
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=params["learning_rate"]),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    keras.utils.set_random_seed(params["seed"])  # fit's shuffling: the same order on every run
    began = time.time()
    model.fit(
        flat(split.train_images),
        split.train_labels,
        batch_size=params["batch_size"],
        epochs=params["epochs"],
        shuffle=True,
        verbose=0,
    )
    train_time = time.time() - began
    emit("metric", rank=0, metric="accuracy", value=numpy_accuracy(model.get_weights(), split))
    emit("metric", rank=0, metric="train_time_s", value=train_time)
    steps = params["epochs"] * steps_per_epoch(params, len(split.train_labels))
    emit("metric", rank=0, metric="train_steps", value=steps)
    emit("result", rank=0, mode="single", steps=steps)
