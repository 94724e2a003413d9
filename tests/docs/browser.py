"""Headless Chromium, driven over its DevTools pipe, with the network cut off.

``Browser`` starts Debian's ``chromium`` (no browser download, no Python driver:
the DevTools protocol runs over two pipes, ``--remote-debugging-pipe``), opens
pages one after the other in one tab, runs a script in each once it has
loaded, and records every request the page made. The network is off twice
over: the browser runs in a network namespace of its own when ``unshare -n``
is allowed, and in any case every host name resolves to nothing and every
request goes to a proxy that does not exist.
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
         "--disable-default-apps", "--mute-audio", "--hide-scrollbars", "--window-size=1200,1600",
         "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND", "--remote-debugging-pipe"]


def chromium() -> str | None:
    """The path of a Chromium on PATH, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _offline_prefix() -> list[str]:
    """``unshare -n`` (a network namespace with no interface but loopback) where it is allowed."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n"]
    return []


class BrowserError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one tab; ``visit(url, script)`` returns what the script returns."""

    def __init__(self, executable: str, timeout: float = 60.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        to_browser_read, self._write = os.pipe()
        self._read, from_browser_write = os.pipe()

        def pipes():  # Chromium reads commands on fd 3 and writes answers on fd 4
            reading, writing = os.dup(to_browser_read), os.dup(from_browser_write)  # above 4: the pipes hold 3..6
            os.dup2(reading, 3)
            os.dup2(writing, 4)

        self.offline = _offline_prefix()
        self.log = os.path.join(self.profile, "chromium.log")
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [*self.offline, executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=pipes, close_fds=False)
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer, self._next_id, self.events = b"", 0, []
        try:
            targets = self.send("Target.getTargets")["targetInfos"]
            page = next(t for t in targets if t["type"] == "page")
            self.session = self.send("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
            for domain in ("Page", "Network", "Runtime"):
                self.send(f"{domain}.enable", session=self.session)
        except Exception:
            self.close()
            raise

    # ------------------------------------------------------------ the protocol
    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._read], [], [], left)[0]:
                raise BrowserError("Chromium did not answer in time")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                with open(self.log, "rb") as log:
                    raise BrowserError(f"Chromium exited: {log.read().decode(errors='replace')[-2000:]}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, session: str | None = None, **params) -> dict:
        self._next_id += 1
        command = {"id": self._next_id, "method": method, "params": params}
        if session:
            command["sessionId"] = session
        os.write(self._write, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            message = self._message(deadline)
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            for index, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(index)
            self.events.append(self._message(deadline))

    # ------------------------------------------------------------ pages
    def visit(self, url: str, script: str):
        """Open ``url``, wait for its load event, run ``script`` (an expression, awaited if a promise) and
        return (its value, the URLs the page requested)."""
        self.events.clear()
        self.send("Page.navigate", session=self.session, url=url)
        self.wait_for("Page.loadEventFired")
        result = self.send("Runtime.evaluate", session=self.session, expression=script, awaitPromise=True,
                           returnByValue=True, timeout=int(self.timeout * 1000))
        if "exceptionDetails" in result:
            raise BrowserError(f"{url}: {result['exceptionDetails']}")
        requested = [e["params"]["request"]["url"] for e in self.events
                     if e.get("method") == "Network.requestWillBeSent"]
        return result["result"].get("value"), requested

    def screenshot(self, url: str, path: str) -> None:
        self.visit(url, "document.fonts.ready.then(() => true)")
        data = self.send("Page.captureScreenshot", session=self.session, format="png")["data"]
        with open(path, "wb") as handle:
            handle.write(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._read, self._write):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)
