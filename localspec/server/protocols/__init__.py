"""One translator per protocol: each turns its request bodies into a `ChatRequest` (or a prompt of its own) run
through `bridge.Run`, and the events back into its own JSON, SSE or NDJSON. None imports another's handlers."""
