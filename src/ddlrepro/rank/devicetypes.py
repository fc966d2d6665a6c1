"""Device types emulated on CPU: a type is (instruction-set cap, intra-op threads, CPU quota).

Two GPU models differ in the kernels they run, and so in the bits of the gradients they compute. On one CPU the
same happens when processes run different kernels. Measured on this repository's development machine (Xeon with
AVX-512, torch 2.13.0), a forward and backward pass of `smallnet` / `resnet20` changes gradient bits with each of:
oneDNN's ISA cap (`ONEDNN_MAX_CPU_ISA=SSE41`: its convolutions; `AVX2` changed resnet20's only), ATen's vector
kernels (`ATEN_CPU_CAPABILITY=default` or `avx2` against the host's AVX-512), MKL's reproducibility mode
(`MKL_CBWR=COMPATIBLE`; `MKL_ENABLE_INSTRUCTIONS=AVX2` alone did not) and the intra-op thread count (1 against 2).
A type's `isa` therefore caps oneDNN, ATen and MKL together (ISA_ENVIRONMENT), and its `threads` sets the thread
count; its `cpu_quota` (a share of its threads' cores, applied by the launcher through a cgroup) only slows it.

D2 gives every process the kernels of one reference type (its ISA and threads) while each keeps its own quota.
A point's params carry `device_types` (one type per process) and, with D2, `kernels` (the reference type); the
launcher turns them into each rank's environment (`rank_environment`) before the rank starts, since oneDNN, ATen
and MKL read these variables once, when torch loads. Torch is imported here only inside `describe_device`.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Any

from ddlrepro.rank.allocation import cgroup_cpu_limit

# Most basic first: D2's default reference is the first ISA any configured type uses.
ISA_ENVIRONMENT: dict[str, dict[str, str]] = {
    "sse41": {"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512": {
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
    },
    "native": {},
}
TYPE_VARIABLE = "DDLREPRO_DEVICE_TYPE"
QUOTA_STATUS_VARIABLE = "DDLREPRO_CPU_QUOTA_STATUS"  # set by the launcher: "applied" or why not
DEFAULT_TYPE = "default"
PROC_CGROUP, CGROUP_ROOT = Path("/proc/self/cgroup"), Path("/sys/fs/cgroup")


def rank_type(params: dict[str, Any], rank: int) -> dict[str, Any] | None:
    """This rank's device type ({name, isa, threads, cpu_quota}); None on the default type (an untyped point)."""
    types = params.get("device_types")
    return types[rank] if types else None


def describe_type(params: dict[str, Any], rank: int) -> str:
    """`<type>` or, with D2, `<type> (<reference>'s kernels)`; `default` when untyped."""
    own, kernels = rank_type(params, rank), params.get("kernels")
    name = own["name"] if own else DEFAULT_TYPE
    return f"{name} ({kernels['name']}'s kernels)" if kernels else name


def rank_kernels(params: dict[str, Any], rank: int) -> dict[str, Any] | None:
    """The type whose kernels this rank runs: D2's reference type, else its own; None on the default type."""
    return params.get("kernels") or rank_type(params, rank)


def rank_threads(params: dict[str, Any], rank: int, default: int) -> int:
    kernels = rank_kernels(params, rank)
    return kernels["threads"] if kernels else default


def rank_environment(params: dict[str, Any], rank: int) -> dict[str, str]:
    """The variables that give this rank its kernels (ISA caps, threads) and name its type; {} when untyped."""
    own, kernels = rank_type(params, rank), rank_kernels(params, rank)
    if kernels is None:
        return {}
    threads = str(kernels["threads"])
    return {
        **ISA_ENVIRONMENT[kernels["isa"]],
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        TYPE_VARIABLE: own["name"] if own else DEFAULT_TYPE,
    }


def rank_quota(params: dict[str, Any], rank: int) -> float | None:
    """The cores this rank may use (its type's quota × its threads); None without a quota below a full share."""
    own = rank_type(params, rank)
    if own is None or own["cpu_quota"] >= 1:
        return None
    return own["cpu_quota"] * rank_threads(params, rank, own["threads"])


@functools.cache
def onednn_isa() -> str:
    """oneDNN's effective ISA, from the line its verbose mode prints (to fd 1) at its first primitive."""
    import torch
    import torch.nn.functional as F

    with tempfile.TemporaryFile(mode="w+") as capture:
        saved = os.dup(1)
        os.dup2(capture.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                F.conv2d(torch.ones(8, 3, 16, 16), torch.ones(16, 3, 3, 3))
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        capture.seek(0)
        lines = [line for line in capture.read().splitlines() if ",isa:" in line]
    return lines[0].split(",isa:", 1)[1] if lines else "unknown (oneDNN printed no ISA)"


def describe_device(params: dict[str, Any], rank: int) -> dict[str, Any]:
    """What a typed rank records in its worker record: its type, the kernels it runs and the quota it runs under."""
    import torch

    own, kernels, wanted = rank_type(params, rank), rank_kernels(params, rank), rank_quota(params, rank)
    unset = f"not applied: the launcher set no CPU quota ({QUOTA_STATUS_VARIABLE} unset)" if wanted else "none wanted"
    return {
        "device_type": own["name"] if own else DEFAULT_TYPE,
        "kernels_of": kernels["name"] if kernels else DEFAULT_TYPE,
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_isa": onednn_isa(),
        "isa_environment": {name: os.environ.get(name) for name in ISA_ENVIRONMENT["sse41"]},
        "cpu_quota_wanted": wanted,
        "cpu_quota_cores": cgroup_cpu_limit(),
        "cpu_quota_status": os.environ.get(QUOTA_STATUS_VARIABLE, unset),
    }
