"""What llama.cpp does with a model's architecture (GGUF general.architecture) when a draft is rejected,
known from the header alone: `localspec models check` and doctor say it before anything loads; a loaded
context's own classification (backend/rollback.py) is the final word."""

from __future__ import annotations

PARTIAL, SNAPSHOT, CHECKPOINT = "partial", "snapshot", "checkpoint"

# llama.cpp's recurrent and hybrid architectures (llm_arch_is_recurrent, llm_arch_is_hybrid) and those it
# keeps per-token state snapshots for (llm_arch_supports_rs_rollback), in the version the project pins
RECURRENT_ARCHS = frozenset({
    "mamba", "mamba2", "jamba", "falcon-h1", "granitehybrid", "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe",
    "qwen3next", "qwen35", "qwen35moe", "qwen4exp", "kimi-linear", "kimi-k3", "glm5-next", "plamo2", "rwkv6",
    "rwkv6qwen2", "rwkv7", "arwkv7", "bailingmoe3", "deepseek4"})
SNAPSHOT_ARCHS = frozenset({"lfm2", "lfm2moe", "qwen35", "qwen35moe", "qwen4exp", "nemotron_h", "nemotron_h_moe",
                            "kimi-k3", "glm5-next", "deepseek4", "bailingmoe3"})


def rollback_of(arch: str | None) -> str:
    """The rollback a model of this architecture gets."""
    if arch in SNAPSHOT_ARCHS:
        return SNAPSHOT
    return CHECKPOINT if arch in RECURRENT_ARCHS else PARTIAL


def describe(kind: str) -> str:
    return {PARTIAL: "a rejected draft's cells dropped (a transformer's KV cache)",
            SNAPSHOT: "per-token state snapshots for short drafts, checkpoints for longer ones",
            CHECKPOINT: "a state checkpoint before each verify pass, the kept tokens replayed"}[kind]
