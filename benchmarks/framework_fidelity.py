"""Framework fidelity: img/s of the throughput workload under each framework ÷ that framework's own baseline.

Same model, batch and image size, one thread per worker. The baselines are each framework's plainest training
code, started the framework's own way:
- torch: the bare loop of harness_fidelity.py (written independently of the workload), one worker;
- Horovod: Horovod's own published `examples/pytorch/pytorch_synthetic_benchmark.py`, unmodified, under
  `horovodrun -np N --gloo` (N = `--horovod-workers`, 2 by default), against our horovod point at N workers.
  The script imports its model from torchvision; `benchmarks/horovod_shim/` stands in for torchvision on its
  PYTHONPATH and hands it ddlrepro's model (its docstring says how the script's fixed 224 px batch and 1000
  labels are fitted). The script is the one of the installed Horovod release, downloaded from GitHub at run
  time, or `--horovod-script PATH`;
- TensorFlow: a MultiWorkerMirroredStrategy custom loop (strategy.run of a GradientTape step in a tf.function),
  on its own synthetic data, one worker.
The workload runs through the project's launcher with its records and resource sampling. Baseline and workload
runs alternate in fresh processes, so machine noise hits both alike; each round's ratio pairs the two, and a target is
judged on the mean of the rounds' ratios and its one-sided 95 % bootstrap bounds (as the workflow judges a timing
claim), over the `--rounds` fixed before the run (default 10: three rounds gave no interval to judge by). Target
(targets.yaml): ≥ 0.97 for every framework.

    python benchmarks/framework_fidelity.py [--frameworks torch horovod tensorflow] [--rounds 10]
        [--horovod-workers 2] [--horovod-script PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _common import BenchmarkRecord, paired_round
from harness_fidelity import measure_bare as measure_torch_bare
from harness_fidelity import measure_harness
from horovod_shim.torchvision.models import IMAGE_SIZE_ENV

from ddlrepro.host.hostload import ForeignLoadMeter

if TYPE_CHECKING:
    import tensorflow as tf


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


def bare_tensorflow(args: argparse.Namespace) -> float:
    os.environ.pop("TF_CONFIG", None)
    import keras
    import tensorflow as tf

    from ddlrepro.rank.models import MODELS
    from ddlrepro.rank.tf_models import build_keras_model

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_keras_model(args.model, args.image_size or None)
        optimizer = keras.optimizers.SGD(0.01)
    side = args.image_size or MODELS[args.model].image_size
    images = tf.random.uniform((args.batch_size, side, side, 3), -1.0, 1.0, seed=0)
    labels = tf.random.uniform((args.batch_size,), 0, MODELS[args.model].num_classes, dtype=tf.int64, seed=0)

    def replica_step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, model(images, training=True)))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    step = tf.function(lambda: strategy.run(replica_step))
    return timed(step, lambda loss: loss.numpy(), args)


FRAMEWORKS = ["torch", "horovod", "tensorflow"]
SHIM = Path(__file__).resolve().parent / "horovod_shim"
SCRIPT_URL = (
    "https://raw.githubusercontent.com/horovod/horovod/v{version}/examples/pytorch/pytorch_synthetic_benchmark.py"
)
SCRIPT_RESULT = re.compile(r"Img/sec per CPU: ([0-9.]+)")


def measure_bare(framework: str, args: argparse.Namespace) -> float:
    """img/s per worker of the framework's baseline, in fresh processes."""
    if framework == "torch":
        return measure_torch_bare(args)
    if framework == "horovod":
        return measure_horovod_own(args)
    own = [sys.executable, __file__, "--bare", framework, *protocol_flags(args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(own, capture_output=True, text=True, check=True, env=env)
    return float(done.stdout.strip().splitlines()[-1].split(":")[-1])


def horovod_script(args: argparse.Namespace, scratch: Path) -> Path:
    """Horovod's synthetic benchmark: `--horovod-script`, else the installed release's, downloaded."""
    if args.horovod_script:
        return args.horovod_script
    import horovod

    url = SCRIPT_URL.format(version=horovod.__version__)
    target = scratch / "pytorch_synthetic_benchmark.py"
    try:
        urllib.request.urlretrieve(url, target)
    except OSError as error:
        sys.exit(f"could not download Horovod's benchmark from {url} ({error}); pass --horovod-script PATH")
    return target


def measure_horovod_own(args: argparse.Namespace) -> float:
    """img/s per worker that Horovod's own script prints, under `horovodrun -np N --gloo`, our model shimmed in."""
    workers = str(args.horovod_workers)
    command = [str(Path(sys.executable).parent / "horovodrun"), "-np", workers, "-H", f"localhost:{workers}"]
    command += ["--gloo", sys.executable, str(args.horovod_script), "--no-cuda", "--model", args.model]
    command += ["--batch-size", str(args.batch_size), "--num-warmup-batches", str(args.warmup)]
    command += ["--num-batches-per-iter", str(args.batches), "--num-iters", str(args.iterations)]
    pythonpath = os.pathsep.join(filter(None, [str(SHIM), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath}
    if args.image_size:
        env[IMAGE_SIZE_ENV] = str(args.image_size)
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    found = SCRIPT_RESULT.search(done.stdout)
    if done.returncode or not found:
        sys.exit(f"Horovod's benchmark failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return float(found.group(1))


def protocol_flags(args: argparse.Namespace) -> list[str]:
    return [
        *("--model", args.model, "--batch-size", str(args.batch_size), "--image-size", str(args.image_size)),
        *("--warmup", str(args.warmup), "--iterations", str(args.iterations), "--batches", str(args.batches)),
    ]


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bare", choices=["tensorflow"], help=argparse.SUPPRESS)
    parser.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=FRAMEWORKS)
    parser.add_argument("--horovod-workers", type=int, default=2)
    parser.add_argument("--horovod-script", type=Path, help="Horovod's pytorch_synthetic_benchmark.py")
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=10, help="paired rounds, fixed before the run")
    return parser.parse_args()


def main() -> None:
    args = parse()
    if args.bare:
        print(f"bare img/s: {bare_tensorflow(args)}", flush=True)
        return
    if "horovod" in args.frameworks and not shutil.which("horovodrun", path=str(Path(sys.executable).parent)):
        sys.exit("horovodrun is not in this environment: run `make horovod` first")
    with tempfile.TemporaryDirectory() as workdir, BenchmarkRecord(__file__, args) as record:
        if "horovod" in args.frameworks:
            args.horovod_script = horovod_script(args, Path(workdir))
            digest = hashlib.sha256(args.horovod_script.read_bytes()).hexdigest()
            print(f"Horovod's benchmark: {args.horovod_script} (sha256 {digest})")
            record.options["horovod_script_sha256"] = digest
        for framework in args.frameworks:
            compare(framework, args, Path(workdir), record)


def compare(framework: str, args: argparse.Namespace, workdir: Path, record: BenchmarkRecord) -> None:
    """Alternate the framework's baseline and the workload for the rounds (which goes first swapping round by
    round); each round's ratio pairs its two runs."""
    workers = args.horovod_workers if framework == "horovod" else 1
    bare, workload = [], []
    with ForeignLoadMeter() as meter:
        for round_index in range(args.rounds):
            run_dir = workdir / f"{framework}{round_index}"
            harness = partial(measure_harness, args, run_dir, workers=workers, framework=framework)
            rates = paired_round(round_index, partial(measure_bare, framework, args), harness)
            bare.append(rates[0])
            workload.append(rates[1])
            print(f"{framework} round {round_index}: baseline {bare[-1]:.1f} img/s, workload {workload[-1]:.1f} img/s")
    print(json.dumps({"framework": framework, "workers": workers, "baseline": bare, "workload": workload}))
    for name, rates in (("baseline", bare), ("workload", workload)):
        what = f"{framework} @{workers}: {name}, median img/s per worker"
        record.add(f"{framework}-{name}", what, statistics.median(rates), "img/s", meter.load, workers=workers)
    what = f"{framework} @{workers}: workload ÷ the framework's own baseline, mean of the rounds' ratios"
    ratios = [mine / theirs for mine, theirs in zip(workload, bare, strict=True)]
    record.add(
        f"{framework}-fidelity", what, statistics.fmean(ratios), "", meter.load, workers=workers, round_values=ratios
    )


if __name__ == "__main__":
    main()
