"""Launchers turn a point into a job: `render(point, timeout_s, run_dir) -> JobSpec` and `execute(spec, output)`."""

from __future__ import annotations

import importlib
from types import ModuleType

LAUNCHERS = {
    "local": "ddlrepro.host.launchers.local",
    "slurm": "ddlrepro.host.launchers.slurm",
    "kubernetes": "ddlrepro.host.launchers.kubernetes",
    "elastic": "ddlrepro.host.launchers.inplace",
    "torchrun": "ddlrepro.host.launchers.torchrun",
}


def get_launcher(name: str) -> ModuleType:
    if name not in LAUNCHERS:
        raise KeyError(f"unknown launcher {name!r}; valid launchers: {', '.join(sorted(LAUNCHERS))}")
    return importlib.import_module(LAUNCHERS[name])
