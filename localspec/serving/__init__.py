"""One loaded model under several requests, no HTTP in it: the serving engine (`engine`: lanes over one context),
their passes batched (`batching`), saved and shared prompts (`caches/`), lanes handed out (`lanes`), the job
queue and a job's options (`jobqueue`, `job`), the worker threads (`worker`), editor limits, metrics and log
lines. `server/` translates HTTP onto it; the errors it raises are the project's own (localspec/errors.py)."""
