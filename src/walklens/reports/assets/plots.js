// walklens inline plots: heatmaps on <canvas> with a hover tooltip, and SVG line charts. No network, no CDN.
// The one heatmap renderer of the report pages and the explorer: nothing else draws on a canvas
// (tests/test_schemas.py checks); a heatmap's geometry answers which cell a pointer is on and marks cells.
// Every label, tooltip and legend comes from a model, a text or a database: it is inserted with textContent
// (or drawn on the canvas), never parsed as markup.
(function () {
  var SVG = "http://www.w3.org/2000/svg";
  function node(parent, tag, attrs, text) { // an SVG element with attributes and (plain) text
    var e = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, String(attrs[k])); });
    if (text !== undefined && text !== null) e.textContent = String(text);
    parent.appendChild(e);
    return e;
  }
  function colour(v, lo, hi, diverging) {
    var t = hi > lo ? (v - lo) / (hi - lo) : 0.5;
    t = Math.max(0, Math.min(1, t));
    if (diverging) { // blue - white - red
      var r = t < 0.5 ? Math.round(255 * t * 2) : 255, b = t > 0.5 ? Math.round(255 * (1 - t) * 2) : 255;
      var g = Math.round(255 * (1 - Math.abs(t - 0.5) * 2));
      return "rgb(" + r + "," + g + "," + b + ")";
    }
    // viridis-like ramp
    var stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
    var x = t * (stops.length - 1), i = Math.min(stops.length - 2, Math.floor(x)), f = x - i;
    var c = stops[i].map(function (s, k) { return Math.round(s + f * (stops[i + 1][k] - s)); });
    return "rgb(" + c.join(",") + ")";
  }
  // the colour bar under a heatmap: the ramp from lo to hi with both ends (and 0 when diverging) written, and
  // spec.legend (what the colours mean, e.g. the sign of a score) beside it as plain text
  function colourBar(el, lo, hi, spec) {
    var bar = document.createElement("canvas"), n = 200;
    bar.className = "wl-colourbar"; bar.width = n + 20; bar.height = 30;
    el.appendChild(bar);
    var b = bar.getContext("2d");
    b.fillStyle = "#fff"; b.fillRect(0, 0, bar.width, bar.height);
    for (var k = 0; k < n; k++) {
      b.fillStyle = colour(lo + (hi - lo) * k / (n - 1), lo, hi, spec.diverging); b.fillRect(10 + k, 2, 1, 12);
    }
    b.fillStyle = "#222"; b.font = "10px sans-serif"; b.textBaseline = "top";
    var num = function (x) { return isFinite(x) ? Number(x).toPrecision(3) : "-"; };
    b.textAlign = "left"; b.fillText(num(lo), 10, 17);
    b.textAlign = "right"; b.fillText(num(hi), 10 + n, 17);
    if (spec.diverging) { b.textAlign = "center"; b.fillText("0", 10 + n / 2, 17); }
    if (spec.legend) {
      var note = document.createElement("span"); note.className = "wl-legend";
      note.textContent = " " + spec.legend; el.appendChild(note);
    }
  }
  // column and row labels: every label when cells are 12 px or more, else every step-th (about one per 12 px)
  function labelStep(cell) { return Math.max(1, Math.ceil(12 / cell)); }
  function heatmap(el) {
    var spec = JSON.parse(el.getAttribute("data-spec"));
    var z = spec.z, rows = z.length, cols = rows ? z[0].length : 0;
    var cell = spec.cell || Math.max(4, Math.min(28, Math.floor(900 / Math.max(cols, 1))));
    var left = spec.row_labels ? 130 : 10, top = spec.col_labels ? 90 : 10;
    var canvas = document.createElement("canvas");
    canvas.width = left + cols * cell + 10; canvas.height = top + rows * cell + 10;
    canvas.className = "wl-canvas";
    el.appendChild(canvas);
    var ctx = canvas.getContext("2d");
    var lo = Infinity, hi = -Infinity;
    z.forEach(function (r) { r.forEach(function (v) { if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); } }); });
    if (spec.vmin !== undefined && spec.vmin !== null) lo = spec.vmin;
    if (spec.vmax !== undefined && spec.vmax !== null) hi = spec.vmax;
    if (spec.diverging) { var m = Math.max(Math.abs(lo), Math.abs(hi)); lo = -m; hi = m; }
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    for (var i = 0; i < rows; i++) for (var j = 0; j < cols; j++) {
      var v = z[i][j];
      ctx.fillStyle = v === null ? "#ddd" : colour(v, lo, hi, spec.diverging);
      ctx.fillRect(left + j * cell, top + i * cell, cell, cell);
    }
    var step = labelStep(cell);
    ctx.fillStyle = "#222"; ctx.font = Math.min(12, Math.max(9, cell * step - 3)) + "px sans-serif";
    if (spec.row_labels) { ctx.textAlign = "right"; ctx.textBaseline = "middle";
      spec.row_labels.forEach(function (s, i) { if (i % step === 0) ctx.fillText(s, left - 4, top + i * cell + cell / 2); }); }
    if (spec.col_labels) { ctx.textAlign = "left"; ctx.textBaseline = "middle";
      spec.col_labels.forEach(function (s, j) { if (j % step === 0) { ctx.save();
        ctx.translate(left + j * cell + cell / 2, top - 4); ctx.rotate(-Math.PI / 3); ctx.fillText(s, 0, 0); ctx.restore(); } }); }
    colourBar(el, lo, hi, spec);
    var tip = document.createElement("div"); tip.className = "wl-tip"; el.appendChild(tip);
    canvas.addEventListener("mousemove", function (e) {
      var r = canvas.getBoundingClientRect(), x = e.clientX - r.left - left, y = e.clientY - r.top - top;
      var j = Math.floor(x / cell), i = Math.floor(y / cell);
      if (i < 0 || j < 0 || i >= rows || j >= cols) { tip.style.display = "none"; return; }
      var txt = (spec.row_labels ? spec.row_labels[i] : i) + " / " + (spec.col_labels ? spec.col_labels[j] : j) +
        ": " + (z[i][j] === null ? "-" : Number(z[i][j]).toPrecision(4));
      if (spec.hover) txt += "\n" + spec.hover[i][j];
      tip.textContent = txt; tip.style.display = "block";
      tip.style.left = (e.clientX - el.getBoundingClientRect().left + 12) + "px";
      tip.style.top = (e.clientY - el.getBoundingClientRect().top + 12) + "px";
    });
    canvas.addEventListener("mouseleave", function () { tip.style.display = "none"; });
    var geo = {canvas: canvas, left: left, top: top, cell: cell, rows: rows, cols: cols};
    ["left", "top", "cell", "rows", "cols"].forEach(function (k) { el.setAttribute("data-" + k, geo[k]); });
    geo.at = function (ev) {  // the cell under a mouse event, or null
      var r = canvas.getBoundingClientRect();
      var j = Math.floor((ev.clientX - r.left - left) / cell), i = Math.floor((ev.clientY - r.top - top) / cell);
      return (i < 0 || j < 0 || i >= rows || j >= cols) ? null : {row: i, col: j};
    };
    geo.mark = function (i, j, colour, dot) {  // a box (or a dot) on cell (i, j)
      var x = left + j * cell, y = top + i * cell;
      ctx.strokeStyle = colour; ctx.fillStyle = colour; ctx.lineWidth = 2;
      if (dot) { ctx.beginPath(); ctx.arc(x + cell / 2, y + cell / 2, Math.max(1.5, cell / 6), 0, 7); ctx.fill(); }
      else ctx.strokeRect(x + 1, y + 1, cell - 2, cell - 2);
    };
    el.setAttribute("data-rendered", "1");
    return geo;
  }
  function lines(el) {
    var spec = JSON.parse(el.getAttribute("data-spec"));
    var W = spec.width || 640, H = spec.height || 300, L = 50, R = 150, T = 10, B = 40;
    var xs = spec.x, lo = Infinity, hi = -Infinity;
    spec.series.forEach(function (s) { s.y.forEach(function (v, k) { if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
      if (s.band) { lo = Math.min(lo, s.band[0][k]); hi = Math.max(hi, s.band[1][k]); } }); });
    if (!(hi > lo)) { hi = lo + 1; }
    var n = xs.length, sx = function (i) { return L + (n > 1 ? i * (W - L - R) / (n - 1) : 0); };
    var sy = function (v) { return T + (H - T - B) * (1 - (v - lo) / (hi - lo)); };
    var palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
    var svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", H); svg.setAttribute("class", "wl-svg");
    node(svg, "line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#444"});
    node(svg, "line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#444"});
    [lo, (lo + hi) / 2, hi].forEach(function (v) {
      node(svg, "text", {x: L - 4, y: sy(v), "font-size": 10, "text-anchor": "end"}, Number(v).toPrecision(3)); });
    var step = Math.max(1, Math.ceil(n / 12));
    xs.forEach(function (x, i) { if (i % step === 0)
      node(svg, "text", {x: sx(i), y: H - B + 14, "font-size": 10, "text-anchor": "middle"}, x); });
    if (spec.xlabel) node(svg, "text", {x: (L + W - R) / 2, y: H - 6, "font-size": 11, "text-anchor": "middle"}, spec.xlabel);
    var marks = spec.marks || [], below = T + 14 * (spec.series.length + 1) + 6;
    marks.forEach(function (m, k) {  // a dashed vertical line at x index m.at, named in the legend under the series
      var c = m.color || "#555", x = sx(m.at), y = below + 14 * k;
      var line = node(svg, "line", {x1: x, x2: x, y1: T, y2: H - B, stroke: c, "stroke-width": 1.5,
        "stroke-dasharray": "5 3", "class": "wl-mark"});
      node(line, "title", {}, m.name);
      node(svg, "line", {x1: W - R + 8, x2: W - R + 20, y1: y - 4, y2: y - 4, stroke: c, "stroke-dasharray": "3 2"});
      node(svg, "text", {x: W - R + 24, y: y, "font-size": 10, fill: c}, m.name);
    });
    spec.series.forEach(function (s, k) {
      var c = s.color || palette[k % palette.length];
      if (s.band) { var pts = s.band[1].map(function (v, i) { return sx(i) + "," + sy(v); });
        pts = pts.concat(s.band[0].map(function (v, i) { return sx(i) + "," + sy(v); }).reverse());
        node(svg, "polygon", {points: pts.join(" "), fill: c, opacity: 0.15}); }
      var d = s.y.map(function (v, i) { return v === null ? null : sx(i) + "," + sy(v); }).filter(Boolean);
      var line = node(svg, "polyline", {fill: "none", stroke: c, "stroke-width": 2, points: d.join(" ")});
      if (s.dash) line.setAttribute("stroke-dasharray", "4 3");
      node(line, "title", {}, s.name);
      if (s.hover) s.y.forEach(function (v, i) {  // a dot per value, its own text on hover
        if (v === null) return;
        var dot = node(svg, "circle", {cx: sx(i), cy: sy(v), r: 3, fill: c, "class": "wl-dot"});
        node(dot, "title", {}, s.hover[i]);
      });
      node(svg, "text", {x: W - R + 8, y: T + 14 * (k + 1), "font-size": 11, fill: c}, s.name);
    });
    el.textContent = "";
    el.appendChild(svg);
    el.setAttribute("data-rendered", "1");
    return svg;
  }
  function render() {  // a plot already drawn (by results.js, say) is left as it is
    document.querySelectorAll(".wl-heatmap:not([data-rendered])").forEach(heatmap);
    document.querySelectorAll(".wl-lines:not([data-rendered])").forEach(lines);
    document.body.setAttribute("data-plots-rendered", "1");
  }
  // the explorer (walklens serve) draws with the same two functions: el holds data-spec, set as an attribute
  window.walklensPlots = {heatmap: heatmap, lines: lines};
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", render); else render();
})();
