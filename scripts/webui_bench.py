"""The chat page against the API it streams from, in real Chromium, side by side on one server.

For each workload the page sends a prompt as a person does (Enter); its request body is captured and
sent again straight to /v1/chat/completions, streamed the way curl streams it; runs alternate page, API.
Figures: Enter (or the request) to the first token on screen (or off the socket), and tokens per second
from the first token to the last. Also the page's first paint and its bytes over the wire, and, with
--shots, screenshots of the page (light and dark) on the real pair for docs/WEBUI.md.

    scripts/webui-bench                      # starts `localspec serve` on the default pair
    scripts/webui-bench --url http://127.0.0.1:8012 --runs 3 --shots docs/webui
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
from harness.browserproc import chromium  # noqa: E402
from harness.serverproc import ServerProcess  # noqa: E402

# Marks when Enter was pressed in the prompt box and each time the reply's shown token count changes.
TRACE = """
window.__trace = { enter: null, marks: [] };
document.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && e.target.id === "prompt") window.__trace.enter = performance.now();
}, true);
document.addEventListener("DOMContentLoaded", () => {
  new MutationObserver((records) => {
    for (const r of records) window.__trace.marks.push([performance.now(), Number(r.target.dataset.tokens)]);
  }).observe(document.getElementById("messages"), { attributes: true, attributeFilter: ["data-tokens"], subtree: true });
});
"""

CHAT = ("Write a thorough tutorial on Python's asyncio for someone who knows threads: the event loop, "
        "coroutines, tasks, gather, timeouts, cancellation, queues, and running blocking code, with a "
        "code example for each.")
EDIT_FILE = ROOT / "localspec" / "text.py"
EDIT = "Rename the class TextStream to TokenText everywhere in this file. Return the whole file and nothing else."


def until(page, expression: str, timeout_s: float = 30) -> None:
    """Polls an expression (wait_for_function would evaluate it with eval, which the page's CSP refuses)."""
    end = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        if time.monotonic() > end:
            raise TimeoutError(expression)
        page.wait_for_timeout(20)


def settle(url: str, quiet_s: float = 3.0) -> None:
    """Both sides start alike: the server's idle work (measuring pass costs on a fresh data root) done,
    and the same quiet gap before each run."""
    u = urlparse(url)
    end = time.monotonic() + 900
    while time.monotonic() < end:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("GET", "/props")
        props = json.loads(conn.getresponse().read())
        conn.close()
        if props.get("localspec", {}).get("profile"):
            break
        time.sleep(5)
    time.sleep(quiet_s)


def page_run(page, url: str, prompt: str, max_tokens: int, attach: Path | None = None) -> dict:
    page.goto(url + "/")
    page.wait_for_selector("#model:not(:empty)")
    page.click("#new-chat")
    page.click("#settings-toggle")
    page.fill("#set-temperature", "0")
    page.fill("#set-max_tokens", str(max_tokens))
    if attach is not None:
        page.set_input_files("#attach", str(attach))
        page.click("#edit-mode summary")
        page.set_input_files("#prediction-file", str(attach))
        until(page, "document.getElementById('prediction').value.length > 0")
    page.fill("#prompt", prompt)
    with page.expect_request("**/v1/chat/completions") as req:
        page.press("#prompt", "Enter")
    body = json.loads(req.value.post_data)
    page.wait_for_selector("article.assistant[data-done]", timeout=600_000)
    trace = page.evaluate("window.__trace")
    marks = trace["marks"]
    (t0, n0), (t1, n1) = marks[0], marks[-1]
    return {"ttft_ms": t0 - trace["enter"], "tok_s": (n1 - n0) / (t1 - t0) * 1000 if t1 > t0 else 0.0,
            "tokens": n1, "body": body, "figures": page.inner_text("article.assistant .figures")}


def api_run(url: str, body: dict) -> dict:
    """The page's request, streamed straight from the server (one piece per token, as the page gets it)."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t_send = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    times, buf = [], b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if event.startswith(b"data: {"):
                piece = json.loads(event[6:])
                if piece["choices"] and piece["choices"][0]["delta"].get("content"):
                    times.append(time.perf_counter())
    conn.close()
    n = len(times)
    return {"ttft_ms": (times[0] - t_send) * 1000, "tok_s": (n - 1) / (times[-1] - times[0]) if n > 1 else 0.0,
            "tokens": n}


def first_paint(browser, url: str, runs: int = 5) -> dict:
    paints, sizes = [], []
    for _ in range(runs):
        context = browser.new_context()
        page = context.new_page()
        page.goto(url + "/")
        page.wait_for_load_state("load")
        until(page, "performance.getEntriesByName('first-contentful-paint').length > 0")
        paints.append(page.evaluate("performance.getEntriesByName('first-contentful-paint')[0].startTime"))
        sizes.append(page.evaluate("[...performance.getEntriesByType('navigation'), ...performance.getEntriesByType"
                                   "('resource')].filter(e => !e.name.includes('/props') && !e.name.includes("
                                   "'/localspec/')).reduce((s, e) => s + e.encodedBodySize, 0)"))
        context.close()
    return {"first_paint_ms": statistics.median(paints), "first_paint_all_ms": paints, "page_bytes_gz": max(sizes)}


def compare(browser, url: str, name: str, prompt: str, max_tokens: int, runs: int, attach: Path | None) -> dict:
    context = browser.new_context()
    page = context.new_page()
    page.add_init_script(TRACE)
    cold = page_run(page, url, prompt, max_tokens, attach)  # fills the prompt cache; reported apart
    rows = {"page": [], "api": []}
    for _ in range(runs):
        settle(url)
        rows["api"].append(api_run(url, cold["body"]))
        settle(url)
        rows["page"].append(page_run(page, url, prompt, max_tokens, attach))
    context.close()
    med = {side: {k: statistics.median(r[k] for r in rs) for k in ("ttft_ms", "tok_s", "tokens")}
           for side, rs in rows.items()}
    out = {"workload": name, "runs": runs, "cold_page": {k: cold[k] for k in ("ttft_ms", "tok_s", "tokens")},
           "page": med["page"], "api": med["api"], "figures_shown": rows["page"][-1]["figures"],
           "pace": med["page"]["tok_s"] / med["api"]["tok_s"] if med["api"]["tok_s"] else None,
           "ttft_extra_ms": med["page"]["ttft_ms"] - med["api"]["ttft_ms"],
           "all": {side: [{k: r[k] for k in ("ttft_ms", "tok_s", "tokens")} for r in rs] for side, rs in rows.items()}}
    print(f"{name}: page {med['page']['tok_s']:.1f} tok/s vs API {med['api']['tok_s']:.1f} ({out['pace']:.3f}x); "
          f"first token page {med['page']['ttft_ms']:.0f} ms vs API {med['api']['ttft_ms']:.0f} ms "
          f"(+{out['ttft_extra_ms']:.0f} ms); {med['page']['tokens']:.0f} tokens", file=sys.stderr)
    return out


def screenshots(browser, url: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        context = browser.new_context(color_scheme=scheme, viewport={"width": 1280, "height": 800})
        page = context.new_page()
        page.goto(url + "/")
        page.wait_for_selector("#model:not(:empty)")
        page.click("#settings-toggle")
        page.fill("#set-temperature", "0")
        page.fill("#set-max_tokens", "400")
        page.click("#settings-toggle")
        page.set_input_files("#attach", str(EDIT_FILE))
        page.click("#edit-mode summary")
        page.set_input_files("#prediction-file", str(EDIT_FILE))
        page.click("#edit-mode summary")
        page.fill("#prompt", "Add a docstring to Chunk. Return the whole file.")
        page.press("#prompt", "Enter")
        page.wait_for_selector("article.assistant[data-done]", timeout=600_000)
        page.screenshot(path=str(out / f"page-{scheme}.png"))
        context.close()


def measured_home() -> Path:
    """A fresh data root holding this machine's measurements (pass costs, attention kernel) when the user's
    has them, as a server has after its first idle minute; conversations the bench writes stay out of the
    user's history."""
    from localspec import paths

    home = Path(tempfile.mkdtemp(prefix="webui-bench-"))
    if paths.profiles_dir().is_dir():
        shutil.copytree(paths.profiles_dir(), home / paths.profiles_dir().name)
    return home


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running `localspec serve` (default: start one on the default pair)")
    ap.add_argument("--runs", type=int, default=2, help="page and API runs per workload, alternating (default 2)")
    ap.add_argument("--shots", type=Path, help="write screenshots of the page here")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    server = None
    if args.url is None:
        server = ServerProcess([], measured_home(), wait=False)
        server.wait_ready(600)
    url = args.url or server.url
    try:
        with chromium() as browser:
            result = {"url": url, "paint": first_paint(browser, url)}
            print(f"first paint {result['paint']['first_paint_ms']:.0f} ms (median of 5); page and libraries "
                  f"{result['paint']['page_bytes_gz'] / 1024:.0f} KB over the wire", file=sys.stderr)
            result["chat"] = compare(browser, url, "chat", CHAT, 1000, args.runs, None)
            result["edit"] = compare(browser, url, "edit", EDIT, 1500, args.runs, EDIT_FILE)
            if args.shots:
                screenshots(browser, url, args.shots)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(server.home, ignore_errors=True)
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
