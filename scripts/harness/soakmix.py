"""What scripts/soak's clients send: each client a kind of user (an agent, an editor, the chat page, a script,
one who hangs up), its requests drawn from a seeded generator over realistic prompts and answer lengths, and
the model each names (the real pair most often, the tiny hybrid and the tiny NextN model the rest)."""

from __future__ import annotations

import random

from .soakclients import Request

PAIR, HYBRID, HEAD = "qwen2.5-coder-1.5b", "soak-hybrid", "soak-head"
CHATS = [  # (prompt, max tokens): tens to hundreds of tokens
    ("Write a Python function that parses one CSV line with quoted fields, with a docstring.", 160),
    ("Explain the difference between a process and a thread in three sentences.", 96),
    ("Write a shell one-liner that counts the lines of every .py file under a folder.", 48),
    ("What does HTTP status 429 mean, and how should a client react to it?", 80),
    ("Write a haiku about caches.", 32),
    ("Rewrite this with a dict instead of if/elif:\n\ndef colour(c):\n    if c == 'r':\n        return 'red'\n"
     "    elif c == 'g':\n        return 'green'\n    elif c == 'b':\n        return 'blue'\n    return 'unknown'", 120),
    ("Give three tips for naming variables well.", 128),
    ("Write a Python class for a stack with push, pop and peek.", 200),
]
COMPLETIONS = [("def fibonacci(n):\n", 64), ("import json\n\n\ndef load_config(path):\n", 96),
               ("# A small HTTP client\nimport urllib.request\n\n", 128), ("The three laws of thermodynamics are", 48)]
EDITED_FILE = ("import os\nimport sys\n\n\ndef list_python_files(root):\n    found = []\n    for dirpath, _, names in "
               "os.walk(root):\n        for name in names:\n            if name.endswith('.py'):\n                "
               "found.append(os.path.join(dirpath, name))\n    return found\n\n\ndef count_lines(path):\n")
AGENT_SYSTEM = " ".join(  # over 1024 tokens: saved to disk (serving/caches/promptdisk.py), kept across restarts
    f"Rule {i}: when the user asks for a change to file number {i}, read the file first, keep its style, "
    f"change only what was asked, and say in one line what changed and why." for i in range(1, 50))
KINDS = ("openai-chat", "agent", "editor", "page", "openai-completions", "responses", "ollama-chat", "hangup",
         "ollama-generate", "completion")
EXACT_SHARE = 0.3  # of the pair's requests: `"exact": true`, whose greedy text must equal a quiet server's
SHARED = ("openai-chat", "openai-completions", "anthropic", "responses", "completion", "infill")  # llama-server's too


class Mix:
    """One client's requests: kind `KINDS[i % len]`, then the next kind after every `per_kind` requests."""

    def __init__(self, index: int, seed: int, per_kind: int = 4):
        self.index, self.rng, self.per_kind, self.n = index, random.Random(seed * 1000 + index), per_kind, 0
        self.typed = 40 + 7 * index  # the editor's cursor in EDITED_FILE

    @property
    def kind(self) -> str:
        return KINDS[(self.index + self.n // self.per_kind) % len(KINDS)]

    def model(self) -> str:
        r = self.rng.random()
        return PAIR if r < 0.5 else HYBRID if r < 0.75 else HEAD

    def next(self) -> tuple[str, Request | tuple[str, str, int]]:
        """(kind, a Request), or ("page", (model, prompt, max tokens)) for the page's turn."""
        kind, rng = self.kind, self.rng
        self.n += 1
        prompt, n = rng.choice(CHATS)
        messages = [{"role": "user", "content": prompt}]
        if kind == "page":
            return kind, (self.model(), prompt, n)
        if kind == "agent":  # Claude Code's shape: a long system prompt, then the task; always the pair
            return kind, Request("anthropic", PAIR, {"system": AGENT_SYSTEM, "messages": messages, "max": n,
                                                     **({"exact": True} if rng.random() < EXACT_SHARE else {})})
        if kind == "editor":  # llama.vim: the file up to the cursor, the rest after it, the cursor moving on
            self.typed = 40 + (self.typed + rng.randint(3, 20) - 40) % (len(EDITED_FILE) - 40)
            cut = self.typed
            return kind, Request("infill", PAIR, {"input_prefix": EDITED_FILE[:cut], "input_suffix": EDITED_FILE[cut:],
                                                  "max": 24}, exempt="an editor's completion")
        if kind == "hangup":
            proto = rng.choice(["openai-chat", "ollama-chat"])
            return kind, Request(proto, self.model(), {"messages": messages, "max": 200}, hangup_after=3, greedy=False)
        stream = rng.random() < 0.7
        req = self._plain(kind, rng, prompt, messages, n, stream)
        if req.model == PAIR and rng.random() < EXACT_SHARE:
            req.body["exact"] = True
        return kind, req

    def _plain(self, kind, rng, prompt, messages, n, stream) -> Request:
        if kind in ("openai-completions", "ollama-generate", "completion"):
            text, n = rng.choice(COMPLETIONS)
            return Request(kind, self.model(), {"prompt": text, "max": n}, stream=stream)
        if kind == "responses":
            return Request(kind, self.model(), {"input": prompt, "max": n}, stream=stream)
        return Request(kind, self.model(), {"messages": messages, "max": n}, stream=stream)
