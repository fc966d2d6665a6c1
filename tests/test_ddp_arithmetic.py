"""Plain DDP's arithmetic reproduced (EasyScale's D1, issue 36 item 4): gloo's ring all-reduce and DDP's buckets,
against real gloo processes, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import spawn_gloo
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddlrepro.rank.ddp_arithmetic import bucket_layout, ddp_average, ring_blocks, ring_sum

SIZES = [1, 5, 1000, 2**18 + 3, 3 * 2**18 + 1]  # the last two over gloo's 1 MiB segment: more than 2 per rank


def ring_run(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(gloo's all-reduce, ring_sum of every rank's gathered input) per size."""
    pairs = []
    for size in SIZES:
        mine = torch.randn(size, generator=torch.Generator().manual_seed(1000 * rank + size))
        gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, mine)
        reduced = mine.clone()
        dist.all_reduce(reduced)
        pairs.append((reduced, ring_sum(torch.stack(gathered))))
    return pairs


@pytest.mark.parametrize("world", [3, 4])
def test_ring_sum_is_gloos_all_reduce(tmp_path: Path, world: int) -> None:
    for rank_pairs in spawn_gloo(ring_run, world, tmp_path):
        for size, (reduced, emulated) in zip(SIZES, rank_pairs, strict=True):
            assert torch.equal(reduced, emulated), size


def test_ring_blocks_by_hand() -> None:
    """10 floats on 2 ranks: 4 segments of 12 bytes (3 floats), 2 per rank: rank 0 holds [0, 6), rank 1 [6, 10)."""
    assert ring_blocks(10, 2, 4) == [(0, 6), (6, 10)]
    assert ring_blocks(1, 3, 4) == [(0, 1), (1, 1), (1, 1)]


def network() -> nn.Module:
    """Over 1 MiB of parameters in layers of unequal size: DDP's rebuilt buckets split it (1 MiB first cap)."""
    return nn.Sequential(nn.Linear(24, 400), nn.ReLU(), nn.Linear(400, 700), nn.ReLU(), nn.Linear(700, 5))


def ddp_run(rank: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per step: (DDP's averaged gradient, ddp_average of every rank's local gradient), flattened."""
    torch.manual_seed(0)
    model = DistributedDataParallel(network())
    local = network()
    local.load_state_dict(model.module.state_dict())
    parameters = list(local.parameters())
    ready: list[int] = []
    for index, parameter in enumerate(parameters):
        parameter.register_post_accumulate_grad_hook(lambda _, index=index: ready.append(index))
    sizes = [parameter.numel() for parameter in parameters]
    pairs = []
    for step in range(steps):
        generator = torch.Generator().manual_seed(100 * rank + step)
        x, y = torch.randn(16, 24, generator=generator), torch.randint(0, 5, (16,), generator=generator)
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()
        local.zero_grad()
        F.cross_entropy(local(x), y).backward()
        mine = torch.cat([parameter.grad.flatten() for parameter in parameters])
        gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, mine)
        layout = bucket_layout(parameters, ready[: len(parameters)] if step > 0 else None)
        averaged = torch.cat([parameter.grad.flatten() for parameter in model.module.parameters()])
        pairs.append((averaged, ddp_average(torch.stack(gathered), sizes, layout)))
    return pairs


@pytest.mark.parametrize("world", [3, 4])
def test_ddp_average_is_what_ddp_leaves_in_the_gradients(tmp_path: Path, world: int) -> None:
    """Three steps: the first with DDP's one initial bucket, then its buckets rebuilt in gradient-ready order."""
    layout = bucket_layout(list(network().parameters()), [5, 4, 3, 2, 1, 0])
    assert len(layout) > 1  # the rebuilt buckets are several: the test crosses bucket boundaries
    for rank_pairs in spawn_gloo(ddp_run, world, tmp_path, 3):
        for step, (averaged, emulated) in enumerate(rank_pairs):
            assert torch.equal(averaged, emulated), step
