"""What the server's tests share: llama.vim's completion request as it sends it, and the CLI run against a server."""

from __future__ import annotations

# llama.vim (autoload/llama.vim, s:fim_render / llama#fim): the FIM request, field for field
VIM_FIM = {
    "id_slot": 0, "input_prefix": "def read the file\n    for line in data\n", "input_suffix": "\n    return value\n",
    "input_extra": [{"text": "def parse the csv file\n    return list\n", "filename": "parse.py"}],
    "prompt": "        ", "n_predict": 32, "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.90,
    "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500,
    "t_max_predict_ms": 1000,
    "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                        "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                        "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"],
}


def run_cli(server, *args: str, env: dict | None = None):
    import subprocess
    import sys

    from harness.serverproc import ROOT

    return subprocess.run([sys.executable, "-m", "localspec", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**server.env, "LOCALSPEC_SERVER": server.url, **(env or {})}, timeout=120)
