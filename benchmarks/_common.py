"""Shared by the benchmarks: how busy the host was with other work while a figure was measured, and the verdict.

Every figure is printed with the foreign and steal load the host saw over its measured section
(`ddlrepro.host.hostload`). Above `DISTURBED_SHARE` of the host's CPU capacity (foreign + steal) a figure with a target
is marked `disturbed` instead of `met` or `missed`: on a busy machine a timing says nothing about the code.
Memory is judged whatever the load (other programs do not change it), with the load still printed.
"""

from __future__ import annotations

from ddlrepro.host.config import schema_default
from ddlrepro.host.hostload import HostLoad

DISTURBED_SHARE = schema_default("checks", "max_foreign_share")  # the workflow's threshold


def disturbed(load: HostLoad) -> bool:
    """Whether foreign plus steal CPU exceeded the workflow's threshold while the figure was measured."""
    return load.foreign_share + load.steal_share > DISTURBED_SHARE


def verdict(met: bool | None, load: HostLoad, timed: bool = True) -> str:
    """`disturbed` for a timing taken on a busy host, else `met` or `missed`, or `inconclusive` (`met` None: the
    figure's noise exceeds its margin to the target). `timed=False`: a figure, such as memory, that other
    programs' CPU use does not change."""
    if timed and disturbed(load):
        return "disturbed"
    if met is None:
        return "inconclusive"
    return "met" if met else "missed"


def load_note(load: HostLoad) -> str:
    """The host load written beside a printed figure, in % of the host's CPU capacity."""
    return f"foreign load {100 * load.foreign_share:.1f} % (steal {100 * load.steal_share:.1f} %)"


def judged(figure: str, met: bool | None, target: str, load: HostLoad, timed: bool = True) -> str:
    """One figure against its target, e.g. `... 0.951  (target >= 0.9): met  [foreign load 2.0 % (steal 0.0 %)]`."""
    return f"{figure}  (target {target}): {verdict(met, load, timed)}  [{load_note(load)}]"


def noted(figure: str, load: HostLoad) -> str:
    """A figure without a target, with the load it was measured under."""
    return f"{figure}  [{load_note(load)}]"
