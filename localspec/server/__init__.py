"""`localspec serve`: llama-server's HTTP API over one loaded pair (app, worker, protocol, shapes,
infill, metrics, runner) and the client `localspec run` uses to reach it (client).

Kept import-free: the CLI reads DEFAULT_PORT at start-up without loading the HTTP stack."""

DEFAULT_PORT = 8012  # llama.vim's and llama.vscode's default endpoint: editors work with no setting
