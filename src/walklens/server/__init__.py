"""``walklens serve``: the explorer in the browser, a local web app over the analyses.

The server is a top layer like :mod:`walklens.cli` (which starts it): it loads the models once, captures on
request and calls the analyses (:mod:`walklens.analyses.walks`, :mod:`~walklens.analyses.decoding`,
:mod:`~walklens.analyses.attention`,
:mod:`~walklens.analyses.kernels`, :mod:`~walklens.analyses.power`, :mod:`~walklens.analyses.steering`, the sweep
statistics of
:mod:`walklens.analyses.concepts`); it never re-implements one.  Modules, one job each:

- :mod:`.security` -- the guard every request passes: token, Host header (DNS rebinding), body size, headers;
- :mod:`.bounds` -- argument limits with clear JSON errors, and the reductions that bound every payload;
- :mod:`.state` -- models, per-model locks, caches, jobs cancelled when their client leaves;
- :mod:`.traces` -- the captures the views read, cached;
- :mod:`.routing` -- JSON in, JSON out, errors as ``{"error": ...}``;
- :mod:`.api_walks`, :mod:`.api_heads`, :mod:`.api_power`, :mod:`.api_sweeps` -- one module per group of views;
- :mod:`.app` -- the Starlette app, the page and its assets (``static/``, no build step, nothing from the
  network), and :func:`~.app.serve` on uvicorn.

docs/explorer.md describes the views, the security model and the measured payload sizes.
"""
