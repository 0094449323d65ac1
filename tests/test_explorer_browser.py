"""`walklens serve` end to end in headless Chromium, driven by Playwright (issue 16).

One explorer is served from a thread for the module (two tiny random models and a small sweep database); the
browser reaches nothing but that server: every other request is blocked by Playwright's routing and recorded
(and any the page's Content-Security-Policy stopped first), and the tests assert there was none.  Each view
is screenshotted into the test's output folder; with ``WALKLENS_SCREENSHOTS=docs/explorer`` the same tests
run on smollm2-135m (and its bfloat16 copy for the compare view) and also write the screenshots there (the
ones docs/explorer.md shows).

Chromium is the system's, from the ``chromium`` fixture (tests/conftest.py: installed with apt-get when
missing and we are root); without it these tests are skipped, saying so.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _explorer import EVIL_GENERATION, EVIL_MODEL, EVIL_TEXT, TEST_TEXT, evil_card, sweep_db
from walklens.server.app import Running
from walklens.server.state import Cache, Explorer
from walklens.testing import tiny_model

SHOTS = os.environ.get("WALKLENS_SCREENSHOTS")  # a folder (relative to the repository) to keep screenshots in
REPO = Path(__file__).resolve().parent.parent

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.browser  # Chromium through Playwright


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The running explorer, its state and the text the tests type."""
    if SHOTS:
        import walklens

        models = {
            m.name: m
            for m in (walklens.load_model("smollm2-135m"), walklens.load_model("smollm2-135m", dtype="bfloat16"))
        }
        text = "The capital of France is Paris, and the capital of Italy is"
    else:
        models = {"llama": tiny_model("llama"), "gpt2": tiny_model("gpt2")}
        text = TEST_TEXT
    tmp = tmp_path_factory.mktemp("explorer")
    db = sweep_db(tmp / "results.sqlite")
    explorer = Explorer(models, db, cards=[("card.json", evil_card(tmp))])
    with Running(explorer) as srv:
        yield srv, explorer, text


@pytest.fixture(scope="module")
def browser(chromium):
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


class Page:
    """A fresh browser context whose requests may reach only the explorer; everything else is aborted and
    recorded in ``blocked``.  ``requests``: every URL asked; ``errors``: uncaught script errors; ``dialogs``:
    alert/confirm texts (a script injected through data would typically raise one)."""

    def __init__(self, browser, srv, out: Path) -> None:
        self.origin = srv.url.split("/?")[0]
        self.ctx = browser.new_context(viewport={"width": 1300, "height": 900})
        self.blocked: list[str] = []
        self.requests: list[str] = []
        self.failed: list[tuple[str, str]] = []
        self.ctx.route("**/*", self._route)
        # the page's Content-Security-Policy stops a request to another origin before it is made: record those too
        self.ctx.add_init_script(
            "window.__violations = []; document.addEventListener('securitypolicyviolation', "
            "e => window.__violations.push(e.blockedURI + ' ' + e.violatedDirective));"
        )
        self.page = self.ctx.new_page()
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(f"{e}\n{e.stack or ''}"))  # the stack says where
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on("requestfailed", lambda r: self.failed.append((r.url, r.failure or "")))
        self.page.set_default_timeout(180_000)
        self.out = out
        self.page.goto(srv.url)
        self.page.wait_for_selector("body[data-ready='1']")

    def _route(self, route) -> None:
        url = route.request.url
        self.requests.append(url)
        if url.startswith(self.origin + "/"):
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort()

    def view(self, name: str, ready: str) -> None:
        """Switch to a view and wait for ``ready`` (a selector) to appear."""
        self.page.click(f"#tabs button[data-view={name}]")
        self.page.wait_for_selector(ready)

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(self.out / f"{name}.png"), full_page=True)
        if SHOTS:
            folder = REPO / SHOTS
            folder.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(folder / f"{name}.png"), full_page=True)

    def offline(self) -> None:
        """Nothing but the explorer was asked for, and nothing was stopped by the page's policy either."""
        assert self.blocked == [] and self.page.evaluate("window.__violations") == []
        assert self.requests and all(u.startswith(self.origin + "/") for u in self.requests)

    def type_and_run(self, text: str) -> None:
        self.page.fill("#text", text)
        self.page.click("#run")

    def coloured(self, selector: str) -> int:
        """Pixels of clearly saturated colour in a canvas (heatmap cells; labels are grey)."""
        return self.page.evaluate(
            """sel => { const c = document.querySelector(sel);
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
            for (let i = 0; i < d.length; i += 4) {
              const hi = Math.max(d[i], d[i + 1], d[i + 2]), lo = Math.min(d[i], d[i + 1], d[i + 2]);
              if (hi - lo > 64) n++; }
            return n; }""",
            selector,
        )

    def close(self) -> None:
        self.ctx.close()


@pytest.fixture
def page(browser, served, tmp_path):
    p = Page(browser, served[0], tmp_path)
    yield p
    p.close()


def test_every_view_in_the_browser(page, served):
    """Type a text, see the heatmap, click a cell and see its neighbours, then every view: decoding walk (step
    through it), similarity map, attention (click a layer x head cell) and position kernels, power and the
    steering playground, the sweeps of the database (filter by a parameter), and two models compared."""
    srv, explorer, text = served
    pg = page.page
    explorer.results = Cache(16)  # nothing kept: the page's first walk of this text paints twice
    pg.evaluate(  # record what the map shows first: the provisional screen, marked as such
        "() => { window.__paints = []; new MutationObserver(() => window.__paints.push("
        "[document.getElementById('walk-map').getAttribute('data-provisional'), "
        "document.getElementById('walk-echo').textContent.startsWith('PROVISIONAL')])).observe("
        "document.getElementById('walk-map'), {attributes: true, attributeFilter: ['data-provisional']}); }"
    )
    page.type_and_run(text)
    pg.wait_for_function("t => document.getElementById('walk-echo').textContent.endsWith(t)", arg=text)
    pg.wait_for_selector("#walk-map[data-provisional='0']")  # the exact map has replaced the provisional one
    assert not pg.text_content("#walk-echo").startswith("PROVISIONAL")
    paints = pg.evaluate("() => window.__paints")  # (the page's own first text may finish first: exact)
    assert ["1", True] in paints and paints[-1] == ["0", False]  # provisional and labelled, then exact
    first = next(iter(explorer.models))
    n_tokens = len(explorer.models[first].tokenizer(text)["input_ids"])
    n_rows = explorer.models[first].n_layers + 2
    assert page.coloured("#walk-map canvas.wl-canvas") > 50 * n_tokens
    geo = pg.eval_on_selector(
        "#walk-map .wl-heatmap",
        "e => [e.dataset.left, e.dataset.top, e.dataset.cell, e.dataset.rows, e.dataset.cols].map(Number)",
    )
    left, top, cell, rows, cols = geo
    assert (rows, cols) == (n_rows, n_tokens)
    row, col = rows - 2, 2  # the last layer's output, position 2
    pg.locator("#walk-map canvas.wl-canvas").click(
        position={"x": left + (col + 0.5) * cell, "y": top + (row + 0.5) * cell}
    )
    pg.wait_for_selector("#walk-neighbours")
    heading = pg.text_content("#walk-cell h3")
    assert heading.startswith(f"L{n_rows - 3}.resid_post, position 2: w_t = ")
    assert pg.locator("#walk-neighbours tr").count() == 1 + 10  # header + k = 10 nearest tokens
    page.shot("walk")

    page.view("decode", "#decode-strip button")
    pg.click("#decode-strip button:nth-of-type(3)")
    pg.wait_for_function(
        "() => ((document.querySelector('#decode-out h3') || {}).textContent || '').startsWith('step 2:')"
    )
    assert pg.locator("#decode-out table tr").count() == 11
    page.shot("decode")

    page.view("simmap", "#simmap-out canvas.wl-canvas")
    assert page.coloured("#simmap-out canvas.wl-canvas") > 50 * n_tokens
    page.shot("simmap")

    page.view("attention", "#attn-members")
    pg.click("#kernels-run")
    pg.wait_for_selector("#kernels-out canvas.wl-canvas")
    maps = pg.locator("#attention-out .side-by-side canvas.wl-canvas")
    assert maps.count() == 4
    hm = pg.eval_on_selector(
        "#attention-out .side-by-side .wl-heatmap", "e => [e.dataset.left, e.dataset.top, e.dataset.cell].map(Number)"
    )
    maps.first.click(position={"x": hm[0] + 1.5 * hm[2], "y": hm[1] + 0.5 * hm[2]})  # layer 0, head 1
    pg.wait_for_function(
        "() => ((document.querySelector('#attention-out h3') || {}).textContent || '').startsWith('layer 0, head 1')"
    )
    page.shot("attention")

    page.view("power", "#power-out svg")
    pg.fill("#steer-target", " London" if SHOTS else " paris")
    pg.fill("#steer-layers", "12" if SHOTS else "1")
    pg.fill("#steer-alpha", "-1000" if SHOTS else "100")
    pg.click("#steer-run")
    pg.wait_for_selector("#steer-steered")
    assert pg.text_content("#steer-unsteered").startswith(text)
    assert pg.text_content("#steer-steered").startswith(text)
    page.shot("power")

    page.view("sweeps", "#sweeps-top")
    assert EVIL_MODEL in pg.text_content("#sweeps-run option")
    assert "18 of 18 schemes match" in pg.text_content("#sweeps-out h3")
    pg.select_option("#sweeps-filters select[data-param=layer]", "E")
    pg.wait_for_function(
        "() => ((document.querySelector('#sweeps-out h3') || {}).textContent || '').startsWith('6 of 18')"
    )
    assert pg.locator("#sweeps-top tr").count() == 1 + 6
    assert all("layer=E," in t for t in pg.locator("#sweeps-top td:nth-child(2)").all_text_contents())
    page.shot("sweeps")

    page.view("compare", "#compare-out table")
    assert pg.locator("#compare-out canvas.wl-canvas").count() == 2
    names = pg.locator("#compare-out td:first-child").all_text_contents()
    assert names == list(explorer.models)
    page.shot("compare")

    assert page.errors == [] and page.dialogs == []
    page.offline()


def test_markup_from_the_user_or_the_database_renders_as_text(page):
    """``</script><img src=x onerror=...>`` typed as the text, and a database model name with an <img onerror>,
    show as text: no element is created, no script runs (window.__pwned stays undefined), no dialog opens."""
    pg = page.page
    page.type_and_run(EVIL_TEXT)
    pg.wait_for_function("t => document.getElementById('walk-echo').textContent.endsWith(t)", arg=EVIL_TEXT)
    assert pg.get_by_text(EVIL_TEXT).is_visible()
    page.view("decode", "#decode-strip button")
    page.view("sweeps", "#sweeps-top")
    assert EVIL_MODEL in pg.text_content("#sweeps-run option")
    # a steering card whose model name and first example continuation are markup: its report's parts drawn
    page.view("cards", "#cards-out[data-rendered='1']")
    assert EVIL_MODEL in pg.text_content("#cards-card option")
    assert pg.get_by_text(EVIL_GENERATION).count() == 2  # the prompt and the continuation, as table cells' text
    assert pg.locator("#cards-out .wl-lines svg").count() == 12 and pg.locator("#cards-out table").count() >= 7
    page.shot("cards")
    page.view("walk", "#walk-map canvas.wl-canvas")
    assert pg.evaluate("window.__pwned") is None
    assert pg.locator("img").count() == 0 and pg.locator("main script, header script").count() == 0
    assert page.dialogs == [] and page.errors == []
    page.offline()


def test_an_abort_while_the_answer_is_read_rejects_and_never_draws(page):
    """A request superseded while its answer's body is being read rejects with the AbortError (which the views
    ignore: the newer request draws); it never resolves with a stand-in answer a view would try to draw. A body
    that is not JSON is an error on the status line."""
    # the page's own first requests (walk, sweeps) also write the status line when they end: let them end first
    page.page.wait_for_load_state("networkidle")
    call = """async (error) => {
      const real = window.fetch;
      window.fetch = async () => ({ok: true, status: 200, json: () => Promise.reject(new DOMException("x", error))});
      try { return "resolved " + JSON.stringify(await walklens.call("t", "/api/info")); }
      catch (e) { return "rejected " + e.name + ": " + e.message; }
      finally { window.fetch = real; }
    }"""
    assert page.page.evaluate(call, "AbortError") == "rejected AbortError: x"
    assert page.page.evaluate(call, "SyntaxError") == "rejected Error: HTTP 200: the answer is not JSON"
    assert page.page.text_content("#status") == "t: HTTP 200: the answer is not JSON"
    assert page.errors == [] and page.dialogs == []


def test_the_exact_rows_replace_the_provisional_ones_piece_by_piece(page, served, monkeypatch):
    """One walk point per piece: the provisional map has every walk point's row at once; each piece's exact rows
    replace the provisional ones in place (the map keeps its rows, the count of exact rows grows by one), and the
    whole walk makes it exact."""
    from walklens.server import api_walks

    srv, explorer, _ = served
    pg = page.page
    pg.wait_for_selector("#walk-map[data-provisional='0']")  # the page's first walk is done, exact
    monkeypatch.setattr(api_walks, "PIECE_POINTS", 1)
    pieces: list[str] = []
    pg.on("request", lambda r: pieces.append(r.post_data) if '"piece":' in (r.post_data or "") else None)
    pg.evaluate(
        "() => { window.__maps = []; const m = document.getElementById('walk-map'); new MutationObserver(() => "
        "window.__maps.push([m.getAttribute('data-provisional'), Number(m.getAttribute('data-exact-rows')), "
        "Number(m.querySelector('.wl-heatmap').dataset.rows)])).observe(m, {attributes: true, "
        "attributeFilter: ['data-exact-rows']}); }"
    )
    page.type_and_run("paris is the capital of france")  # a text no other test asks for: nothing kept
    pg.wait_for_function("() => window.__maps.some(x => x[0] === '1') && window.__maps.at(-1)[0] === '0'")
    maps = pg.evaluate("() => window.__maps")
    P = next(iter(explorer.models.values())).n_layers + 2
    assert {rows for *_, rows in maps} == {P}  # every walk point's row from the first paint on
    exact = [n for prov, n, _ in maps if prov == "1"]
    assert sorted(set(exact)) == list(range(P + 1)) and exact == sorted(exact)  # one more exact row per piece
    assert maps[-1] == ["0", P, P] and len(pieces) == P
    assert page.errors == []


def test_a_superseded_request_is_aborted(page, served):
    """Two runs in a row: the first walk request is aborted by the page (AbortController), the second renders."""
    pg = page.page
    pg.wait_for_selector("#walk-map[data-provisional='0']")  # the page's first walk is done, its pieces too
    a, b = "the city of london", "the king and the queen"
    pg.evaluate(
        """([a, b]) => { const W = window.walklens;
        W.$('text').value = a; W.run(); W.$('text').value = b; W.run(); }""",
        [a, b],
    )
    pg.wait_for_function("t => document.getElementById('walk-echo').textContent.endsWith(t)", arg=b)
    aborted = [u for u, why in page.failed if u.endswith("/api/walk") and "ABORTED" in why]
    assert len(aborted) == 1, page.failed
    assert a not in pg.text_content("#walk-echo")


def test_run_replaces_the_run_due_after_typing(page):
    """Typing and then pressing Run runs the view once: the run due after the typing pause (700 ms) is dropped.
    Before, it ran again and redrew whatever the user had moved on to (it reset the decoding walk's step)."""
    pg = page.page
    pg.wait_for_selector("#walk-map canvas.wl-canvas")  # the page's first walk is done
    walks: list[str] = []  # the runs: each starts with its provisional request (then its pieces, then the whole)
    pg.on(
        "request",
        lambda r: (
            walks.append(r.url) if r.url.endswith("/api/walk") and '"provisional":true' in (r.post_data or "") else None
        ),
    )
    text = "the king and the queen"
    page.type_and_run(text)
    pg.wait_for_function("t => document.getElementById('walk-echo').textContent.endsWith(t)", arg=text)
    pg.wait_for_timeout(1500)  # past the typing pause
    assert len(walks) == 1, walks


# ---- one document, one script: the explorer draws a result as its report does ----------------------------------------

LABELS = [
    "",
    " the",
    "\n",
    "a\tb\r",
    "it's",
    'say "hi"',
    'it\'s "x"',
    "back\\slash",
    "\x00\x1b\x7f",
    "\x85\xa0",
    "é ü",
    "\u200b\u2028\u00ad",
    "😀",
    "\U000e0001",
    "<img src=x>",
]


def test_the_page_labels_tokens_as_the_reports_do(page):
    """The documents carry tokens as they are; the page shows them with results.js's show/visible, which must
    write what reports/html.py's show/visible write (Python's repr rules)."""
    from walklens.reports.html import show, visible

    got = page.page.evaluate("ss => ss.map(s => [walklensResults.show(s), walklensResults.visible(s)])", LABELS)
    assert got == [[show(s), visible(s)] for s in LABELS]


def test_the_power_view_and_the_report_draw_the_same_document(page, served, browser, monkeypatch):
    """A curve added to the alignment's document (one line, ALIGNMENT_CURVES) is drawn by the explorer's power
    view and by the power report's page, with the same numbers: both run results.js on the same document."""
    import walklens
    from walklens.reports import power as power_report
    from walklens.server.api_power import N_RANDOM, N_SHUFFLES

    monkeypatch.setattr(
        power_report, "ALIGNMENT_CURVES", (*power_report.ALIGNMENT_CURVES, {"name": "planted curve", "y": "std"})
    )
    srv, explorer, text = served
    pg = page.page
    page.type_and_run(text)
    page.view("power", "#power-out svg")
    pg.wait_for_function("() => document.getElementById('power-out').getAttribute('data-rendered') === '1'")
    charts = "es => es.map(e => JSON.parse(e.getAttribute('data-spec')))"
    live = pg.eval_on_selector_all("#power-out .wl-lines", charts)[:3]  # the alignment at its three kinds of point

    lm = next(iter(explorer.models.values()))
    spectra = walklens.power_spectra(lm, heads=False, nearest=8)
    al = walklens.alignment(lm, text, spectra=spectra, n_random=N_RANDOM, n_shuffles=N_SHUFFLES)
    ctx = browser.new_context()
    report = ctx.new_page()
    report.set_content(power_report.build(spectra, al).render())
    report.wait_for_selector(".wl-result[data-result=alignment][data-drawn]")
    drawn = report.eval_on_selector_all(".wl-result[data-result=alignment] .wl-lines", charts)
    ctx.close()
    assert len(live) == len(drawn) == 3
    for a, b in zip(live, drawn):
        assert [s["name"] for s in a["series"]] == [s["name"] for s in b["series"]]
        assert a["series"][-1]["name"] == "planted curve" and a["x"] == b["x"]
        for sa, sb in zip(a["series"], b["series"]):
            assert sa["y"] == pytest.approx(sb["y"], abs=1e-5), sa["name"]
    assert page.errors == [] and page.dialogs == []
