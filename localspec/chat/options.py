"""What `localspec chat` was asked for: a plain dataclass, whoever builds it (the CLI, a test)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..session import GenChoice, ModelChoice


@dataclass
class ChatOptions:
    models: ModelChoice = field(default_factory=ModelChoice)
    gen: GenChoice = field(default_factory=GenChoice)
    resume: bool = False  # continue the last saved conversation
    local: bool = False  # load the pair here even when a running `localspec serve` holds it
