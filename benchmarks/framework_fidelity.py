"""Framework fidelity: img/s of the throughput workload under each framework ÷ that framework's own minimal loop.

Same model, batch, image size, one worker with one thread. The minimal loops are each framework's plainest
training code, started the framework's own way: torch, a bare SGD loop (as harness_fidelity.py); Horovod, its
synthetic benchmark's loop (DistributedOptimizer, broadcasts) under `horovodrun --gloo`; TensorFlow, a
MultiWorkerMirroredStrategy custom loop (strategy.run of a GradientTape step in a tf.function). The workload runs
through the project's launcher with its records and resource sampling. Bare and workload runs alternate in fresh
processes within one run of this script, so machine noise hits both alike. Target: ≥ 0.97 for every framework.

    python benchmarks/framework_fidelity.py [--frameworks torch horovod tensorflow] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness_fidelity import measure_harness

if TYPE_CHECKING:
    import tensorflow as tf
    import torch

TARGET = 0.97


def timed(step: Callable[[], Any], finish: Callable[[Any], Any], args: argparse.Namespace) -> float:
    """The protocol's mean img/s of `step` (warm-up, then iterations of `batches` steps)."""
    for _ in range(args.warmup):
        result = step()
    finish(result)
    rates = []
    for _ in range(args.iterations):
        started = time.perf_counter()
        for _ in range(args.batches):
            result = step()
        finish(result)
        rates.append(args.batch_size * args.batches / (time.perf_counter() - started))
    return statistics.fmean(rates)


def torch_batch(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    from ddlrepro.workloads.throughput import synthetic_batch

    return synthetic_batch(args.model, args.batch_size, args.image_size or None, torch.device("cpu"), 0)


def bare_torch(args: argparse.Namespace) -> float:
    import torch

    from ddlrepro.models import build_model
    from ddlrepro.workloads.throughput import make_train_step

    torch.set_num_threads(1)
    torch.manual_seed(0)
    step = make_train_step(build_model(args.model), *torch_batch(args))
    return timed(step, lambda loss: loss.item(), args)


def bare_horovod(args: argparse.Namespace) -> float:
    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F

    from ddlrepro.models import build_model

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(args.model)
    images, labels = torch_batch(args)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def step() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss

    return timed(step, lambda loss: loss.item(), args)


def bare_tensorflow(args: argparse.Namespace) -> float:
    os.environ.pop("TF_CONFIG", None)
    import keras
    import tensorflow as tf

    from ddlrepro.tf_models import build_keras_model
    from ddlrepro.workloads.tensorflow_trainer import synthetic_batch

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_keras_model(args.model, args.image_size or None)
        optimizer = keras.optimizers.SGD(0.01)
    images, labels = synthetic_batch(args.model, args.batch_size, args.image_size or None, 0)

    def replica_step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, model(images, training=True)))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    step = tf.function(lambda: strategy.run(replica_step))
    return timed(step, lambda loss: loss.numpy(), args)


BARE = {"torch": bare_torch, "horovod": bare_horovod, "tensorflow": bare_tensorflow}


def measure_bare(framework: str, args: argparse.Namespace) -> float:
    own = [sys.executable, __file__, "--bare", framework, *protocol_flags(args)]
    if framework == "horovod":
        own = [str(Path(sys.executable).parent / "horovodrun"), "-np", "1", "-H", "localhost:1", "--gloo", *own]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(own, capture_output=True, text=True, check=True, env=env)
    return float(done.stdout.strip().splitlines()[-1].split(":")[-1])


def protocol_flags(args: argparse.Namespace) -> list[str]:
    return [
        *("--model", args.model, "--batch-size", str(args.batch_size), "--image-size", str(args.image_size)),
        *("--warmup", str(args.warmup), "--iterations", str(args.iterations), "--batches", str(args.batches)),
    ]


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bare", choices=list(BARE), help=argparse.SUPPRESS)
    parser.add_argument("--frameworks", nargs="+", choices=list(BARE), default=list(BARE))
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args()


def main() -> None:
    args = parse()
    if args.bare:
        print(f"bare img/s: {BARE[args.bare](args)}", flush=True)
        return
    if "horovod" in args.frameworks and not shutil.which("horovodrun", path=str(Path(sys.executable).parent)):
        sys.exit("horovodrun is not in this environment: run `make horovod` first")
    with tempfile.TemporaryDirectory() as workdir:
        for framework in args.frameworks:
            bare, workload = [], []
            for round_index in range(args.rounds):
                bare.append(measure_bare(framework, args))
                workload.append(measure_harness(args, Path(workdir) / f"{framework}{round_index}", framework=framework))
                print(f"{framework} round {round_index}: bare {bare[-1]:.1f} img/s, workload {workload[-1]:.1f} img/s")
            ratio = statistics.median(workload) / statistics.median(bare)
            print(json.dumps({"framework": framework, "bare": bare, "workload": workload}))
            print(f"{framework}: workload ÷ own minimal loop (medians): {ratio:.3f}  (target >= {TARGET})")


if __name__ == "__main__":
    main()
