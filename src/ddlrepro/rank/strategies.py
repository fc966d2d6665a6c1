"""KungFu's communication strategies for the PyTorch path, as DDP communication hooks over torch.distributed.

As KungFu builds them (lsds/KungFu@osdi20-artifact): a strategy is a list of graph pairs over the ranks
(session/strategy.go:45-108, plan/topology.go), each pair a broadcast graph and its reduce graph (the broadcast
graph reversed, a self-loop at every node: plan/topology.go:33-40). A tensor is cut into ceil(bytes / 1 MiB) chunks
of nearly equal length (session/session.go:335-358, plan/interval.go:12 EvenPartition), exchanged at once; chunk i
goes through pair i mod len(pairs) (KungFu's default `simpleHash`, session/shard.go:13; its NAME hash is not
built). Through a pair a node adds what its reduce-graph predecessors send onto its own and passes the result on;
then it takes what its broadcast-graph parent sends and passes that on (session/session.go:255-332). Hosts are
consecutive groups of `group_size` ranks (a machine's local ranks; the first is its master):
- STAR: one star rooted at rank 0 (movable here: `StrategyHook.root`, for Fig 5).
- MULTI_STAR: a star inside each host, and a star among the masters rooted at each master in turn (one pair each).
- TREE: a star inside each host, the masters a star rooted at the first master.
- BINARY_TREE: the binary tree of ranks (children 2i+1, 2i+2).
- BINARY_TREE_STAR: a star inside each host, a binary tree among the masters.
- MULTI_BINARY_TREE_STAR: BINARY_TREE_STAR with the masters' tree rotated by each offset in turn (one pair each):
  the strategy of the artifact's Fig 9 runs.
- CLIQUE: one star rooted at each rank (one pair each): the chunks spread over every root, ~2× the tensor sent per
  rank; a tensor up to 1 MiB goes through one plain star.
- AUTO: STAR on one host, else BINARY_TREE_STAR (session/strategy.go:120-129).
- RING: here torch.distributed.all_reduce (gloo's bandwidth-optimal ring all-reduce, DDP's default, so no hook is
  registered), not KungFu's RING (k chained rings, each reducing along the ring to a rotating root).

Departures, on purpose: a node adds its inputs in rank order (itself included), not in arrival order, so every rank ends
with the same bits and moving STAR's root changes none; every chunk is in flight at once, as in KungFu, but a rank sums
them on one thread per core (at most 8), not a goroutine each, and sends the chunks it only passes up first, in
chunk order (`Exchange`). The hook runs each bucket's exchange on one background thread, in bucket order (the same
on every rank), so communication still overlaps the rest of the backward pass, as DDP's own all-reduce does, and
counts the bytes it reduced and the seconds it took (`StrategyHook.throughput`: KungFu's per-step all-reduce
throughput). On integer tensors every strategy gives exactly the all-reduce's sum; on floats the same sum up to the
order of additions.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STRATEGIES = [
    "RING",
    "STAR",
    "MULTI_STAR",
    "TREE",
    "BINARY_TREE",
    "BINARY_TREE_STAR",
    "MULTI_BINARY_TREE_STAR",
    "CLIQUE",
    "AUTO",
]
CHUNK_BYTES = 1 << 20
LANES = min(8, len(os.sched_getaffinity(0)))  # threads adding chunks' sums, as Go runs goroutines on one per core

Edges = frozenset[tuple[int, int]]


class Reducer(Protocol):
    """An in-place sum over all ranks: `options` are the strategy's own (STAR's `root`)."""

    def __call__(self, tensor: torch.Tensor, **options: int) -> torch.Tensor: ...


@dataclass(frozen=True)
class GraphPair:
    """A broadcast graph (edges parent → child) and its reduce graph (the reverse, every node adding its inputs)."""

    broadcast: Edges

    def reduce_inputs(self, rank: int) -> list[int]:
        """Whose partial sums `rank` adds onto its own (its children in the broadcast graph)."""
        return sorted(child for parent, child in self.broadcast if parent == rank)

    def parent(self, rank: int) -> int | None:
        return next((parent for parent, child in self.broadcast if child == rank), None)

    def sent_bytes(self, rank: int, nbytes: int) -> int:
        """What `rank` sends through this pair for a chunk of `nbytes`: up once, down to each child."""
        return nbytes * ((self.parent(rank) is not None) + len(self.reduce_inputs(rank)))


def hosts_of(world: int, group_size: int) -> list[list[int]]:
    """The ranks of each host: consecutive groups of `group_size` (the first of each is its master)."""
    size = max(1, group_size)
    return [list(range(first, min(first + size, world))) for first in range(0, world, size)]


def _local_stars(hosts: list[list[int]]) -> set[tuple[int, int]]:
    return {(ranks[0], rank) for ranks in hosts for rank in ranks[1:]}


def _star(nodes: list[int], root: int) -> set[tuple[int, int]]:
    return {(root, node) for node in nodes if node != root}


def _binary_tree(nodes: list[int]) -> set[tuple[int, int]]:
    return {(nodes[i], nodes[j]) for i in range(len(nodes)) for j in (2 * i + 1, 2 * i + 2) if j < len(nodes)}


def strategy_pairs(strategy: str, world: int, group_size: int, root: int = 0) -> list[GraphPair]:
    """The graph pairs `strategy` runs on `world` ranks in hosts of `group_size` (RING has none: gloo's)."""
    hosts = hosts_of(world, group_size)
    masters = [ranks[0] for ranks in hosts]
    everyone = list(range(world))
    if strategy == "AUTO":
        strategy = "STAR" if len(hosts) == 1 else "BINARY_TREE_STAR"
    graphs: dict[str, Callable[[], list[set[tuple[int, int]]]]] = {
        "STAR": lambda: [_star(everyone, root)],
        "MULTI_STAR": lambda: [_local_stars(hosts) | _star(masters, master) for master in masters],
        "TREE": lambda: [_local_stars(hosts) | _star(masters, masters[0])],
        "BINARY_TREE": lambda: [_binary_tree(everyone)],
        "BINARY_TREE_STAR": lambda: [_local_stars(hosts) | _binary_tree(masters)],
        "MULTI_BINARY_TREE_STAR": lambda: [
            _local_stars(hosts) | _binary_tree(masters[offset:] + masters[:offset]) for offset in range(len(masters))
        ],
        "CLIQUE": lambda: [_star(everyone, rank) for rank in everyone],
    }
    if strategy not in graphs:
        raise ValueError(f"unknown strategy {strategy!r}; valid strategies: {', '.join(STRATEGIES)}")
    return [GraphPair(frozenset(edges)) for edges in graphs[strategy]()]


def chunk_count(nbytes: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """KungFu's chunks of a tensor: ceil(bytes / chunk), its chunk 1 MiB (session/session.go:347)."""
    return max(1, math.ceil(nbytes / chunk_bytes))


def sent_per_rank(strategy: str, world: int, group_size: int, nbytes: int, chunk_bytes: int = CHUNK_BYTES) -> list[int]:
    """Bytes each rank sends in one all-reduce of `nbytes`: KungFu's chunks, chunk i through pair i mod len. It
    receives as many: per chunk, a message from its parent and one from each child, as it sends one to each. RING:
    gloo's ring, 2(n − 1)/n of the tensor from every rank."""
    if strategy == "RING":
        return [2 * (world - 1) * nbytes // world] * world
    pairs = strategy_pairs(strategy, world, group_size)
    chunks = chunk_count(nbytes, chunk_bytes)
    sizes = [nbytes // chunks + (index < nbytes % chunks) for index in range(chunks)]
    return [sum(pairs[i % len(pairs)].sent_bytes(rank, size) for i, size in enumerate(sizes)) for rank in range(world)]


def link_bound(strategy: str, world: int, nbytes: int) -> float:
    """The most of the ring's bus bandwidth `strategy` can reach where links are the limit, a rank per host: the
    ring's bytes per link ÷ the busiest rank's through the strategy's graphs. At 4 ranks: STAR and TREE 0.5 (the
    root moves n − 1 tensors each way), BINARY_TREE, BINARY_TREE_STAR and AUTO 0.75, CLIQUE, MULTI_STAR and
    MULTI_BINARY_TREE_STAR 1 (their roots rotate)."""
    return max(sent_per_rank("RING", world, 1, nbytes)) / max(sent_per_rank(strategy, world, 1, nbytes))


@dataclass(frozen=True)
class Peers:
    """This rank in the default group, and the group's own send and receive bindings: `dist.isend`'s Python checks
    cost more than queueing the send (a chunk makes a few)."""

    group: dist.ProcessGroup
    rank: int

    @classmethod
    def default(cls) -> Peers:
        group = dist.distributed_c10d._get_default_group()
        return cls(group, group.rank())

    def send(self, tensor: torch.Tensor, destinations: tuple[int, ...], tag: int) -> list[dist.Work]:
        return [self.group.send([tensor], destination, tag) for destination in destinations]

    def receive(self, tensor: torch.Tensor, source: int, tag: int) -> dist.Work:
        return self.group.recv([tensor], source, tag)


class ReceiveBuffers:
    """Receive buffers kept from one exchange to the next, one per (chunk, sender), grown when a larger chunk comes.

    A fresh buffer per received chunk faults its pages in again and again (glibc returns a freed MiB to the kernel):
    BINARY_TREE's root at 4 ranks, 32 MiB, took 1,545 page faults and 7 ms more system time per all-reduce with
    fresh buffers, 1 fault with these. The cost: a rank keeps, per sender in its reduce graph, the largest tensor it
    reduced (DDP: a bucket, 25 MiB)."""

    def __init__(self) -> None:
        self._storage: dict[tuple[int, int], torch.Tensor] = {}
        self._views: dict[tuple[int, int], torch.Tensor] = {}

    def like(self, tensor: torch.Tensor, chunk: int, source: int) -> torch.Tensor:
        """A buffer of `tensor`'s shape and type for what `source` sends of `chunk` (no two live exchanges share
        one: each chunk in flight has its own index, and a reducer runs one tensor at a time)."""
        key = (chunk, source)
        view = self._views.get(key)
        if view is not None and view.shape == tensor.shape and view.dtype == tensor.dtype:
            return view  # the usual case: the same tensors every step
        nbytes = tensor.numel() * tensor.element_size()
        storage = self._storage.get(key)
        if storage is None or storage.numel() < nbytes:
            storage = self._storage[key] = torch.empty(nbytes, dtype=torch.uint8)
        view = self._views[key] = storage[:nbytes].view(tensor.dtype).view(tensor.shape)
        return view


@dataclass(frozen=True)
class Role:
    """A rank's place in a graph pair: its inputs in the reduce graph (its children in the broadcast graph), those
    below and above its own rank, and its parent."""

    inputs: tuple[int, ...]
    lower: tuple[int, ...]
    higher: tuple[int, ...]
    parent: int | None

    @classmethod
    @functools.cache
    def of(cls, pair: GraphPair, rank: int) -> Role:
        inputs = tuple(pair.reduce_inputs(rank))
        lower = tuple(source for source in inputs if source < rank)
        higher = tuple(source for source in inputs if source > rank)
        return cls(inputs, lower, higher, pair.parent(rank))


@dataclass
class _Chunk:
    """One chunk's exchange through its graph pair: the receives of what its inputs send and of the total its
    parent sends back, and whom it sends to."""

    tensor: torch.Tensor
    tag: int
    role: Role
    received: dict[int, torch.Tensor]
    receiving: list[dist.Work]
    total: dist.Work | None

    @classmethod
    def post(cls, peers: Peers, tensor: torch.Tensor, tag: int, pair: GraphPair, buffers: ReceiveBuffers) -> _Chunk:
        """Post the receives of what `pair`'s reduce graph sends this rank for this chunk, and of the total.

        The total lands in the chunk itself, which will first be summed and sent up: over TCP (gloo's transport)
        the parent has all of the sum, so the send has read all of it, before the parent sends the total."""
        role = Role.of(pair, peers.rank)
        received = {source: buffers.like(tensor, tag, source) for source in role.inputs}
        receiving = [peers.receive(received[source], source, tag) for source in role.inputs]
        total = None if role.parent is None else peers.receive(tensor, role.parent, tag)
        return cls(tensor, tag, role, received, receiving, total)

    def add_inputs(self) -> None:
        """This rank's chunk plus what each input sent, added in rank order with this rank among them (the same
        bits whichever node adds them)."""
        for work in self.receiving:
            work.wait()
        if self.role.lower:
            before = self.received[self.role.lower[0]]
            for source in self.role.lower[1:]:  # the lower ranks' sum, in a buffer of theirs
                before.add_(self.received[source])
            self.tensor.add_(before)  # x + y is y + x, bit for bit: the sum's order is kept without a copy
        for source in self.role.higher:
            self.tensor.add_(self.received[source])


class Exchange:
    """Every chunk of a tensor through its graph pair at once. Each of `lanes` threads takes its share of the chunks
    this rank has inputs for, in chunk order, waits for their partial sums, adds them and sends the result up the
    reduce graph, or, at the root, down the broadcast graph; one more thread takes, in chunk order, each total that
    comes down and passes it on to the chunk's children. Sums going up and totals going down overlap, as in KungFu,
    where a goroutine per chunk does both (session/session.go:255-332) on as many threads as cores (Go's
    GOMAXPROCS). Fewer Python threads than chunks, on purpose: with a thread per chunk (at most 16), as before, the
    trees' bus bandwidth was ~10 % lower (benchmarks/allreduce_strategies.py: 4 ranks on 2 cores, 16–64 MiB).

    Totals are passed on in chunk order, the same on every rank, not as the lanes happen to finish: in strategies
    with several deep graphs, two ranks passing totals to each other in different orders would each wait for the
    other's first. For the same reason the chunks a rank adds nothing to (where it is a leaf of the reduce graph)
    go up at once, in chunk order, before the lanes start: posted by the lanes, each leaf's order was whichever
    lane ran first (all its even chunks, then the odd ones, or the reverse), and a parent, which needs chunk i
    from every input before it can pass chunk i on, waited for the orders to cross (STAR on 4 testbed hosts at
    1 Gbit/s: the root's link sent nothing for the first 0.8 s of a 2.5 s all-reduce)."""

    def __init__(self, lanes: int = LANES) -> None:
        if lanes < 1:
            raise ValueError(f"an exchange needs at least one lane, not {lanes}")
        self.lanes = lanes
        self.buffers = ReceiveBuffers()
        self._up = ThreadPoolExecutor(max_workers=lanes, thread_name_prefix="strategy-up")
        self._down = ThreadPoolExecutor(max_workers=1, thread_name_prefix="strategy-down")

    def run(self, pieces: list[torch.Tensor], pairs: list[GraphPair]) -> None:
        """Sum `pieces` (a tensor's chunks) over every rank, each through pair i mod len(pairs). Every thread is
        waited for before the first failure is raised: none is left behind, blocked in a receive."""
        peers = Peers.default()
        chunks = [
            _Chunk.post(peers, piece, tag, pairs[tag % len(pairs)], self.buffers) for tag, piece in enumerate(pieces)
        ]
        leaving = [work for chunk in chunks if not chunk.role.inputs for work in _send_up(peers, chunk)]
        summed = [chunk for chunk in chunks if chunk.role.inputs]
        running = [self._up.submit(_upward, peers, summed[lane :: self.lanes]) for lane in range(self.lanes)]
        totals = [(chunk, chunk.total) for chunk in chunks if chunk.total is not None]
        running.append(self._down.submit(_forward, peers, totals))
        futures.wait(running)
        for future in running:
            future.result()
        for work in leaving:
            work.wait()


def _send_up(peers: Peers, chunk: _Chunk) -> list[dist.Work]:
    """Send a chunk this rank adds nothing to (a leaf of its reduce graph) to its parent, if it has one."""
    return [] if chunk.role.parent is None else peers.send(chunk.tensor, (chunk.role.parent,), chunk.tag)


def _upward(peers: Peers, chunks: list[_Chunk]) -> None:
    """Sum each chunk's inputs and send the sum to its parent, or, where the chunk's graph has its root here, send
    the total to its children."""
    sending: list[dist.Work] = []
    for chunk in chunks:
        chunk.add_inputs()
        parent = chunk.role.parent
        sending += peers.send(chunk.tensor, chunk.role.inputs if parent is None else (parent,), chunk.tag)
    for work in sending:
        work.wait()


def _forward(peers: Peers, totals: list[tuple[_Chunk, dist.Work]]) -> None:
    """Pass each chunk's total, as it comes down from its parent, on to its children."""
    sending: list[dist.Work] = []
    for chunk, total in totals:
        total.wait()
        sending += peers.send(chunk.tensor, chunk.role.inputs, chunk.tag)
    for work in sending:
        work.wait()


def ring(tensor: torch.Tensor, **_options: int) -> torch.Tensor:
    """gloo's all-reduce (it needs no tag or root)."""
    dist.all_reduce(tensor)
    return tensor


@functools.cache
def _pairs(strategy: str, world: int, group_size: int, root: int) -> list[GraphPair]:
    return strategy_pairs(strategy, world, group_size, root)


def reducer(strategy: str, group_size: int, lanes: int = LANES, chunk_bytes: int = CHUNK_BYTES) -> Reducer:
    """The in-place sum over all ranks that `strategy` names; `group_size`: the ranks of a host; `lanes`: threads
    summing chunks (`Exchange`); `chunk_bytes`: KungFu's 1 MiB unless a benchmark asks what another size costs."""
    if strategy == "RING":
        return ring
    strategy_pairs(strategy, 1, 1)  # an unknown name is refused here, before any exchange
    if chunk_bytes < 1:
        raise ValueError(f"chunks need at least one byte, not {chunk_bytes}")
    exchange = Exchange(lanes)

    def reduce(tensor: torch.Tensor, root: int = 0, **_options: int) -> torch.Tensor:
        pairs = _pairs(strategy, dist.get_world_size(), group_size, root)
        pieces = chunk_count(tensor.numel() * tensor.element_size(), chunk_bytes) if tensor.is_contiguous() else 1
        exchange.run([tensor] if pieces == 1 else list(tensor.view(-1).tensor_split(pieces)), pairs)
        return tensor

    return reduce


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
            result = self.reduce(tensor.div_(dist.get_world_size()), root=self.root)
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
