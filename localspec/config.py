"""One config object for a generation, every default commented (in the spirit of nanoGPT).

The CLI, the chat app and the bench all build a `GenConfig`; the engine reads nothing else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace


def default_threads() -> int:
    # llama-cpp-python defaults to cpu_count()//2, which is ONE thread on a 2-core laptop VM.
    # Decoding is memory-bound and scales with cores here, so use all of them unless told.
    return max(1, os.cpu_count() or 1)


# model: a separate draft model; ngram: prompt lookup; hybrid: n-grams when their match is long, the model else;
# mtp: the target's own NextN (multi-token-prediction) blocks; auto: hybrid with the target's head in the model's
# place where it has one (the head first, then a draft model, then n-grams: docs/MODELS.md, "Drafters")
DRAFTERS = ("auto", "model", "ngram", "hybrid", "mtp")

@dataclass
class GenConfig:
    # --- sampling (applied identically to the target p and the draft q) ---
    # defaults are llama.cpp's (llama-cli, llama-server), so answers feel the same as there
    temperature: float = 0.8  # 0 = greedy: every emitted token is the target's argmax
    top_k: int = 40  # 0 = off; keep only the k most likely tokens
    top_p: float = 0.95  # 1.0 = off; nucleus sampling mass (on the untempered softmax)
    min_p: float = 0.05  # 0.0 = off; drop tokens below min_p * p(top token)
    seed: int | None = None  # fixes the sampler's RNG so runs are reproducible

    # --- speculation ---
    spec: str = "auto"  # "on" | "off" | "auto" (auto drafts only when the cost model says it pays)
    drafter: str = "auto"  # one of DRAFTERS
    draft_max: int = 4  # k: the most tokens drafted per round (auto may choose fewer, down to 0)
    ngram_draft_max: int = 64  # n-gram drafts cost nothing to make, so auto may verify long ones (-k sets both)
    prediction: str = ""  # the expected output (OpenAI's predicted outputs): an n-gram draft source aligned with the answer
    draft_min: int = 0  # llama-server's speculative.n_min: shorter drafts are not verified (0 = any length)
    p_min: float = 0.0  # stop drafting when the draft model's top probability falls below this
    ngram_min: int = 2  # shortest suffix match the n-gram drafter trusts
    ngram_max: int = 4  # longest suffix it looks up (the match is then extended backwards to measure it)
    exact: bool = False
    # a server's caches: saved prompts in host memory (promptcache) and on disk under the data root (promptdisk),
    # built by its engine (serving/engine.py), and n-gram drafts that may copy earlier requests' answers
    cache_ram_mib: int = 0
    cache_disk_mib: int = 0
    remember_generations: bool = False  # byte-identical to plain decoding: drafts only where the engine's kernels are exact (--exact)
    repeatable: bool = True  # greedy text repeats whatever ran before (docs/EXACT.md); editors' completions keep the cache whole

    # --- stopping ---
    max_tokens: int = 512  # hard cap on generated tokens
    stop: list[str] = field(default_factory=list)  # stop strings; no text past one is ever emitted
    stop_tokens: frozenset[int] = frozenset()  # token ids that end generation besides the model's EOG set (FIM)

    # --- constraints on the target's distribution (drafts are judged against the constrained target) ---
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added logit (-inf bans it)
    grammar: str | None = None  # GBNF the output must follow (decoding/constraints.py; JSON schemas become one)
    heal: str = ""  # token healing: text the prompt ends with but its tokens leave out; the output must start with it (hidden)

    def with_(self, **kw) -> "GenConfig":
        return replace(self, **kw)


@dataclass
class LoadConfig:
    n_ctx: int = 4096  # context window for both target and draft (tokens)
    n_batch: int = 512  # prompt is evaluated in chunks of this many tokens
    n_parallel: int = 1  # generations at once in one context (a server's --parallel; batching.py)
    n_threads: int = field(default_factory=default_threads)  # decode threads (all cores, see above)
    n_threads_batch: int = field(default_factory=default_threads)  # prompt/verify threads
    adapt_threads: bool = True  # fewer threads while other processes hold the cores (costs/threads.py); -t N fixes them
    # -1: fitted to the GPU's free memory at load (session.place_on_device: every layer where they fit); the
    # numbers the load used replace it. Without a GPU backend, nothing is offloaded whatever the number.
    n_gpu_layers_target: int = -1
    n_gpu_layers_draft: int = -1  # same for the draft: whole on the GPU, or on the CPU
    placement: str = ""  # what the fit chose, in a line for the load's notes ("" where nothing was fitted)
    # Memory-mapped load, with the file's pages released as llama.cpp finishes with them (backend.py):
    # llama.cpp repacks Q4 weights for the CPU into a second buffer, and the mapped originals would
    # otherwise stay resident too (docs/BENCHMARKS.md, "Start-up and memory": the lowest peak, as fast as plain mmap).
    # False: read() the file into memory (--no-mmap).
    mmap: bool = True
    rpc_servers: str | None = None  # "host:port,host:port": llama.cpp RPC backends for the target
    # Verify passes padded to a few shapes (1, 2, 4, 8, 16 tokens): on a GPU, llama.cpp replays a CUDA graph
    # only after two passes of identical shape, so a verify whose k changes every round is captured anew
    # each time. None = on when the target is offloaded to a GPU, off on a CPU (where a padded token costs
    # what a real one does).
    verify_buckets: bool | None = None
    chat_template: str | None = None  # override the template stored in the GGUF
    # llama.cpp's flash attention: "on", "off", or "auto": llama.cpp's own choice on a GPU; on a CPU the
    # kernel measured faster for this tool's work (costs/attention.py says how). It takes a smaller compute
    # buffer (docs/BENCHMARKS.md has a 32k context's with and without).
    flash_attn: str = "auto"
    # --exact: batch-invariant kernels (backend/exact.py), so speculative output has plain decoding's bits
    # on every request; the weights stay in their file layout and attention runs over a bf16 KV cache.
    exact: bool = False
    # a server's caches: saved prompts in host memory (promptcache) and on disk under the data root (promptdisk),
    # built by its engine (serving/engine.py), and n-gram drafts that may copy earlier requests' answers
    cache_ram_mib: int = 0
    cache_disk_mib: int = 0
    remember_generations: bool = False


def rpc_endpoints(text: str) -> str:
    """llama.cpp RPC hosts as `--rpc` takes them ("host:port,host:port"), checked and joined; ValueError
    naming the bad one otherwise (the flag's and models.yaml's one rule)."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    for item in items:
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{item!r} is not host:port (for example 192.168.1.20:50052)")
    if not items:
        raise ValueError("no host:port given")
    return ",".join(items)
