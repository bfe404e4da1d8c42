"""The bench: speculative against plain decoding, by workload, in one A/B run.

- `workloads`: the shipped prompt sets (localspec/workloads/*.jsonl) and the user's own files.
- `runner`: settings, the A B A B schedule, aggregation of the engine's `Stats`.
- `summary`: runs summed per setting and workload; `document`: the result document (what ran, on what, every
  figure); predicted speedups come from `costs.costmodel` (shared with the chat's status bar).
- `report`: terminal tables and the markdown report; `plots`: its PNGs (matplotlib optional).
- `fimcode`: the fim workload's code; `load`: background load; `progress`: the bar on stderr.
The command is `localspec bench` (localspec/commands/bench.py).
"""
