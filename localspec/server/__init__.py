"""`localspec serve`, HTTP only: the app, its routes and guard, the router of models, the request bridge onto
the serving layer (localspec/serving/), the protocol translators (`protocols/`) and the chat page (`page/`).

Kept import-free: the CLI reads DEFAULT_PORT at start-up without loading the HTTP stack."""

DEFAULT_PORT = 8012  # llama.vim's and llama.vscode's default endpoint: editors work with no setting
