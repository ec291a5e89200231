"""The documentation site as a reader gets it: built, served, and loaded in a browser.

The site is built once (``mkdocs build --strict``) into a temporary directory, served on
127.0.0.1 by a server thread, and every page is loaded in headless Chromium driven
through its DevTools pipe: each must show its title, draw every image, show no diagram
source, and ask nothing of any host but the local server (mkdocs.yml promises a site that
reads offline). The checks of the sources (code lines that fit, the reference's coverage,
the diagram file) need no build.
"""

from __future__ import annotations

import fcntl
import functools
import html
import importlib
import json
import os
import pkgutil
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# What fits a code block's column on the site at its default width, in characters; a
# longer line is wrapped by docs/css/extra.css rather than cut, but reads badly.
MAX_CODE_LINE = 82
# Pages whose code lines are not (yet) held to the limit: their long lines wrap.
LONG_LINES_ALLOWED = ("getting-started.md", "guides/", "tutorial/", "howto/")

_FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)


def fenced_blocks(path: Path) -> Iterator[tuple[int, str, str]]:
    text = path.read_text(encoding="utf-8")
    for m in _FENCE.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m["info"].strip(), m["body"]


def source_pages() -> list[Path]:
    """The Markdown the site is made of: docs/ and the root files it includes."""
    return [*sorted(DOCS.rglob("*.md")), ROOT / "PROTOCOL.md", ROOT / "CHANGELOG.md"]


# -- the sources -------------------------------------------------------------------------


def test_code_lines_fit_the_column() -> None:
    long = []
    for page in source_pages():
        name = page.relative_to(DOCS).as_posix() if page.is_relative_to(DOCS) else page.name
        if name.startswith(LONG_LINES_ALLOWED):
            continue
        for start, _info, body in fenced_blocks(page):
            for n, line in enumerate(body.split("\n"), start + 1):
                if len(line) > MAX_CODE_LINE:
                    long.append(f"{name}:{n} ({len(line)} characters)")
    assert not long, f"code lines longer than {MAX_CODE_LINE} characters: {long}"


def test_commands_are_fenced_as_commands() -> None:
    """A command to type is a ``bash`` block; a ``console`` block is a session whose
    commands start with ``$ `` (the console lexer shows a line without it as output,
    greyed out)."""
    for page in source_pages():
        for start, info, body in fenced_blocks(page):
            if info.split()[:1] == ["console"]:
                assert body.startswith("$ "), (
                    f"{page.name}:{start}: a console block must start with a `$ ` prompt "
                    "(or be a bash block, for commands without their output)"
                )


def public_modules() -> list[str]:
    names = []
    for top in ("gosim", "netframe", "idempotency"):
        package = importlib.import_module(top)
        names.append(top)
        for info in pkgutil.walk_packages(package.__path__, top + "."):
            parts = info.name.split(".")
            if not any(p.startswith("_") for p in parts):
                names.append(info.name)
    return names


# A program rather than an API: its page is docs/demo.md.
NOT_IN_THE_REFERENCE = {"idempotency.demo"}


def test_every_public_module_has_its_reference() -> None:
    rendered = set()
    for page in (DOCS / "reference").glob("*.md"):
        rendered.update(re.findall(r"^::: ([\w.]+)$", page.read_text(encoding="utf-8"), re.M))
    missing = sorted(set(public_modules()) - NOT_IN_THE_REFERENCE - rendered)
    assert not missing, f"public modules without a reference: {missing}"


def test_the_diagram_is_what_its_script_draws() -> None:
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        sequence_svg = importlib.import_module("sequence_svg")
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    committed = (DOCS / "img" / "rpc-call.svg").read_text(encoding="utf-8")
    assert committed == sequence_svg.render(), (
        "docs/img/rpc-call.svg is stale: run python docs/_ext/sequence_svg.py"
    )


# -- the built site ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs extra (mkdocs) is not installed")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr}"
    return out


def pages(site: Path) -> list[str]:
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))


class _Resources(HTMLParser):
    """Every URL a page makes the browser fetch by itself: src, srcset, poster, data,
    and the href of a <link> (style sheets, icons, preloads). A plain <a href> fetches
    nothing until followed, so it may name anything."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if value is None:
                continue
            if key in ("src", "poster", "data") or (key == "href" and tag == "link"):
                self.urls.append(value)
            elif key == "srcset":
                self.urls.extend(part.split()[0] for part in value.split(",") if part.strip())


_CSS_URL = re.compile(r"""url\(\s*['"]?([^'")\s]+)|@import\s+['"]([^'"]+)""")


def external(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme in ("", "data", "blob", "about") and not url.startswith("//"):
        return False
    return parts.hostname not in ("127.0.0.1", "localhost")


def test_the_built_site_names_no_other_host(site: Path) -> None:
    found = []
    for page in pages(site):
        parser = _Resources()
        parser.feed((site / page).read_text(encoding="utf-8"))
        found += [f"{page}: {u}" for u in parser.urls if external(u)]
    for css in site.rglob("*.css"):
        for m in _CSS_URL.finditer(css.read_text(encoding="utf-8")):
            url = m[1] or m[2]
            if external(url):
                found.append(f"{css.relative_to(site)}: {url}")
    assert not found, f"resources fetched from elsewhere: {found}"


def test_the_reference_shows_how_to_construct(site: Path) -> None:
    """Each class's heading carries its constructor's signature, and the instance
    attributes its __init__ sets (``ttl = ttl``) are not entries of their own."""
    idem = (site / "reference/idempotency/index.html").read_text(encoding="utf-8")
    text = re.sub(r"<[^>]+>", "", idem)
    for signature in ("PostgresStore(", "SQLiteStore(", "Idempotency("):
        assert signature in text, f"no {signature}...) signature on the idempotency page"
    for keyword in ("pool_size", "lock_timeout", "max_result_bytes", "journal_mode"):
        assert keyword in text, f"the constructors' keyword {keyword} is not shown"
    assert 'id="idempotency.Idempotency.ttl"' not in idem
    for page, cls in (("rpc", "idempotency.rpc.Server"), ("netframe", "netframe.Client")):
        html = (site / f"reference/{page}/index.html").read_text(encoding="utf-8")
        heading = html[html.index(f'id="{cls}"') :][:20000]
        assert "doc-signature" in heading, f"{cls} has no signature"


def test_module_docstrings_cited_are_linked(site: Path) -> None:
    """A docstring's "see the module docstring" is a link to that docstring, rendered
    on the site (the strict build refuses a link to a module that is not)."""
    html = (site / "reference/netframe/index.html").read_text(encoding="utf-8")
    assert re.search(r'<a [^>]*href="#netframe\._server"[^>]*>the module docstring</a>', html)
    assert 'id="netframe._server"' in html


# -- in the browser ----------------------------------------------------------------------


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class DevTools:
    """Chromium driven over --remote-debugging-pipe: commands in on fd 3, replies and
    events out on fd 4, each a JSON message ended by a NUL byte."""

    def __init__(self, browser: str, profile: Path) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:  # the pipe's ends where Chromium expects them
            # (moved above 4 first: either end may itself be fd 3 or 4)
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                # nothing may leave the machine: any other host does not resolve
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=fds,  # noqa: PLW1509 -- fds() only calls dup2, thread-safe
            pass_fds=(3, 4),  # kept open in the browser; the rest are closed
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next = 0
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buf = b""
        while chunk := os.read(self._from_browser, 65536):
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for m in messages:
                self.messages.put(json.loads(m))

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self.wait(lambda m: m.get("id") == self._next)

    def wait(self, match: Any, seconds: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            assert left > 0, "Chromium did not answer in time"
            m = self.messages.get(timeout=left)
            if "method" in m:
                self.events.append(m)
            if match(m):
                assert "error" not in m, m["error"]
                return m

    def close(self) -> None:
        os.close(self._to_browser)  # Chromium exits when its pipe closes
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._from_browser)


# What each page reports of itself once loaded.
_LOOK = """JSON.stringify({
  title: document.title,
  h1: (document.querySelector("article h1") || {}).textContent || "",
  broken: [...document.images].filter(i => !i.complete || i.naturalWidth === 0)
          .map(i => i.src),
  text: document.body.innerText,
})"""


@functools.cache
def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(
    _chromium() is None, reason="chromium is not installed (apt-get install chromium)"
)
def test_every_page_renders_in_a_browser_offline(site: Path, tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    with (ROOT / "pyproject.toml").open("rb") as f:
        version = tomllib.load(f)["project"]["version"]
    browser = DevTools(str(_chromium()), tmp_path / "profile")
    try:
        target = browser.call("Target.createTarget", url="about:blank")["result"]["targetId"]
        session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["result"][
            "sessionId"
        ]
        for domain in ("Network", "Page", "Runtime"):
            browser.call(f"{domain}.enable", session)
        checked = 0
        for page in pages(site):
            if page == "404.html":
                continue
            browser.call("Page.navigate", session, url=base + page)
            browser.wait(lambda m: m.get("method") == "Page.loadEventFired")
            look = json.loads(
                browser.call("Runtime.evaluate", session, expression=_LOOK, returnByValue=True)[
                    "result"
                ]["result"]["value"]
            )
            served = (site / page).read_text(encoding="utf-8")
            h1 = re.search(r"<h1[^>]*>(.*?)</h1>", served, re.S)
            assert h1, f"{page}: the page has no title heading"
            expected = html.unescape(re.sub(r"<[^>]+>", "", h1[1])).replace("¶", "").strip()
            assert look["h1"].replace("¶", "").strip() == expected, (
                f"{page}: the browser shows the heading {look['h1']!r}, not {expected!r}"
            )
            assert look["title"].endswith(f"gosim {version}"), (
                f"{page}: the title {look['title']!r} does not name the site and its version"
            )
            assert not look["broken"], f"{page}: images not drawn: {look['broken']}"
            assert "sequenceDiagram" not in look["text"], f"{page}: a diagram shown as source"
            checked += 1
    finally:
        browser.close()
        server.shutdown()
        server.server_close()
    assert checked >= 20, f"only {checked} pages were loaded"
    requested = [
        e["params"]["request"]["url"]
        for e in browser.events
        if e["method"] == "Network.requestWillBeSent"
    ]
    assert any(u.startswith(base) for u in requested), "the network log recorded nothing"
    elsewhere = sorted({u for u in requested if external(u)})
    assert not elsewhere, f"requests that left the machine: {elsewhere}"
    urls = {
        e["params"]["requestId"]: e["params"]["request"]["url"]
        for e in browser.events
        if e["method"] == "Network.requestWillBeSent"
    }
    failed = [
        (urls.get(e["params"]["requestId"]), e["params"].get("errorText"))
        for e in browser.events
        if e["method"] == "Network.loadingFailed" and not e["params"].get("canceled")
    ]
    assert not failed, f"requests that failed: {failed}"
