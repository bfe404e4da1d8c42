"""`/infill`'s request checks (llama-server's, in its order). The FIM prompt is built by `localspec.fim.layout`,
the editors' limits (n_indent, t_max_predict_ms) applied by `serving/limits.py`."""

from __future__ import annotations

from .apierrors import ApiError


def check_infill_body(body: dict) -> list[dict]:
    """llama-server's checks, in its order; returns input_extra as a list."""
    if "prompt" in body and body["prompt"] is not None and not isinstance(body["prompt"], str):
        raise ApiError(400, '"prompt" must be a string')
    for key in ("input_prefix", "input_suffix"):
        if key not in body:
            raise ApiError(400, f'"{key}" is required')
        if not isinstance(body[key], str):
            raise ApiError(400, f'"{key}" must be a string')
    extra = body.get("input_extra")
    if extra is None:
        return []
    if not isinstance(extra, list):
        raise ApiError(400, '"input_extra" must be an array of {"filename": string, "text": string}')
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ApiError(400, 'extra_context chunk must contain a "text" field with a string value')
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise ApiError(400, "extra_context chunk's \"filename\" field must be a string")
    return extra
