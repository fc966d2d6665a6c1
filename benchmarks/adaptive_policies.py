"""KungFu's adaptation policies (issue: KungFu Figs 4–6): the targets of all four parts in one record.

Parts (each its own module beside this one, run in this order; `--parts` picks some):
- `noise`: the noise-scale monitor's cost on Fig 8's model (adaptive_noise.py);
- `batch`: what an in-place batch change costs (adaptive_batch.py);
- `strategy`: how soon the STAR root moves under interference, and never without it (adaptive_strategy.py; root);
- `provisioning`: from the provisioning policy's decision to the first step at the new size (adaptive_provisioning.py).
Targets: benchmarks/targets.yaml, `adaptive_policies`; a part not run leaves its targets `skipped`.

    python benchmarks/adaptive_policies.py [--parts noise batch strategy provisioning] [each part's options]
"""

from __future__ import annotations

import argparse
import importlib

from _common import BenchmarkRecord

PARTS = ["noise", "batch", "strategy", "provisioning"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS)
    modules = {part: importlib.import_module(f"adaptive_{part}") for part in PARTS}
    for part, module in modules.items():
        module.add_arguments(parser.add_argument_group(part))
    args = parser.parse_args()
    with BenchmarkRecord(__file__, args) as record:
        for part in args.parts:
            print(f"== {part}")
            modules[part].measure(record, args)


if __name__ == "__main__":
    main()
