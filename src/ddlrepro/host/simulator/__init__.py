"""A trace-driven scheduler simulator for EasyScale's Figs 14–15, written fresh (no code of the artifact's).

Pure Python, no torch: `cluster` (device types and counts), `profiles` (step times per application × device type ×
per-EST batch × ESTs per device, and the throughput model), `traces` (jobs: the artifact's CSV and a seeded
generator with its statistics), `placements` (the throughput-optimal ESTs per device of a set of devices, waste),
`policies` (yarn-cs, fifo-gang, easyscale-homo, easyscale-heter; the EasyScale pair share `elastic`), `rules` (the
rules' numbers), `engine` (the round loop and its two tables), `parsing` (numbers read from files), `cli`
(`ddlrepro simulate`).
What follows the artifact (github.com/sUntvoOk/EasyScale_info_for_SC23, `simulator/`) and what is ours is said in
each module's docstring.
"""
