"""The fault suite on real processes: `localspec serve` on the default pair (or PAIR args) gets hostile
bodies, foreign Hosts and Origins, a 10 MB /tokenize, hang-ups, concurrent streams, paths of no route (in
each protocol's error shape), tool results that answer no call, 68 waiters that hang up while long streams
hold every lane, two long prompts that fit the context alone but not together (-c 1280), saved prompts
replaced by [], null, a number or garbage, SIGTERM and SIGINT
mid-stream, an unwritable data dir under a long prompt; the CLI gets bad flags and a mistyped profile;
then a soak of SOAK mixed requests (RSS and open files at start and end, errors by kind, /health).
Prints one table; exits 1 if any probe failed. The fast part runs in CI as tests/server/test_faults.py.

  scripts/fault-check                         # default pair, 2000-request soak
  SOAK=300 scripts/fault-check --target T.gguf --draft D.gguf
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.faults import (
    Finding,
    post_json,
    probe_abandoned_waiters,
    probe_big_inputs,
    probe_call_ids,
    probe_concurrent_streams,
    probe_damaged_saved_prompts,
    probe_error_shapes,
    probe_foreign_pages,
    probe_hangups,
    probe_hostile_bodies,
    probe_long_prompts_together,
    request,
    soak,
    stream_then_signal,
)
from harness.serverproc import ServerProcess, drop_data_copies

args = sys.argv[1:]
SOAK = int(os.environ.get("SOAK", 2000))
work = Path(tempfile.mkdtemp(prefix="localspec-faults-"))
findings: list[Finding] = []

def section(name, fn):
    t0 = time.monotonic()
    got = fn()
    findings.extend(got)
    print(f"  {name}: {sum(f.ok for f in got)}/{len(got)} ok ({time.monotonic() - t0:.1f} s)", file=sys.stderr)

srv = ServerProcess(args, work / "home")
print(f"server up: {srv.url}", file=sys.stderr)
section("hostile bodies", lambda: probe_hostile_bodies(srv.port))
section("foreign pages", lambda: probe_foreign_pages(srv.port))
section("big inputs", lambda: probe_big_inputs(srv.port))
section("hang-ups", lambda: probe_hangups(srv.port))
section("concurrent streams", lambda: probe_concurrent_streams(srv.port, 8, 3))
section("error shapes by protocol", lambda: probe_error_shapes(srv.port))
section("tool results without a call", lambda: probe_call_ids(srv.port))
section("abandoned waiters", lambda: probe_abandoned_waiters(srv.port, lanes=4))
small = ServerProcess([*args, "-c", "1280", "--parallel", "4"], work / "home-small")  # long prompts cost seconds
section("the shared cache under long prompts", lambda: probe_long_prompts_together(small.port, 1280, lanes=4))
small.stop()
saved = work / "home-saved"
section("damaged saved prompts", lambda: probe_damaged_saved_prompts(lambda: ServerProcess(args, saved), saved))
soaked = soak(srv.port, SOAK, srv.proc.pid)
print(f"  soak: {soaked}", file=sys.stderr)
code = srv.stop()
log = srv.output()
findings.append(Finding("Ctrl-C when idle", code == 0 and "Traceback" not in log,
                        f"exit {code}; traceback in log: {'Traceback' in log}"))

for sig in (signal.SIGTERM, signal.SIGINT):
    s2 = ServerProcess(args, work / f"home-{sig}")
    findings.append(stream_then_signal(s2.proc, s2.port, sig))
    s2.log_file.close()
    out = s2.output()
    findings.append(Finding(f"{signal.Signals(sig).name}: clean log", not any(w in out for w in ("Traceback", "ERROR", "CancelledError")),
                            out.strip().splitlines()[-1][:90] if out.strip() else ""))

blocker = work / "a-file"
blocker.write_text("not a directory")
files = args
if not any(a in ("--target", "--draft") for a in args):  # the pair's own files: an unwritable home cannot assemble them
    from localspec.models import bundle_paths_if_installed
    target, draft = bundle_paths_if_installed()
    files = ["--target", str(target), "--draft", str(draft)]
s3 = ServerProcess(files, work / "home-ro", env={"LOCALSPEC_HOME": str(blocker / "home")})
long_prompt = "def parse(line):\n    return line.split(',')\n" * 60
first = post_json(s3.port, "/completion", {"prompt": long_prompt, "n_predict": 4})[0]
time.sleep(2)
later = [post_json(s3.port, "/completion", {"prompt": f"x = {i}", "n_predict": 4}, timeout=120)[0] for i in range(3)]
findings.append(Finding("unwritable data dir, long prompt", first == 200 and later == [200] * 3,
                        f"first {first}, later {later}, health {request(s3.port, 'GET', '/health')[0]}"))
s3.stop()

def cli(*a, env=None):
    return subprocess.run([sys.executable, "-m", "localspec", *a], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LOCALSPEC_HOME": str(work / "cli-home"), "LOCALSPEC_SERVER": "127.0.0.1:9",
                               **(env or {})}, stdin=subprocess.DEVNULL)
for flags in (["--temperature", "nan"], ["-t", "999"], ["-n", "0"], ["--ctx-size", "-5"], ["--seed", "-2"],
              ["--top-p", "nan"], ["-ngl", "-7"]):
    r = cli("run", *args, *flags, "hi")
    lines = r.stderr.strip().splitlines()
    findings.append(Finding(f"flag {' '.join(flags)}", r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"),
                            f"exit {r.returncode}: {r.stderr.strip()[:80]}"))
r = cli("run", *args, "-n", "4", "--temperature", "0", "hello")
profiles = list((work / "cli-home" / "profiles").glob("*.json"))
if profiles:
    profiles[0].write_text(json.dumps({**json.loads(profiles[0].read_text()), "t_verify": "fast"}))
r = cli("run", *args, "-n", "4", "--temperature", "0", "hello")
findings.append(Finding("mistyped profile", r.returncode == 0 and "note: ignoring" in r.stderr,
                        r.stderr.strip().splitlines()[0][:90] if r.stderr.strip() else f"exit {r.returncode}"))

width = max(len(f.probe) for f in findings)
print(f"| {'probe'.ljust(width)} | ok | seen |\n|{'-' * (width + 2)}|----|------|")
for f in findings:
    print(f"| {f.probe.ljust(width)} | {'yes' if f.ok else 'NO'} | {f.seen.replace('|', '/')} |")
errs = ", ".join(f"{k} x{v}" for k, v in soaked["errors"].items()) or "none"
print(f"\n| soak requests | seconds | errors | RSS MB start -> end | open files start -> end | /health at end |\n"
      f"|---|---|---|---|---|---|\n| {soaked['requests']} | {soaked['seconds']} | {errs} | "
      f"{soaked['rss_mb'][0]} -> {soaked['rss_mb'][1]} | {soaked['open_files'][0]} -> {soaked['open_files'][1]} | {soaked['health']} |")
drop_data_copies(work)  # the pair assembled into each data root; the logs in it stay
print(f"logs in {work}", file=sys.stderr)
failed = [f for f in findings if not f.ok] or soaked["errors"]
print(f"\n{sum(f.ok for f in findings)} passed, {sum(not f.ok for f in findings)} failed")
sys.exit(1 if failed else 0)
