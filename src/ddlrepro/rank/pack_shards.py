"""Pack the throughput workload's synthetic batches as shards (see shards.py), one batch per shard.

`python -m ddlrepro.rank.pack_shards --out DIR --model M --batch-size B --count N`: the workflow's `pack_shards` rule.
"""

from __future__ import annotations

from ddlrepro import startup

if __name__ == "__main__":  # no collections while it loads torch (startup.py)
    startup.pause_collection()

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from ddlrepro.rank.shards import shard_name
from ddlrepro.rank.workloads.throughput import synthetic_batch


def pack(out: Path, model: str, batch_size: int, count: int, image_size: int | None = None) -> list[Path]:
    """Write `count` shards of one batch each into `out`, and `manifest.json` describing them."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        images, labels = synthetic_batch(model, batch_size, image_size, torch.device("cpu"), seed=index)
        path = out / shard_name(index)
        with path.open("wb") as file:
            np.savez(file, images=images.numpy(), labels=labels.numpy())
        paths.append(path)
    manifest = {"model": model, "batch_size": batch_size, "count": count, "image_size": image_size}
    (out / "manifest.json").write_text(json.dumps(manifest, sort_keys=True) + "\n")
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Pack the throughput workload's synthetic batches as shards.")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--image-size", type=int)
    args = parser.parse_args(argv)
    startup.resume_collection()
    pack(args.out, args.model, args.batch_size, args.count, args.image_size)


if __name__ == "__main__":
    main()
