"""Where a pair goes on a device with a given amount of free memory: a pure function over GGUF headers, as
llama-server's `--fit` (common/fit.cpp) does it with llama.cpp's own measurements.

The draft goes on the device whole first (its per-token latency is what speculation is built on), or stays on
the CPU whole; then the target: every layer at the asked context if it fits; else, where the user gave no
context, the largest context (a multiple of 256, not below FIT_MIN_CTX) at which every layer fits; else
FIT_MIN_CTX and as many layers as fit. llama.cpp counts the output layer as one more than the blocks and
offloads it first (`n_gpu_layers` = 1 puts only the output layer on the device), then blocks from the last.
Device memory per model: the weights of the layers on it, their KV cache at the context, and the compute
buffer (the largest activation of a ubatch: the logits when the output layer is there). A margin of
FIT_MARGIN stays free, llama-server's `--fit-target` default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FIT_MARGIN = 1 << 30  # bytes left free on the device (llama-server's --fit-target default: 1024 MiB)
FIT_MIN_CTX = 4096  # the smallest context the fit reduces to (llama-server's --fit-ctx default)
N_UBATCH = 512  # llama.cpp's default physical batch: the compute buffer is sized for it
GiB = 1 << 30

_BLOCK = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class ModelShape:
    """What a load costs, per part, from a GGUF's tensor descriptions and hyperparameters."""
    layer_bytes: tuple[int, ...]  # weights of each block
    output_bytes: int  # the output layer (its matrix, or the tied embeddings' copy, and the final norm)
    host_bytes: int  # what stays on the host wherever the layers go (the token embeddings)
    kv_per_token: tuple[int, ...]  # K and V bytes one token of context takes in each block (f16; 0: recurrent)
    n_vocab: int
    n_embd: int
    n_ff: int

    @property
    def n_layer(self) -> int:
        return len(self.layer_bytes)

    @property
    def weights(self) -> int:
        return sum(self.layer_bytes) + self.output_bytes + self.host_bytes

    def on_device(self, n_gpu_layers: int) -> tuple[int, int]:
        """(weights, KV bytes per token of context) on the device with `n_gpu_layers` (llama.cpp's count,
        output layer included) there."""
        n = max(0, min(n_gpu_layers, self.n_layer + 1))
        if n == 0:
            return 0, 0
        blocks = range(self.n_layer - (n - 1), self.n_layer)
        return self.output_bytes + sum(self.layer_bytes[i] for i in blocks), sum(self.kv_per_token[i] for i in blocks)

    def device_bytes(self, n_gpu_layers: int, n_ctx: int, n_ubatch: int = N_UBATCH) -> int:
        """Device memory with `n_gpu_layers` on it: weights, KV at `n_ctx`, the compute buffer."""
        if n_gpu_layers <= 0:
            return 0
        weights, kv = self.on_device(n_gpu_layers)
        compute = 4 * n_ubatch * max(self.n_vocab + 2 * self.n_embd, 3 * self.n_ff + self.n_embd)
        return weights + kv * n_ctx + compute

    def host_bytes_at(self, n_gpu_layers: int, n_ctx: int) -> int:
        """Host memory: the weights and KV not on the device."""
        weights, kv = self.on_device(n_gpu_layers)
        return self.weights - weights + (sum(self.kv_per_token) - kv) * n_ctx


def shape_of(header) -> ModelShape:
    """A ModelShape from a header read with its tensor descriptions (gguf_header.read_layout_file)."""
    arch = header.architecture or ""
    n_layer = int(header.get(f"{arch}.block_count", 0) or 0)
    layers = [0] * n_layer
    output = host = 0
    tied = True
    n_vocab = 0
    for t in header.tensors or []:
        m = _BLOCK.match(t.name)
        if m and int(m.group(1)) < n_layer:
            layers[int(m.group(1))] += t.n_bytes
        elif t.name.startswith("token_embd."):
            host += t.n_bytes
            n_vocab = n_vocab or (t.shape[1] if len(t.shape) > 1 else 0)
        elif t.name.startswith("output.") or t.name.startswith("output_norm."):
            output += t.n_bytes
            if t.name == "output.weight":
                tied, n_vocab = False, (t.shape[1] if len(t.shape) > 1 else n_vocab)
        elif m is None:
            host += t.n_bytes  # position embeddings and the like
        else:
            layers[-1] += t.n_bytes  # NextN blocks past block_count: with the last block
    if tied:  # llama.cpp copies the tied embeddings to the output layer's device
        output += next((t.n_bytes for t in header.tensors or [] if t.name == "token_embd.weight"), 0)
    n_embd = int(header.get(f"{arch}.embedding_length", 0) or 0)
    n_ff = header.get(f"{arch}.feed_forward_length", 0) or 0
    n_ff = max(n_ff) if isinstance(n_ff, list) else int(n_ff)
    return ModelShape(tuple(layers), output, host, tuple(kv_per_token(header, n_layer)),
                      n_vocab or len(header.get("tokenizer.ggml.tokens") or []), n_embd, n_ff)


def kv_per_token(header, n_layer: int) -> list[int]:
    """f16 K+V bytes per token of context in each block (a per-layer head count of 0: no KV there)."""
    arch = header.architecture or ""
    heads = header.get(f"{arch}.attention.head_count", 1) or 1
    kv_heads = header.get(f"{arch}.attention.head_count_kv", heads)
    n_embd = int(header.get(f"{arch}.embedding_length", 0) or 0)
    out = []
    for i in range(n_layer):
        h = heads[i] if isinstance(heads, list) else heads
        kv = kv_heads[i] if isinstance(kv_heads, list) else kv_heads
        k = header.get(f"{arch}.attention.key_length") or (n_embd // h if h else 0)
        v = header.get(f"{arch}.attention.value_length") or k
        out.append(int(kv) * (int(k) + int(v)) * 2)
    return out


@dataclass(frozen=True)
class Placement:
    target_layers: int  # n_gpu_layers for the target (llama.cpp's count: blocks + the output layer)
    draft_layers: int  # 0 (the CPU) or all of the draft's
    n_ctx: int
    device_bytes: int  # projected use of the device
    free_bytes: int
    fits: bool  # False: not even the target's layers on the CPU fit the host's memory beside the device
    why: str  # one line for the load line and the doctor

    def describe(self, target: ModelShape, draft: ModelShape | None) -> str:
        d = "" if draft is None else (f", draft {'on the GPU' if self.draft_layers else 'on the CPU'}")
        return (f"target {self.target_layers}/{target.n_layer + 1} layers on the GPU{d}, context {self.n_ctx}: "
                f"{self.device_bytes / GiB:.1f} of {self.free_bytes / GiB:.1f} GiB free ({self.why})")


def fit_pair(target: ModelShape, draft: ModelShape | None, free: int, n_ctx: int, ctx_given: bool,
             host_memory: int | None = None, draft_on_device: bool | None = None, margin: int = FIT_MARGIN,
             min_ctx: int = FIT_MIN_CTX) -> Placement:
    """The placement of a pair on a device with `free` bytes free (see the module's words); draft_on_device:
    where the user put the draft (None: chosen here)."""
    budget = free - margin
    all_t = target.n_layer + 1

    def use(t_layers: int, draft_on: bool, ctx: int) -> int:
        d = draft.device_bytes(draft.n_layer + 1, ctx) if draft is not None and draft_on else 0
        return target.device_bytes(t_layers, ctx) + d

    draft_on = draft is not None and (use(0, True, min(n_ctx, min_ctx) if not ctx_given else n_ctx) <= budget
                                      if draft_on_device is None else draft_on_device)
    d_layers = draft.n_layer + 1 if draft is not None and draft_on else 0

    def placed(t_layers: int, ctx: int, why: str) -> Placement:
        ok = host_memory is None or _host_need(target, draft, t_layers, d_layers, ctx) <= host_memory
        if not ok:
            why = _what_fits(target, draft, free, host_memory)
        return Placement(t_layers, d_layers, ctx, use(t_layers, draft_on, ctx), free, ok, why)

    if use(all_t, draft_on, n_ctx) <= budget:
        return placed(all_t, n_ctx, "all of it fits")
    floor = n_ctx if ctx_given else min(n_ctx, min_ctx)
    if not ctx_given and n_ctx > floor:
        fixed, per_token = use(all_t, draft_on, 0), use(all_t, draft_on, 1) - use(all_t, draft_on, 0)
        ctx = (budget - fixed) // per_token // 256 * 256 if per_token else n_ctx
        if ctx >= floor:
            return placed(all_t, int(min(ctx, n_ctx)), f"context reduced from {n_ctx} to fit every layer")
    n = max((t for t in range(all_t) if use(t, draft_on, floor) <= budget), default=0)
    return placed(n, floor, f"{all_t - n} of the target's layers on the CPU")


def _host_need(target: ModelShape, draft: ModelShape | None, t_layers: int, d_layers: int, ctx: int) -> int:
    return target.host_bytes_at(t_layers, ctx) + (draft.host_bytes_at(d_layers, ctx) if draft is not None else 0)


def _what_fits(target: ModelShape, draft: ModelShape | None, free: int, host: int) -> str:
    need = target.weights + (draft.weights if draft is not None else 0)
    room = max(0, free - FIT_MARGIN) + host
    return (f"the pair's weights alone take {need / GiB:.1f} GiB, more than the GPU's {max(0, free - FIT_MARGIN) / GiB:.1f} "
            f"and the host's {host / GiB:.1f} GiB together: a quantization of at most {room * 0.9 / GiB:.1f} GiB "
            "of weights would fit (or free memory)")


LAYER_LINE = re.compile(r"layer\s+(\d+) assigned to device (\S+?),")


def layer_ranges(lines: list[str]) -> list[tuple[str, int, int]]:
    """(device, first layer, last layer) runs from llama.cpp's load lines ("layer 3 assigned to device RPC0,")."""
    runs: list[tuple[str, int, int]] = []
    for line in lines:
        m = LAYER_LINE.search(line)
        if m is None:
            continue
        layer, dev = int(m.group(1)), m.group(2)
        if runs and runs[-1][0] == dev and runs[-1][2] == layer - 1:
            runs[-1] = (dev, runs[-1][1], layer)
        else:
            runs.append((dev, layer, layer))
    return runs


def describe_layers(lines: list[str], hosts: dict[str, str]) -> str | None:
    """"layers 0-9 here, 10-18 on 10.0.0.2:50052, ..." from llama.cpp's load lines (`hosts`: an RPC device's
    name -> its host:port); None when the lines name no layer."""
    runs = layer_ranges(lines)
    if not runs:
        return None

    def where(dev: str) -> str:
        return f"on {hosts[dev]}" if dev in hosts else "here" if dev == "CPU" else f"on {dev}"
    parts = [(f"{a}" if a == b else f"{a}-{b}") + f" {where(dev)}" for dev, a, b in runs]
    return "layers " + ", ".join(parts) + " (the last is the output layer)"
