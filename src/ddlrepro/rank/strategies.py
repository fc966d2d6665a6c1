"""KungFu's communication strategies for the PyTorch path, as DDP communication hooks over torch.distributed.

Every strategy sums one tensor over all ranks and leaves the same bits on every rank:
- RING: torch.distributed.all_reduce (gloo's ring all-reduce; DDP's default, so no hook is registered for it).
- STAR: every rank sends its tensor to rank 0, which adds them in rank order and sends the sum back.
- BINARY_TREE: partial sums flow up the binary tree of ranks (parent of r: (r-1)//2), the total flows down.
- BINARY_TREE_STAR: a star inside each group of `group_size` consecutive ranks (a machine: its local ranks), a
  binary tree among the groups' first ranks, then the sum back down the tree and out along each star.
- CLIQUE: every rank sends its tensor to every other; each adds all of them in rank order.

Messages are torch.distributed point-to-point sends and receives; on integer tensors every strategy gives exactly
the all-reduce's sum, on floats the same sum up to the order of additions. Tensors larger than CHUNK_BYTES are
cut into chunks (at most MAX_CHUNKS) exchanged at once, each on its own thread and message tag, so that one
chunk's sum travels back while the next one is still arriving (a pipeline, as KungFu's chunked all-reduce). The
hook runs each bucket's exchange on one background thread, in bucket order (the same on every rank), so
communication still overlaps the rest of the backward pass, as DDP's own all-reduce does.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STRATEGIES = ["RING", "STAR", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE"]
CHUNK_BYTES = 1 << 20
MAX_CHUNKS = 16
_chunk_threads = ThreadPoolExecutor(max_workers=MAX_CHUNKS, thread_name_prefix="strategy-chunk")

Reducer = Callable[[torch.Tensor], torch.Tensor]


def _add_received(total: torch.Tensor, sources: list[int], tag: int) -> None:
    """Add what `sources` send to `total`, in the order of `sources` (all receives are posted at once)."""
    buffers = [torch.empty_like(total) for _ in sources]
    for work in [dist.irecv(buffer, src=source, tag=tag) for buffer, source in zip(buffers, sources, strict=True)]:
        work.wait()
    for buffer in buffers:
        total.add_(buffer)


def _send(tensor: torch.Tensor, destinations: list[int], tag: int) -> None:
    for work in [dist.isend(tensor, dst=destination, tag=tag) for destination in destinations]:
        work.wait()


def _star_reduce(tensor: torch.Tensor, members: list[int], tag: int) -> None:
    """The first member ends with the sum over `members` (its own tensor first); the others send theirs."""
    leader = members[0]
    if dist.get_rank() == leader:
        _add_received(tensor, members[1:], tag)
    else:
        dist.send(tensor, dst=leader, tag=tag)


def _star_broadcast(tensor: torch.Tensor, members: list[int], tag: int) -> None:
    leader = members[0]
    if dist.get_rank() == leader:
        _send(tensor, members[1:], tag)
    else:
        dist.recv(tensor, src=leader, tag=tag)


def _tree(tensor: torch.Tensor, members: list[int], tag: int) -> None:
    """Sum over `members` up their binary tree (children 2i+1, 2i+2 of the i-th), then the total back down."""
    index = members.index(dist.get_rank())
    children = [members[child] for child in (2 * index + 1, 2 * index + 2) if child < len(members)]
    _add_received(tensor, children, tag)
    if index > 0:
        parent = members[(index - 1) // 2]
        dist.send(tensor, dst=parent, tag=tag)
        dist.recv(tensor, src=parent, tag=tag)
    _send(tensor, children, tag)


def ring(tensor: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(tensor)
    return tensor


def star(tensor: torch.Tensor, tag: int = 0) -> torch.Tensor:
    everyone = list(range(dist.get_world_size()))
    _star_reduce(tensor, everyone, tag)
    _star_broadcast(tensor, everyone, tag)
    return tensor


def binary_tree(tensor: torch.Tensor, tag: int = 0) -> torch.Tensor:
    _tree(tensor, list(range(dist.get_world_size())), tag)
    return tensor


def binary_tree_star(tensor: torch.Tensor, group_size: int, tag: int = 0) -> torch.Tensor:
    world, rank = dist.get_world_size(), dist.get_rank()
    first = rank - rank % group_size
    group = list(range(first, min(first + group_size, world)))
    _star_reduce(tensor, group, tag)
    if rank == first:
        _tree(tensor, list(range(0, world, group_size)), tag)
    _star_broadcast(tensor, group, tag)
    return tensor


def clique(tensor: torch.Tensor, tag: int = 0) -> torch.Tensor:
    """Everyone sends to everyone; every rank adds the world's tensors in rank order (hence the same bits)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    others = [r for r in range(world) if r != rank]
    received = {r: torch.empty_like(tensor) for r in others}
    works = [dist.irecv(received[r], src=r, tag=tag) for r in others]
    works += [dist.isend(tensor, dst=r, tag=tag) for r in others]
    for work in works:
        work.wait()
    parts = [tensor if r == rank else received[r] for r in range(world)]
    total = parts[0].clone()
    for part in parts[1:]:
        total.add_(part)
    return tensor.copy_(total)


def chunked(exchange: Callable[..., torch.Tensor]) -> Reducer:
    """`exchange(tensor, tag=...)` on chunks of a large tensor at once (one thread and tag each), in place."""

    def reduce(tensor: torch.Tensor) -> torch.Tensor:
        pieces = min(MAX_CHUNKS, max(1, tensor.numel() * tensor.element_size() // CHUNK_BYTES))
        if pieces == 1 or not tensor.is_contiguous():
            return exchange(tensor, tag=0)
        running = [
            _chunk_threads.submit(exchange, chunk, tag=tag) for tag, chunk in enumerate(tensor.view(-1).chunk(pieces))
        ]
        for future in running:
            future.result()
        return tensor

    return reduce


def reducer(strategy: str, group_size: int) -> Reducer:
    """The in-place sum over all ranks that `strategy` names; `group_size` only matters to BINARY_TREE_STAR."""
    reducers: dict[str, Reducer] = {
        "RING": ring,
        "STAR": chunked(star),
        "BINARY_TREE": chunked(binary_tree),
        "BINARY_TREE_STAR": chunked(partial(binary_tree_star, group_size=max(1, group_size))),
        "CLIQUE": chunked(clique),
    }
    if strategy not in reducers:
        raise ValueError(f"unknown strategy {strategy!r}; valid strategies: {', '.join(STRATEGIES)}")
    return reducers[strategy]


def strategy_hook(strategy: str, group_size: int) -> Callable[[object, dist.GradBucket], torch.futures.Future]:
    """A DDP communication hook averaging each gradient bucket with `strategy`, off the backward thread."""
    reduce = reducer(strategy, group_size)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"strategy-{strategy.lower()}")

    def exchange(tensor: torch.Tensor, future: torch.futures.Future) -> None:
        try:
            future.set_result(reduce(tensor.div_(dist.get_world_size())))
        except Exception as error:  # handed to DDP, which raises it in the training thread
            future.set_exception(error)

    def hook(state, bucket):  # unannotated: DDP compares annotations with the real types, not strings
        future: torch.futures.Future = torch.futures.Future()
        executor.submit(exchange, bucket.buffer(), future)
        return future

    return hook


def apply_strategy(model: DistributedDataParallel, strategy: str, group_size: int) -> None:
    """Make `model` average its gradients with `strategy` (RING keeps DDP's own all-reduce)."""
    reducer(strategy, group_size)
    if strategy != "RING":
        model.register_comm_hook(None, strategy_hook(strategy, group_size))
