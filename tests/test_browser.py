"""The HTML reports render in a real browser: headless Chromium loads the self-contained page (offline), the
inline script draws every plot, the screenshot is not blank and the token labels are in the rendered DOM.

Chromium comes from the ``chromium`` fixture (tests/conftest.py): installed with apt-get when missing and we
are root; otherwise these tests are skipped, saying so.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import walklens
from walklens.analyses.walks import labels_for
from walklens.reports import generate as generate_report
from walklens.reports import simmap as simmap_report
from walklens.reports import walk as walk_report
from walklens.reports.html import show
from walklens.testing import tiny_model

pytestmark = pytest.mark.browser  # a real headless Chromium


def _run(chromium: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={tmp / 'profile'}",
        "--virtual-time-budget=5000",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def dump_dom(chromium: str, html: Path) -> str:
    """The DOM after the page's scripts ran."""
    r = _run(chromium, html.parent, "--dump-dom", html.as_uri())
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def colourful_pixels(chromium: str, html: Path, height: int = 2400) -> int:
    """Pixels of clearly saturated colour in a screenshot (heatmap cells and chart lines; text is grey)."""
    import matplotlib.image as mpimg

    shot = html.parent / (html.stem + ".png")
    r = _run(chromium, html.parent, f"--window-size=1300,{height}", f"--screenshot={shot}", html.as_uri())
    assert shot.is_file(), r.stderr[-2000:]
    img = mpimg.imread(str(shot))[..., :3]
    sat = img.max(-1) - img.min(-1)
    return int((sat > 0.25).sum())


def _check_page(chromium: str, path: Path, labels: list[str]) -> None:
    html = path.read_text(encoding="utf-8")
    assert re.search(r"class='wl-(heatmap|lines)'", html)
    dom = dump_dom(chromium, path)
    assert re.search(r"<body[^>]*data-plots-rendered=\"1\"", dom)
    assert dom.count('data-drawn="1"') == html.count("<div class='wl-result' data-result='")  # each document drawn
    n_plots = len(re.findall(r"class=\"wl-(heatmap|lines)\"", dom))  # the page's own and those its documents drew
    assert dom.count('data-rendered="1"') == n_plots  # every plot was drawn
    assert len(re.findall(r"<canvas [^>]*class=\"wl-canvas\"", dom)) == len(re.findall(r"class=\"wl-heatmap\"", dom))
    body = re.sub(r"<script>.*?</script>", "", dom, flags=re.S)
    svg_text = " ".join(re.findall(r"<text[^>]*>([^<]*)</text>", body))  # only the script creates <text>
    for label in labels:
        assert label in svg_text, label
    on = colourful_pixels(chromium, path)
    # negative control: the same page without its script shows (almost) no colour
    bare = path.with_name(path.stem + "_noscript.html")
    bare.write_text(re.sub(r"<script>.*?</script>", "", html, flags=re.S), encoding="utf-8")
    off = colourful_pixels(chromium, bare)
    assert on > 2000 and on > 20 * (off + 1), (on, off)


def test_reports_render_in_chromium(chromium, tmp_path):
    lm = tiny_model("llama")
    tr = walklens.capture(lm, "the capital of france is paris")
    walks = {"none": walklens.encoding_walk(tr, k=5), "final": walklens.encoding_walk(tr, k=5, norm="final")}
    labels = labels_for(lm.tokenizer, sorted(set().union(*[set(w.label_ids()) for w in walks.values()])))
    enc = walk_report.build(walks, labels, "walk", figures=False).save(tmp_path / "walk")
    assert tr.tokens[4:] == [" is", " paris"]
    _check_page(chromium, enc, ["4: is →  paris", "cos(x, w_t+1) mean", "L1.resid_post"])

    dw = walklens.decoding_walk(lm, "the capital of", max_new_tokens=4, stop_at_eos=False)
    dec = generate_report.build(dw, "dec", figures=False).save(tmp_path / "dec")
    _check_page(chromium, dec, [f"0:{dw.tokens[0]}", "P(emitted token)"])

    maps = {
        "embed/cosine": walklens.similarity_map(tr, "embed", "cosine"),
        "final/dot": walklens.similarity_map(tr, "final", "dot"),
    }
    sim = simmap_report.build(maps, tr.tokens, "sim", figures=False).save(tmp_path / "sim")
    html = sim.read_text()
    dom = dump_dom(chromium, sim)
    assert dom.count('data-rendered="1"') == 2 == len(re.findall(r"<canvas [^>]*class=\"wl-canvas\"", dom))
    assert colourful_pixels(chromium, sim) > 2000
    assert "paris" in html  # token labels travel with the map


@pytest.mark.real
def test_real_demo_report_renders(chromium, tmp_path, smollm2):
    tr = walklens.capture(smollm2, "The capital of France is Paris")
    walks = {"final": walklens.encoding_walk(tr, k=5, norm="final", points="residual")}
    labels = labels_for(smollm2.tokenizer, walks["final"].label_ids())
    path = walk_report.build(walks, labels, "demo", figures=False).save(tmp_path / "demo")  # colour = JS only
    assert tr.tokens[3:] == [" France", " is", " Paris"]
    _check_page(chromium, path, ["4: is →  Paris", "3: France →  is"])
    # the nearest-token grid names " Paris" as the top token for " is" at the top of the stack
    assert re.search(r"<th>final</th>(<td[^>]*>[^<]*</td>){4}<td[^>]*>\s*Paris</td>", dump_dom(chromium, path))


def test_the_steering_runs_show_control_characters_escaped(chromium, tmp_path):
    """The steer report's table of runs is drawn by results.js from the embedded document: a prompt's NUL and
    ESC show as \\x00 and \\x1b (reports/html.py's visible()), and the page's source holds neither."""
    from walklens.reports import steer as steer_report

    sw = walklens.analyses.steering_sweep(
        tiny_model("llama"),
        ["the\x00 king\x1b"],
        " river",
        [[1]],
        alphas=[0.0, 4.0],
        methods=["eigen"],
        max_new_tokens=1,
    )
    page = steer_report.build(sw).save(tmp_path / "steer")
    dom = dump_dom(chromium, page)
    assert "the\\x00 king\\x1b" in dom and "\x00" not in dom and "\x1b" not in dom
    assert dom.count("<tr>") - page.read_text(encoding="utf-8").count("<tr>") == 1 + len(sw.rows)  # drawn by JS


# ---- model strings reach the page as text, never markup (tooltips too) -----------------------------------------------

EVIL = ["<img src=x onerror=\"document.title='pwned'\">", "</script><b>x</b>", "<filename>", "a&amp;b"]

# Appended after plots.js: once the page has loaded, move the mouse over every 4 px of every heatmap (cells are at
# least 4 px) and over every element, keep each tooltip's text and every element hovering added (tooltips set
# text only, so none), then report what the DOM holds.
_PROBE = """<script>
window.addEventListener("load", function () {
  var tips = [], added = [];  // every element that hovering puts into the page, even for a moment
  var note = function (ms) { ms.forEach(function (m) { m.addedNodes.forEach(function (n) {
    if (n.nodeType === 1) added.push(n.tagName); }); }); };
  var seen = new MutationObserver(note);
  seen.observe(document, {childList: true, subtree: true});
  document.querySelectorAll("canvas").forEach(function (c) {
    var r = c.getBoundingClientRect(), tip = c.parentNode.querySelector(".wl-tip");
    for (var y = 1; y < r.height; y += 4) for (var x = 1; x < r.width; x += 4) {
      c.dispatchEvent(new MouseEvent("mousemove", {clientX: r.left + x, clientY: r.top + y, bubbles: true}));
      if (tip.style.display === "block" && tips.indexOf(tip.textContent) < 0) tips.push(tip.textContent);
    }
  });
  document.querySelectorAll("body *").forEach(function (e) {
    e.dispatchEvent(new MouseEvent("mouseover", {bubbles: true}));
    e.dispatchEvent(new MouseEvent("mouseenter"));
  });
  setTimeout(function () {
    note(seen.takeRecords()); seen.disconnect();
    var svg = [];
    document.querySelectorAll("svg text, svg title").forEach(function (e) { svg.push(e.textContent); });
    var out = document.createElement("pre");
    out.id = "wl-probe";
    out.textContent = JSON.stringify({tips: tips, svg: svg, title: document.title, added: added,
                                imgs: document.querySelectorAll("img").length,
                                bold: document.querySelectorAll("b").length});
    document.body.appendChild(out);
  }, 500);
});
</script>"""


def hover_everything(chromium: str, page: Path) -> dict:
    """Load ``page`` with the probe above; returns tooltips, SVG texts, the title and the <img>/<b> counts."""
    import html as html_mod
    import json

    probed = page.with_name(page.stem + "_probe.html")
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    dom = dump_dom(chromium, probed)
    m = re.search(r'<pre id="wl-probe">(.*?)</pre>', dom, flags=re.S)
    assert m, dom[-2000:]
    return json.loads(html_mod.unescape(m.group(1)))


def test_model_strings_are_text_on_hover(chromium, tmp_path):
    """Token strings with markup (a token named ``<img onerror=...>``, ``</script>``, SmolLM2's ``<filename>``)
    are shown as text in the walk, simmap, power and generic reports: hovering every cell creates no element and runs
    no script, and the exact strings are in the tooltips and chart labels."""
    import dataclasses

    from walklens.reports.html import Report

    lm = tiny_model("llama")
    tr = walklens.capture(lm, "the capital of france is paris")
    n = len(tr.tokens)
    toks = [EVIL[i % len(EVIL)] for i in range(n)]
    walk = walklens.encoding_walk(tr, k=3, norm="final")
    walk = dataclasses.replace(walk, tokens=toks)
    labels = {i: EVIL[i % len(EVIL)] for i in walk.label_ids()}
    rep = walk_report.build({"final": walk}, labels, EVIL[0], EVIL[1], figures=False)
    pages = {"walk": rep.save(tmp_path / "w")}
    maps = {"embed/cosine": walklens.similarity_map(tr, "embed", "cosine")}
    pages["sim"] = simmap_report.build(maps, toks, EVIL[1], figures=False).save(tmp_path / "s")
    rep = Report(EVIL[0], EVIL[1]).h2(EVIL[0]).p(EVIL[1]).table(EVIL, [EVIL])
    rep.heatmap(
        [[0.1, 0.5], [0.9, None]],
        row_labels=EVIL[:2],
        col_labels=EVIL[2:],
        title=EVIL[3],
        hover=[[EVIL[0], EVIL[1]], [EVIL[2], EVIL[3]]],
        cell=20,
    )
    rep.lines(
        EVIL,
        [{"name": EVIL[0], "y": [1, 2, 3, 4]}, {"name": EVIL[1], "y": [2, 1, 0, 1], "dash": True}],
        title=EVIL[2],
        xlabel=EVIL[1],
    )
    pages["generic"] = rep.save(tmp_path / "g")
    from walklens.analyses.power import alignment, power_spectra
    from walklens.reports import power as power_report

    spectra = power_spectra(lm, nearest=4)
    al = alignment(lm, "the cat and the dog", spectra=spectra, n_random=8, n_shuffles=4)
    al.tokens = [[EVIL[i % len(EVIL)] for i in range(len(al.tokens[0]))]]
    for s in spectra.layers:  # the spectra table, drawn by results.js: each token as Python's repr writes it
        s.nearest = list(EVIL)
    pages["power"] = power_report.build(spectra, al).save(tmp_path / "p")
    import html as html_mod

    dom = html_mod.unescape(dump_dom(chromium, pages["power"]))
    assert all(repr(e) in dom for e in EVIL)
    for name, page in pages.items():
        got = hover_everything(chromium, page)
        figures = page.read_text(encoding="utf-8").count("<img class='wl' ")  # the report's own PNG figures
        assert got["added"] == [] and got["imgs"] == figures and got["bold"] == 0, (name, got["added"], got["tips"][:3])
        assert got["title"] != "pwned", name
        tips = "\n".join(got["tips"])
        shown = EVIL if name in ("generic", "power") else [show(e) for e in EVIL]  # walks show '\n' as \\n
        assert got["tips"] and all(e in tips for e in shown), (name, got["tips"][:3])
        if name == "generic":
            assert all(e in got["svg"] for e in EVIL) and got["title"] == EVIL[0], got
        if name == "walk":  # the nearest tokens of each cell, and the per-position curves' names
            assert repr(EVIL[0]) in tips and any(show(EVIL[1]) in s for s in got["svg"])
