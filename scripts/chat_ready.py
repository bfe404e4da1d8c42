"""One chat start-up timed in Textual's headless mode (scripts/chat-ready runs it twice on one data root):
python scripts/chat_ready.py first|later [PAIR | --target T --draft D]."""
import asyncio
import sys
import time

from localspec.chat.app import ChatApp
from localspec.commands.chat import parse_chat_args


async def main():
    t0 = time.perf_counter()
    app = ChatApp(parse_chat_args([*sys.argv[2:], "--temperature", "0", "-n", "32"]))
    async with app.run_test(size=(100, 30)) as pilot:
        while app.loading:
            await pilot.pause(0.02)
        ready = time.perf_counter() - t0
        if app.engine is None:
            sys.exit(f"load failed: {app.load_error}")
        app.query_one("#prompt").load_text("Write a haiku about caches")
        await pilot.press("enter")
        while app.replies < 1:
            await pilot.pause(0.02)
        if app.last_stats is None:
            sys.exit("the first reply failed: " + " | ".join(str(n.content) for n in app.query(".notice"))[-400:])
        print(f"{sys.argv[1]} run: ready after {ready:.1f} s, first reply done after {time.perf_counter() - t0:.1f} s "
              f"(its tokens: {app.last_stats.tokens}, spec {app.last_stats.spec_mode})")
asyncio.run(main())
