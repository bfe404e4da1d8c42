"""localspec verify's comparison of two builds."""

from __future__ import annotations

import pytest


def _verify_report(plain, spec, margins, noise=0.01):
    return {"noise": noise, "max_tokens": 8, "verdict": "OK",
            "prompts": [{"prompt": [1, 2], "plain": plain, "spec": spec, "margins": margins}]}


def test_compare_builds_judges_partings_by_both_builds_margins():
    from localspec.verify import compare_builds, first_parting

    assert first_parting([1, 2, 3], [1, 2, 3]) is None
    assert first_parting([1, 2, 3], [1, 5, 3]) == 1
    assert first_parting([1, 2], [1, 2, 3]) == 2  # one ended (EOS) where the other went on
    here = _verify_report([5, 6, 7, 8], [5, 6, 7, 8], [3.0, 0.02, 2.0, 1.0])
    # the other build picks 9 at token 1, where both saw the top two within 0.03: a near-tie
    near = _verify_report([5, 9, 7, 8], [5, 9, 7, 8], [3.02, 0.01, 2.0, 1.0])
    c = compare_builds(here, near)
    assert c["verdict"] == "OK" and c["prompts"][0]["plain"] == {
        "parted_at": 1, "margins": [0.02, 0.01], "tokens": [4, 4], "near_tie": True}
    assert c["cross_noise"] == pytest.approx(0.01)  # |3.0 - 3.02| / 2, before the parting only
    # a confident token (margin 2.0 here) chosen differently there is a real difference
    far = _verify_report([5, 6, 9, 8], [5, 6, 9, 8], [3.0, 0.02, 0.01, 1.0])
    c = compare_builds(here, far)
    assert c["verdict"] == "MISMATCH" and c["prompts"][0]["spec"]["near_tie"] is False
    # both speculative runs left their own plain runs earlier (judged by each build's own verdict)
    a = _verify_report([5, 6, 7, 8], [5, 4, 4, 8], [3.0, 0.0, 2.0, 1.0])
    b = _verify_report([5, 6, 7, 8], [5, 4, 3, 8], [3.0, 0.0, 2.0, 1.0])
    row = compare_builds(a, b)["prompts"][0]
    assert row["plain"]["parted_at"] is None and row["spec"] == {
        "parted_at": 2, "margins": [None, None], "tokens": [4, 4], "near_tie": None}
    with pytest.raises(ValueError, match="same prompts"):
        compare_builds(here, {**near, "prompts": [{**near["prompts"][0], "prompt": [3]}]})
    with pytest.raises(ValueError, match="same -n"):
        compare_builds(here, {**near, "max_tokens": 9})
