"""Every communication strategy equals the plain all-reduce, in real multi-process gloo runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import spawn_gloo
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddlrepro.rank import strategies
from ddlrepro.rank.strategies import (
    STRATEGIES,
    apply_strategy,
    chunk_count,
    link_bound,
    reducer,
    sent_per_rank,
    strategy_pairs,
)


def sums_by_strategy(rank: int, group_size: int, lanes: int) -> dict[str, dict[str, torch.Tensor]]:
    """Each strategy's sum of rank-dependent integer and float tensors, next to all_reduce's, its chunks summed on
    `lanes` threads; the float tensor also cut into 1000-byte chunks (17 pieces of 241 floats)."""
    generator = torch.Generator().manual_seed(rank)
    integers = torch.randint(-1000, 1000, (1031,), generator=generator, dtype=torch.int64)
    floats = torch.randn(4097, generator=generator)
    chunked = torch.randint(-1000, 1000, (3 * 2**18 + 5,), generator=generator, dtype=torch.int32)  # > 3 MiB
    sums = {}
    for strategy in ["ALL_REDUCE", *STRATEGIES]:
        reduce = (
            (lambda t: (dist.all_reduce(t), t)[1]) if strategy == "ALL_REDUCE" else reducer(strategy, group_size, lanes)
        )
        sums[strategy] = {
            "int": reduce(integers.clone()),
            "float": reduce(floats.clone()),
            "chunked": reduce(chunked.clone()),
        }
        if strategy != "ALL_REDUCE":
            sums[strategy]["small chunks"] = reducer(strategy, group_size, lanes, chunk_bytes=1000)(floats.clone())
    return sums


@pytest.mark.parametrize(("world", "group_size", "lanes"), [(2, 2, 1), (3, 2, 5), (4, 1, 2), (4, 1, 4), (5, 1, 2)])
def test_every_strategy_equals_all_reduce(tmp_path: Path, world: int, group_size: int, lanes: int) -> None:
    """Five lanes for four chunks leave one without any. At 4 and 5 ranks of a host each, MULTI_BINARY_TREE_STAR's
    four or five trees pass totals down through ranks in different orders, chunk by chunk."""
    results = spawn_gloo(sums_by_strategy, world, tmp_path, group_size, lanes)
    for rank_sums in results:
        expected = rank_sums["ALL_REDUCE"]
        for strategy in STRATEGIES:
            assert torch.equal(rank_sums[strategy]["int"], expected["int"]), strategy
            assert torch.equal(rank_sums[strategy]["chunked"], expected["chunked"]), strategy
            torch.testing.assert_close(rank_sums[strategy]["float"], expected["float"], rtol=1e-5, atol=1e-5)
            small, whole = rank_sums[strategy]["small chunks"], rank_sums[strategy]["float"]
            if strategy == "RING" or len(strategy_pairs(strategy, world, group_size)) == 1:
                assert torch.equal(small, whole), strategy  # one graph: the same additions, however cut
            else:  # chunks through different trees: their partial sums group the ranks differently
                torch.testing.assert_close(small, whole, rtol=1e-5, atol=1e-5)
    for strategy in STRATEGIES:
        assert all(torch.equal(r[strategy]["float"], results[0][strategy]["float"]) for r in results), strategy


def star_sums_at_every_root(rank: int) -> dict[str, torch.Tensor]:
    """STAR's float sum rooted at each rank, and the sum of every rank's tensor added in rank order here."""
    world = dist.get_world_size()
    tensors = [torch.randn(4097, generator=torch.Generator().manual_seed(source)) for source in range(world)]
    in_rank_order = tensors[0].clone()
    for tensor in tensors[1:]:
        in_rank_order += tensor
    star = reducer("STAR", 1)
    return {"order": in_rank_order} | {f"root {root}": star(tensors[rank].clone(), root=root) for root in range(world)}


def test_star_adds_in_rank_order_bit_for_bit_wherever_its_root(tmp_path: Path) -> None:
    """The root adds its own tensor where its rank falls among the others', without copying it aside."""
    results = spawn_gloo(star_sums_at_every_root, 4, tmp_path)
    for rank_sums in results:
        for root in range(4):
            assert torch.equal(rank_sums[f"root {root}"], rank_sums["order"]), root


def sends_of_one_exchange(rank: int, strategy: str) -> list[tuple[int, tuple[int, ...]]]:
    """(chunk, destinations) of every send this rank posts in one 8-chunk all-reduce on two lanes, in order."""
    posted: list[tuple[int, tuple[int, ...]]] = []
    send = strategies.Peers.send

    def recording(peers, tensor: torch.Tensor, destinations: tuple[int, ...], tag: int) -> list:
        posted.append((tag, destinations))
        return send(peers, tensor, destinations, tag)

    strategies.Peers.send = recording  # in this forked rank only
    reducer(strategy, 1, lanes=2)(torch.ones(8 * 2**18))
    return posted


@pytest.mark.parametrize("strategy", ["STAR", "CLIQUE"])
def test_a_leaf_sends_its_chunks_up_in_chunk_order_whichever_lane_runs_first(tmp_path: Path, strategy: str) -> None:
    """A parent passes chunk i on once every input has sent it: leaves sending their chunks in different orders
    (lane by lane, as the lanes happened to run) left a star's root idle until the orders crossed."""
    results = spawn_gloo(sends_of_one_exchange, 4, tmp_path, strategy)
    pairs = strategy_pairs(strategy, 4, 1)
    for rank, posted in enumerate(results):
        up = [tag for tag, destinations in posted if destinations == (pairs[tag % len(pairs)].parent(rank),)]
        leaf_chunks = [tag for tag in range(8) if not pairs[tag % len(pairs)].reduce_inputs(rank)]
        assert up[: len(leaf_chunks)] == leaf_chunks, (rank, posted)  # all of them first, in chunk order


def train_with(rank: int, strategy: str, steps: int) -> list[torch.Tensor]:
    """A few DDP steps of a small network under `strategy`; the parameters afterwards."""
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3)),
        bucket_cap_mb=0.01,
    )
    apply_strategy(model, strategy, group_size=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x, y = torch.randn(32, 16, generator=generator), torch.randint(0, 3, (32,), generator=generator)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def train_with_every_strategy(rank: int, steps: int) -> dict[str, list[torch.Tensor]]:
    return {strategy: train_with(rank, strategy, steps) for strategy in STRATEGIES}


def test_strategy_hooks_train_as_ddp_does(tmp_path: Path) -> None:
    """Same data, same start: every hook's parameters match DDP's own (RING) and are the same bits on every rank."""
    results = spawn_gloo(train_with_every_strategy, 3, tmp_path, 5)
    for strategy in STRATEGIES:
        for rank in range(3):
            for hooked, plain in zip(results[rank][strategy], results[rank]["RING"], strict=True):
                torch.testing.assert_close(hooked, plain, rtol=1e-4, atol=1e-5)
            assert all(torch.equal(a, b) for a, b in zip(results[rank][strategy], results[0][strategy], strict=True))


def test_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="valid strategies: RING, STAR"):
        reducer("MULTI_RING", 1)


def test_an_exchange_without_lanes_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one lane, not 0"):
        reducer("STAR", 1, lanes=0)
    with pytest.raises(ValueError, match="at least one byte, not 0"):
        reducer("STAR", 1, chunk_bytes=0)


def train_moving_root(rank: int, steps: int, move_at: int | None) -> dict[str, object]:
    """DDP steps under STAR whose root moves from rank 0 to rank 1 before step `move_at` (None: never)."""
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(16, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 3))
    )
    hook = apply_strategy(model, "STAR", group_size=1)
    assert hook is not None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(100 + rank)
    reduced = []
    for step in range(steps):
        hook.root = 1 if move_at is not None and step >= move_at else 0
        x, y = torch.randn(32, 16, generator=generator), torch.randint(0, 3, (32,), generator=generator)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        volume = hook.throughput()
        reduced.append((volume.bytes, volume.seconds, volume.mib_per_s))
    return {"parameters": [p.detach().clone() for p in model.parameters()], "reduced": reduced}


def train_moving_and_still(rank: int, steps: int) -> dict[str, dict[str, object]]:
    return {"moved": train_moving_root(rank, steps, move_at=2), "still": train_moving_root(rank, steps, None)}


def test_moving_star_root_mid_run_changes_no_bit(tmp_path: Path) -> None:
    """STAR adds in rank order whoever the root is: moving it mid-run leaves every parameter bit-equal, and the
    hook counts each step's reduced bytes (the whole gradient, once) and a time for them."""
    results = spawn_gloo(train_moving_and_still, 4, tmp_path, 5)
    gradient_bytes = sum(p.numel() * p.element_size() for p in results[0]["still"]["parameters"])
    for rank_result in results:
        moved, still = rank_result["moved"]["parameters"], rank_result["still"]["parameters"]
        assert all(torch.equal(a, b) for a, b in zip(moved, still, strict=True))
        assert all(torch.equal(a, b) for a, b in zip(moved, results[0]["moved"]["parameters"], strict=True))
        for reduced_bytes, seconds, mib_per_s in rank_result["moved"]["reduced"]:
            assert reduced_bytes == gradient_bytes
            assert seconds > 0 and mib_per_s > 0


def test_the_graphs_are_kungfus() -> None:
    """lsds/KungFu@osdi20-artifact plan/topology.go and session/strategy.go, on 6 ranks in 3 hosts of 2 (masters 0,
    2, 4), worked out by hand from the Go: broadcast edges parent → child."""
    local = {(0, 1), (2, 3), (4, 5)}

    def edges(strategy: str) -> list[set[tuple[int, int]]]:
        return [set(pair.broadcast) for pair in strategy_pairs(strategy, 6, 2)]

    assert edges("STAR") == [{(0, r) for r in range(1, 6)}]
    assert edges("TREE") == [local | {(0, 2), (0, 4)}]
    assert edges("MULTI_STAR") == [local | {(0, 2), (0, 4)}, local | {(2, 0), (2, 4)}, local | {(4, 0), (4, 2)}]
    assert edges("BINARY_TREE") == [{(0, 1), (0, 2), (1, 3), (1, 4), (2, 5)}]
    assert edges("BINARY_TREE_STAR") == [local | {(0, 2), (0, 4)}]
    # genBinaryTreeStar(peers, offset): the masters' tree over masters[(i + offset) % 3]
    assert edges("MULTI_BINARY_TREE_STAR") == [
        local | {(0, 2), (0, 4)},
        local | {(2, 4), (2, 0)},
        local | {(4, 0), (4, 2)},
    ]
    assert edges("CLIQUE") == [{(root, r) for r in range(6) if r != root} for root in range(6)]
    assert edges("AUTO") == edges("BINARY_TREE_STAR") and strategy_pairs("AUTO", 4, 4) == strategy_pairs("STAR", 4, 4)


def test_clique_spreads_chunks_over_every_root_and_a_small_tensor_is_one_star() -> None:
    """KungFu's CLIQUE is k stars: a 4 MiB tensor on 4 ranks is 4 chunks, one rooted at each rank, so every rank
    sends 1.5× the tensor (2(n−1)/n), not every rank's tensor to every other ((n−1)× = 3×). Up to 1 MiB: one chunk,
    one plain star."""
    mib = 1 << 20
    assert chunk_count(4 * mib) == 4 and chunk_count(mib) == 1 and chunk_count(mib + 1) == 2
    assert sent_per_rank("CLIQUE", 4, 4, 4 * mib) == [6 * mib] * 4
    assert sent_per_rank("CLIQUE", 4, 4, mib) == sent_per_rank("STAR", 4, 4, mib) == [3 * mib, mib, mib, mib]


def test_where_links_limit_a_star_reaches_half_the_rings_bus_bandwidth_at_4_ranks() -> None:
    """A rank per host, 64 MiB: gloo's ring sends 1.5 tensors over each rank's link, each way; STAR's root 3 (one
    to each other rank), the binary tree's root and rank 1 two (to and from two neighbours), CLIQUE's rotating
    roots 1.5 in all; at 8 ranks the star's root sends 7, the ring 1.75."""
    mib = 1 << 20
    assert sent_per_rank("RING", 4, 1, 64 * mib) == [96 * mib] * 4
    assert sent_per_rank("BINARY_TREE", 4, 1, 64 * mib) == [128 * mib, 128 * mib, 64 * mib, 64 * mib]
    bounds = {strategy: link_bound(strategy, 4, 64 * mib) for strategy in STRATEGIES}
    assert bounds == {
        "RING": 1.0,
        "STAR": 0.5,
        "MULTI_STAR": 1.0,
        "TREE": 0.5,
        "BINARY_TREE": 0.75,
        "BINARY_TREE_STAR": 0.75,
        "MULTI_BINARY_TREE_STAR": 1.0,
        "CLIQUE": 1.0,
        "AUTO": 0.75,
    }
    assert link_bound("STAR", 8, 64 * mib) == 0.25
