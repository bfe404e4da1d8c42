"""Fill-in-the-middle prompts from the FIM tokens a GGUF declares, the way llama-server builds them.

Layout (Qwen2.5-Coder's repo-level format, llama-server's `format_prompt_infill`):

    [FIM_REP]myproject\n [FIM_SEP]file0\n chunk0 ... [FIM_SEP]filename\n
    [FIM_PRE]prefix [FIM_SUF]suffix [FIM_MID]prompt

Budgets as llama-server's with its default batch of 2048: the prefix keeps its last 3/4 of a
batch, the suffix its first 1/4 (less the prompt), and the extra chunks fill what is left of the
context after one batch and twice the tokens to predict, newest chunks kept. Used by the server's
/infill and by the bench's `fim` workload.
"""

from __future__ import annotations

from ..errors import LocalspecError


class FimUnsupported(LocalspecError):
    pass


FIM_BATCH = 2048  # llama-server's default n_batch, which sizes its FIM budgets
REQUIRED = (("pre", "prefix"), ("suf", "suffix"), ("mid", "middle"))


def require_fim(fim: dict[str, int]) -> None:
    missing = [what for key, what in REQUIRED if key not in fim]
    if missing:
        raise FimUnsupported("Infill is not supported by this model: the GGUF declares no FIM "
                             f"{' or '.join(missing)} token; use a code model with FIM tokens (e.g. Qwen2.5-Coder)")


def infill_tokens(model, body: dict, extra: list[dict], n_ctx: int, n_predict: int) -> list[int]:
    """body: input_prefix, input_suffix and an optional prompt (text the middle starts with);
    extra: [{"filename", "text"}] chunks of other files."""
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
