"""What one token drafted by a NextN (MTP) head costs on this machine, against a decode of the target and against
its arithmetic share: the head's block and the output projection it runs, over what a decode reads (every main
layer and the output projection), both in bytes of weights, since a decode on a CPU is bound by reading them.

    scripts/hybrid-twin TWIN.gguf --nextn 1      # a Qwen3.5-0.8B-shaped twin with its NextN block, Q4_K_M
    scripts/mtp-cost TWIN.gguf [--depth 256] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from localspec.backend.mtp import MtpHead
from localspec.config import LoadConfig
from localspec.engine import Engine


def weight_bytes(path: str) -> tuple[int, int, int]:
    """(bytes a decode reads, bytes of the NextN block, bytes of the output projection the head runs)."""
    import gguf

    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    n_main = r.fields[f"{arch}.block_count"].contents() - r.fields[f"{arch}.nextn_predict_layers"].contents()
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    head = sum(n for name, n in sizes.items() if name.startswith(f"blk.{n_main}.") and "embed_tokens" not in name
               and "shared_head_head" not in name)
    out = sizes.get(f"blk.{n_main}.nextn.shared_head_head.weight") or sizes["output.weight"]
    main = sum(n for name, n in sizes.items() if name.startswith("blk.") and int(name.split(".")[1]) < n_main)
    return main + sizes["output.weight"], head, out


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--depth", type=int, default=256)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    e = Engine(a.model, None, LoadConfig(n_ctx=2048, n_threads=a.threads, n_threads_batch=a.threads))
    try:
        tgt = e.target
        prompt = [int(t) for t in np.random.default_rng(0).integers(10, 200, a.depth)]
        tgt.eval(prompt, logits="last")
        head = MtpHead(tgt, tgt.hidden)
        head.sync(prompt)
        h = tgt.hidden.rows[0][a.depth - 1]

        def decode():  # the context grows by a token a decode (a few in all): no rollback timed with it
            tgt.eval([prompt[-1]], logits="last")

        def step():
            head.step(prompt[-1], a.depth, h)
            head.L.llama_memory_seq_rm(head.mem, 0, a.depth, -1)

        for fn in (decode, step):  # warm
            timed(fn, 3)
        t_decode, t_step = timed(decode, a.repeats), timed(step, a.repeats)
        total, block, out = weight_bytes(a.model)
        share = (block + out) / total
        print(f"target decode {t_decode * 1e3:.2f} ms, head step {t_step * 1e3:.2f} ms at depth {a.depth}: "
              f"{t_step / t_decode:.3f} of a decode")
        print(f"arithmetic share: NextN block {block / 2**20:.1f} MiB + output projection {out / 2**20:.1f} MiB over "
              f"a decode's {total / 2**20:.1f} MiB = {share:.3f}; measured / share = {t_step / t_decode / share:.2f}")
        head.close()
    finally:
        e.close()


if __name__ == "__main__":
    main()
