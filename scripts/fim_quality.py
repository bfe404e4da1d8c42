"""Suggestion quality of the FIM windows: a FIM set built from the standard library's Python files (a
fixed seed picks N positions; half hide the rest of a line, half a whole line), asked as llama.vim asks
(256 lines before the cursor, the typed part of the line, 64 lines after), answered greedily by the
target, scored on the first line: exact match and edit similarity (difflib), in percent.

  llama-server     llama-server's format_infill windows (the last 1,536 prefix tokens, the typed part
                   before the suffix, up to 510 suffix tokens)
  editor           `serve`'s default windows (fim_windows: a PREFIX-token prefix window (340), 160 suffix tokens,
                   the typed part after FIM_MID)
  editor, moved    the same with the anchor 8 lines above the cursor (those lines after FIM_MID too),
                   as while typing on in one area

  scripts/fim-quality                       # default pair's target, N=24
  N=60 scripts/fim-quality --target T.gguf
  BUDGETS=512:96,340:160 ONLY=editor scripts/fim-quality   # other prefix:suffix budgets beside the default
"""

import difflib
import os
import random
import statistics
import sys
import sysconfig
import time
from pathlib import Path

from localspec.config import GenConfig
from localspec.fim.layout import fim_stop_tokens, infill_tokens
from localspec.fim.windows import EditorWindows, FimBudget
from localspec.session import GenChoice, ModelChoice, Session

args = sys.argv[1:]
opts = dict(zip(args[::2], args[1::2]))
N = int(os.environ.get("N", 24))
PREFIX = int(os.environ.get("PREFIX", 340))  # serve's budget at this machine's ~170 prompt tok/s (fim_windows)
FILES = ["textwrap.py", "shlex.py", "difflib.py", "csv.py", "heapq.py", "calendar.py", "fractions.py",
         "argparse.py", "json/decoder.py", "string.py", "configparser.py", "bisect.py"]
lib = Path(sysconfig.get_paths()["stdlib"])
rng = random.Random(20261124)
cases = []
while len(cases) < N:
    path = lib / rng.choice(FILES)
    lines = path.read_text().split("\n")
    y = rng.randrange(30, len(lines) - 1)
    line = lines[y]
    body = line.strip()
    if len(body) < 12 or body.startswith("#"):
        continue
    indent = len(line) - len(line.lstrip())
    if len(cases) % 2 == 0:  # the rest of a line, from a word boundary after a few characters
        cuts = [i for i in range(indent + 3, len(line) - 3) if line[i - 1] in " ._(=,[" ]
        if not cuts:
            continue
        x = rng.choice(cuts)
        middle, truth, rest = line[:x], line[x:], ""
    else:  # a whole line, the cursor on it as an empty line
        middle, truth, rest = "", line.strip(), ""
    prefix = "\n".join(lines[max(0, y - 256):y]) + "\n"
    suffix = rest + "\n" + "\n".join(lines[y + 1:y + 65]) + "\n"
    cases.append(dict(file=path.name, y=y, prefix=prefix, middle=middle, suffix=suffix, truth=truth,
                      whole=not middle))

session = Session.open(ModelChoice(target=opts.get("--target"), draft=None), GenChoice(temperature=0.0, spec="off"))
e = session.engine
model = e.target_model
cfg = GenConfig(temperature=0.0, max_tokens=48, spec="off", stop=["\n"])
cfg.stop_tokens = fim_stop_tokens(model)


def llama_server(c):
    cfg.heal = ""
    return infill_tokens(model, {"input_prefix": c["prefix"], "input_suffix": c["suffix"], "prompt": c["middle"]},
                         [], e.target.n_ctx, cfg.max_tokens)


def editor(c, moved=0, prefix=PREFIX, suffix=FimBudget().suffix):
    w = EditorWindows(model, FimBudget(prefix=prefix, suffix=suffix))
    if moved:
        cut = c["prefix"].rstrip("\n").split("\n")
        head = "\n".join(cut[:-moved]) + "\n"
        w.local(head, "", "\n".join(cut[-moved:]) + "\n" + c["suffix"])  # the anchor, 8 lines up
    toks, cfg.heal = w.local(c["prefix"], c["middle"], c["suffix"])
    return w.head([]) + toks


variants = [("llama-server", llama_server), ("editor", editor), ("editor, moved 8 lines", lambda c: editor(c, 8))]
for budget in filter(None, os.environ.get("BUDGETS", "").split(",")):  # more windows to compare: PREFIX:SUFFIX,...
    pre, suf = map(int, budget.split(":"))
    variants.append((f"editor {pre}+{suf}", lambda c, pre=pre, suf=suf: editor(c, 0, pre, suf)))
if os.environ.get("ONLY"):  # e.g. ONLY=llama-server,editor: the variants to run
    variants = [v for v in variants if v[0] in os.environ["ONLY"].split(",")
                or any(v[0] == f"editor {b}".replace(":", "+") for b in os.environ.get("BUDGETS", "").split(","))]
scores = {name: [] for name, _ in variants}
t0 = time.time()
for i, c in enumerate(cases):
    for name, build in variants:
        prompt = build(c)
        text, st = e.complete(prompt, cfg)
        got = text.split("\n")[0].strip() if c["whole"] else text.split("\n")[0].rstrip()
        want = c["truth"].rstrip() if not c["whole"] else c["truth"]
        scores[name].append((got == want, difflib.SequenceMatcher(None, got, want).ratio(), len(prompt)))
    print(f"[{i + 1}/{N}] {c['file']}:{c['y'] + 1} {'line' if c['whole'] else 'rest'} "
          + " ".join(f"{n.split(',')[0]}={'=' if s[-1][0] else round(s[-1][1], 2)}" for n, s in scores.items()),
          file=sys.stderr, flush=True)

print(f"\nFIM quality, {N} positions in {len(FILES)} standard-library files ({model.path.name}), "
      f"greedy, first line scored ({time.time() - t0:.0f} s)\n")
print("| windows | exact match | edit similarity | prompt tokens (median) |")
print("|---|---|---|---|")
for name, s in scores.items():
    exact = 100 * sum(x[0] for x in s) / len(s)
    sim = 100 * statistics.mean(x[1] for x in s)
    print(f"| {name} | {exact:.1f} % | {sim:.1f} % | {statistics.median(x[2] for x in s):.0f} |")
base = scores.get("llama-server")
for name, s in scores.items() if base else ():
    if name != "llama-server":
        d_exact = 100 * (sum(x[0] for x in s) - sum(x[0] for x in base)) / len(s)
        d_sim = 100 * (statistics.mean(x[1] for x in s) - statistics.mean(x[1] for x in base))
        print(f"\n{name} vs llama-server: exact {d_exact:+.1f} points, edit similarity {d_sim:+.1f} points")
session.close()
