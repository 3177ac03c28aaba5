"""The README's picture of the explorer page: a trained run served on the loopback address,
one sentence translated in a headless browser (Playwright + chromium, as the browser tests
use), one layer's cross-attention averaged over heads, hovering a source word.

    .venv/bin/python benchmarks/serve/screenshot.py --model runs/demo --out benchmarks/serve/explorer.png
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SENTENCE = "A man in a blue shirt is riding a bike down the street."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, server: subprocess.Popen, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if server.poll() is not None:
            sys.exit(f"the server exited with code {server.returncode}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    sys.exit(f"the server did not answer at {url} within {timeout:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="run directory to serve")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--sentence", default=SENTENCE)
    ap.add_argument("--hover", default="bike", help="the source word to hover")
    ap.add_argument("--layer", type=int, default=-1, help="which layer (0-based; -1: the last)")
    ap.add_argument("--chromium", default="/usr/bin/chromium", help="chromium executable (.ci/install-browser.sh)")
    args = ap.parse_args()
    from playwright import sync_api  # an optional dependency (the test extra): not needed for --help

    from transformer import hardware

    print(f"machine: {hardware.describe_line()}", flush=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    transformer = str(Path(sys.executable).with_name("transformer"))
    server = subprocess.Popen([transformer, "serve", "--model", args.model, "--port", str(port)])
    try:
        wait_until_up(url, server)
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.set_default_timeout(120_000)
            page.goto(url + "/")
            page.wait_for_function("document.getElementById('model-info').textContent.includes('layers')")
            page.fill("#source", args.sentence)
            page.press("#source", "Enter")
            page.wait_for_selector("#heatmap td")
            page.check('input[name="kind"][value="cross"]')
            layers = page.eval_on_selector_all("#layer option", "els => els.map(e => e.value)")
            page.select_option("#layer", value=layers[args.layer])
            page.select_option("#head", value="avg")
            cols = page.eval_on_selector_all("#heatmap th.col", "els => els.map(e => [e.dataset.col, e.textContent])")
            col = next((c for c, text in cols if args.hover in text), cols[0][0])
            page.hover(f"#heatmap th.col[data-col='{col}']")
            page.screenshot(path=args.out, full_page=True)
            print(f"{args.out}: {page.text_content('#translation')!r}")
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
