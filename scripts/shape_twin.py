"""A model's shape twin: its exact GGUF header (metadata, vocabulary, tensor names, shapes and quant
types) with random weights of the same types. Pass costs depend on shapes and types alone, so a twin
measures a model's cost profile (plain decode, verify n tokens, the draft's cost) on a machine the
real file cannot reach (a GPU box without the download), from a few MB instead of GBs. Its outputs
are noise, so acceptance must come from the real pair.

  scripts/shape-twin header MODEL.gguf OUT.twin     # header bytes + tensor layout, a few MB
  scripts/shape-twin build  OUT.twin    TWIN.gguf   # fill in random weights of the same types
"""
import json
import os
import struct
import sys

import numpy as np

# bytes per block, and the byte offsets of each block's fp16 scales (set to small finite values so
# random quants stay finite); types not listed are filled with small random floats or left random
BLOCKS = {  # ggml type id: (block bytes, fp16 scale offsets)
    2: (18, (0,)),        # Q4_0
    3: (20, (0, 2)),      # Q4_1
    6: (22, (0,)),        # Q5_0
    7: (24, (0, 2)),      # Q5_1
    8: (34, (0,)),        # Q8_0
    12: (144, (0, 2)),    # Q4_K: d, dmin, scales[12], qs[128]
    13: (176, (0, 2)),    # Q5_K
    14: (210, (208,)),    # Q6_K: ql[128], qh[64], scales[16], d
    10: (84, (80, 82)),   # Q2_K
    11: (110, (108,)),    # Q3_K
}
F32, F16 = 0, 1
MAGIC = b"LSTWIN01"


def header(model: str, out: str) -> None:
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ValueError("reading a GGUF needs the gguf package: pip install 'localspec[test]'") from None
    r = GGUFReader(model)
    layout = [[t.name, int(t.tensor_type), int(t.data_offset), int(t.n_bytes)] for t in r.tensors]
    with open(model, "rb") as f:
        head = f.read(min(t[2] for t in layout))
    meta = json.dumps({"size": max(o + n for _, _, o, n in layout), "tensors": layout}).encode()
    if not head.startswith(b"GGUF"):
        raise ValueError(f"{model} is not a GGUF file")
    with open(out, "wb") as f:
        f.write(MAGIC + struct.pack("<QQ", len(meta), len(head)) + meta + head)


def build(twin: str, out: str) -> None:
    rng = np.random.default_rng(0)
    with open(twin, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError(f"{twin} was not written by `shape-twin header`")
        n_meta, n_head = struct.unpack("<QQ", f.read(16))
        meta = json.loads(f.read(n_meta))
        head = f.read(n_head)
    small = np.float16(0.002).tobytes()
    part = out + ".part"  # renamed when complete: never a half-written model
    with open(part, "wb") as f:
        f.write(head)
        for name, ttype, offset, n_bytes in meta["tensors"]:
            f.seek(offset)
            if ttype == F32:  # norms and biases: ones for norms keep activations in range
                fill = 1.0 if name.endswith("norm.weight") else 0.0
                f.write(np.full(n_bytes // 4, fill, np.float32).tobytes())
            elif ttype == F16:
                f.write((rng.standard_normal(n_bytes // 2) * 0.02).astype(np.float16).tobytes())
            else:
                data = rng.integers(0, 256, n_bytes, dtype=np.uint8)
                if ttype in BLOCKS:
                    size, scales = BLOCKS[ttype]
                    blocks = data.reshape(-1, size)
                    for at in scales:
                        blocks[:, at:at + 2] = np.frombuffer(small, np.uint8)
                f.write(data.tobytes())
        f.truncate(meta["size"])
    os.replace(part, out)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("header", "build"):
        sys.exit(__doc__.strip().splitlines()[-2].strip() + "\n" + __doc__.strip().splitlines()[-1].strip())
    try:
        (header if sys.argv[1] == "header" else build)(sys.argv[2], sys.argv[3])
    except (OSError, ValueError, KeyError, struct.error) as e:
        sys.exit(f"shape-twin: {e} (header takes a GGUF model; build takes what header wrote)")
