#!/usr/bin/env python3
"""Opens every page of the built manual (target/docs/*.html) in headless Chromium over the
DevTools protocol and fails when a page logs an error (console error, uncaught exception, a
resource that failed to load), shows an image that did not load, or does not render a diagram
its source names (an <img> of diagrams/*.svg with no width). Saves a full-page screenshot of
each page to target/docs/screenshots/PAGE.png.

    scripts/docs-check.py CHROMIUM [target/docs]
"""
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from websockets.sync.client import connect

chromium, root = sys.argv[1], Path(sys.argv[2] if len(sys.argv) > 2 else "target/docs").resolve()
shots = root / "screenshots"
shots.mkdir(exist_ok=True)
# print.html is every page at once, toc.html the sidebar without scripts, 404.html a template.
pages = sorted(p for p in root.glob("*.html") if p.name not in ("print.html", "404.html", "toc.html"))

CHECK = """(() => {
  const imgs = [...document.querySelectorAll('main img')];
  return JSON.stringify({
    title: document.title,
    broken: imgs.filter((i) => !i.complete || i.naturalWidth === 0).map((i) => i.getAttribute('src')),
    diagrams: imgs.filter((i) => /diagrams\\/.*\\.svg$/.test(i.getAttribute('src')) && i.naturalWidth > 0).length,
    named: imgs.filter((i) => /diagrams\\//.test(i.getAttribute('src'))).length,
    text: document.querySelector('main') ? document.querySelector('main').innerText.length : 0,
  });
})()"""


class Tab:
    def __init__(self, url: str) -> None:
        warnings.filterwarnings("ignore", category=DeprecationWarning)  # connect() outside a `with`
        self.ws = connect(url, max_size=64 * 1024 * 1024)
        self.next_id = 0
        self.events = []

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 30):
        end = time.monotonic() + timeout
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(i)
        while time.monotonic() < end:
            msg = json.loads(self.ws.recv(timeout=end - time.monotonic()))
            if msg.get("method") == method:
                return msg
            self.events.append(msg)
        raise TimeoutError(method)


profile = tempfile.mkdtemp(prefix="docs-check-")
browser = subprocess.Popen(
    [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
     "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1280,900", "about:blank"],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
problems = []
try:
    port_file = Path(profile) / "DevToolsActivePort"
    for _ in range(300):
        if port_file.exists() and port_file.read_text().strip():
            break
        time.sleep(0.1)
    port = port_file.read_text().split()[0]
    import urllib.request

    targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
    page_target = next(t for t in targets if t["type"] == "page")
    tab = Tab(page_target["webSocketDebuggerUrl"])
    for domain in ("Page", "Runtime", "Log", "Network"):
        tab.call(f"{domain}.enable")
    for page in pages:
        tab.events.clear()
        tab.call("Page.navigate", url=page.as_uri())
        tab.wait_for("Page.loadEventFired")
        time.sleep(0.3)
        state = json.loads(tab.call("Runtime.evaluate", expression=CHECK, returnByValue=True)["result"]["value"])
        # Everything the page logged meanwhile.
        tab.call("Runtime.evaluate", expression="1")
        for e in tab.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                problems.append(f"{page.name}: uncaught {p['exceptionDetails'].get('text')}")
            elif m == "Runtime.consoleAPICalled" and p.get("type") == "error":
                problems.append(f"{page.name}: console error {[a.get('value') for a in p.get('args', [])]}")
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                problems.append(f"{page.name}: {p['entry'].get('text')} {p['entry'].get('url', '')}")
            elif m == "Network.loadingFailed":
                problems.append(f"{page.name}: failed to load a resource: {p.get('errorText')}")
        if state["broken"]:
            problems.append(f"{page.name}: images that did not load: {state['broken']}")
        if state["diagrams"] < state["named"]:
            problems.append(f"{page.name}: {state['named']} diagrams named, {state['diagrams']} rendered")
        if state["text"] < 200:
            problems.append(f"{page.name}: almost no text rendered ({state['text']} characters)")
        metrics = tab.call("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        shot = tab.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                        clip={"x": 0, "y": 0, "width": 1280, "height": min(size["height"], 12000), "scale": 1})
        (shots / f"{page.stem}.png").write_bytes(base64.b64decode(shot["data"]))
        print(f"docs-check: {page.name}: {state['title']!r}, {state['diagrams']} diagram(s), screenshot {shots.name}/{page.stem}.png")
finally:
    browser.terminate()
    try:
        browser.wait(10)
    except subprocess.TimeoutExpired:
        browser.kill()
    subprocess.run(["rm", "-rf", profile])
if problems:
    print("\n".join(f"docs-check: {p}" for p in problems), file=sys.stderr)
    sys.exit(1)
print(f"docs-check: {len(pages)} pages opened in headless Chromium, no error")
