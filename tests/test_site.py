"""The built site, opened in a real browser: every page of the table of contents loads with its
title, the chapter and solution pages show their figures (each <img> present and loaded), and
each lab page's Colab button opens that lab's notebook in the repository, and every formula is
typeset by the MathJax the site ships (no network: MathJax must come from the site itself).

In the same browser, at a 1280-pixel window, the last browser tests check that the page is
readable at the size it is shown: the content column is as wide as the figures are drawn for
(``inferlab.analysis.column.COLUMN_PX``), no image is scaled below 95% of its pixels (the
browser shrinks a wider one, and its legend text with it), no printed output, output table,
code cell or code block or display equation is wider than its box (cut, or scrolled sideways),
drop-down answers included, and no table cell is narrower than a word of it (the word would
break between two letters). A planted page shows that the last checks find what they look for.

The last tests read the built HTML as text, with no browser: every figure has real alt text
(words, not MyST-NB's default of the image's file name), and no MyST role, directive fence or
raw TeX leaks into what a reader sees outside code and math.

The site is the one ``jupyter-book build .`` writes to ``_build/html`` (the book test builds it
first); if it is missing or older than its sources, this test builds it. ``INFERLAB_SITE_HTML``
points the test at another built site. The pages are served from a Python http.server on a free
localhost port and opened in headless Chromium (Debian's ``chromium`` package; ``.ci/run``
installs it when missing), driven through the DevTools protocol so that the test can ask the
browser whether each image actually loaded. Every request to another host (MathJax's CDN, say) is
refused, so the test needs no network.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nbformat
import pytest
import yaml
from bs4 import BeautifulSoup

from inferlab.course import catalog

# The window a reader on a laptop has: 1280 pixels wide, where the theme's content column is
# 688 pixels (inferlab.analysis.column.COLUMN_PX, which figures and printed lines are sized for).
WINDOW = (1280, 900)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                  "--hide-scrollbars", "--remote-debugging-port=0", "about:blank"]
PAGE_TIMEOUT_S = 60

# Run in the page once it has loaded: wait for every image in the article and for MathJax to
# typeset the page (it is loaded deferred; give it 20 s), then report.
INSPECT_JS = """
(async () => {
  const imgs = Array.from(document.querySelectorAll('article img'));
  imgs.forEach(img => { img.loading = 'eager'; });
  await Promise.all(imgs.map(img => img.complete ? null : new Promise(done => {
    img.addEventListener('load', done); img.addEventListener('error', done);
    setTimeout(done, 10000);
  })));
  const maths = document.querySelectorAll('article .math');
  if (maths.length) {
    const deadline = Date.now() + 20000;
    while (!(window.MathJax && MathJax.startup && MathJax.startup.promise)
           && Date.now() < deadline) {
      await new Promise(r => setTimeout(r, 100));
    }
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      await Promise.race([MathJax.startup.promise, new Promise(r => setTimeout(r, 20000))]);
    }
  }
  // What is wider than the column it sits in: a block whose content is wider than its box
  // scrolls or is cut (outputs, display equations), an image wider than its box is scaled down.
  const wide = el => el.scrollWidth > el.clientWidth + 1;
  const where = el => (el.closest('section[id]') || {}).id || '';
  const outputs = Array.from(document.querySelectorAll(
      'article .cell_output pre, article .cell_output .output, article .cell_output table, ' +
      'article .cell_input pre, article div[class*="highlight-"]:not(.output) pre'));
  const overflowing = outputs.filter(wide).map(el => ({
    section: where(el), scroll: el.scrollWidth, client: el.clientWidth,
    text: (el.innerText || el.textContent || '').split(String.fromCharCode(10)).sort((a, b) => b.length - a.length)[0].slice(0, 120)}));
  const equations = Array.from(document.querySelectorAll('article div.math'))
    .filter(el => { const m = el.querySelector('mjx-container');
                    return m && (wide(el) || wide(m)); })
    .map(el => ({section: where(el), scroll: el.scrollWidth, client: el.clientWidth,
                 text: (el.textContent || '').slice(0, 120)}));
  // Words a table cell breaks between two letters ("rooflin e"): a word (a run of non-spaces
  // in one text node, cut after each hyphen, where a line may end; <wbr> ends a text node)
  // whose box spans more than one line.
  const broken = [];
  for (const cell of document.querySelectorAll('article td, article th')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const words = /[^\s-]+-*|-+/g;
      let m;
      while ((m = words.exec(node.textContent))) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const lines = new Set(Array.from(range.getClientRects()).filter(r => r.width > 0)
                                   .map(r => Math.round(r.top)));
        if (lines.size > 1) {
          broken.push({section: where(cell), word: m[0].slice(0, 60), width: cell.clientWidth});
        }
      }
    }
  }
  // the width the article gives its content: its box less its padding
  const body = document.querySelector('article.bd-article') || document.querySelector('article');
  const pad = body ? parseFloat(getComputedStyle(body).paddingLeft)
                     + parseFloat(getComputedStyle(body).paddingRight) : 0;
  const h1 = document.querySelector('article h1');
  return JSON.stringify({
    title: document.title,
    h1: h1 ? h1.textContent : '',
    images: imgs.map(i => ({src: i.getAttribute('src'), complete: i.complete,
                            width: i.naturalWidth, shown: i.getBoundingClientRect().width})),
    column: body ? body.clientWidth - pad : 0,
    overflowing: overflowing,
    equations: equations,
    broken: broken,
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
    maths: maths.length,
    typeset: Array.from(maths).filter(m => m.querySelector('mjx-container')).length,
    mathjax_errors: document.querySelectorAll('article mjx-merror').length,
    scripts: Array.from(document.querySelectorAll('script[src]')).map(s => s.src),
  });
})()
"""


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _source(root: Path, page: str) -> Path:
    for ext in (".md", ".ipynb"):
        if (root / f"{page}{ext}").is_file():
            return root / f"{page}{ext}"
    raise FileNotFoundError(f"{page} in _toc.yml has no .md or .ipynb file")


def _plain(text: str) -> str:
    """Heading text as the browser shows it: no Markdown marks, straight quotes, one space."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[`*_]", "", text)
    for fancy, plain in (("\u2019", "'"), ("\u2018", "'"), ("\u201c", '"'), ("\u201d", '"'),
                         ("\u2013", "--"), ("\u2014", "---"), ("\u00b6", ""), ("#", "")):
        text = text.replace(fancy, plain)
    return " ".join(text.split())


def _expected_title(path: Path) -> str:
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    else:
        text = path.read_text(encoding="utf-8")
        if text.startswith("---"):
            text = text.split("---", 2)[2]
    m = re.search(r"^#\s+(.+)$", text, re.M)
    assert m, f"{path} has no top-level heading"
    return _plain(m.group(1))


def _image_outputs(executed: Path) -> int:
    """Image outputs of an executed notebook that the page shows (cells not removed)."""
    nb = nbformat.read(executed, as_version=4)
    count = 0
    for cell in nb.cells:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell.cell_type != "code" or tags & {"remove-cell", "remove-output", "remove_cell",
                                               "remove_output"}:
            continue
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            count += any(k.startswith("image/") for k in data)
    return count


def _site_is_fresh(root: Path, html: Path) -> bool:
    index = html / "index.html"
    if not index.is_file():
        return False
    sources = [root / "_toc.yml", root / "_config.yml"]
    sources += [_source(root, page) for page in catalog.toc_files(root)]
    return index.stat().st_mtime >= max(p.stat().st_mtime for p in sources)


@pytest.fixture(scope="module")
def site(root) -> Path:
    if os.environ.get("INFERLAB_SITE_HTML"):
        html = Path(os.environ["INFERLAB_SITE_HTML"])
        assert (html / "index.html").is_file(), f"INFERLAB_SITE_HTML={html} has no index.html"
        return html
    html = root / "_build" / "html"
    if not _site_is_fresh(root, html):
        jb = Path(sys.executable).with_name("jupyter-book")
        subprocess.run([str(jb) if jb.exists() else "jupyter-book", "build", str(root)],
                       check=True, capture_output=True, timeout=1500)
    return html


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output clean
        pass


class Browser:
    """Headless Chromium, one tab, driven over the DevTools protocol (tornado's websocket)."""

    def __init__(self, executable: str):
        self.profile = tempfile.mkdtemp(prefix="inferlab-chromium-")
        self.proc = subprocess.Popen([executable, *CHROMIUM_FLAGS[:-2],
                                      f"--user-data-dir={self.profile}", *CHROMIUM_FLAGS[-2:]],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        self.ws_url = pages[0]["webSocketDebuggerUrl"]
        self.blocked: list[str] = []

    def inspect(self, urls: list[str], allowed: str) -> dict[str, dict]:
        return asyncio.run(self._inspect(urls, allowed))

    async def _inspect(self, urls: list[str], allowed: str) -> dict[str, dict]:
        from tornado.websocket import websocket_connect

        ws = await websocket_connect(self.ws_url, max_message_size=256 * 2**20)
        ids = iter(range(1, 10**9))

        async def send(method: str, **params) -> int:
            msg_id = next(ids)
            await ws.write_message(json.dumps({"id": msg_id, "method": method, "params": params}))
            return msg_id

        async def until(matches, timeout: float = PAGE_TIMEOUT_S) -> dict:
            deadline = time.monotonic() + timeout
            while True:
                raw = await asyncio.wait_for(ws.read_message(), max(0.1, deadline - time.monotonic()))
                if raw is None:
                    raise ConnectionError("chromium closed the DevTools connection")
                msg = json.loads(raw)
                if msg.get("method") == "Fetch.requestPaused":  # only our server, never the net
                    request_id, url = msg["params"]["requestId"], msg["params"]["request"]["url"]
                    if url.startswith((allowed, "data:", "blob:")):
                        await send("Fetch.continueRequest", requestId=request_id)
                    else:
                        self.blocked.append(url)
                        await send("Fetch.failRequest", requestId=request_id,
                                   errorReason="BlockedByClient")
                    continue
                if matches(msg):
                    return msg

        try:
            for method, params in (("Page.enable", {}), ("Fetch.enable", {"patterns": [{"urlPattern": "*"}]})):
                sent = await send(method, **params)
                await until(lambda m, sent=sent: m.get("id") == sent)
            results = {}
            for url in urls:
                await send("Page.navigate", url=url)
                await until(lambda m: m.get("method") == "Page.loadEventFired")
                sent = await send("Runtime.evaluate", expression=INSPECT_JS, awaitPromise=True,
                                  returnByValue=True)
                reply = await until(lambda m, sent=sent: m.get("id") == sent)
                value = reply.get("result", {}).get("result", {}).get("value")
                results[url] = json.loads(value) if value else {"error": reply}
            return results
        finally:
            ws.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def pages(root, site, server) -> dict[str, dict]:
    """What the browser saw on every page of the table of contents, keyed by the page's file."""
    executable = _chromium()
    if executable is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; .ci/run does "
                    "this when it is missing)")
    files = catalog.toc_files(root)
    browser = Browser(executable)
    try:
        seen = browser.inspect([server + f + ".html" for f in files] + [PLANTED],
                               allowed=server)
    finally:
        browser.close()
    out = {f: seen[server + f + ".html"] for f in files}
    out["_blocked"] = list(browser.blocked)   # requests to any host but the test's own server
    out["_server"] = server
    out["_planted"] = seen[PLANTED]
    return out


# A page with what the browser checks look for, to show that they find it: a table cell too
# narrow for its word, which a rule lets break between letters, and a code cell's long line.
PLANTED = ("data:text/html," + urllib.parse.quote(
    "<html><body><article><section id='planted'>"
    "<table style='width:60px'><tr><td style='overflow-wrap:anywhere'>supercalifragilistic"
    "</td><td>ok</td></tr></table>"
    "<div class='cell_input'><pre style='width:100px;overflow:auto'>" + "x = 1; " * 40
    + "</pre></div></section></article></body></html>"))


def _part(root, kind: str) -> list[str]:
    """The pages of one kind ("chapter", "lab", "solution") in the table of contents."""
    return catalog.toc_pages(kind, root)


def test_every_page_loads_with_its_title(root, pages):
    for page in catalog.toc_files(root):
        seen = pages[page]
        assert "error" not in seen, f"{page}: {seen}"
        title = _expected_title(_source(root, page))
        number = re.compile(r"^\d+\.\s+")  # a chapter's number ("9. "): the part is numbered
        assert number.sub("", _plain(seen["h1"])) == title, \
            f"{page}: heading {seen['h1']!r}, expected {title!r}"
        assert number.sub("", _plain(seen["title"])).startswith(title), \
            f"{page}: <title> {seen['title']!r}"


@pytest.mark.parametrize("kind", ["chapter", "lab", "solution"])
def test_figures_are_present_and_loaded(root, site, pages, kind):
    files = _part(root, kind)
    assert files, f"_toc.yml has no {kind} page"
    for page in files:
        images = pages[page]["images"]
        broken = [i["src"] for i in images if not (i["complete"] and i["width"] > 0)]
        assert not broken, f"{page}: images that did not load: {broken}"
        executed = site.parent / "jupyter_execute" / f"{page}.ipynb"
        if kind != "lab" and executed.is_file():  # labs are shown unexecuted
            expected = _image_outputs(executed)
            shown = [i for i in images if "_images/" in (i["src"] or "")]
            assert len(shown) >= expected, f"{page}: {len(shown)} figures shown, {expected} made"
        if kind == "solution" and executed.is_file() and _image_outputs(executed):
            assert images, f"{page} shows no figure"
    if kind == "chapter":      # a chapter split into pages shows its figures on some of them
        for chapter, chapter_pages in catalog.chapters(root).items():
            assert any(pages[p]["images"] for p in chapter_pages), f"{chapter} shows no figure"


def test_each_labs_colab_button_opens_that_labs_notebook(root, pages):
    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    url = config["repository"]["url"].rstrip("/")
    branch = config["repository"].get("branch", "main")
    org_repo = url.removeprefix("https://github.com/")
    colab = config["launch_buttons"]["colab_url"].rstrip("/")
    labs = _part(root, "lab")
    assert labs and all(p.startswith("labs/") for p in labs)
    for page in labs:
        assert (root / f"{page}.ipynb").is_file()
        expected = f"{colab}/github/{org_repo}/blob/{branch}/{page}.ipynb"
        colab_links = [h for h in pages[page]["links"] if h.startswith(colab)]
        assert expected in colab_links, f"{page}: Colab links {colab_links}, expected {expected}"



def test_formulas_are_typeset_offline_by_the_sites_own_mathjax(root, pages):
    """MathJax must come from the built site: the browser may reach no other host, so a page
    whose formulas render proves the site works on a closed network."""
    chapters = _part(root, "chapter")
    assert sum(pages[p]["maths"] for p in chapters) > 50, "the chapters have almost no formulas"
    for page in catalog.toc_files(root):
        seen = pages[page]
        if not seen.get("maths"):
            continue
        mathjax = [s for s in seen["scripts"] if "mathjax" in s.lower()]
        assert mathjax and all(s.startswith(pages["_server"]) for s in mathjax), \
            f"{page}: MathJax loaded from {mathjax}"
        assert seen["typeset"] == seen["maths"], \
            f"{page}: {seen['typeset']} of {seen['maths']} formulas typeset"
        assert seen["mathjax_errors"] == 0, f"{page}: MathJax reported errors"
    assert not [u for u in pages["_blocked"] if "mathjax" in u.lower()], pages["_blocked"]


# --- The built HTML as text: alt text, and nothing raw in what a reader sees ------------

ROLE = re.compile(r"\{(term|cite|cite:p|cite:t|doc|ref|numref|eq|glue|glue:text|glue:any|"
                  r"download|math|abbr)\}`")
FENCE = re.compile(r"(```|:::)\s*\{[a-z-]+\}")
TEX = re.compile(r"\\(frac|text|times|mathrm|left|right|cdot|approx|beta|pi|sum|lfloor|"
                 r"lceil|le|ge|quad)\b|\$[^$\s][^$]{0,60}\$")
HASHLIKE = re.compile(r"(^|/)[0-9a-f]{32,}\.(png|svg|jpg)$|\.(png|svg|jpg)$")


@pytest.fixture(scope="module")
def html_pages(site, root):
    out = {}
    for page in catalog.toc_files(root):
        path = site / f"{page}.html"
        assert path.is_file(), f"{path} was not built"
        soup = BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")
        article = soup.select_one("article") or soup.body
        out[page] = article
    return out


def test_every_figure_has_real_alt_text(html_pages):
    problems = []
    for page, article in html_pages.items():
        for img in article.find_all("img"):
            alt = (img.get("alt") or "").strip()
            if len(alt) < 40 or HASHLIKE.search(alt) or len(alt.split()) < 8:
                problems.append(f"{page}: {img.get('src')} has alt {alt[:60]!r}")
    assert not problems, "\n".join(problems)


def _visible_text(article) -> str:
    article = BeautifulSoup(str(article), "html.parser")
    for tag in article.find_all(["pre", "code", "script", "style", "math", "mjx-container"]):
        tag.decompose()
    # a cell's output is the program's, like a printed block: an HTML table of prices may show
    # two dollar signs in one row, which is not TeX
    for tag in article.select(".math, .highlight, .cell_input, .MathJax, .cell_output table"):
        tag.decompose()
    return article.get_text(" ")


def test_no_role_directive_or_tex_leaks_into_the_text(html_pages):
    problems = []
    for page, article in html_pages.items():
        text = _visible_text(article)
        for pattern, what in ((ROLE, "MyST role"), (FENCE, "directive fence"), (TEX, "raw TeX")):
            for m in pattern.finditer(text):
                around = text[max(0, m.start() - 40):m.end() + 40].replace("\n", " ")
                problems.append(f"{page}: {what} {m.group()!r} in ...{around}...")
    assert not problems, "\n".join(problems[:40])


def test_the_checks_catch_what_they_look_for():
    leaky = BeautifulSoup("<article><p>see {term}`KV cache` and H$_2$O and \\frac{a}{b}</p>"
                          "<span class='math'>\\(\\frac{a}{b}\\)</span>"
                          "<img src='../_images/" + "a" * 64 + ".png' alt='../_images/"
                          + "a" * 64 + ".png'></article>", "html.parser").article
    text = _visible_text(leaky)
    assert ROLE.search(text) and TEX.search(text)
    assert len(TEX.findall(text)) == 2                      # the span.math one is not counted
    alt = leaky.find("img")["alt"]
    assert HASHLIKE.search(alt)


# --- Readable at the size it is shown: figures not scaled down, outputs not cut --------------

LEGIBLE_SCALE = 0.95   # a figure shown at 95% of its pixels keeps its 10-point text legible


def test_the_column_is_as_wide_as_the_figures_are_drawn_for(root, pages):
    """The figures are drawn for COLUMN_PX pixels; the built site's column must be that wide."""
    from inferlab.analysis.figures import COLUMN_PX

    columns = {page: pages[page]["column"] for page in _part(root, "chapter")}
    assert all(width >= COLUMN_PX for width in columns.values()), \
        f"content column narrower than the {COLUMN_PX} pixels figures are drawn for: {columns}"


def test_no_figure_is_scaled_below_a_legible_size(root, pages):
    """At a 1280-pixel window, every figure is shown at (nearly) its own pixel size: a wider
    PNG is shrunk by the browser, and its legend text with it (to 5-6 pixels at 58%)."""
    problems = []
    for page in catalog.toc_files(root):
        for image in pages[page]["images"]:
            if image["width"] and image["shown"] < LEGIBLE_SCALE * image["width"]:
                problems.append(f"{page}: {image['src']} is {image['width']} pixels wide, shown "
                                f"at {image['shown']:.0f} ({image['shown'] / image['width']:.0%})")
    assert not problems, "\n".join(problems)


def test_no_table_cell_is_narrower_than_a_word(root, pages):
    """Every table on the site, in prose or in a cell's output, leaves each word whole: a
    column squeezed below its longest word breaks it between letters ("rooflin e", "Chapte r
    1"), which no reader can read as a word. Long names break at the joints a page marks."""
    planted = pages["_planted"]
    assert [b["word"] for b in planted["broken"]] == ["supercalifragilistic"]
    assert planted["overflowing"], "the planted code line that scrolls was not seen"
    problems = [f"{page} #{b['section']}: {b['word']!r} broken in a {b['width']}-pixel cell"
                for page in catalog.toc_files(root) for b in pages[page]["broken"]]
    assert not problems, f"{len(problems)} words broken:\n" + "\n".join(problems[:60])


def test_no_output_or_equation_is_wider_than_the_column(root, pages):
    """Printed output and display equations fit the column: nothing a reader must scroll
    sideways to read, or never sees (a table cut mid-column, a streamed field off the edge)."""
    problems = []
    for page in catalog.toc_files(root):
        for what in ("overflowing", "equations"):
            for block in pages[page][what]:
                problems.append(f"{page} #{block['section']}: {what} block {block['scroll']} "
                                f"pixels wide in {block['client']}: {block['text']!r}")
    assert not problems, f"{len(problems)} blocks wider than the column:\n" + "\n".join(problems)

