"""KungFu's communication strategies for the PyTorch path, as DDP communication hooks over torch.distributed.

Every strategy sums one tensor over all ranks and leaves the same bits on every rank:
- RING: torch.distributed.all_reduce (gloo's ring all-reduce; DDP's default, so no hook is registered for it).
- STAR: every rank sends its tensor to the root (rank 0 unless moved: `StrategyHook.root`), which adds them in
  rank order, whoever the root is (so moving it changes no bit of the sum), and sends the sum back.
- BINARY_TREE: partial sums flow up the binary tree of ranks (parent of r: (r-1)//2), the total flows down.
- BINARY_TREE_STAR: a star inside each group of `group_size` consecutive ranks (a machine: its local ranks), a
  binary tree among the groups' first ranks, then the sum back down the tree and out along each star.
- CLIQUE: every rank sends its tensor to every other; each adds all of them in rank order.

Messages are torch.distributed point-to-point sends and receives; on integer tensors every strategy gives exactly
the all-reduce's sum, on floats the same sum up to the order of additions. Tensors larger than CHUNK_BYTES are
cut into chunks (at most MAX_CHUNKS) exchanged at once, each on its own thread and message tag, so that one
chunk's sum travels back while the next one is still arriving (a pipeline, as KungFu's chunked all-reduce). The
hook runs each bucket's exchange on one background thread, in bucket order (the same on every rank), so
communication still overlaps the rest of the backward pass, as DDP's own all-reduce does, and counts the bytes it
reduced and the seconds it took (`StrategyHook.throughput`: KungFu's per-step all-reduce throughput).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STRATEGIES = ["RING", "STAR", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE"]
CHUNK_BYTES = 1 << 20
MAX_CHUNKS = 16
_chunk_threads = ThreadPoolExecutor(max_workers=MAX_CHUNKS, thread_name_prefix="strategy-chunk")


class Reducer(Protocol):
    """An in-place sum over all ranks: `options` are the strategy's own (a chunk's message `tag`, STAR's `root`)."""

    def __call__(self, tensor: torch.Tensor, **options: int) -> torch.Tensor: ...


def _send(tensor: torch.Tensor, destinations: list[int], tag: int) -> None:
    for work in [dist.isend(tensor, dst=destination, tag=tag) for destination in destinations]:
        work.wait()


def _sum_in_order(tensor: torch.Tensor, parts: list[torch.Tensor]) -> torch.Tensor:
    """`tensor` (one of `parts`) becomes their sum, added in the order of `parts` (the same bits on every rank)."""
    total = tensor if parts[0] is tensor else parts[0].clone()
    for part in parts[1:]:
        total.add_(part)
    return total if total is tensor else tensor.copy_(total)


def _add_in_member_order(tensor: torch.Tensor, members: list[int], tag: int) -> None:
    """`tensor` (this rank's, a member) becomes the sum of every member's, added in the order of `members` (all
    receives are posted at once)."""
    rank = dist.get_rank()
    others = [member for member in members if member != rank]
    received = {member: torch.empty_like(tensor) for member in others}
    for work in [dist.irecv(received[member], src=member, tag=tag) for member in others]:
        work.wait()
    _sum_in_order(tensor, [tensor if member == rank else received[member] for member in members])


def _star_reduce(tensor: torch.Tensor, members: list[int], tag: int, leader: int | None = None) -> None:
    """The leader (the first member unless given) ends with the sum over `members`, added in member order; the
    others send theirs."""
    leader = members[0] if leader is None else leader
    if dist.get_rank() != leader:
        dist.send(tensor, dst=leader, tag=tag)
    else:
        _add_in_member_order(tensor, members, tag)


def _star_broadcast(tensor: torch.Tensor, members: list[int], tag: int, leader: int | None = None) -> None:
    leader = members[0] if leader is None else leader
    if dist.get_rank() == leader:
        _send(tensor, [member for member in members if member != leader], tag)
    else:
        dist.recv(tensor, src=leader, tag=tag)


def _tree(tensor: torch.Tensor, members: list[int], tag: int) -> None:
    """Sum over `members` up their binary tree (children 2i+1, 2i+2 of the i-th), then the total back down."""
    index = members.index(dist.get_rank())
    children = [members[child] for child in (2 * index + 1, 2 * index + 2) if child < len(members)]
    _add_in_member_order(tensor, [members[index], *children], tag)
    if index > 0:
        parent = members[(index - 1) // 2]
        dist.send(tensor, dst=parent, tag=tag)
        dist.recv(tensor, src=parent, tag=tag)
    _send(tensor, children, tag)


def ring(tensor: torch.Tensor, **_options: int) -> torch.Tensor:
    """gloo's all-reduce (it needs no tag or root)."""
    dist.all_reduce(tensor)
    return tensor


def star(tensor: torch.Tensor, tag: int = 0, root: int = 0) -> torch.Tensor:
    """The sum at `root` (added in rank order whatever the root), then sent back to every rank."""
    everyone = list(range(dist.get_world_size()))
    _star_reduce(tensor, everyone, tag, root)
    _star_broadcast(tensor, everyone, tag, root)
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
    return _sum_in_order(tensor, [tensor if r == rank else received[r] for r in range(world)])


def chunked(exchange: Callable[..., torch.Tensor]) -> Reducer:
    """`exchange(tensor, tag=..., **options)` on chunks of a large tensor at once (one thread and tag each), in
    place."""

    def reduce(tensor: torch.Tensor, **options: int) -> torch.Tensor:
        pieces = min(MAX_CHUNKS, max(1, tensor.numel() * tensor.element_size() // CHUNK_BYTES))
        if pieces == 1 or not tensor.is_contiguous():
            return exchange(tensor, tag=0, **options)
        running = [
            _chunk_threads.submit(exchange, chunk, tag=tag, **options)
            for tag, chunk in enumerate(tensor.view(-1).chunk(pieces))
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


@dataclass
class ReducedVolume:
    """Bytes reduced and seconds spent reducing them, summed over buckets since the last `take`."""

    bytes: int = 0
    seconds: float = 0.0

    def take(self) -> ReducedVolume:
        taken = ReducedVolume(self.bytes, self.seconds)
        self.bytes, self.seconds = 0, 0.0
        return taken

    @property
    def mib_per_s(self) -> float:
        return self.bytes / 2**20 / self.seconds if self.seconds > 0 else 0.0


@dataclass
class StrategyHook:
    """A DDP communication hook averaging each gradient bucket with `strategy`, off the backward thread, counting
    what it reduced. `root`: STAR's root, changed between steps (never during one) the same way on every rank."""

    strategy: str
    group_size: int
    root: int = 0
    reduced: ReducedVolume = field(default_factory=ReducedVolume)

    def __post_init__(self) -> None:
        self.reduce = reducer(self.strategy, self.group_size)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"strategy-{self.strategy.lower()}")

    def throughput(self) -> ReducedVolume:
        """What the hook reduced since the last call (call it after a step's backward pass has been waited for)."""
        return self.reduced.take()

    def exchange(self, tensor: torch.Tensor, future: torch.futures.Future) -> None:
        try:
            started = time.perf_counter()
            options = {"root": self.root} if self.strategy == "STAR" else {}
            result = self.reduce(tensor.div_(dist.get_world_size()), **options)
            self.reduced.bytes += tensor.numel() * tensor.element_size()
            self.reduced.seconds += time.perf_counter() - started
            future.set_result(result)
        except Exception as error:  # handed to DDP, which raises it in the training thread
            future.set_exception(error)

    def communicate(self, state, bucket):  # unannotated: DDP compares annotations with the real types, not strings
        future: torch.futures.Future = torch.futures.Future()
        self.executor.submit(self.exchange, bucket.buffer(), future)
        return future


def apply_strategy(model: DistributedDataParallel, strategy: str, group_size: int) -> StrategyHook | None:
    """Make `model` average its gradients with `strategy` (RING keeps DDP's own all-reduce: no hook)."""
    reducer(strategy, group_size)
    return None if strategy == "RING" else hooked(model, strategy, group_size)


def hooked(model: DistributedDataParallel, strategy: str, group_size: int) -> StrategyHook:
    """Make `model` average its gradients through `strategy`'s hook, and return the hook (its throughput, its
    root)."""
    hook = StrategyHook(strategy, group_size)
    model.register_comm_hook(None, hook.communicate)
    return hook
