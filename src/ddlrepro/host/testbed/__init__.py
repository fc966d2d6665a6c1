"""The testbed: hosts as network namespaces on this machine, joined by a bridge, their links rate-limited.

network.py   Testbed (create, attach, exec_prefix, set_rate, counters, destroy), Host, leftovers of killed runs
limits.py    what is refused before anything is created: root, owner names, host count, rates, subnets
shaping.py   the link rates (TBF on both ends of each host's link)
overlay.py   the VXLAN overlay over the hosts' links (MTU 1450, as Calico's VXLAN mode)
counters.py  each host's interface bytes, sampled into a run's metrics.jsonl
traffic.py   competing TCP flows between hosts; flowpeer.py is what runs on the hosts
__main__.py  the command line behind scripts/testbed
"""

from ddlrepro.host.testbed.limits import TestbedError, unavailable_reason
from ddlrepro.host.testbed.network import Host, Testbed, remove_leftovers

__all__ = ["Host", "Testbed", "TestbedError", "remove_leftovers", "unavailable_reason"]
