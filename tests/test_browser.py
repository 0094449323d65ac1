"""The HTML reports render in a real browser: headless Chromium loads the self-contained page (offline), the
inline script draws every plot, the screenshot is not blank and the token labels are in the rendered DOM.

Chromium is installed with apt-get when missing and we are root; otherwise these tests are skipped, saying so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import walklens
from walklens.reports.walks import decoding_walk_report, encoding_walk_report, similarity_report
from walklens.testing import tiny_model
from walklens.walks import labels_for

_BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _find() -> str | None:
    for name in _BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="session")
def chromium() -> str:
    path = _find()
    if path is None:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.skip("Chromium is not installed and cannot be installed here (needs root and apt-get): "
                        "apt-get install -y chromium")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        r = subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], capture_output=True, text=True,
                           timeout=1200, env=env)
        if r.returncode != 0:  # stale package lists: refresh once
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600, env=env)
            r = subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], capture_output=True, text=True,
                               timeout=1200, env=env)
        path = _find()
        if path is None:
            pytest.skip(f"Chromium could not be installed with apt-get: {r.stderr.strip()[-300:]}")
    return path


def _run(chromium: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={tmp / 'profile'}", "--virtual-time-budget=5000", *args]
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
    n_plots = len(re.findall(r"class='wl-(heatmap|lines)'", html))
    assert n_plots > 0
    dom = dump_dom(chromium, path)
    assert re.search(r"<body[^>]*data-plots-rendered=\"1\"", dom)
    assert dom.count('data-rendered="1"') == n_plots  # every plot was drawn
    assert len(re.findall(r"<canvas [^>]*class=\"wl-canvas\"", dom)) == len(re.findall(r"class='wl-heatmap'", html))
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
    enc = encoding_walk_report(walks, labels, "walk", figures=False).save(tmp_path / "walk")
    assert tr.tokens[4:] == [" is", " paris"]
    _check_page(chromium, enc, ["4: is →  paris", "cos(x, w_t+1) mean", "L1.resid_post"])

    dw = walklens.decoding_walk(lm, "the capital of", max_new_tokens=4, stop_at_eos=False)
    dec = decoding_walk_report(dw, "dec", figures=False).save(tmp_path / "dec")
    _check_page(chromium, dec, [f"0:{dw.tokens[0]}", "P(emitted token)"])

    maps = {"embed/cosine": walklens.similarity_map(tr, "embed", "cosine"),
            "final/dot": walklens.similarity_map(tr, "final", "dot")}
    sim = similarity_report(maps, tr.tokens, "sim", figures=False).save(tmp_path / "sim")
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
    path = encoding_walk_report(walks, labels, "demo", figures=False).save(tmp_path / "demo")  # colour = JS only
    assert tr.tokens[3:] == [" France", " is", " Paris"]
    _check_page(chromium, path, ["4: is →  Paris", "3: France →  is"])
    # the nearest-token grid names " Paris" as the top token for " is" at the top of the stack
    assert re.search(r"<th>final</th>(<td[^>]*>[^<]*</td>){4}<td[^>]*>\s*Paris</td>", dump_dom(chromium, path))
