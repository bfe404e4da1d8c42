"""Measuring once nobody waits (costs/idle.py): on a quiet machine only, giving way within a pass, backing off."""

from __future__ import annotations


def test_pass_costs_measured_on_a_busy_machine_are_not_kept(tiny, monkeypatch):
    """auto's first profile is measured after an answer, never before, and kept only when no other program
    used the cores meanwhile: a busy machine's figures are not this machine's; it then backs off."""
    from localspec import paths
    from localspec.config import LoadConfig
    from localspec.costs import idle, tuning
    from localspec.engine import Engine

    monkeypatch.setattr(tuning, "noisy_sizes", lambda samples: [])  # the tiny model's passes take microseconds

    e = Engine(tiny.target, None, LoadConfig(n_threads=2, n_threads_batch=2))
    try:
        assert idle.measure_when_idle(e, lambda: True, request=lambda: False) and e.profile is None
        m = idle.state_of(e)
        assert m.state == "waiting" and m.why == "another program used the cores" and m.backoff.gave_way == 1
        assert not list(paths.profiles_dir().glob("*.json"))
        assert m.to_dict()["retry_in_s"] > 10  # backing off
        m.backoff.not_before = 0.0
        assert idle.measure_when_idle(e, lambda: False, request=lambda: False)
        assert e.profile.extra.get("quick") and list(paths.profiles_dir().glob("*.json"))
        assert m.state == "done" and m.backoff.gave_way == 0 and not idle.due(e)
    finally:
        e.close()


def test_a_measurement_gives_way_to_a_request_within_a_pass_and_keeps_its_rounds(tiny, monkeypatch):
    from localspec.config import LoadConfig
    from localspec.costs import idle, tuning
    from localspec.engine import Engine

    monkeypatch.setattr(tuning, "noisy_sizes", lambda samples: [])  # the tiny model's passes take microseconds
    e = Engine(tiny.target, None, LoadConfig(n_threads=1, n_threads_batch=1))
    try:
        conversation = e.prompt_tokens("hello world")
        e.target.eval(conversation, logits="none")
        calls, real = [], e.target.eval
        e.target.eval = lambda tokens, logits="last", **kw: calls.append(len(tokens)) or real(tokens, logits, **kw)
        # a request comes during the second round (a round: the depth's fill, 4 sizes, 4 single tokens)
        assert idle.measure_when_idle(e, lambda: False, request=lambda: len(calls) >= 12)
        m = idle.state_of(e)
        assert e.profile is None and m.state == "pending" and m.why == "gave way to a request"
        assert len(calls) == 12 and m.rounds.done == 1  # within a pass; the first round kept
        assert e.target.tokens == conversation  # the conversation's cache put back
        calls.clear()
        assert idle.measure_when_idle(e, lambda: False, request=lambda: False) and e.profile is not None
        assert 2 * 8 <= len(calls) <= 2 * 9  # the two rounds left (8 passes each; the depth filled again)
    finally:
        e.close()


def test_a_measurement_gives_way_to_another_program_and_backs_off_longer_each_time(tiny, monkeypatch):
    from localspec.config import LoadConfig
    from localspec.costs import idle
    from localspec.engine import Engine

    e = Engine(tiny.target, None, LoadConfig(n_threads=1, n_threads_batch=1))
    try:
        looks = []
        appears = lambda: looks.append(1) or len(looks) > 5  # noqa: E731  (another process starts mid-way)
        assert idle.measure_when_idle(e, appears, request=lambda: False) and e.profile is None
        m = idle.state_of(e)
        first_wait = m.backoff.wait_s()
        assert m.state == "waiting" and m.backoff.gave_way == 1 and idle.BACKOFF_S[0] - 1 < first_wait <= idle.BACKOFF_S[0]
        assert idle.measure_when_idle(e, lambda: False, request=lambda: False) and m.backoff.gave_way == 1  # not yet
        m.backoff.not_before = 0.0
        looks.clear()
        idle.measure_when_idle(e, appears, request=lambda: False)
        assert m.backoff.gave_way == 2 and m.backoff.wait_s() > first_wait  # longer each time
        assert idle.word(e) == "measure later"
    finally:
        e.close()
