"""llama.cpp's GBNF grammar sampler over a model's vocabulary."""

from __future__ import annotations

import ctypes

import numpy as np

from .model import Model

TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # llama_token_data


class GrammarSampler:
    """llama.cpp's own GBNF grammar sampler (what llama-server constrains with) over a model's vocabulary:
    which tokens the grammar allows next, given the tokens accepted so far. Accepting a token it does not
    allow aborts llama.cpp, so callers accept only what `allows` or `mask` let through, and never an EOG."""

    def __init__(self, model: Model, gbnf: str, root: str = "root", _ptr=None):
        self.L, self.model = model.L, model
        self.ptr = _ptr or self.L.llama_sampler_init_grammar(model.vocab, gbnf.encode("utf-8"), root.encode())
        if not self.ptr:
            raise ValueError("the grammar could not be parsed (LOCALSPEC_DEBUG=1 shows llama.cpp's reason)")
        self._one = np.zeros(1, dtype=TOKEN_DATA)
        self._all: np.ndarray | None = None  # the whole vocabulary, made on the first full mask

    def _apply(self, cand: np.ndarray) -> None:
        L = self.L
        arr = L.llama_token_data_array(data=cand.ctypes.data_as(L.llama_token_data_p), size=len(cand),
                                       selected=-1, sorted=False)
        L.llama_sampler_apply(self.ptr, ctypes.byref(arr))

    def allows(self, token: int) -> bool:
        self._one["id"], self._one["logit"] = token, 0.0
        self._apply(self._one)
        return bool(np.isfinite(self._one["logit"][0]))

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """One row of logits with every token the grammar forbids set to -inf (in place)."""
        if self._all is None:
            self._all = np.zeros(self.model.n_vocab, dtype=TOKEN_DATA)
            self._all["id"] = np.arange(self.model.n_vocab)
        self._all["logit"] = 0.0
        self._apply(self._all)
        logits[~np.isfinite(self._all["logit"])] = -np.inf
        return logits

    def accept(self, token: int) -> None:
        if not self.model.is_eog(token):
            self.L.llama_sampler_accept(self.ptr, token)

    def clone(self) -> "GrammarSampler":
        twin = GrammarSampler(self.model, "", _ptr=self.L.llama_sampler_clone(self.ptr))
        twin._all = self._all
        return twin

    def close(self) -> None:
        if getattr(self, "ptr", None):
            self.L.llama_sampler_free(self.ptr)
            self.ptr = None

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
