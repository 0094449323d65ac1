// walklens explorer: the walk views (encoding walk, decoding walk, similarity map, compare). Text only.
(function () {
  "use strict";
  var W = window.walklens, $ = W.$;

  // the fields of the walk's document (reports/walk.py walk_document) the map and the compare view draw
  var WALK_FIELDS = ["tokens", "points", "rank_of_input", "rank_of_next", "escape_point", "escape_stable"];

  // the layer x position rank map of one walk reply, drawn by the reports' rankMap (results.js, as a walk report's
  // page draws it), its colour scale up to log10(the vocabulary); exact: which rows are exact (null: all);
  // returns the heatmap's geometry
  function walkMap(parent, d, which, exact) {
    return W.results.rankMap(parent, d, which, {vmax: Math.log(d.n_vocab) / Math.LN10,
      note: function (i) { return exact && !exact[i] ? "provisional (bfloat16 screen)\n" : ""; }});
  }

  // ---- encoding walk ---------------------------------------------------------------------------------------
  var walkData = null, walkExact = null, walkArgs = null, selected = null, cellAgain = null, walkRuns = 0;
  // painted at once from the bfloat16 screen (every 4th point; each row not screened shows the screened row above
  // it), marked provisional; then the exact rows piece by piece, each replacing its rows in place; after the last
  // piece the whole exact walk (joined on the server from the pieces it kept) brings the escape points. One channel:
  // a new run aborts the request in flight and the pieces after it. A click is sent at once, on its own channel;
  // the server answers it between two pieces.
  function walkRun() {
    var args = {model: W.model(), text: W.text(), norm: $("walk-norm").value, metric: $("walk-metric").value};
    var run = ++walkRuns;
    W.call("walk", "/api/walk", Object.assign({fields: WALK_FIELDS, provisional: true}, args)).then(function (d) {
      if (run !== walkRuns) return;
      walkData = d.provisional ? spread(d) : d; walkArgs = args; selected = null; cellAgain = null;
      walkExact = d.provisional ? walkData.points.map(function () { return false; }) : null;
      walkDraw();
      W.clear($("walk-cell"));
      if (d.provisional) walkPiece(run, args, 0, d.pieces);
    }, W.quiet);
  }
  // the screen's reply at every walk point: each row from the screened point at or above it (none exact yet)
  function spread(d) {
    var e = Object.assign({}, d, {points: d.walk_points, rank_of_input: [], rank_of_next: []}), s = 0;
    d.walk_points.forEach(function (p, i) {
      while (s + 1 < d.point_index.length && d.point_index[s + 1] <= i) s++;
      e.rank_of_input.push(d.rank_of_input[s]);
      e.rank_of_next.push(d.rank_of_next[s]);
    });
    var at = function (p) { return p >= 0 ? d.point_index[p] : -1; };  // the screen's escape points, as walk rows
    e.escape_point = d.escape_point.map(at);
    e.escape_stable = d.escape_stable.map(at);
    return e;
  }
  function walkPiece(run, args, n, count) {
    if (n >= count) {  // every row exact: the whole walk, with its escape points and `final`
      W.call("walk", "/api/walk", Object.assign({fields: WALK_FIELDS}, args)).then(function (e) {
        if (run !== walkRuns) return;
        walkData = e; walkExact = null;
        walkDraw();
        if (cellAgain) walkCell(cellAgain.point, cellAgain.position, true);  // its escape points are known now
      }, W.quiet);
      return;
    }
    W.call("walk", "/api/walk", Object.assign({fields: WALK_FIELDS, piece: n}, args)).then(function (p) {
      if (run !== walkRuns) return;
      p.point_index.forEach(function (row, j) {
        walkData.rank_of_input[row] = p.rank_of_input[j];
        walkData.rank_of_next[row] = p.rank_of_next[j];
        walkExact[row] = true;
      });
      walkDraw();
      walkPiece(run, args, n + 1, count);
    }, W.quiet);
  }
  function walkDraw() {
    var d = walkData, out = W.clear($("walk-map"));
    var exact = walkExact ? walkExact.filter(function (x) { return x; }).length : 0;
    $("walk-echo").textContent = (d.provisional ? "PROVISIONAL ranks (bfloat16 screen; exact rows so far: " + exact +
      " of " + d.points.length + "): " : "") + "text (" + d.tokens.length + " tokens" +
      (d.block > 1 ? "; each column: the best rank among " + d.block + " positions" : "") + "): " + walkArgs.text;
    var geo = walkMap(out, d, $("walk-show").value, walkExact);
    out.setAttribute("data-rendered", "1");
    out.setAttribute("data-provisional", d.provisional ? "1" : "0");
    out.setAttribute("data-exact-rows", String(d.provisional ? exact : d.points.length));
    out.classList.toggle("provisional", !!d.provisional);
    if (selected) geo.mark(selected.row, selected.col, "#000000");
    geo.canvas.addEventListener("click", function (ev) {
      var c = geo.at(ev);
      if (!c) return;
      selected = c;
      walkDraw();
      walkCell(c.row, c.col * d.block);
    });
  }
  function walkCell(point, position, again) {
    var k = parseInt($("walk-k").value, 10) || 10;
    W.call("cell", "/api/walk/cell", Object.assign({}, walkArgs, {point: point, position: position, k: k}))
      .then(function (c) {  // the walk's document at one cell (reports/walk.py cell_document) and labels
        cellAgain = c.escape_point === null && !again ? {point: point, position: position} : null;
        if (cellAgain && !walkData.provisional) walkCell(point, position, true);  // the whole walk came first
        var out = W.clear($("walk-cell")), ids = c.top_ids.filter(function (i) { return i >= 0; });
        W.add(out, "h3", {}, c.point + ", position " + c.position + ": w_t = '" + W.label(c.token) + "'" +
          (c.next !== null ? ", w_t+1 = '" + W.label(c.next) + "'" : "") +
          (c.escape_point === point ? "  (escape point)" : "") +
          (c.escape_stable === point ? "  (stays ahead from here)" : ""));
        W.table(out, ["", "rank", "P", "cos"], [
          ["w_t", c.rank_of_input, c.prob_of_input, c.cos_input],
          ["w_t+1", c.next === null ? null : c.rank_of_next, c.prob_of_next, c.cos_next]]);
        W.add(out, "p", {"class": "note"}, "the " + ids.length + " nearest tokens by " + walkArgs.metric +
          " (|x| = " + W.fmt(c.vector_norm) + ")");
        var mark = function (i) { return ids[i] === c.next_id ? "next" : ids[i] === c.token_ids ? "input" : ""; };
        W.table(out, ["#", "token", "score", ""], ids.map(function (id, i) {
          return [i, W.label(c.labels[id]), c.top_scores[i],
                  id === c.next_id ? "w_t+1" : id === c.token_ids ? "w_t" : ""];
        }), mark).setAttribute("id", "walk-neighbours");
      }, W.quiet);
  }
  W.views.walk = {run: walkRun};
  ["walk-norm", "walk-metric"].forEach(function (id) { $(id).addEventListener("change", W.rerun("walk")); });
  $("walk-show").addEventListener("change", function () { if (walkData) walkDraw(); });

  // ---- decoding walk ---------------------------------------------------------------------------------------
  // the fields of the decoding walk's document (reports/generate.py document) the view draws
  var DECODE_FIELDS = ["prompt_tokens", "tokens", "ranks", "probs", "top_tokens", "top_probs", "d_norm", "step_length",
                       "step_angle", "target", "in_neighbourhood", "left_path_at"];
  var dec = null, step = 0;
  function decodeRun() {
    var target = $("decode-target").value;
    W.call("decode", "/api/decode", {model: W.model(), text: W.text(), target: target.trim() ? target : null,
      fields: DECODE_FIELDS,
      max_new_tokens: parseInt($("decode-steps").value, 10) || 12, k: parseInt($("decode-k").value, 10) || 10})
      .then(function (d) { dec = d; step = 0; decodeDraw(); }, W.quiet);
  }
  function decodeDraw() {
    var d = dec, out = W.clear($("decode-out"));
    var strip = W.add(out, "div", {"class": "strip", id: "decode-strip"});
    d.prompt_tokens.forEach(function (t) { W.add(strip, "span", {"class": "prompt"}, W.label(t)); });
    d.tokens.forEach(function (t, i) {
      var cls = i === step ? "sel" : "";
      if (d.in_neighbourhood) cls += d.in_neighbourhood[i] ? " on" : " off";
      var b = W.add(strip, "button", {type: "button", "class": cls, title: "step " + i}, W.label(t));
      b.addEventListener("click", function () { step = i; decodeDraw(); });
    });
    if (d.target !== null) W.add(out, "p", {"class": "note"}, "target path (teacher-forced): green = d_t lies in " +
      "the target token's neighbourhood (rank 0); " + (d.left_path_at < 0 ? "the walk stays on the path" :
      "it leaves the path at step " + d.left_path_at));
    var nav = W.add(out, "div", {"class": "controls"});
    var prev = W.add(nav, "button", {type: "button"}, "◀ step"), next = W.add(nav, "button", {type: "button"}, "step ▶");
    var range = W.add(nav, "input", {type: "range", min: 0, max: d.tokens.length - 1, value: step, id: "decode-step"});
    prev.addEventListener("click", function () { if (step > 0) { step--; decodeDraw(); } });
    next.addEventListener("click", function () { if (step < d.tokens.length - 1) { step++; decodeDraw(); } });
    range.addEventListener("input", function () { step = parseInt(range.value, 10); decodeDraw(); });
    W.add(out, "h3", {}, "step " + step + ": emitted '" + W.label(d.tokens[step]) + "' (rank " + d.ranks[step] +
      ", P = " + W.fmt(d.probs[step]) + "); greedy pick '" + W.label(d.top_tokens[step][0]) + "'; |d_t| = " +
      W.fmt(d.d_norm[step]) +
      ", moved " + W.fmt(d.step_length[step]) + " at " + W.fmt(d.step_angle[step], 3) + "°");
    W.table(out, ["#", "d_t's nearest token", "P"], d.top_tokens[step].map(function (t, i) {
      return [i, W.label(t), d.top_probs[step][i]]; }));
    var xs = d.tokens.map(function (t, i) { return i + ":" + W.label(t); });
    W.lines(out, {x: xs, xlabel: "step", series: [{name: "P(emitted token)", y: d.probs},
      {name: "step angle / 180", y: d.step_angle.map(function (a) { return a === null ? null : a / 180; }), dash: true}]});
    out.setAttribute("data-rendered", "1");
  }
  W.views.decode = {run: decodeRun};

  // ---- similarity map --------------------------------------------------------------------------------------
  function simmapRun() {
    var args = {model: W.model(), text: W.text(), point: $("simmap-point").value, metric: $("simmap-metric").value,
      normed: $("simmap-normed").checked};
    W.call("similarity", "/api/simmap", args).then(function (d) {  // reports/simmap.py document: one map
      var out = W.clear($("simmap-out"));
      W.add(out, "p", {"class": "note"}, args.metric + " similarity at " + args.point +
        (args.normed ? " (final norm first)" : "") +
        (d.block > 1 ? "; each cell: the mean over " + d.block + " x " + d.block + " positions" : ""));
      W.results.draw.simmap_view(out, d);  // as the similarity report's page draws it
      out.setAttribute("data-rendered", "1");
    }, W.quiet);
  }
  function simmapInit() {
    var m = W.modelInfo();
    W.options($("simmap-point"), ["V"].concat(m.points), null, true);
    if ($("simmap-point").value === "V") $("simmap-point").value = m.points[Math.floor(m.points.length / 2)] || "embed";
  }
  W.views.simmap = {run: simmapRun, init: simmapInit};
  ["simmap-point", "simmap-metric", "simmap-normed"].forEach(function (id) {
    $(id).addEventListener("change", W.rerun("simmap")); });
  $("model").addEventListener("change", simmapInit);

  // ---- compare: the same text on two models --------------------------------------------------------------
  function summary(d) {
    var f = d.final.rank_of_next, n = 0, top1 = 0, sorted = [];
    f.forEach(function (r) { if (r >= 0) { n++; if (r === 0) top1++; sorted.push(r); } });
    sorted.sort(function (a, b) { return a - b; });
    var esc = d.escape_point.filter(function (p) { return p >= 0; });
    return [d.model, d.tokens.length, n ? sorted[Math.floor((n - 1) / 2)] : null, n ? top1 / n : null,
            esc.length ? esc.reduce(function (a, b) { return a + b; }, 0) / esc.length / (d.points.length - 1) : null];
  }
  function compareRun() {
    var a = $("compare-a").value, b = $("compare-b").value, norm = $("compare-norm").value, text = W.text();
    var out = W.clear($("compare-out"));
    var sides = [a, b].map(function (m, i) {
      return W.call("compare " + "AB"[i], "/api/walk", {model: m, text: text, norm: norm, metric: "dot",
                                                          fields: WALK_FIELDS});
    });
    Promise.all(sides).then(function (ds) {
      ds.forEach(function (d) {
        var col = W.add(out, "div", {});
        W.add(col, "h3", {}, d.model + ": rank of w_t+1");
        walkMap(col, d, "next", null);
      });
      var tbl = W.add(out, "div", {});
      W.table(tbl, ["model", "tokens", "median rank of w_t+1 at final", "top-1 at final", "mean escape depth (0-1)"],
        ds.map(summary));
      out.setAttribute("data-rendered", "1");
    }, W.quiet);
  }
  function compareInit(info) {
    var names = info.models.map(function (m) { return m.name; });
    W.options($("compare-a"), names);
    W.options($("compare-b"), names);
    $("compare-b").value = names[Math.min(1, names.length - 1)];
  }
  W.views.compare = {run: compareRun, init: compareInit};
  ["compare-a", "compare-b", "compare-norm"].forEach(function (id) {
    $(id).addEventListener("change", W.rerun("compare")); });
})();
