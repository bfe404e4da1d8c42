"""`localspec run PROMPT` (one-shot, streaming) and `localspec verify` (exactness self-test)."""

from __future__ import annotations

import json
import sys

from ..config import DRAFTERS
from ..costs import idle
from ..costs.threads import quiet_watch
from ..errors import ConfigError, LocalspecError
from ..session import Session, gen_config, load_config, open_engine, select_models
from .common import add_gen_args, add_model_args, gen_choice, model_choice, pos_int, stderr_note


def register(sub) -> None:
    p = sub.add_parser("run", help="answer one prompt, streaming confirmed text to stdout")
    p.add_argument("prompt", nargs="*", help="the prompt (piped stdin is read and put before it)")
    add_model_args(p)
    add_gen_args(p)
    p.add_argument("--raw", action="store_true", help="send the text as-is, without the model's chat template")
    p.add_argument("--predict", metavar="FILE", help="the text the answer is expected to repeat (the file being "
                   "edited): drafted from, aligned with the answer; changes the speed, never the answer")
    p.add_argument("--stats", action="store_true", help="print a speculation summary to stderr")
    p.add_argument("--json", action="store_true", help='print {"text", "tokens", "stats"} as one JSON object')
    p.add_argument("--local", action="store_true",
                   help="load the models here even when a `localspec serve` with this pair is running")
    p.set_defaults(func=cmd_run)

    v = sub.add_parser("verify", help="check that speculative greedy output matches plain greedy output")
    add_model_args(v)
    v.add_argument("-k", "--draft-max", type=pos_int, default=4)
    v.add_argument("-n", "--max-tokens", type=pos_int, default=64)
    v.add_argument("--drafter", choices=DRAFTERS, default=None)
    v.add_argument("--json", action="store_true")
    v.add_argument("--prompts", metavar="FILE", help="your own prompts, one a line (default: three built in)")
    v.add_argument("--quick", action="store_true", help="plain and speculative answers alone (what --against "
                   "compares), without the default mode's and the history's checks")
    v.add_argument("--against", metavar="REPORT.json",
                   help="also compare with another build's `verify --json` report (a CPU build vs a GPU "
                        "build, say): where the outputs part, both margins must be near-ties")
    v.set_defaults(func=cmd_verify)


def piped_stdin(wait_s: float | None) -> str:
    """Text piped into us, or "". With a prompt on the command line we wait at most `wait_s` for a
    pipe to say something, so an inherited, never-closed stdin (some CI runners) cannot hang us."""
    try:
        if sys.stdin is None or sys.stdin.isatty():
            return ""
        fd = sys.stdin.fileno()
    except (OSError, ValueError, AttributeError):
        return ""
    if wait_s is not None:
        import select

        if not select.select([fd], [], [], wait_s)[0]:
            return ""
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8", "surrogateescape")
    return decode_text(data, "the piped input")


def decode_text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); convert it "
                          "first, e.g. `iconv -f latin1 -t utf-8 FILE | localspec run ...`") from None


def read_prompt(args) -> str:
    parts = []
    piped = piped_stdin(2.0 if args.prompt else None)
    if piped.strip():
        parts.append(piped.rstrip("\n"))
    if args.prompt:  # arguments with bytes that are not UTF-8 reach Python as lone surrogates
        parts.append(decode_text(" ".join(args.prompt).encode("utf-8", "surrogateescape"), "the prompt argument"))
    text = "\n\n".join(parts)
    if not text.strip():
        raise ConfigError('empty prompt; try `localspec run "Write a haiku about caches"`')
    return text


def cmd_run(args) -> int:
    prompt_text = read_prompt(args)
    messages = ([("system", args.system)] if args.system else []) + [("user", prompt_text)]
    if not args.local:
        code = run_on_server(args, prompt_text, messages)
        if code is not None:
            return code
    from ..chat_format import Message

    session = Session.open(model_choice(args), gen_choice(args), None if args.json else stderr_note)
    for note in session.notes:
        stderr_note(f"note: {note}")
    engine, cfg, sel = session.engine, session.gen, session.selection
    prompt = engine.prompt_tokens(prompt_text if args.raw else [Message(r, c) for r, c in messages], raw=args.raw)
    engine.check_prompt(prompt)
    session.ensure_profile(None if args.json else stderr_note, measure=False)
    busy = quiet_watch()  # the first run here: priced by the reference curve now (engine.py), measured after
    out = _Output(args)
    for chunk in engine.generate(prompt, cfg):
        out.write(chunk.text)
    code = out.finish(engine.last_stats, sel.name)
    if cfg.spec == "auto":  # auto's pass costs, once, after the answer, on a machine that stayed quiet
        idle.measure_due(engine, busy, what="costs")
    return code


def run_on_server(args, prompt_text: str, messages) -> int | None:
    """Answer through a running `localspec serve` holding the same pair; None: no such server."""
    from ..client import connect as client

    found = client.find_server(model_choice(args))
    if found is None:
        return None
    ep, _, sel = found
    cfg = gen_config(gen_choice(args), sel)
    path, body = client.request_body(prompt_text if args.raw else messages, cfg, args.raw)
    out = _Output(args)
    try:
        stats = client.stream_run(ep, path, body, out.write)
    except client.ServerFailed as e:
        raise LocalspecError(f"{e} (answered by the server at {ep.host}:{ep.port})")
    except (OSError, ValueError) as e:
        raise LocalspecError(f"the server at {ep.host}:{ep.port} stopped answering ({e}); rerun with --local")
    return out.finish(stats, sel.name)


class _Output:
    """Streamed text on stdout, or one JSON object at the end; the same for both paths."""

    def __init__(self, args):
        self.args, self.pieces = args, []

    def write(self, text: str) -> None:
        if self.args.json:
            self.pieces.append(text)
        elif text:
            sys.stdout.write(text)
            sys.stdout.flush()

    def finish(self, stats, pair: str) -> int:
        out = sys.stdout
        if self.args.json:
            out.write(json.dumps({"text": "".join(self.pieces), "tokens": stats.tokens, "pair": pair,
                                  "stats": stats.to_dict()}, ensure_ascii=False) + "\n")
        else:
            out.write("\n")
        if stats.stop_reason == "context":
            sys.stderr.write(f"note: the context filled up after {stats.tokens} tokens; raise --ctx-size for longer answers\n")
        if self.args.stats:
            for line in stats.summary_lines():
                sys.stderr.write(line + "\n")
        return 0


VERIFY_PROMPTS = [
    "Write a Python function that parses a CSV file.",
    "Explain what a KV cache is in two sentences.",
    "List three uses of speculative decoding.",
]


def cmd_verify(args) -> int:
    from ..config import GenConfig
    from ..session import ensure_profile
    from ..verify import history_independence, verify_exactness

    other = read_verify_report(args.against) if args.against else None
    texts = read_prompt_lines(args.prompts) if args.prompts else VERIFY_PROMPTS
    choice = model_choice(args)
    sel = select_models(choice)
    cfg = GenConfig(temperature=0.0, spec="on", draft_max=args.draft_max, max_tokens=args.max_tokens,
                    drafter=args.drafter or ("model" if sel.draft else "ngram"))
    engine = open_engine(sel, load_config(choice, sel))
    prompts = [engine.prompt_tokens(p) for p in texts]
    if choice.exact:  # its auto runs price drafts by this machine's figures (greedy ones elsewhere need none)
        ensure_profile(engine, "auto", stderr_note)
    # answers fresh (before anything else ran) and after other requests, unless --quick
    history = None if args.quick else history_independence(engine, prompts, GenConfig(temperature=0.0,
                                                                                       max_tokens=args.max_tokens))
    report = verify_exactness(engine, prompts, cfg, exact=choice.exact)
    if history is not None:
        report["history"] = history
        self_checks(engine, prompts, report, args.max_tokens, choice.exact)
    against = compare_reports(report, other, args.against) if other is not None else None
    if args.json:
        print(json.dumps(report | ({"against": against} if against else {}), indent=2))
    else:
        print(f"logit noise between batched and single-token evaluation: {report['noise']:.4f} "
              f"(near-tie bound {report['near_tie_bound']:.4f})")
        for i, r in enumerate(report["prompts"]):
            if r["parted_at"] is None:
                print(f"prompt {i + 1}: identical ({r['tokens']} tokens)")
            else:
                print(f"prompt {i + 1}: parted at token {r['parted_at']}, plain-run top-1/top-2 margin "
                      f"{r['margin']:.4f} ({'near-tie' if r['near_tie'] else 'NOT a near-tie'})")
        if not args.quick:
            print_self_checks(report, len(prompts))
        print(f"verdict: {report['verdict']}" + (" (--exact: byte-identical required)" if choice.exact else ""))
        if against:
            print_comparison(against, args.against)
    ok = report["verdict"] == "OK" and (against is None or against["verdict"] == "OK")
    return 0 if ok else 1


def self_checks(engine, prompts: list[list[int]], report: dict, max_tokens: int, exact: bool) -> None:
    """The default mode against --spec off, and the verdict with the history's (not --quick)."""
    from ..verify import default_mode_partings

    report["default_parted_at"] = default_mode_partings(engine, prompts, [r["plain"] for r in report["prompts"]],
                                                        max_tokens)
    if exact and any(i is not None for i in [*report["history"]["parted_at"], *report["default_parted_at"]]):
        report["verdict"] = "MISMATCH"


def print_self_checks(report: dict, n: int) -> None:
    parted = [i for i in report["default_parted_at"] if i is not None]
    print(f"default mode: {n - len(parted)} of {n} answers (--spec auto) the same as "
          f"--spec off's" + (f"; parted at token {', '.join(map(str, parted))}" if parted else ""))
    parted = [i for i in report["history"]["parted_at"] if i is not None]
    print(f"history: {n - len(parted)} of {n} answers (--spec auto) the same fresh and "
          f"after other requests" + (f"; parted at token {', '.join(map(str, parted))}" if parted else ""))


def read_prompt_lines(path: str) -> list[str]:
    """`verify --prompts FILE`: one prompt a line, blank lines skipped; read before any model loads."""
    try:
        with open(path, "rb") as f:
            lines = [ln.strip() for ln in decode_text(f.read(), path).splitlines() if ln.strip()]
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}; give a text file with one prompt a line") from None
    if not lines:
        raise ConfigError(f"{path} has no prompt; give a text file with one prompt a line")
    return lines


def read_verify_report(path: str) -> dict:
    """Another build's `verify --json` output, checked before any model loads."""
    try:
        with open(path, "rb") as f:
            obj = json.loads(decode_text(f.read(), path))
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}; give a file written by `localspec verify --json`") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not JSON ({e.msg} at line {e.lineno}); give a file written by "
                          "`localspec verify --json`") from None
    prompts = obj.get("prompts") if isinstance(obj, dict) else None
    fields = ("prompt", "plain", "spec", "margins")
    if not (isinstance(prompts, list) and prompts and {"noise", "max_tokens", "verdict"} <= obj.keys()
            and all(isinstance(p, dict) and all(isinstance(p.get(k), list) for k in fields) for p in prompts)):
        raise ConfigError(f"{path} is not a `localspec verify --json` report of this version; make it again")
    return obj


def compare_reports(report: dict, other: dict, path: str) -> dict:
    from ..verify import compare_builds

    try:
        return compare_builds(report, other)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"cannot compare with {path}: {e}") from None


def print_comparison(c: dict, path: str) -> None:
    print(f"against {path}: logit noise between the two builds {c['cross_noise']:.4f} "
          f"(near-tie bound {c['near_tie_bound']:.4f})")
    for i, row in enumerate(c["prompts"]):
        for kind, label in (("plain", "plain"), ("spec", "speculative")):
            r = row[kind]
            if r["parted_at"] is None:
                print(f"prompt {i + 1}, {label}: identical ({r['tokens'][0]} tokens)")
                continue
            margins = "/".join("?" if m is None else f"{m:.4f}" for m in r["margins"])
            judged = {True: "near-tie", False: "NOT a near-tie", None: "both parted from plain earlier"}[r["near_tie"]]
            print(f"prompt {i + 1}, {label}: parted at token {r['parted_at']}, margins here/there {margins} ({judged})")
    print(f"verdict against {path}: {c['verdict']}")
