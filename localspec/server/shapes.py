"""Response JSON in llama-server's shapes (so clients work unmodified), from the engine's `Stats`.

Every response that generated text carries llama.cpp's `timings` (with `draft_n` and
`draft_n_accepted` when drafting ran) and localspec's own figures under `localspec`.
"""

from __future__ import annotations

import time
import uuid

STOP_TYPE = {"eos": "eos", "stop": "word"}  # anything else -> "limit"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def timings(st) -> dict:
    """llama-server's `timings`, by its definitions: the prompt's pass, whose last row gives the first
    token, is `prompt_n` tokens in `prompt_ms` (the engine evaluates the prompt's last token in it too);
    `predicted_ms` runs from there to the last token, and `predicted_per_second` is the tokens after the
    first (end of text included, as llama-server counts it) over that time."""
    prompt_s, gen_s, prompt_n = st.prompt_eval_s, st.generation_s, st.prompt_eval_tokens
    steps = st.decode_steps
    t = {
        "cache_n": max(0, st.prompt_tokens - prompt_n),
        "prompt_n": prompt_n,
        "prompt_ms": prompt_s * 1e3,
        "prompt_per_token_ms": prompt_s * 1e3 / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / prompt_s if prompt_s > 0 else 0.0,
        "predicted_n": st.tokens,
        "predicted_ms": gen_s * 1e3,
        "predicted_per_token_ms": gen_s * 1e3 / steps if steps else 0.0,
        "predicted_per_second": steps / gen_s if gen_s > 0 else 0.0,
    }
    if st.drafted:
        t["draft_n"] = st.drafted
        t["draft_n_accepted"] = st.accepted
    return t


def localspec_stats(st) -> dict:
    return {
        "spec": st.spec_mode,
        "drafters": sorted(st.drafted_by_drafter),
        "acceptance_rate": round(st.acceptance_rate, 4),
        "mean_accepted_length": round(st.mean_accepted_length, 4),
        "target_passes": st.target_passes,
        "rounds_plain": st.rounds_plain,
        "drafted_by_drafter": st.drafted_by_drafter,
        "accepted_by_drafter": st.accepted_by_drafter,
        "tokens_by_source": st.tokens_by_source,
        "stop_reason": st.stop_reason,
        "policy": st.policy,
        "speedup_estimate": st.speedup_estimate,
        "stats": st.to_dict(),  # every figure (what `localspec run --json` prints), for clients that want it
    }


def live_fields(live) -> dict:
    """llama-server's `timings_per_token`: a streamed piece's figures so far; localspec adds which model
    the piece's last token came from ("target", or "model"/"ngram" for an accepted draft)."""
    source, st = live
    return {"timings": timings(st), "localspec": {"source": source or "target", "stats": st.to_dict()}}


def usage(st) -> dict:
    return {"completion_tokens": st.tokens, "prompt_tokens": st.prompt_tokens,
            "total_tokens": st.tokens + st.prompt_tokens,
            "prompt_tokens_details": {"cached_tokens": st.prompt_tokens - st.prompt_eval_tokens},
            "completion_tokens_details": {"reasoning_tokens": 0,  # predicted outputs, as OpenAI counts them
                                          "accepted_prediction_tokens": st.prediction_accepted,
                                          "rejected_prediction_tokens": st.prediction_rejected}}


def native_final(content: str, st, model: str, cfg, stopping_word: str = "") -> dict:
    """/completion and /infill (non-streamed, or the last streamed event with content "")."""
    return {
        "index": 0, "content": content, "tokens": [], "id_slot": 0, "stop": True, "model": model,
        "tokens_predicted": st.tokens, "tokens_evaluated": st.prompt_tokens,
        "generation_settings": generation_settings(cfg), "prompt": "",
        "has_new_line": "\n" in content, "truncated": st.stop_reason == "context",
        "stop_type": STOP_TYPE.get(st.stop_reason, "limit"), "stopping_word": stopping_word,
        "tokens_cached": st.prompt_tokens + st.tokens, "timings": timings(st), "localspec": localspec_stats(st),
    }


def native_partial(text: str, n_decoded: int, prompt_len: int) -> dict:
    return {"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": 0,
            "tokens_predicted": n_decoded, "tokens_evaluated": prompt_len}


def generation_settings(cfg) -> dict:
    return {"n_predict": cfg.max_tokens, "temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p,
            "min_p": cfg.min_p, "seed": -1 if cfg.seed is None else cfg.seed, "stop": list(cfg.stop),
            "speculative.n_max": cfg.draft_max, "speculative.n_min": cfg.draft_min, "speculative.p_min": cfg.p_min,
            "spec": cfg.spec, "drafter": cfg.drafter}


def _oai_head(obj_id: str, model: str, kind: str) -> dict:
    return {"id": obj_id, "object": kind, "created": int(time.time()), "model": model,
            "system_fingerprint": "localspec"}


def oai_completion(obj_id: str, model: str, text: str | None, st=None, finish: str | None = None) -> dict:
    """/v1/completions: the whole answer (st given) or one streamed piece."""
    out = _oai_head(obj_id, model, "text_completion")
    out["choices"] = [{"text": text or "", "index": 0, "logprobs": None, "finish_reason": finish}]
    if st is not None:
        out["usage"] = usage(st)
        out["timings"] = timings(st)
        out["localspec"] = localspec_stats(st)
    return out


def oai_chat(obj_id: str, model: str, text: str, st, tool_calls: list, finish: str) -> dict:
    out = _oai_head(obj_id, model, "chat.completion")
    message = {"role": "assistant", "content": text or (None if tool_calls else text)}
    if tool_calls:
        message["tool_calls"] = tool_calls
    out["choices"] = [{"index": 0, "finish_reason": finish, "message": message}]
    out.update(usage=usage(st), timings=timings(st), localspec=localspec_stats(st))
    return out


def oai_chat_chunk(obj_id: str, model: str, delta: dict, finish: str | None = None) -> dict:
    out = _oai_head(obj_id, model, "chat.completion.chunk")
    out["choices"] = [{"index": 0, "finish_reason": finish, "delta": delta}]
    return out


def usage_chunk(obj_id: str, model: str, kind: str, st) -> dict:
    """The extra last event of stream_options.include_usage: empty choices, the usage."""
    out = _oai_head(obj_id, model, kind)
    out.update(choices=[], usage=usage(st))
    return out
