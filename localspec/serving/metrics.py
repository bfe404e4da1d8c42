"""Counters for `GET /metrics`, in Prometheus text with llama-server's metric names, plus localspec's
own (drafted and accepted tokens by drafter, target passes)."""

from __future__ import annotations

import threading


class Metrics:
    def __init__(self, jobs=None):
        """jobs: the server's `JobQueue`, whose waiting and running jobs are the two request gauges."""
        self.lock = threading.Lock()
        self.jobs = jobs
        self.requests = 0
        self.prompt_tokens = 0  # evaluated (not served from the cache)
        self.prompt_cached = 0
        self.prompt_s = 0.0
        self.predicted = 0
        self.predicted_s = 0.0
        self.decode_calls = 0
        self.drafted = 0
        self.accepted = 0
        self.draft_rounds = 0
        self.by_drafter: dict[str, list[int]] = {}  # drafter -> [drafted, accepted]
        self.n_tokens_max = 0

    def add(self, st) -> None:
        with self.lock:
            self.requests += 1
            self.prompt_tokens += st.prompt_eval_tokens
            self.prompt_cached += st.prompt_tokens - st.prompt_eval_tokens
            self.prompt_s += st.prompt_eval_s
            self.predicted += st.tokens
            self.predicted_s += st.generation_s
            self.decode_calls += st.target_passes
            self.drafted += st.drafted
            self.accepted += st.accepted
            self.draft_rounds += st.draft_rounds
            for d, n in st.drafted_by_drafter.items():
                row = self.by_drafter.setdefault(d, [0, 0])
                row[0] += n
                row[1] += st.accepted_by_drafter.get(d, 0)
            self.n_tokens_max = max(self.n_tokens_max, st.prompt_tokens + st.tokens)

    def prometheus(self, swapped: int = 0) -> str:
        """swapped: sequences moved out of a full cache to wait for cells (caches/swap.py), since the start."""
        return prometheus_text([("", self.samples(swapped))])

    def samples(self, swapped: int = 0, measurement: dict | None = None,
                saved_bytes: int = 0) -> list[tuple[str, str, str, str, float]]:
        """(name, kind, help, labels, value) rows; labels as Prometheus writes them inside braces. measurement:
        where this machine's first measurements stand (costs/idle.py, `Measurement.to_dict`); saved_bytes: the
        saved prompts held in memory (bounded by --cache-ram)."""
        processing, deferred = (len(self.jobs.running), self.jobs.qsize()) if self.jobs else (0, 0)
        with self.lock:
            rows = [
                ("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.", self.prompt_tokens),
                ("llamacpp:prompt_seconds_total", "counter", "Prompt process time", round(self.prompt_s, 6)),
                ("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.", self.predicted),
                ("llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time", round(self.predicted_s, 6)),
                ("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls of the target", self.decode_calls),
                ("llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
                 round(self.prompt_tokens / self.prompt_s, 3) if self.prompt_s else 0),
                ("llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
                 round(self.predicted / self.predicted_s, 3) if self.predicted_s else 0),
                ("llamacpp:requests_processing", "gauge", "Number of requests processing.", processing),
                ("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", deferred),
                ("llamacpp:n_tokens_max", "counter", "Largest observed n_tokens.", self.n_tokens_max),
                ("llamacpp:spec_decode_num_draft_tokens_total", "counter", "Total draft tokens generated.", self.drafted),
                ("llamacpp:spec_decode_num_accepted_tokens_total", "counter", "Total draft tokens accepted.", self.accepted),
                ("llamacpp:spec_decode_num_drafts_total", "counter", "Total speculative verification steps.",
                 self.draft_rounds),
                ("localspec:requests_total", "counter", "Generation requests served.", self.requests),
                ("localspec:prompt_tokens_cached_total", "counter", "Prompt tokens reused from the cache.",
                 self.prompt_cached),
                ("localspec:sequences_swapped_total", "counter", "Sequences that waited for cells out of a full cache.",
                 swapped),
                ("localspec:prompt_cache_bytes", "gauge", "Saved prompts held in memory (at most --cache-ram).",
                 saved_bytes),
            ]
            out = [(name, kind, help_, "", value) for name, kind, help_, value in rows]
            if measurement is not None:
                out += [("localspec:measurement", "gauge", "This machine's first measurements: 1 for the state "
                         "they are in (pending, measuring, waiting after giving way to another program, done).",
                         f'state="{state}"', int(measurement["state"] == state))
                        for state in ("pending", "measuring", "waiting", "done")]
                out.append(("localspec:measurement_seconds_total", "counter", "Seconds spent measuring while idle.",
                            "", measurement["measured_s"]))
            for metric, col, help_ in (("localspec:draft_tokens_total", 0, "Draft tokens proposed, by drafter."),
                                       ("localspec:draft_tokens_accepted_total", 1, "Draft tokens accepted, by drafter.")):
                out += [(metric, "counter", help_, f'drafter="{d}"', v[col]) for d, v in sorted(self.by_drafter.items())]
                if not self.by_drafter:
                    out.append((metric, "counter", help_, None, 0))  # HELP and TYPE with no sample yet
        return out


def prometheus_text(groups: list[tuple[str, list]]) -> str:
    """Prometheus's text format for several sources' samples: (extra label such as 'model="x"', samples);
    each metric's HELP and TYPE once, then its samples from every source."""
    order, by_name = [], {}
    for extra, samples in groups:
        for name, kind, help_, labels, value in samples:
            if name not in by_name:
                order.append(name)
                by_name[name] = ([f"# HELP {name} {help_}", f"# TYPE {name} {kind}"], [])
            if labels is None:
                continue
            both = ",".join(x for x in (extra, labels) if x)
            by_name[name][1].append(f"{name}{{{both}}} {value}" if both else f"{name} {value}")
    lines = []
    for name in order:
        head, rows = by_name[name]
        lines += head + rows
    return "\n".join(lines) + "\n"
