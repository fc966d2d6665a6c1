"""The generic Slurm profile as the user's Snakemake profile, so that `snakemake --profile slurm` finds one."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import cast

from ddlrepro.host.errors import UserError


def global_profile(name: str) -> Path | None:
    """The config file of the Snakemake profile `name` in the user's or the site's config folder, where and as
    Snakemake itself looks for it (its own lookup); None when neither has one."""
    from snakemake.cli import get_appdirs, get_profile_dir

    folders = get_appdirs()
    for folder in (folders.user_config_dir, folders.site_config_dir):
        candidate = Path(folder) / name
        found = get_profile_dir(str(candidate)) if candidate.exists() else None
        if found:
            return cast("Path | None", found[1])
    return None


def install_profile(source: Path) -> str:
    """Copy the profile folder `source` to the user's Snakemake profiles under its own name, unless the user or
    the site already has a profile of that name; never overwrite anything. Returns the one line saying which."""
    from snakemake.cli import get_appdirs, get_profile_dir

    if not source.is_dir() or get_profile_dir(str(source)) is None:
        raise UserError(f"{source}: not a Snakemake profile folder (no config.yaml or profile.yaml in it)")
    name = source.name
    existing = global_profile(name)
    if existing is not None:
        return f"Snakemake profile {name!r}: using yours at {existing.parent} (left as it is)"
    target = Path(get_appdirs().user_config_dir) / name
    if target.exists():
        raise UserError(f"{target} exists but holds no Snakemake profile: move it away, then run this again")
    shutil.copytree(source, target)
    return f"Snakemake profile {name!r}: installed {source} as {target} (`snakemake --profile {name}` uses it)"
