"""Every result in a notebook: ``_repr_html_`` draws its report's view, offline, isolated and bounded in size.

A result names its view (:class:`walklens.base.display.Shown`); :data:`VIEWS` maps the name to the report builder
that draws the result (the same builders as the commands' pages and the explorer: no second drawing code).
Importing this module registers :func:`html` as the renderer of every view of :data:`VIEWS` with the display
protocol (:func:`walklens.base.display.register_view`): the results never import it, the package root does.
:func:`html` wraps the page in its own frame:

- **offline**: the page is one document with its scripts and images inline (:meth:`Report.render`); nothing
  is fetched, no require.js, no CDN; figures that only repeat an interactive view are left out (their PNG is
  a file of the command's report, not of a notebook);
- **isolated**: the page is the ``srcdoc`` of a sandboxed iframe (``allow-scripts`` only: no access to the
  notebook, its cookies or its kernel), so any number of views in one notebook run on their own;
- **kept**: the output is plain HTML stored in the notebook, so a saved notebook reopened without a kernel
  and nbconvert's HTML export show the same view (a frontend that strips iframes from untrusted output
  still shows the caption line);
- **bounded**: a page over :data:`LIMIT_MB` is replaced by a summary (the text repr) with a note, so a
  notebook never grows by hundreds of MB; :func:`save` writes the full report instead.

Every string from a model or a text reaches the page escaped (:mod:`walklens.reports.html`), and the page
reaches the ``srcdoc`` attribute escaped once more; a name holding a lone surrogate shows as ``\\udcff``
(:func:`walklens.base.errors.displayable`), so the output is always UTF-8.
"""

from __future__ import annotations

import html as _html
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..base.display import displayable_copy, headline, register_view, text
from ..base.errors import displayable
from . import generate, heads, kernels, parity, parts, patching, power, simmap, steer, walk
from .html import Report, inline_only

LIMIT_MB = 5.0  #: the largest view a notebook holds (MB of HTML); over it, a summary with a note
HEIGHT = 560  #: the frame's height (px) until the page reports its own


def _titled(title: str, add: Callable[[Report], Any]) -> Report:
    rep = Report(title)
    add(rep)
    return rep


def _head_stats(st: Any) -> Report:
    return _titled(f"Per-head filters of {st.stack or 'the model'}", lambda r: heads.add_head_stats(r, st))


#: view name -> the builder that draws a result of that view
VIEWS: dict[str, Callable[[Any], Report]] = {
    "trace": parts.trace,
    "walk": lambda w: walk.build({w.norm: w}, w.labels, f"Encoding walk of {w.model_name}", figures=False),
    "target": lambda a: _titled(f"{a.token!r} through {a.model_name}", lambda r: walk.add_answers(r, [a])),
    "decoding": lambda dw: generate.build(dw, "Decoding walk", figures=False),
    "similarity": lambda m: simmap.build(
        {simmap.key(m.point, m.metric, m.normed): m.plain()},
        m.tokens,
        f"Similarity map of {m.model_name}",
        figures=False,
    ),
    "similarity_pair": lambda p: simmap.build_pair(
        {simmap.key(p.a.point, p.a.metric, p.a.normed): p.a.plain()},
        p.a.tokens,
        {simmap.key(p.b.point, p.b.metric, p.b.normed): p.b.plain()},
        p.b.tokens,
        f"Similarity maps of {p.a.model_name}: {p.names[0]} and {p.names[1]}",
        names=p.names,
        figures=False,
    ),
    "head_matrices": parts.head_matrices,
    "identity": lambda r: _titled("The A.3 identity", lambda rep: heads.add_identity(rep, r)),
    "cluster": lambda v: _titled("Cluster & aggregate (A.3)", lambda rep: heads.add_cluster_views(rep, [v])),
    "self_mass": lambda sm: _titled("Self-attention mass", lambda rep: heads.add_self_mass(rep, sm)),
    "head_stats": _head_stats,
    "kernels": lambda pk: kernels.build(pk, "Position kernels"),
    "spectra": lambda s: _titled(f"Power-method view of {s.model_name}", lambda r: power.add_spectra(r, s)),
    "alignment": lambda a: _titled("Alignment with v1", lambda r: power.add_alignment(r, a)),
    "dynamics": lambda d: _titled("Idealised dynamics", lambda r: power.add_dynamics(r, d)),
    "shared_weights": lambda s: _titled("Shared weights", lambda r: power.add_shared(r, s)),
    "steering_sweep": lambda s: steer.build(s),  # SteeringSweep: the `walklens steer` sweep
    "steering_edit": parts.steer_result,  # SteerResult: what one `steer(...)` context edited
    "parity": lambda c: parity.build(c),
    "compacted_text": parts.compacted,  # Compacted: a text compacted into concept vectors
    "compaction_explained": parts.compaction,  # CompactionReport: neighbours and the continuation scored
    "control_vector": parts.control_vector,
    "blocks": parts.blocks,
    "cooccurrence": parts.cooccurrence,
    "patching": patching.build,  # PatchResult: an activation, attribution or path patching grid
    "walk_beside": patching.build_beside,  # WalkBeside: the walk beside the test
}

#: posts the page's height to the notebook, which sizes the frame (only that frame: the message's source)
_SIZE_PAGE = (
    "<script>(function(){function s(){parent.postMessage({walklens:'height',h:document.documentElement"
    ".scrollHeight},'*')}addEventListener('load',s);if(window.ResizeObserver)new ResizeObserver(s)"
    ".observe(document.body)})();</script>"
)
_SIZE_FRAME = (
    "<script>(function(){var f=document.getElementById('%s');addEventListener('message',function(e){"
    "if(f&&e.source===f.contentWindow&&e.data&&e.data.walklens==='height')f.style.height="
    "Math.min(e.data.h+24,4000)+'px'})})();</script>"
)


def report(result: Any, inline: bool = True) -> Report:
    """The report of ``result``'s view (:data:`VIEWS`); ``inline``: leave out the figures a page would only link
    (:func:`walklens.reports.html.inline_only`)."""
    view = getattr(type(result), "_view", "")
    if view not in VIEWS:
        raise TypeError(f"{type(result).__name__} has no notebook view")
    result = displayable_copy(result)  # a name of undecodable bytes drawn as \\udcff (figures, tables, page)
    if not inline:
        return VIEWS[view](result)
    with inline_only():
        return VIEWS[view](result)


def page(result: Any) -> str:
    """The full page of ``result``'s view: one HTML document, everything inline."""
    return report(result).render().replace("</body>", _SIZE_PAGE + "</body>", 1)


def summary_page(result: Any, size_mb: float, limit_mb: float) -> str:
    """The page shown instead of a view over the limit: the text repr and a note saying how to see it all."""
    rep = Report(headline(result))
    rep.p(
        f"The full view would add {size_mb:.1f} MB to the notebook, over walklens.reports.notebook.LIMIT_MB = "
        f"{limit_mb:g}: this is its summary. walklens.reports.notebook.save(result, folder) writes the full report; "
        "raising LIMIT_MB "
        "shows it here.",
        note=True,
    )
    rep.raw(f"<pre>{_html.escape(text(result))}</pre>")
    return rep.render().replace("</body>", _SIZE_PAGE + "</body>", 1)


def html(result: Any, limit_mb: float | None = None) -> str:
    """``result``'s view as notebook output: a caption and a sandboxed frame holding :func:`page` (or
    :func:`summary_page` when the page is over ``limit_mb``, by default :data:`LIMIT_MB`)."""
    limit = LIMIT_MB if limit_mb is None else limit_mb
    doc = page(result)  # displayable already (Report.render)
    size = len(doc.encode()) / 1e6
    if size > limit:
        doc = summary_page(result, size, limit)
    fid = f"walklens-{uuid.uuid4().hex}"
    caption = _html.escape(displayable(headline(result)))
    return (
        f"<div class='walklens-view'><div style='font:12px monospace;color:#555'>{caption}</div>"
        f"<iframe id='{fid}' class='walklens-frame' sandbox='allow-scripts' title='{caption}' "
        f"style='width:100%;height:{HEIGHT}px;border:1px solid #ddd;resize:vertical' "
        f'srcdoc="{_html.escape(doc, quote=True)}"></iframe>{_SIZE_FRAME % fid}</div>'
    )


def save(result: Any, out_dir: str | Path) -> Path:
    """The full report of ``result``'s view written to ``out_dir`` (``index.html`` plus its files)."""
    return report(result, inline=False).save(out_dir)


def add_views(views: dict[str, Callable[[Any], Report]]) -> None:
    """Add ``views`` (view name -> report builder) and register :func:`html` as their renderer: how the lab's
    results (:mod:`walklens.lab.views`) get notebook views without the instrument importing the lab."""
    VIEWS.update(views)
    for name in views:
        register_view(name, html)


add_views(dict(VIEWS))


__all__ = ["HEIGHT", "LIMIT_MB", "VIEWS", "add_views", "html", "page", "report", "save", "summary_page"]
