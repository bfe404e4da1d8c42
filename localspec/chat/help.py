"""The keys and slash commands, for the start-up banner, /help and `localspec chat --help`
(no Textual import here, so the CLI can show them cheaply)."""

KEYS = [
    "Enter send · ctrl+j newline · ↑/↓ earlier prompts · Esc cancel the reply · ctrl+q quit",
    "ctrl+t provenance colours (green: accepted drafts, amber: the target's) · ctrl+y copy reply",
]

COMMANDS = [
    ("/k N", "most tokens drafted per round (0 = no drafting)"),
    ("/temp T", "sampling temperature (0 = greedy)"),
    ("/system TEXT", "set the system prompt (/system shows it, /system - removes it)"),
    ("/spec on|off|auto", "speculate always, never, or when the measured costs say it pays"),
    ("/clear", "clear the screen (the model still remembers; /new forgets)"),
    ("/new", "start a new conversation"),
    ("/history [ID]", "list saved conversations, or open one"),
    ("/stats", "figures of the last reply"),
    ("/copy", "copy the last reply (OSC 52) and save it to a file"),
    ("/help", "this list"),
]


def help_text() -> str:
    width = max(len(c) for c, _ in COMMANDS)
    lines = ["Keys:", *("  " + k for k in KEYS), "Commands:"]
    lines += [f"  {c.ljust(width)}  {d}" for c, d in COMMANDS]
    return "\n".join(lines)
