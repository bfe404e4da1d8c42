"""A long conversation in a real terminal: `localspec chat` in tmux (120x40) on the default pair (or
--target/--draft), TURNS short turns one after another (greedy, -n 24), then the conversation scrolled
page by page to its top and back (the view keeps the last 200 messages) and one more turn. Each reply's
tok/s comes from the history the app writes (the footnote's figure). The conversation then grows 12k
tokens deep, where every decode step costs more, so the same turns are replayed in-process (the engine
alone, the same prompts at the same depths) and the chat is judged by its ratio to that: the first ten
turns' median ratio against the last ten's. Also the app's RSS after turn 10 and at the end.
  scripts/chat-long-check                 # 200 turns
  TURNS=50 scripts/chat-long-check --target T.gguf --draft D.gguf
"""

import json
import os
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

TURNS = int(os.environ.get("TURNS", 200))
PROMPT = "Reply with one short sentence about the number {}."
work = tempfile.mkdtemp(prefix="chat-long-check-")
home = os.path.join(work, "home")
T = ["tmux", "-S", f"{work}/sock"]
cmd = " ".join(shlex.quote(x) for x in [sys.executable, "-m", "localspec", "chat", *sys.argv[1:], "-c", "16384",
                                        "-n", "24", "--temperature", "0"])
subprocess.run([*T, "-f", "/dev/null", "new-session", "-d", "-s", "c", "-x", "120", "-y", "40",
                f"LOCALSPEC_HOME={shlex.quote(home)} TERM=xterm-256color COLORTERM=truecolor {cmd}; sleep 600"], check=True)
def screen():
    return subprocess.run([*T, "capture-pane", "-p", "-t", "c"], capture_output=True, text=True).stdout
def keys(*k):
    return subprocess.run([*T, "send-keys", "-t", "c", *k], check=True)

def wait(cond, what, limit=300):
    end = time.time() + limit
    while time.time() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.25)
    shown = screen()
    subprocess.run([*T, "kill-server"])
    sys.exit(f"chat-long-check: waited {limit} s for {what}:\n{shown}")

def replies():
    try:
        db = sqlite3.connect(f"file:{home}/history.db?mode=ro", uri=True, timeout=1)
        rows = db.execute("select stats from messages where role='assistant' and complete=1 order by id").fetchall()
        db.close()
    except sqlite3.Error:
        return []
    return [json.loads(r[0] or "{}").get("tokens_per_second", 0.0) for r in rows]

def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) // 1024

wait(lambda: "ready in" in screen(), "the app to load")
pid = int(subprocess.run(["pgrep", "-f", f"^{sys.executable} -m localspec chat"], capture_output=True, text=True).stdout.split()[0])
rss, t0 = {}, time.time()
for i in range(1, TURNS + 2):
    if i == TURNS + 1:  # the whole history scrolled, top and back, then one more turn
        for _ in range(TURNS // 2):
            keys("PageUp")
        keys("C-Home")
        wait(lambda: "every token shown has been verified" in screen(), "the top of the conversation", 60)
        keys("C-End")
        wait(lambda: f"about the number {TURNS}." in screen(), "the bottom again after ctrl+End", 60)
    keys("-l", PROMPT.format(i))
    keys("Enter")
    wait(lambda: len(replies()) >= i, f"reply {i}")
    wait(lambda: any(line.startswith(" ready │") for line in screen().splitlines()), f"the app ready after reply {i}")
    if i in (10, TURNS):
        rss[i] = rss_mb(pid)
    if i % 25 == 0:
        print(f"  turn {i}: {time.time() - t0:.0f} s", file=sys.stderr)
tps = replies()
subprocess.run([*T, "kill-server"])

# the same turns in-process: the engine alone at the same depths (greedy, so the same tokens)
from localspec.chat_format import Message  # noqa: E402 (after the terminal run, in the same order as before)
from localspec.session import GenChoice, ModelChoice, Session  # noqa: E402

flags = dict(zip(sys.argv[1::2], sys.argv[2::2]))
sess = Session.open(ModelChoice(target=flags.get("--target"), draft=flags.get("--draft"), ctx_size=16384),
                    GenChoice(temperature=0.0, max_tokens=24))
sess.ensure_profile()
db = sqlite3.connect(f"{home}/history.db")
rows = db.execute("select role, content from messages order by id").fetchall()
msgs, engine_tps = [], []
for role, content in rows:
    if role == "user":
        msgs.append(Message("user", content))
        _, st = sess.engine.complete(sess.engine.prompt_tokens(msgs), sess.gen)
        engine_tps.append(st.tokens_per_second)
    else:
        msgs.append(Message("assistant", content))
ratio = [c / e for c, e in zip(tps, engine_tps)]
first, last = statistics.median(ratio[:10]), statistics.median(ratio[TURNS - 10:TURNS])
print(f"turns: {TURNS} (+1 after scrolling the conversation to its top and back), {time.time() - t0:.0f} s")
print(f"chat tok/s, turns 1-10: {statistics.median(tps[:10]):.1f}; turns {TURNS - 9}-{TURNS}: "
      f"{statistics.median(tps[TURNS - 10:TURNS]):.1f}; after scrolling: {tps[-1]:.1f}")
print(f"engine alone, same turns: {statistics.median(engine_tps[:10]):.1f}; "
      f"{statistics.median(engine_tps[TURNS - 10:TURNS]):.1f}; {engine_tps[-1]:.1f}")
print(f"chat / engine: turns 1-10 {first:.2f}; turns {TURNS - 9}-{TURNS} {last:.2f}; last / first {last / first:.2f}")
print(f"RSS after turn 10: {rss[10]} MB; after turn {TURNS}: {rss[TURNS]} MB")
