"""A server's KV cache beyond one sequence: saved prompts in host memory (`promptcache`) and on disk (`promptdisk`),
prompts shared while another lane evaluates them (`promptfills`), and a waiting sequence's KV moved to host
memory when the shared cache is full (`swap`). Built and used by `serving.engine.ServingEngine` and `serving.batching`."""
