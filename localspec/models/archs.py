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


# a recurrent draft model, whatever its architecture: its passes are one token, so no snapshot reaches back a round
DRAFT_ROLLBACK = ("its state saved after each drafted token where a save costs little beside a step (a CPU), "
                  "else at each round's start and the accepted drafts evaluated again")


# Drafters that ship with models: a target's own NextN (multi-token-prediction) blocks, and drafter GGUFs of
# architectures of their own, which llama-server drives with --spec-type draft-mtp, draft-eagle3, draft-dflash
DRAFTER_ARCHS = {"eagle3": "an EAGLE-3 drafter", "dflash": "a DFlash drafter",
                 "gemma4-assistant": "a Gemma 4 assistant drafter"}


def draft_head(arch: str | None, nextn_layers: int) -> str | None:
    """The drafter a GGUF carries or is, from its header: "nextn" (NextN blocks after its main layers), a
    drafter architecture's name, or None."""
    if arch in DRAFTER_ARCHS:
        return arch
    return "nextn" if nextn_layers > 0 else None


def drafter_refusal(arch: str | None, name: str) -> str | None:
    """Why a drafter file cannot be the draft model here (None: it is an ordinary model): it drafts from the
    target's hidden states through llama.cpp's staging interface, which this version does not drive for it."""
    if arch not in DRAFTER_ARCHS:
        return None
    return (f"{name} is {DRAFTER_ARCHS[arch]} (architecture {arch}), not a draft model: it drafts from the "
            "target's hidden states, which localspec does not drive yet; give a same-vocabulary draft model "
            "or use --drafter ngram")
