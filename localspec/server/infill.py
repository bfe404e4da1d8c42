"""`/infill`: the fill-in-the-middle prompt from the FIM tokens the target's GGUF declares, and the
limits editors ask for (n_indent, t_max_predict_ms), the way llama-server builds and applies them.

Layout (Qwen2.5-Coder's repo-level format, llama-server's `format_prompt_infill`):

    [FIM_REP]myproject\\n [FIM_SEP]file0\\n chunk0 ... [FIM_SEP]filename\\n
    [FIM_PRE]prefix [FIM_SUF]suffix [FIM_MID]prompt

Budgets as llama-server's with its default batch of 2048: the prefix keeps its last 3/4 of a
batch, the suffix its first 1/4 (less the prompt), and the extra chunks fill what is left of the
context after one batch and twice the tokens to predict, newest chunks kept.
"""

from __future__ import annotations

import time

from .protocol import ApiError

FIM_BATCH = 2048  # llama-server's default n_batch, which sizes its FIM budgets
REQUIRED = (("pre", "prefix"), ("suf", "suffix"), ("mid", "middle"))


def require_fim(fim: dict[str, int]) -> None:
    missing = [what for key, what in REQUIRED if key not in fim]
    if missing:
        raise ApiError(501, "Infill is not supported by this model: the GGUF declares no FIM "
                            f"{' or '.join(missing)} token; use a code model with FIM tokens (e.g. Qwen2.5-Coder)")


def check_infill_body(body: dict) -> list[dict]:
    """llama-server's checks, in its order; returns input_extra as a list."""
    if "prompt" in body and body["prompt"] is not None and not isinstance(body["prompt"], str):
        raise ApiError(400, '"prompt" must be a string')
    for key in ("input_prefix", "input_suffix"):
        if key not in body:
            raise ApiError(400, f'"{key}" is required')
        if not isinstance(body[key], str):
            raise ApiError(400, f'"{key}" must be a string')
    extra = body.get("input_extra")
    if extra is None:
        return []
    if not isinstance(extra, list):
        raise ApiError(400, '"input_extra" must be an array of {"filename": string, "text": string}')
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ApiError(400, 'extra_context chunk must contain a "text" field with a string value')
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise ApiError(400, "extra_context chunk's \"filename\" field must be a string")
    return extra


def infill_tokens(model, body: dict, extra: list[dict], n_ctx: int, n_predict: int) -> list[int]:
    fim = model.fim_tokens()
    require_fim(fim)

    def tok(text: str) -> list[int]:
        return model.tokenize(text, add_special=False, parse_special=False) if text else []

    extra_tokens: list[int] = []
    if "rep" in fim:
        extra_tokens += [fim["rep"], *tok("myproject\n")]
    for chunk in extra:
        name = chunk.get("filename") or "tmp"
        if "sep" in fim:
            extra_tokens += [fim["sep"], *tok(name + "\n")]
        else:
            extra_tokens += tok("\n\n--- snippet ---\n\n")
        extra_tokens += tok(chunk["text"])
    if "sep" in fim:
        extra_tokens += [fim["sep"], *tok("filename\n")]

    prompt = tok(body.get("prompt") or "")
    prefix, suffix = tok(body["input_prefix"]), tok(body["input_suffix"])
    n_prefix = min(len(prefix), 3 * (FIM_BATCH // 4))
    n_suffix = min(len(suffix), max(0, FIM_BATCH // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - FIM_BATCH - 2 * max(0, n_predict)), len(extra_tokens))
    head = [model.bos] if model.add_bos else []
    return [*extra_tokens[len(extra_tokens) - n_extra:], *head, fim["pre"], *prefix[len(prefix) - n_prefix:], *prompt,
            fim["suf"], *suffix[:n_suffix], fim["mid"]]


def fim_stop_tokens(model) -> frozenset[int]:
    """FIM pad, repo and file-separator tokens end a completion (they start another file)."""
    fim = model.fim_tokens()
    return frozenset(fim[k] for k in ("pad", "rep", "sep") if k in fim)


class LineLimits:
    """llama-server's two editor limits on streamed text, applied as it is confirmed:

    - n_indent: once a new line starts, it must be indented by at least n_indent (spaces/tabs)
      or generation stops and that line is cut (a completion that dedents has left the block);
    - t_max_predict_ms: after that long, generation stops at the next new line.

    `push(text)` returns the text that may be sent and whether to stop. Indentation that could
    still belong to a cut line is held back until the line's first other character arrives."""

    def __init__(self, n_indent: int = 0, t_max_predict_ms: int = 0, start: float | None = None):
        self.n_indent, self.t_max = n_indent, t_max_predict_ms
        self.start = start  # generation time counts from the first token, not the prompt (as in llama-server)
        self.seen_newline = False
        self.held = ""  # the current line's leading whitespace, not sent yet
        self.at_line_start = False

    def push(self, text: str) -> tuple[str, bool]:
        if self.start is None:
            self.start = time.perf_counter()
        if not self.n_indent:
            return text, self._time_stop(text)
        out = []
        for ch in text:
            if self.at_line_start:
                if ch in " \t":
                    self.held += ch
                    continue
                if ch != "\n" and len(self.held.expandtabs(1)) < self.n_indent:
                    return "".join(out), True  # the new line dedents: cut it
                out.append(self.held)
                self.held, self.at_line_start = "", False
            out.append(ch)
            if ch == "\n":
                self.seen_newline = self.at_line_start = True
        sent = "".join(out)
        return sent, self._time_stop(text)

    def _time_stop(self, text: str) -> bool:
        if "\n" not in text:
            return False
        self.seen_newline = True
        return bool(self.t_max) and (time.perf_counter() - self.start) * 1000 > self.t_max
