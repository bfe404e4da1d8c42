"""Fill-in-the-middle prompts: llama-server's layout from a GGUF's FIM tokens (`layout`: the server's /infill in
that layout, the bench's `fim` workload) and the editors' windows that let typing append to a cached prompt
(`windows`: the server's default for editors)."""
