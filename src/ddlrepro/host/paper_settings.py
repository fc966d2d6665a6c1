"""docs/paper-scale.md: every paper-scale parameter of every figure with its source (each figure folder's paper.yaml,
under a config's own `paper:` block), and the schema defaults a paper-scale figure takes where the block is silent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddlrepro.host.config import folder_block, load_config, load_config_file, merge_into

HEADER = """# Paper-scale parameters and their sources

Written by `ddlrepro paper-settings` from each figure's paper.yaml (src/ddlrepro/host/figures/<id>/: every value
with its source) and the config schema (its defaults, where the block is silent). Run with `--configfile
config/paper.yaml`, a figure's points take exactly these values, and none of its smoke sizes (smoke.yaml beside
it). `ours:` marks a value neither the paper nor its artifact gives, with why.
"""


def shown(value: Any) -> str:
    """A value as one table cell (JSON, pipes escaped)."""
    return json.dumps(value, ensure_ascii=False).replace("|", "\\|")


def sourced_table(entries: dict[str, Any]) -> list[str]:
    """A figure's `paper:` block as a markdown table: each parameter, its value and its source."""
    lines = ["| parameter | value | source |", "|---|---|---|"]
    return lines + [f"| `{key}` | `{shown(entry['value'])}` | {entry['source']} |" for key, entry in entries.items()]


def settings_page(smoke: Path, paper: Path) -> str:
    """The markdown page: per figure, the block's values and sources, then the schema defaults it takes."""
    block = merge_into(folder_block("paper"), load_config_file(paper).get("paper", {}))
    resolved = load_config(smoke, paper)["figures"]
    lines = [HEADER]
    for figure, entries in block.items():
        lines += [f"## {figure}", "", *sourced_table(entries)]
        defaults = {key: value for key, value in resolved[figure].items() if key not in entries and key != "enabled"}
        if defaults:
            taken = ", ".join(f"`{key}` = `{shown(value)}`" for key, value in sorted(defaults.items()))
            lines += ["", f"The schema's defaults: {taken}."]
        lines.append("")
    return "\n".join(lines)
