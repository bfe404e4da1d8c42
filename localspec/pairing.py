"""Can this draft speculate for that target? llama.cpp's rules (common/speculative.cpp):

  same vocab type; same BOS and EOS ids; same add-BOS flag; vocab sizes within 128;
  identical token text for every id from 5 up (to the smaller vocab's end).

`VocabInfo` is built either from a loaded model (backend.Model.vocab_info) or from a GGUF
header alone (models.check.vocab_info_from_header), so the same check runs before a download.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .errors import IncompatiblePairError

VOCAB_SIZE_MAX_DIFFERENCE = 128  # llama.cpp: SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_START_TOKEN_ID = 5  # llama.cpp: SPEC_VOCAB_CHECK_START_TOKEN_ID


@dataclass
class VocabInfo:
    vocab_type: str  # "spm" | "bpe" | "wpm" | "ugm" | ... (llama.cpp's names)
    n_tokens: int
    bos: int
    eos: int
    add_bos: bool
    token_text: Callable[[int], str] | Sequence[str]

    def text(self, i: int) -> str:
        t = self.token_text
        return t(i) if callable(t) else t[i]


def first_mismatch(target: VocabInfo, draft: VocabInfo) -> str | None:
    """None when compatible, else a one-line description of the first mismatch."""
    if target.vocab_type != draft.vocab_type:
        return f"vocab type differs: target {target.vocab_type}, draft {draft.vocab_type}"
    if target.add_bos != draft.add_bos:
        return f"add-BOS flag differs: target {target.add_bos}, draft {draft.add_bos}"
    if target.bos != draft.bos:
        return f"BOS id differs: target {target.bos}, draft {draft.bos}"
    if target.eos != draft.eos:
        return f"EOS id differs: target {target.eos}, draft {draft.eos}"
    diff = abs(target.n_tokens - draft.n_tokens)
    if diff > VOCAB_SIZE_MAX_DIFFERENCE:
        return (f"vocab sizes differ by {diff} (> {VOCAB_SIZE_MAX_DIFFERENCE}): "
                f"target {target.n_tokens}, draft {draft.n_tokens}")
    for i in range(VOCAB_CHECK_START_TOKEN_ID, min(target.n_tokens, draft.n_tokens)):
        a, b = target.text(i), draft.text(i)
        if a != b:
            return f"token {i} differs: target {a!r}, draft {b!r}"
    return None


def require_compatible(target: VocabInfo, draft: VocabInfo) -> None:
    why = first_mismatch(target, draft)
    if why:
        raise IncompatiblePairError(
            f"draft model is not compatible with the target ({why}); "
            "pick a draft from the same model family (see `localspec check`)")
