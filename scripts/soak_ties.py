"""Were scripts/soak's greedy partings near-ties? For each answer given under load that parted from the same
request's answer on a quiet server, the model reads the request and the quiet answer here one token per pass
(single-token decodes), and at the token where the answer under load took another, reads the top-1/top-2
logit margin; a parting is a near-tie when that margin is within twice the batched-vs-single logit noise
measured on the same prompt (`localspec verify`'s rule, docs/EXACT.md). Prints one row per parting and a
count per server; exits 1 if any is not a near-tie.

  scripts/soak-ties OUT/soak.json [WORK]      # every parting (scripts/soak checks its --ties first ones of each server)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from localspec.chat_format import Message
from localspec.decoding.sampling import top2_margin
from localspec.session import ModelChoice, load_config, open_engine, select_models
from localspec.verify import logit_noise

RAW = ("openai-completions", "completion")


def messages_of(protocol: str, body: dict) -> list[Message] | str:
    if protocol in RAW:
        return body["prompt"]
    if protocol == "anthropic":
        return [Message("system", body["system"]), *(Message(m["role"], m["content"]) for m in body["messages"])]
    if protocol in ("responses", "ollama-generate"):
        return [Message("user", body.get("input") or body.get("prompt"))]
    return [Message(m["role"], m["content"]) for m in body["messages"]]


def choice_for(model: str, work: Path) -> ModelChoice:
    from harness.soakmix import HEAD, HYBRID

    files = {HYBRID: "hybrid.gguf", HEAD: "head.gguf"}
    return ModelChoice(target=str(work / "models" / files[model])) if model in files else ModelChoice(pair=model)


def check(engine, protocol: str, body: dict, quiet: str, at: int) -> dict:
    """The top-1/top-2 margin, decoding one token per pass along the quiet answer's tokens, at the token
    that writes character `at` (where the answer under load took the other token)."""
    prompt = engine.prompt_tokens(messages_of(protocol, body), raw=protocol in RAW)
    answer = engine.target_model.tokenize(quiet, add_special=False)
    # over the answer's last tokens: a short raw prompt's last few rows can happen to come out bit-identical
    noise = logit_noise(engine, prompt + answer)
    bound = max(2.0 * noise, 1e-4)
    tgt, seq, text = engine.target, list(prompt), b""
    tgt.sync(prompt[:-1])
    for i, tok in enumerate(answer):
        logits = tgt.eval([seq[-1]], logits="all")[0]
        text += engine.target_model.piece(tok)
        if len(text.decode("utf-8", "replace")) > at:
            margin = top2_margin(logits)
            return {"token": i, "margin": round(margin, 4), "bound": round(bound, 4), "near_tie": margin <= bound}
        seq.append(tok)
    return {"token": None, "margin": None, "bound": round(bound, 4), "near_tie": False}




def check_partings(doc: dict, work: Path | None = None, most: int = 8) -> list[dict]:
    """One row per parting in a soak's figures (`doc["greedy"]`), the first `most` distinct ones of each
    server: where, the margin there, near-tie or not."""
    work = work or Path(doc["work"])
    rows, engines, seen = [], {}, {}
    for server, g in doc["greedy"].items():
        distinct = list({(p["key"], p["quiet"], p["at"]): p for p in g["parted_texts"]}.values())
        for p in distinct[:most]:
            protocol, model, body = json.loads(p["key"])
            same = (p["key"], p["quiet"], p["at"])  # the same parting again: measured once
            if same in seen:
                rows.append({**seen[same], "server": server, "plain": p["exact"]})
                continue
            if model not in engines:
                choice = choice_for(model, work)
                sel = select_models(choice)
                engines[model] = open_engine(sel, load_config(choice, sel))
            proto = "openai-chat" if protocol == "page" else protocol
            rows.append({"server": server, "protocol": protocol, "model": model, "plain": p["exact"],
                         "at": p["at"], **check(engines[model], proto, body, p["quiet"], p["at"])})
            seen[same] = rows[-1]
    for e in engines.values():
        e.close()
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| server | protocol | model | plain (`exact`) | parts at character | token | margin there | near-tie "
             "bound | near-tie |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['server']} | {r['protocol']} | {r['model']} | {'yes' if r['plain'] else 'no'} | {r['at']} | "
                     f"{r['token']} | {r['margin']} | {r['bound']} | {'yes' if r['near_tie'] else 'NO'} |")
    return "\n".join(lines)


def main() -> int:
    doc = json.loads(Path(sys.argv[1]).read_text())
    rows = check_partings(doc, Path(sys.argv[2]) if len(sys.argv) > 2 else None, most=10**6)
    print(table(rows))
    for server in doc["greedy"]:
        mine = [r for r in rows if r["server"] == server]
        print(f"\n{server}: {len(mine)} partings, {sum(r['near_tie'] for r in mine)} near-ties")
    return 0 if all(r["near_tie"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
