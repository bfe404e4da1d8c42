"""`localspec models | paths | pull | rm | check | doctor`: the model pairs and this machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .. import models, paths
from ..models.hub import parse_hub_ref
from .common import add_model_args, model_choice


def register(sub) -> None:
    p = sub.add_parser("models", aliases=["list"], help="list the model pairs, their files and where they are")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("paths", help="print every path localspec reads or writes")
    p.add_argument("--json", action="store_true", help="print the paths as JSON")
    p.set_defaults(func=cmd_paths)

    p = sub.add_parser("pull", help="fetch a pair (or one ORG/REPO/FILE.gguf): bundle first, else download")
    p.add_argument("name", metavar="PAIR|REPO/FILE", help="a pair name from `localspec models`, or ORG/REPO/FILE.gguf")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("rm", help="delete a pair's downloaded and assembled files")
    p.add_argument("pair", metavar="PAIR")
    p.set_defaults(func=cmd_rm)

    p = sub.add_parser("check", help="can DRAFT speculate for TARGET? reads only the two GGUF headers")
    p.add_argument("target", metavar="TARGET", help="a .gguf path, ORG/REPO/FILE.gguf, or a pair name (its target)")
    p.add_argument("draft", metavar="DRAFT", nargs="?",
                   help="a .gguf path, ORG/REPO/FILE.gguf, or a pair name (its draft); omit to list known drafts")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("doctor", help="llama.cpp build, GPU backend, RAM, the default pair, reinstall commands")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--load", action="store_true",
                   help="also load the pair (both models) and say where llama.cpp put each one's layers")
    add_model_args(p, positional_pair=True)
    p.set_defaults(func=cmd_doctor)


def _print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def models_listing() -> dict:
    registry = models.load_registry()
    pairs = []
    for spec in registry.values():
        pairs.append({
            "name": spec.name,
            "default": spec.name == models.DEFAULT_PAIR,
            "settings": spec.settings_dict(),
            "notes": spec.notes,
            "files": [f.__dict__ for f in models.pair_status(spec)],
        })
    from ..models.catalog import find_models

    lone = [{"name": e.name, "path": str(e.target), "size": e.size, "draft": str(e.draft) if e.draft else None}
            for e in find_models() if e.pair is None]
    return {"default": models.DEFAULT_PAIR, "pairs": pairs, "gguf_files": lone}


STATE_WORDS = {"path": "local path", "hf-cache": "HF cache", "bundle": "bundle copy",
               "bundle-chunks": "bundle (assembled on first use)", "bundle-broken": "bundle broken",
               "missing": "missing"}


def format_listing(listing: dict) -> str:
    rows = [("PAIR", "ROLE", "SIZE", "WHERE", "FILE")]
    for pair in listing["pairs"]:
        name = pair["name"] + (" *" if pair["default"] else "")
        for f in pair["files"]:
            rows.append((name, f["role"], models.human_size(f["size"]), STATE_WORDS.get(f["state"], f["state"]),
                         f["path"] or f["source"]))
            name = ""
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    lines.append(f"* default pair. `localspec pull PAIR` fetches a missing pair; pairs come from "
                 f"{models.registry.PACKAGE_REGISTRY_FILE} and {paths.user_config_file()}")
    if listing["gguf_files"]:
        lines.append(f"GGUF files in {paths.models_dir()} that `localspec serve` also serves, by name:")
        for f in listing["gguf_files"]:
            drafting = f"draft {Path(f['draft']).name}" if f["draft"] else "n-gram drafts"
            lines.append(f"  {f['name']}  {models.human_size(f['size'])}  {drafting}")
    return "\n".join(lines)


def cmd_models(args) -> int:
    listing = models_listing()
    if args.json:
        _print_json(listing)
    else:
        sys.stdout.write(format_listing(listing) + "\n")
    return 0


def all_paths() -> dict[str, str]:
    return {**paths.all_paths(), "hf_cache": str(models.hf_cache_dir()),
            "package_models": str(models.registry.PACKAGE_REGISTRY_FILE)}


def cmd_paths(args) -> int:
    found = all_paths()
    if args.json:
        _print_json(found)
    else:
        width = max(map(len, found))
        sys.stdout.write("".join(f"{k:<{width}}  {v}\n" for k, v in found.items()))
    return 0


def cmd_pull(args) -> int:
    if parse_hub_ref(args.name) is not None:
        sys.stdout.write(f"{models.pull_ref(args.name)}\n")
        return 0
    for role, path in models.pull_pair(args.name):  # an unknown name fails with the closest pair names
        sys.stdout.write(f"{role}: {path}\n")
    return 0


def cmd_rm(args) -> int:
    spec = models.get_pair(args.pair)
    removed = models.remove_pair(spec.name)
    if not removed:
        sys.stdout.write(f"nothing to remove for {spec.name}: no downloaded or assembled files\n")
    for path, size in removed:
        sys.stdout.write(f"removed {path} ({models.human_size(size)})\n")
    if removed and any(source.bundle for source in (spec.target, spec.draft) if source):
        sys.stdout.write("the bundle's wheels stay installed (pip uninstall them to free that space too)\n")
    return 0


def format_check(result) -> str:
    from ..models import archs

    t, d = result.target, result.draft
    lines = [f"target {t.ref}: {t.architecture} {t.name or ''} ({t.file_type or '?'}), {t.vocab_type} vocab of "
             f"{t.n_tokens} tokens, bos {t.bos}, eos {t.eos}; header {t.header_bytes} bytes"]
    if d is not None:
        lines.append(f"draft  {d.ref}: {d.architecture} {d.name or ''} ({d.file_type or '?'}), {d.vocab_type} vocab "
                     f"of {d.n_tokens} tokens, bos {d.bos}, eos {d.eos}; header {d.header_bytes} bytes")
        lines.append("compatible: the draft can speculate for the target" if result.compatible
                     else f"not compatible: {result.mismatch}")
    lines += [f"{side} rollback: {how} (docs/RECURRENT.md)" for side, s, how in
              (("target", t, archs.describe(t.rollback)), ("draft", d, archs.DRAFT_ROLLBACK))
              if s is not None and s.rollback != archs.PARTIAL]
    if t.draft_head == "nextn":
        lines.append(f"target draft head: {t.nextn_layers} NextN (MTP) block(s) in the file: they draft by default "
                     "(`--drafter auto`, as llama-server's --spec-type draft-mtp); `--drafter mtp` uses them alone")
    if result.suggested_drafts and not result.compatible:
        lines.append("drafts known for this target in models.yaml:")
        lines += [f"  {s['draft']}  (pair {s['pair']})" for s in result.suggested_drafts]
    return "\n".join(lines)


def cmd_check(args) -> int:
    from ..models.check import check_pair_files

    result = check_pair_files(args.target, args.draft)
    if args.json:
        _print_json(result.to_dict())
    else:
        sys.stdout.write(format_check(result) + "\n")
    return 1 if result.compatible is False else 0


def cmd_doctor(args) -> int:
    from .. import doctor

    report = doctor.collect()
    if args.load:
        report["loaded"] = doctor.placement(model_choice(args))
    if args.json:
        _print_json(report)
    else:
        sys.stdout.write(doctor.format_report(report) + "\n")
    return 0
