"""Token pieces to text: UTF-8 kept whole, stop strings held back."""

from __future__ import annotations

from localspec.text import TextStream


def test_text_stream_never_splits_utf8_and_never_passes_a_stop_string():
    s = TextStream(stop=["END"])
    snow = "é☃".encode()
    out = [s.push(snow[:1]), s.push(snow[1:3]), s.push(snow[3:]), s.push(b" E"), s.push(b"N"), s.push(b"Dmore")]
    assert out[0] == "" and "".join(out) == "é☃ "
    assert s.stopped and s.push(b"x") == "" and s.flush() == ""
    s = TextStream(stop=["END"])
    assert s.push(b"EN") == "" and s.flush() == "EN"  # a held-back prefix is released at the end
