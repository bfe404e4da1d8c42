"""The editors' limits on a streamed answer."""

from __future__ import annotations

from localspec.serving import limits


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t



def test_line_limits_on_a_fake_clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(limits.time, "perf_counter", clock)
    lim = limits.LineLimits(n_indent=4)
    assert lim.push("x = 1\n") == ("x = 1\n", False)  # the first line is never checked
    assert lim.push("    y") == ("    y", False)
    assert lim.push(" = 2\n  ") == (" = 2\n", False)  # indentation is held until the line shows itself
    assert lim.push("  z\n") == ("    z\n", False)  # four spaces: kept
    assert lim.push("\n") == ("\n", False)  # a blank line is fine
    assert lim.push("  bad") == ("", True)  # dedented: cut, stop
    timed = limits.LineLimits(t_max_predict_ms=100)
    assert timed.push("a") == ("a", False)  # the clock starts at the first token
    clock.t = 0.05
    assert timed.push("b\n") == ("b\n", False)
    clock.t = 0.2
    assert timed.push("c") == ("c", False)  # past the limit, but no new line yet
    assert timed.push("d\ne") == ("d\ne", True)  # stops at the next new line
