"""The bench: speculative against plain decoding, by workload, in one A/B run.

- `workloads`: the shipped prompt sets (localspec/workloads/*.jsonl) and the user's own files.
- `runner`: settings, the A B A B schedule, aggregation of the engine's `Stats`.
- `document`: the result document (what ran, on what, every figure).
Predicted speedups come from `costmodel` (shared with the chat's status bar).
- `report`: terminal tables, markdown report, PNG plots (matplotlib optional).
- `progress`: the progress bar on stderr.
The command is `localspec bench` (localspec/commands/bench.py).
"""
