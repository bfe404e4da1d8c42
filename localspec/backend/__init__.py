"""A thin layer over llama-cpp-python's low-level API (never `Llama(...)`).

`Model` is a loaded GGUF (weights + vocabulary); `Context` is one llama_context holding one
sequence (or, for a server's parallel requests, several in one unified KV cache), the tokens whose
K/V it caches per sequence, and a reusable `llama_batch`. `Context.eval` asks for
logits only on the rows the caller needs: `Llama(logits_all=True)` would keep an
n_ctx x n_vocab float array (2.5 GB at 4k context for Qwen's 151,936-token vocabulary).
"""

from . import exact, mtp
from .context import Context
from .fill import common_prefix, fill_to_answer, sync_cache
from .grammar import GrammarSampler
from .model import MappedPageReleaser, Model, add_rpc_servers, llama, system_info

__all__ = ["Context", "exact", "GrammarSampler", "MappedPageReleaser", "Model", "add_rpc_servers", "common_prefix",
           "fill_to_answer", "llama", "mtp", "sync_cache", "system_info"]
