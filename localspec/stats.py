"""Counters and timings of one generation: plain data, returned by the engine, printed elsewhere."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Stats:
    prompt_tokens: int = 0  # tokens in the formatted prompt
    prompt_eval_tokens: int = 0  # of those, how many had to be evaluated (the rest came from the cache)
    tokens: int = 0  # confirmed tokens emitted
    # rounds, each one target pass; the first round's is the prompt's own pass when it drafted nothing (that
    # pass's last row gives the first token, as in llama-server)
    target_passes: int = 0
    rounds_plain: int = 0  # rounds that drafted nothing (plain decoding steps)
    full_rounds: int = 0  # rounds whose every drafted token was accepted (the bonus token came too)
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens the target confirmed
    drafted_by_position: list[int] = field(default_factory=list)  # [i] = rounds that drafted a token at position i
    accepted_by_position: list[int] = field(default_factory=list)  # [i] = rounds whose draft token i was accepted
    drafted_by_drafter: dict[str, int] = field(default_factory=dict)
    accepted_by_drafter: dict[str, int] = field(default_factory=dict)
    tokens_by_source: dict[str, int] = field(default_factory=dict)  # emitted tokens: "target" | "model" | "ngram"
    prompt_eval_s: float = 0.0  # prefill of target (and draft) caches
    draft_s: float = 0.0  # time spent proposing drafts (draft model decodes, n-gram lookups)
    verify_s: float = 0.0  # time in the target's verification passes
    generation_s: float = 0.0  # wall time from the first round to the end
    first_token_s: float = 0.0  # of that, until the first token was confirmed (0: none was)
    decode_s: float = 0.0  # time inside llama_decode (target + draft), generation and prefill
    stop_reason: str = ""  # "eos" | "length" | "stop" | "cancelled" | "context"
    stop_word: str = ""  # the stop string that ended the answer (stop_reason "stop")
    spec_mode: str = ""  # "on" | "off" | "auto"
    policy: str = ""  # how k was chosen (for the record)
    threads: int = 0  # decode threads at the end of the run
    thread_changes: list = field(default_factory=list)  # [[from, to, why], ...] during this run
    prediction_tokens: int = 0  # tokens in the request's predicted output (0: none given)
    prediction_accepted: int = 0  # drafted from the prediction and confirmed (OpenAI's accepted_prediction_tokens)
    cache_restored: bool = False  # the prompt started from a saved prompt (promptcache), not the live cache
    cache_entries: int = 0  # saved prompts held after this one (0 without a prompt cache)
    speedup_estimate: float | None = None  # over plain decoding, these rounds priced by the pass costs (None: unmeasured)

    def add_round(self, source: str, drafted: int, accepted: int, draft_s: float, verify_s: float,
                  origin: str = "") -> None:
        self.target_passes += 1
        if origin == "prediction":
            self.prediction_accepted += accepted
        self.draft_s += draft_s
        self.verify_s += verify_s
        if drafted == 0:
            self.rounds_plain += 1
            return
        self.drafted += drafted
        self.accepted += accepted
        self.full_rounds += accepted == drafted
        self.drafted_by_drafter[source] = self.drafted_by_drafter.get(source, 0) + drafted
        self.accepted_by_drafter[source] = self.accepted_by_drafter.get(source, 0) + accepted
        _grow(self.drafted_by_position, drafted)
        _grow(self.accepted_by_position, drafted)
        for i in range(drafted):
            self.drafted_by_position[i] += 1
        for i in range(accepted):
            self.accepted_by_position[i] += 1

    def add_token(self, source: str) -> None:
        self.tokens += 1
        self.tokens_by_source[source] = self.tokens_by_source.get(source, 0) + 1

    # --- derived figures --------------------------------------------------------------------
    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def draft_rounds(self) -> int:
        return self.target_passes - self.rounds_plain

    @property
    def mean_accepted_length(self) -> float:
        """Draft tokens accepted per round that drafted."""
        return self.accepted / self.draft_rounds if self.draft_rounds else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.generation_s if self.generation_s > 0 else 0.0

    @property
    def decode_steps(self) -> int:
        """Tokens the target produced after the first, end of text included: llama-server's n_gen - 1
        (its first token is free, it comes from the prompt's last batch)."""
        return max(0, self.tokens + (self.stop_reason == "eos") - 1)

    @property
    def prediction_rejected(self) -> int:
        """Prediction tokens that did not become part of the answer (OpenAI's rejected_prediction_tokens)."""
        return max(0, self.prediction_tokens - self.prediction_accepted)

    @property
    def other_s(self) -> float:
        """Generation time outside drafting and verifying: sampling, detokenizing, the loop."""
        return max(0.0, self.generation_s - self.draft_s - self.verify_s)

    @property
    def total_s(self) -> float:
        return self.prompt_eval_s + self.generation_s

    @property
    def overhead_share(self) -> float:
        """Share of wall time spent outside llama_decode (the Python loop's own cost)."""
        return max(0.0, 1.0 - self.decode_s / self.total_s) if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("acceptance_rate", "mean_accepted_length", "tokens_per_pass", "tokens_per_second",
                  "other_s", "total_s", "overhead_share", "draft_rounds", "prediction_rejected"):
            d[k] = getattr(self, k)
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in d.items()}

    def summary_lines(self) -> list[str]:
        """A llama.cpp-style summary for stderr."""
        lines = []
        if self.drafted:
            lines.append(f"draft acceptance rate = {self.acceptance_rate:.2f} "
                         f"({self.accepted} accepted / {self.drafted} generated)")
            by = ", ".join(f"{k} {self.accepted_by_drafter.get(k, 0)}/{v}" for k, v in self.drafted_by_drafter.items())
            lines.append(f"accepted by drafter: {by}; mean accepted length = {self.mean_accepted_length:.2f}")
        lines.append(f"tokens = {self.tokens}, target passes = {self.target_passes} "
                     f"({self.tokens_per_pass:.2f} tokens/pass, {self.rounds_plain} plain rounds), "
                     f"speculation {self.spec_mode}")
        lines.append(f"prompt eval: {self.prompt_eval_tokens} tokens in {self.prompt_eval_s:.2f} s; "
                     f"generation: {self.tokens} tokens in {self.generation_s:.2f} s = {self.tokens_per_second:.2f} tok/s")
        lines.append(f"time split: draft {self.draft_s:.2f} s, verify {self.verify_s:.2f} s, other {self.other_s:.2f} s; "
                     f"outside llama_decode {100 * self.overhead_share:.1f}%")
        for a, b, why in self.thread_changes:
            lines.append(f"threads {a} -> {b}: {why}")
        return lines


def _grow(xs: list[int], n: int) -> None:
    if len(xs) < n:
        xs.extend([0] * (n - len(xs)))
