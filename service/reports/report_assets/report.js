// posbias report and viewer: draws the page from the JSON in #posbias-data with hand-written SVG.
// No library and no network: a report file must open anywhere, offline, and look the same in ten years.
// The viewer serves this same script; only a point's answers, trial pages and the job list's progress are
// fetched there, from the viewer itself.
(function () {
  "use strict";

  const DATA = JSON.parse(document.getElementById("posbias-data").textContent);
  const SVGNS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
  const DASHES = ["", "6 3", "2 3", "8 3 2 3", "1 2"];
  const SMALL_N = 30;
  const AXIS_TITLES = {
    "position": "position in the prompt",
    "answer-slot": "answer slot (line of the output)",
    "token-distance": "token distance from question to answer",
    "filler-length": "filler length (tokens)",
  };
  const state = { shade: "pointwise", hidden: new Set() };

  // --- small helpers -------------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function sv(tag, attrs) {
    const node = document.createElementNS(SVGNS, tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined) continue;
      if (key === "text") node.textContent = value;
      else node.setAttribute(key, value);
    }
    return node;
  }

  const pct = (v) => (v === null || v === undefined ? "-" : (100 * v).toFixed(1) + "%");
  const pts = (v) => (v === null || v === undefined ? "-" : (100 * v >= 0 ? "+" : "") + (100 * v).toFixed(1));
  const num = (v, digits) => (v === null || v === undefined ? "-" : Number(v).toPrecision(digits || 3));
  const pval = (p) => (p === null || p === undefined ? "-" : p < 1e-4 ? Number(p).toExponential(1) : Number(p).toFixed(4));
  const interval = (i) => (i ? `${pts(i.estimate)} (${pts(i.low)} to ${pts(i.high)})` : "-");

  function table(headers, rows, attrs) {
    return el(
      "table",
      attrs,
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", { text: h })))),
      el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) => (c instanceof Node ? el("td", {}, c) : el("td", { text: c })))))),
    );
  }

  const variantOrder = [];
  function variantColor(name) {
    if (!variantOrder.includes(name)) variantOrder.push(name);
    return PALETTE[variantOrder.indexOf(name) % PALETTE.length];
  }

  // --- charts ----------------------------------------------------------------------------------------

  function ticks(lo, hi, count, integer) {
    if (!(hi > lo)) hi = lo + 1;
    const raw = (hi - lo) / count;
    const magnitude = Math.pow(10, Math.floor(Math.log10(raw)));
    let step = [1, 2, 5, 10].map((m) => m * magnitude).find((s) => s >= raw) || raw;
    if (integer) step = Math.max(1, Math.round(step));
    const found = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) found.push(Number(v.toPrecision(12)));
    return found;
  }

  // One chart: series of points {x, y, lo, hi, blo, bhi, n, ref}; the shading follows `state.shade`.
  function chart(opts) {
    const W = 520, H = 300, L = 52, R = 14, T = 26, B = 44;
    const series = opts.series.filter((s) => !state.hidden.has(s.variant));
    const all = opts.series.flatMap((s) => s.points);
    let xs = all.map((p) => p.x).concat(opts.series.length ? (opts.xMarks || []).map((m) => m.x) : []);
    if (!xs.length) xs = [0, 1];
    let x0 = Math.min(...xs), x1 = Math.max(...xs);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    const pad = (x1 - x0) * 0.03;
    x0 -= pad; x1 += pad;
    const y0 = opts.yMin === undefined ? 0 : opts.yMin, y1 = opts.yMax === undefined ? 1 : opts.yMax;
    const X = (v) => L + ((v - x0) / (x1 - x0)) * (W - L - R);
    const Y = (v) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
    const root = sv("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "chart", role: "img",
      "data-axis": opts.axis || "", "aria-label": opts.title });
    root.append(sv("text", { x: L, y: 16, class: "chart-title", text: opts.title }));
    for (const v of ticks(y0, y1, 5, false)) {
      root.append(sv("line", { x1: L, x2: W - R, y1: Y(v), y2: Y(v), class: "grid" }));
      root.append(sv("text", { x: L - 6, y: Y(v) + 4, class: "tick", "text-anchor": "end",
        text: opts.yFormat ? opts.yFormat(v) : Math.round(100 * v) + "%" }));
    }
    for (const v of ticks(Math.max(x0, opts.integerX ? Math.ceil(x0) : x0), x1, 8, opts.integerX)) {
      root.append(sv("line", { x1: X(v), x2: X(v), y1: H - B, y2: H - B + 4, class: "axis" }));
      root.append(sv("text", { x: X(v), y: H - B + 16, class: "tick", "text-anchor": "middle", text: String(v) }));
    }
    root.append(sv("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
    root.append(sv("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
    root.append(sv("text", { x: (L + W - R) / 2, y: H - 8, class: "label", "text-anchor": "middle", text: opts.xLabel }));
    root.append(sv("text", { x: 12, y: (T + H - B) / 2, class: "label", "text-anchor": "middle",
      transform: `rotate(-90 12 ${(T + H - B) / 2})`, text: opts.yLabel }));
    if (opts.reference !== null && opts.reference !== undefined) {
      root.append(sv("line", { x1: L, x2: W - R, y1: Y(opts.reference), y2: Y(opts.reference),
        class: opts.referenceClass || "chance" }));
    }
    for (const m of opts.xMarks || []) {
      if (m.x < x0 || m.x > x1) continue;
      root.append(sv("line", { x1: X(m.x), x2: X(m.x), y1: T, y2: H - B, class: "window-line", stroke: variantColor(m.variant), "data-x": m.x }));
      const right = X(m.x) > (L + W - R) / 2;
      root.append(sv("text", { x: X(m.x) + (right ? -3 : 3), y: T + 10, class: "tick", "text-anchor": right ? "end" : "start", text: m.label }));
    }
    const clip = (v) => Math.min(y1, Math.max(y0, v));
    // Shading first, then lines, then points: a later series' shading never covers an earlier one's points.
    const low = state.shade === "band" ? "blo" : "lo", high = state.shade === "band" ? "bhi" : "hi";
    const known = (v) => v !== null && v !== undefined;
    for (const s of series) {
      const shaded = s.points.filter((p) => known(p[low]) && known(p[high]));
      if (state.shade !== "none" && s.shade !== false && shaded.length) {
        const upper = shaded.map((p) => `${X(p.x)},${Y(clip(p[high]))}`);
        const lower = shaded.slice().reverse().map((p) => `${X(p.x)},${Y(clip(p[low]))}`);
        root.append(sv("polygon", { points: upper.concat(lower).join(" "), fill: s.color,
          class: `shade ${state.shade}`, "data-variant": s.variant }));
      }
    }
    for (const s of series) {
      const drawn = s.points.filter((p) => known(p.y));
      if (drawn.length > 1) {
        root.append(sv("polyline", { points: drawn.map((p) => `${X(p.x)},${Y(clip(p.y))}`).join(" "),
          stroke: s.color, "stroke-dasharray": s.dash || null, class: "line", "data-variant": s.variant }));
      }
    }
    series.forEach((s, index) => {
      // Points of several series at one x are dodged apart a little, so that each can be clicked.
      const dodge = (index - (series.length - 1) / 2) * Math.min(3, 12 / series.length);
      for (const p of s.points.filter((q) => known(q.y))) {
        const dot = sv("circle", { cx: X(p.x) + dodge, cy: Y(clip(p.y)), r: 4, fill: s.color, class: "point",
          "data-variant": s.variant, tabindex: 0 });
        for (const [key, value] of Object.entries(p.ref || {})) dot.setAttribute("data-" + key, value);
        dot.append(sv("title", { text: `${s.label}: ${opts.xName || "x"} ${p.label || p.x}: ${pct(p.y)} (n = ${p.n}); click for its trials` }));
        if (p.ref) dot.addEventListener("click", () => openPoint(dot.dataset));
        root.append(dot);
        if (opts.showSmallN && p.n < SMALL_N) {
          root.append(sv("text", { x: X(p.x), y: Y(clip(p.y)) - 7, class: "small-n", "text-anchor": "middle", text: `n=${p.n}` }));
        }
      }
    });
    const legend = el("div", { class: "legend" },
      series.map((s) => el("span", { class: "key" },
        el("span", { class: "swatch", style: `background:${s.color}` + (s.dash ? ";opacity:0.6" : "") }), s.label)));
    const banded = series.some((s) => s.points.some((p) => known(p.blo)));
    const note = opts.note ? el("div", { class: "shade-note", text: opts.note }) :
      opts.shadeNote === false ? null : el("div", { class: "shade-note", text: shadeNote(opts, banded) });
    return el("figure", { class: "figure" }, root, legend, note);
  }

  function shadeNote(opts, banded) {
    const parts = [];
    if (state.shade === "pointwise") parts.push("shading: pointwise 95% interval at each point");
    else if (state.shade === "band" && banded) parts.push("shading: simultaneous 95% band (holds at every point at once)");
    else if (state.shade === "band") parts.push("no simultaneous band for this view (pointwise intervals only)");
    else parts.push("no shading");
    if (opts.reference !== null && opts.reference !== undefined) parts.push(opts.referenceNote || `dashed: chance (${pct(opts.reference)})`);
    if (opts.showSmallN) parts.push(`n shown where below ${SMALL_N}`);
    return parts.join("; ");
  }

  function curveSeries(curves, job, axis, metric) {
    const fillers = [...new Set(curves.map((c) => c.filler_tokens))];
    const variants = [...new Set(curves.map((c) => c.variant))];
    return curves.map((c) => {
      const parts = [];
      if (variants.length > 1 || c.variant !== "baseline") parts.push(c.variant);
      if (c.filler_tokens !== null && fillers.length > 1) parts.push(`filler ${c.filler_tokens}`);
      if (!parts.length) parts.push(`N = ${c.batch_size}`);
      const label = metric === "accuracy" ? parts.join(", ") : `${parts.join(", ")}: ${metric === "parse_rate" ? "parse rate" : "strict accuracy"}`;
      return {
        label,
        variant: c.variant,
        color: variantColor(c.variant),
        dash: DASHES[(metric === "accuracy_strict" ? 1 : 0) + Math.max(0, fillers.indexOf(c.filler_tokens)) % DASHES.length] || null,
        shade: metric === "accuracy",
        points: c.points.map((p) => ({
          x: p.x, y: p[metric], n: p.n, label: String(p.position),
          lo: metric === "accuracy" ? p.ci_low : null, hi: metric === "accuracy" ? p.ci_high : null,
          blo: metric === "accuracy" ? p.band_low : null, bhi: metric === "accuracy" ? p.band_high : null,
          ref: { job: job, axis: axis, variant: c.variant, batch: c.batch_size,
            filler: c.filler_tokens === null ? "" : c.filler_tokens, pos: p.position, n: p.n },
        })),
      };
    });
  }

  function byBatchSize(curves) {
    const groups = new Map();
    for (const c of curves) {
      if (!groups.has(c.batch_size)) groups.set(c.batch_size, []);
      groups.get(c.batch_size).push(c);
    }
    return [...groups.entries()].sort((a, b) => a[0] - b[0]);
  }

  // --- the report ------------------------------------------------------------------------------------

  function controls() {
    const variants = [...new Set(DATA.jobs.flatMap((j) => Object.values(j.curves).flat().map((c) => c.variant)))];
    const shade = el("fieldset", { class: "toggle", id: "shade-toggle" }, el("legend", { text: "shading" }),
      [["pointwise", "pointwise 95% interval"], ["band", "simultaneous 95% band"], ["none", "none"]].map(([value, text]) =>
        el("label", {}, el("input", { type: "radio", name: "shade", value, checked: state.shade === value,
          onchange: () => { state.shade = value; render(); } }), text)));
    const variant = variants.length < 1 ? null : el("fieldset", { class: "toggle", id: "variant-toggle" },
      el("legend", { text: "variants" }),
      variants.map((name) => el("label", {},
        el("input", { type: "checkbox", value: name, checked: !state.hidden.has(name), onchange: (e) => {
          if (e.target.checked) state.hidden.delete(name); else state.hidden.add(name);
          render();
        } }),
        el("span", { class: "swatch", style: `background:${variantColor(name)}` }), name)));
    return el("div", { class: "controls" }, shade, variant);
  }

  function summary(report) {
    const s = report.summary, job = report.job;
    const rows = [
      ["model", s.model + (s.revision ? `@${s.revision}` : "")],
      ["status", s.status + (s.error ? `: ${s.error}` : "")],
      ["design", report.design],
      ["answer mode", job.spec.answer_mode],
      ["batch sizes", s.batch_sizes.join(", ")],
      ["iterations", job.spec.iterations],
      ["seed", job.spec.seed],
      ["variants", s.variants.join(", ")],
      ["trials", `${s.trials_done} done, ${s.trials_skipped} skipped, of ${s.trials_total}`],
      ["engine", job.engine ? `${job.engine.name} ${job.engine.version}` : "-"],
      ["submitted", s.created_at],
      ["finished", s.finished_at || "-"],
    ];
    return el("div", { class: "summary" },
      el("dl", {}, rows.map(([k, v]) => [el("dt", { text: k }), el("dd", { text: String(v) })])),
      el("details", {}, el("summary", { text: "job spec" }), el("pre", { class: "spec", text: JSON.stringify(job.spec, null, 2) })));
  }

  function scheduleStrip(report) {
    const sched = report.schedule;
    if (!sched) return null;
    return el("section", { class: "schedule" }, el("h3", { text: `schedule ${sched.name}: checkpoints` }),
      el("div", { class: "strip" }, sched.checkpoints.map((c) => {
        const here = c.job_id === report.summary.id;
        const box = el("div", { class: `checkpoint verdict-${c.verdict}` + (here ? " current" : ""), title: c.reason },
          el("div", { class: "name", text: c.name }), el("div", { class: "verdict", text: c.verdict }),
          c.job_id ? jobLink(c.job_id, `job ${c.job_id}`) : el("div", { text: "no job yet" }));
        return box;
      })));
  }

  function jobLink(id, text) {
    if (DATA.live) return el("a", { href: `/job/${id}`, text });
    if (DATA.jobs.some((j) => j.summary.id === id)) return el("a", { href: `#job-${id}`, text });
    return el("span", { text });
  }

  function curveSection(report, axis) {
    const curves = report.curves[axis];
    if (!curves || !curves.length) return null;
    const id = report.summary.id;
    const section = el("section", { class: `curves axis-${axis}` }, el("h3", { text: `accuracy by ${AXIS_TITLES[axis]}` }));
    if (curves.some((c) => c.note)) section.append(el("p", { class: "note", text: curves.find((c) => c.note).note }));
    for (const [n, group] of byBatchSize(curves)) {
      const chance = group.find((c) => c.chance !== null && c.chance !== undefined);
      const title = axis === "filler-length" ? `N = ${n}, every position pooled` : `N = ${n}`;
      const xName = axis === "token-distance" ? "distance bin" : axis;
      const row = el("div", { class: "figures" },
        chart({ title: `${title}: accuracy among parsed answers`, axis, series: curveSeries(group, id, axis, "accuracy"),
          xLabel: AXIS_TITLES[axis], yLabel: "accuracy", xName, integerX: axis !== "token-distance",
          reference: chance ? chance.chance : null, showSmallN: axis === "token-distance" || axis === "filler-length" }),
        chart({ title: `${title}: parse rate (solid), strict accuracy (dashed)`, axis,
          series: curveSeries(group, id, axis, "parse_rate").concat(curveSeries(group, id, axis, "accuracy_strict")),
          xLabel: AXIS_TITLES[axis], yLabel: "share of answers", xName, integerX: axis !== "token-distance",
          reference: chance ? chance.chance : null, shadeNote: false }));
      section.append(row);
    }
    if (axis === "position") {
      section.append(table(["variant", "N", "filler", "trials", "last - first (points)", "slope per position", "position effect", "p (no effect)"],
        curves.filter((c) => !state.hidden.has(c.variant)).map((c) => [c.variant, c.batch_size,
          c.filler_tokens === null ? "-" : c.filler_tokens, c.trials, interval(c.contrast), interval(c.slope),
          interval(c.position_effect), pval(c.shape_p)]), { class: "curve-table" }));
    }
    return section;
  }

  function heatmaps(report) {
    const curves = (report.curves.position || []).filter((c) => c.filler_tokens !== null);
    const levels = [...new Set(curves.map((c) => c.filler_tokens))].sort((a, b) => a - b);
    if (levels.length < 2) return null;
    const section = el("section", { class: "heatmaps" }, el("h3", { text: "accuracy by filler length x position" }));
    const groups = new Map();
    for (const c of curves) {
      const key = `${c.variant}|${c.batch_size}`;
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(c);
    }
    const row = el("div", { class: "figures" });
    for (const [key, group] of groups) {
      const [variant, n] = key.split("|");
      if (state.hidden.has(variant)) continue;
      const cell = 22, L = 70, T = 28, W = L + cell * Number(n) + 10, H = T + cell * levels.length + 36;
      const root = sv("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "heatmap", "data-variant": variant });
      root.append(sv("text", { x: 4, y: 16, class: "chart-title", text: `${variant}, N = ${n}` }));
      levels.forEach((level, i) => {
        root.append(sv("text", { x: L - 6, y: T + i * cell + 15, class: "tick", "text-anchor": "end", text: `${level}` }));
        const c = group.find((g) => g.filler_tokens === level);
        for (const p of c ? c.points : []) {
          const a = p.accuracy === null ? null : p.accuracy;
          const rect = sv("rect", { x: L + (p.position - 1) * cell, y: T + i * cell, width: cell - 1, height: cell - 1,
            fill: a === null ? "#eee" : `hsl(${Math.round(220 * a)}, 70%, ${Math.round(80 - 35 * a)}%)`, class: "cell point",
            "data-job": report.summary.id, "data-axis": "position", "data-variant": variant, "data-batch": n,
            "data-filler": level, "data-pos": p.position, "data-n": p.n });
          rect.append(sv("title", { text: `filler ${level}, position ${p.position}: ${pct(a)} (n = ${p.n})` }));
          rect.addEventListener("click", () => openPoint(rect.dataset));
          root.append(rect);
        }
      });
      for (let p = 1; p <= Number(n); p++) {
        if (Number(n) <= 20 || p % 5 === 0 || p === 1) {
          root.append(sv("text", { x: L + (p - 1) * cell + cell / 2, y: T + levels.length * cell + 14, class: "tick", "text-anchor": "middle", text: String(p) }));
        }
      }
      root.append(sv("text", { x: L, y: H - 4, class: "label", text: "position; rows: filler tokens; colour: accuracy (red low, blue high)" }));
      row.append(el("figure", { class: "figure" }, root));
    }
    section.append(row);
    return section;
  }

  function explainSection(report) {
    const variants = Object.keys(report.explain);
    if (!variants.length) return null;
    const section = el("section", { class: "explain" }, el("h3", { text: "what moves the curve (posbias explain)" }));
    for (const variant of variants) {
      if (state.hidden.has(variant)) continue;
      for (const e of report.explain[variant]) {
        section.append(el("h4", { text: `${variant}, N = ${e.batch_size}: ${e.answers} parsed answers of ${e.trials} trials in ${e.clusters} ${e.cluster_unit}s` }));
        section.append(table(["cause", "unit", "status", "effect (points)", "95% CI", "p", "not zero"],
          e.effects.map((f) => [f.name, f.unit, f.status, f.effect ? pts(f.effect.estimate) : "-",
            f.effect ? `${pts(f.effect.low)} to ${pts(f.effect.high)}` : "-", pval(f.p), f.distinguishable ? "yes" : "no"]),
          { class: "explain-table" }));
        for (const c of e.confounds) {
          section.append(el("p", { class: "note", text: `${c.effects.join(" and ")} move together in this design` +
            (c.joint_p !== null ? ` (joint p = ${pval(c.joint_p)})` : "") + `: ${c.fix}` }));
        }
        if (e.window) {
          const w = e.window;
          section.append(el("p", { class: "note", text: `sliding window ${w.window} tokens: ${w.answers_inside} answers inside, ${w.answers_beyond} beyond; ` +
            (w.tested ? `step ${w.jump ? interval(w.jump) : "-"} points, p = ${pval(w.p)}` : w.note || "not tested") }));
        }
        section.append(el("p", { class: "verdict", text: `verdict: ${e.verdict}` }));
      }
    }
    return section;
  }

  // Own-question attention of an hf job: by position and by token distance, one line per variant (colour)
  // and layer kind (solid: global, dashed: sliding), the sliding window marked; then explain's section.
  const KIND_DASH = { global: null, sliding: "6 3" };

  function layersOf(report, curve) {
    const built = report.attention.canary[curve.variant];
    return (built && built[curve.layer_kind].length) || 1;
  }

  function attentionSeries(curves, report, by) {
    const variants = [...new Set(curves.map((c) => c.variant))];
    return curves.filter((c) => !state.hidden.has(c.variant)).map((c) => ({
      label: (variants.length > 1 || c.variant !== "baseline" ? `${c.variant}, ` : "") + `${c.layer_kind} layers`,
      variant: c.variant,
      color: variantColor(c.variant),
      dash: KIND_DASH[c.layer_kind] || null,
      shade: false,
      // n: the answers behind the point (each has one row per layer of the kind), as its trial list shows.
      points: c.points.map((p) => ({
        x: p.x, y: p.own_mean, n: Math.round(p.n / layersOf(report, c)), label: by === "position" ? String(p.x) : `${p.x - c.bin_width / 2} to ${p.x + c.bin_width / 2 - 1}`,
        ref: Object.assign({ job: report.summary.id, axis: by, variant: c.variant, batch: c.batch_size, filler: "", n: Math.round(p.n / layersOf(report, c)),
          pos: by === "position" ? p.x : p.x - c.bin_width / 2, metric: "attention", kind: c.layer_kind,
          own: p.own_mean, "own-max": p.own_max, rows: p.n, trials: p.trials }, by === "position" ? {} : { width: c.bin_width }),
      })),
    }));
  }

  // Where each variant's window reaches, on this chart's x axis: its width in tokens by token distance;
  // by position, between the last position whose answer is on average a window or more away and the next.
  function windowMarks(curves, canary, by) {
    const marks = [];
    for (const [variant, built] of Object.entries(canary)) {
      if (!built.window || state.hidden.has(variant)) continue;
      const windows = new Set(Object.values(canary).map((c) => c.window));
      const label = `window ${built.window} tokens` + (windows.size > 1 ? ` (${variant})` : "");
      let x = built.window;
      if (by === "position") {
        const c = curves.find((k) => k.variant === variant && k.points.some((p) => p.token_distance !== null));
        const beyond = c ? c.points.filter((p) => p.token_distance !== null && p.token_distance >= built.window) : [];
        if (!beyond.length || beyond.length === c.points.length) continue;
        x = Math.max(...beyond.map((p) => p.x)) + 0.5;
      }
      // Variants whose windows end at one place share one line.
      if (!marks.some((m) => m.x === x)) marks.push({ x, label, variant });
    }
    return marks;
  }

  function attentionSection(report) {
    const att = report.attention;
    if (!att) return null;
    const section = el("section", { class: "attention" }, el("h3", { text: "attention on the question's own tokens (hf engine)" }));
    const built = Object.entries(att.canary).map(([variant, c]) => `${variant}: ${c.sliding.length} sliding layers` +
      (c.window ? ` (window ${c.window} tokens)` : "") + `, ${c.global.length} global; mask canary ${c.passed ? "passed" : "FAILED"}`);
    section.append(el("p", { class: "note", text: `layers as built: ${built.join("; ") || "not recorded"}. ` +
      "Each point: the share of an answer line's attention on its own question, averaged over heads, the layers of a kind and the trials." }));
    const titles = { "position": "by position", "token-distance": `by token distance (bins of ${att.bin_width})` };
    const sizes = new Map();
    for (const by of ["position", "token-distance"]) {
      for (const [n, group] of byBatchSize(att.curves[by] || [])) {
        if (!sizes.has(n)) sizes.set(n, {});
        sizes.get(n)[by] = group;
      }
    }
    for (const [n, charts] of [...sizes.entries()].sort((a, b) => a[0] - b[0])) {
      const row = el("div", { class: "figures" });
      for (const by of ["position", "token-distance"]) {
        const group = charts[by];
        if (!group) continue;
        const series = attentionSeries(group, report, by);
        const top = Math.max(0.01, ...series.flatMap((s) => s.points.map((p) => p.y)));
        row.append(chart({ title: `N = ${n}: own-question attention ${titles[by]}`, axis: `attention-${by}`, series,
          xLabel: AXIS_TITLES[by], yLabel: "attention share (head mean)", xName: by === "position" ? "position" : "distance",
          integerX: by === "position", yMax: Math.min(1, top * 1.1), yFormat: (v) => num(v, 2), xMarks: windowMarks(group, att.canary, by),
          shadeNote: false, note: "solid: global layers; dashed: sliding layers; vertical line: where the sliding window ends" }));
      }
      section.append(row);
    }
    for (const e of att.explain) {
      if (state.hidden.has(e.variant)) continue;
      section.append(el("h4", { text: `${e.variant}: own-question attention by distance band` + (e.window ? ` (window ${e.window} tokens)` : "") }));
      section.append(table(["layers", "token distance", "rows", "trials", "own (head mean)", "own (largest head)"],
        e.bands.map((b) => [b.layer_kind, b.high === null ? `${b.low}+` : `${b.low}-${b.high}`, b.n, b.trials, num(b.own_mean), num(b.own_max)]),
        { class: "attention-table" }));
      const said = [];
      if (e.decay_within_window !== null) said.push(`sliding layers: the window's far half gets ${e.decay_within_window.toFixed(2)}x the near half's attention (${e.decay_within_window < 1 ? "a decay within the window" : "no decay within the window"})`);
      if (e.global_beyond !== null) said.push(`beyond the window the global layers give the question ${num(e.global_beyond)} (${e.global_beyond > 0 ? "they carry it" : "they do not"})`);
      for (const a of e.aurocs.filter((x) => x.auroc !== null)) {
        said.push(`${a.layer_kind} attention predicts correctness (job ${e.scored_job_id}) at a fixed position with AUROC ${a.auroc.toFixed(2)}` +
          (a.low !== null ? ` (95% CI ${a.low.toFixed(2)} to ${a.high.toFixed(2)}, by trial)` : ` (no interval: ${a.trials} trials)`));
      }
      if (e.note) said.push(`AUROC: ${e.note}`);
      for (const line of said) section.append(el("p", { class: "note", text: line }));
    }
    return section;
  }

  function comparisonSection() {
    if (!DATA.comparisons || !DATA.comparisons.length) return null;
    const section = el("section", { class: "comparison", id: "comparison" }, el("h2", { text: "comparison" }));
    for (const c of DATA.comparisons) {
      const series = [{ label: `${c.b} minus ${c.a}`, variant: "", color: "#444", points: c.points.map((p) => ({
        x: p.position, y: p.diff, lo: p.ci_low, hi: p.ci_high, blo: p.band_low, bhi: p.band_high, n: c.matched_trials,
      })) }];
      section.append(el("h3", { text: `N = ${c.batch_size}: ${c.b} minus ${c.a}, ${c.method} (${c.matched_trials} matched trials of ${c.trials_a} and ${c.trials_b})` }));
      section.append(el("div", { class: "figures" }, chart({ title: `N = ${c.batch_size}: difference in accuracy`, axis: "comparison", series,
        xLabel: "position", yLabel: "B - A", integerX: true, yMin: -1, yMax: 1, reference: 0, referenceClass: "zero",
        referenceNote: "line: no difference", yFormat: (v) => `${Math.round(100 * v)}` })));
      section.append(table(["position", "A", "B", "B - A", "95% CI", "band", "different"],
        c.points.map((p) => [p.position, pct(p.accuracy_a), pct(p.accuracy_b), pts(p.diff),
          `${pts(p.ci_low)} to ${pts(p.ci_high)}`, `${pts(p.band_low)} to ${pts(p.band_high)}`, p.different ? "*" : ""]),
        { class: "comparison-table" }));
      section.append(el("p", { class: "note", text: `last - first: A ${interval(c.contrast_a)}, B ${interval(c.contrast_b)}, difference ${interval(c.contrast_diff)}` }));
    }
    return section;
  }

  // A local model path is named by its folder in titles (the summary gives it whole); a hub id stays.
  const shortModel = (m) => (/^[/.~]/.test(m) ? m.replace(/\/+$/, "").split("/").pop() : m);

  function jobSection(report) {
    const s = report.summary;
    const section = el("section", { class: "job", id: `job-${s.id}` },
      el("h2", { text: `job ${s.id}: ${shortModel(s.model)} (${s.status})` }), summary(report), scheduleStrip(report));
    for (const axis of ["position", "answer-slot", "token-distance", "filler-length"]) section.append(curveSection(report, axis) || "");
    section.append(heatmaps(report) || "", explainSection(report) || "", attentionSection(report) || "");
    const missing = Object.entries(report.missing);
    if (missing.length) section.append(el("ul", { class: "missing" }, missing.map(([k, v]) => el("li", { text: `${k}: ${v}` }))));
    return section;
  }

  // --- trials behind a point -------------------------------------------------------------------------

  function jobById(id) {
    return DATA.jobs.find((j) => String(j.summary.id) === String(id));
  }

  // A point's answers: in a report file those of the trials it shows (a stated sample of a large job's);
  // in the viewer all of them, read from the store a page at a time.
  function openPoint(ref) {
    const report = jobById(ref.job);
    const pos = Number(ref.pos), filler = ref.filler === "" || ref.filler === undefined ? null : Number(ref.filler);
    const width = ref.width ? Number(ref.width) : report.bin_width;
    const panel = document.getElementById("point-trials");
    const where = ref.axis === "token-distance" ? `distances ${pos} to ${pos + width - 1}` : `${ref.axis} ${pos}`;
    panel.replaceChildren(el("h2", { text: `job ${ref.job}, ${ref.variant}, N = ${ref.batch}` + (filler !== null ? `, filler ${filler}` : "") + `, ${where}` }),
      el("button", { type: "button", class: "close", onclick: () => { panel.hidden = true; }, text: "close" }));
    panel.hidden = false;
    if (DATA.live) {
      const said = el("p", { text: "reading its answers from the store" });
      panel.append(said);
      livePoint(ref, { pos, filler, width }, panel, said, [], null);
    } else {
      const rows = sampleAnswers(report, ref, { pos, filler, width });
      const correct = rows.filter((r) => r[ANSWER.correct]).length;
      const sample = report.sample;
      const part = sample && sample.shown < sample.total ?
        ` of the ${sample.shown} trials this file shows (of ${sample.total}; the point counts ${ref.n} answers, and posbias view lists them all)` : "";
      panel.append(el("p", { text: `${rows.length} answers${part}, ${correct} correct; click a trial to see its prompt and output` }),
        answerTable(ref.job, rows));
    }
    panel.scrollIntoView({ block: "nearest" });
  }

  // Where each field is in an answer row: `ANSWER_COLUMNS` (service/reports/answer_lists.py).
  const ANSWER = { trial_id: 0, variant: 1, batch_size: 2, position: 3, answer_slot: 4, token_distance: 5, filler_tokens: 6, parse_status: 7, correct: 8 };

  function sampleAnswers(report, ref, at) {
    return report.answers.rows.filter((r) => {
      if (r[ANSWER.variant] !== ref.variant || r[ANSWER.batch_size] !== Number(ref.batch)) return false;
      if (ref.axis === "filler-length") return r[ANSWER.filler_tokens] === at.pos;
      if (at.filler !== null && r[ANSWER.filler_tokens] !== at.filler) return false;
      if (ref.axis === "answer-slot") return r[ANSWER.answer_slot] === at.pos;
      if (ref.axis === "token-distance") {
        const d = r[ANSWER.token_distance];
        return d !== null && d >= at.pos && d < at.pos + at.width;
      }
      return r[ANSWER.position] === at.pos;
    });
  }

  function livePoint(ref, at, panel, said, shown, after) {
    const query = new URLSearchParams({ variant: ref.variant, batch: ref.batch, axis: ref.axis, at: at.pos });
    if (ref.axis === "token-distance") query.set("width", at.width);
    if (at.filler !== null && ref.axis !== "filler-length") query.set("filler", at.filler);
    if (after) query.set("after", after.join(","));
    fetch(`/api/answers/${ref.job}?${query}`).then((r) => r.json().then((body) => {
      if (!r.ok) throw new Error(body.error || r.statusText);
      const rows = shown.concat(body.rows);
      const correct = rows.filter((x) => x[ANSWER.correct]).length;
      said.textContent = `${rows.length} answers` + (body.after ? ` (the first of ${ref.n})` : "") +
        `, ${correct} correct, read from the store; click a trial to see its prompt and output`;
      panel.querySelectorAll(".trials-table, button.more").forEach((node) => node.remove());
      panel.append(answerTable(ref.job, rows));
      if (body.after) {
        panel.append(el("button", { type: "button", class: "more", text: "more answers",
          onclick: () => livePoint(ref, at, panel, said, rows, body.after) }));
      }
    })).catch((e) => { said.textContent = `answers at this point: ${e.message}`; said.className = "error"; });
  }

  function answerTable(job, rows) {
    return table(["trial", "position", "parse status", "correct"], rows.map((r) => [
      el("a", { href: "#trial", class: "trial-link", "data-job": job, "data-trial": r[ANSWER.trial_id], text: `trial ${r[ANSWER.trial_id]}`,
        onclick: (e) => { e.preventDefault(); openTrial(job, r[ANSWER.trial_id], r[ANSWER.position]); } }),
      r[ANSWER.position], r[ANSWER.parse_status], r[ANSWER.correct] ? "yes" : "no"]), { class: "trials-table" });
  }

  function openTrial(job, trial, position) {
    const panel = document.getElementById("trial");
    panel.hidden = false;
    panel.replaceChildren(el("p", { text: `trial ${trial}: loading` }));
    const show = (view) => { panel.replaceChildren(trialPage(view, position)); panel.scrollIntoView({ block: "start" }); };
    const embedded = (DATA.trials || {})[`${job}:${trial}`];
    if (embedded) return show(embedded);
    if (DATA.live) {
      fetch(`/api/trial/${job}/${trial}`).then((r) => r.json().then((body) => {
        if (!r.ok) throw new Error(body.error || r.statusText);
        show(body);
      })).catch((e) => panel.replaceChildren(el("p", { class: "error", text: `trial ${trial}: ${e.message}` })));
      return;
    }
    panel.replaceChildren(el("p", { class: "note", text: `trial ${trial} is not in this file (it holds ${Object.keys(DATA.trials || {}).length}): ` +
      `posbias trial ${job} ${trial}, or posbias view` }));
  }

  function trialPage(view, position) {
    const head = el("div", {},
      el("h2", { text: `job ${view.job_id}, trial ${view.trial_id} (index ${view.trial_index}): ${view.variant}, N = ${view.batch_size}, iteration ${view.iteration}` }),
      el("button", { type: "button", class: "close", onclick: () => { document.getElementById("trial").hidden = true; }, text: "close" }),
      el("p", { text: `${view.model}; ${view.design} design` + (view.answer_order ? `, answers asked in order ${view.answer_order.join(", ")}` : "") +
        (view.filler_tokens ? `, filler ${view.filler_tokens} tokens` : "") + `; status ${view.status}` +
        (view.sliding_window ? `; sliding window ${view.sliding_window} tokens` : "") }),
      el("p", { class: view.check.matches === false ? "error" : "note", text: `prompt ${view.prompt_source}` +
        (view.check.matches === true ? `, identical to what was sent (${view.check.rebuilt_prompt_tokens} tokens, ${view.check.compared} spans checked)` :
          view.check.matches === false ? `, differs from what was stored: ${view.check.differences.join("; ")}` : ", nothing stored to check it against") }));
    const answers = table(["position", "subject", "parse", "prediction", "gold", "correct", "option probabilities", "slot", "token distance", "in window"],
      view.answers.map((a) => [a.position, a.subject, a.parse_status, a.prediction === null ? "-" : a.prediction + 1, a.gold + 1,
        a.correct ? "yes" : "no", a.option_probs ? a.option_probs.map((p) => p.toFixed(2)).join(" ") : "-",
        a.answer_slot === null ? "-" : a.answer_slot, a.token_distance === null ? "-" : a.token_distance,
        a.in_window === null ? "-" : a.in_window ? "yes" : "no"]), { class: "answers-table" });
    for (const row of answers.querySelectorAll("tbody tr")) {
      if (Number(row.firstChild.textContent) === Number(position)) row.classList.add("picked");
    }
    return el("div", {}, head, el("h3", { text: "prompt as sent (questions outlined; ▸k: where the sliding window from answer k begins)" }),
      promptText(view, position), el("h3", { text: "output" }), el("pre", { class: "output", text: view.output_text || "(no output)" }),
      el("h3", { text: "answers" }), answers);
  }

  function promptText(view, position) {
    const text = view.prompt_text;
    const cuts = new Set([0, text.length]);
    for (const s of view.spans) {
      cuts.add(s.start_char); cuts.add(s.end_char);
      if (s.window_start_char !== null) cuts.add(s.window_start_char);
    }
    const sorted = [...cuts].filter((c) => c >= 0 && c <= text.length).sort((a, b) => a - b);
    const pre = el("pre", { class: "prompt" });
    for (let i = 0; i < sorted.length - 1; i++) {
      const a = sorted[i], b = sorted[i + 1];
      for (const s of view.spans.filter((x) => x.window_start_char === a)) {
        pre.append(el("span", { class: "window-mark", title: `the sliding window from answer ${s.position} reaches back to here (token ${s.window_start_token})`, text: `▸${s.position}` }));
      }
      const span = view.spans.find((s) => s.start_char <= a && a < s.end_char);
      const piece = text.slice(a, b);
      if (span) {
        pre.append(el("span", { class: "question" + (span.position === Number(position) ? " picked" : ""), "data-position": span.position,
          title: `question ${span.position}: tokens ${span.start_token} to ${span.end_token}` }, piece));
      } else pre.append(piece);
    }
    return pre;
  }

  // --- the viewer's job list -------------------------------------------------------------------------

  function jobList() {
    const jobs = DATA.job_list;
    const rows = jobs.map((j) => [
      el("a", { href: `/job/${j.id}`, text: `job ${j.id}` }), j.model, j.status,
      el("span", { class: "progress", "data-job": j.id },
        el("progress", { max: j.trials_total || 1, value: j.trials_done + j.trials_skipped }),
        ` ${j.trials_done + j.trials_skipped} / ${j.trials_total}`),
      j.batch_sizes.join(", "), j.variants.join(", "), j.design, j.created_at]);
    const pick = (name, first) => el("select", { name }, jobs.map((j, i) =>
      el("option", { value: j.id, selected: i === first, text: `job ${j.id}: ${j.model}` })));
    return el("div", {}, el("h2", { text: "jobs" }),
      table(["job", "model", "status", "trials", "batch sizes", "variants", "design", "submitted"], rows, { class: "job-list" }),
      el("form", { method: "get", action: "/compare", class: "compare-form" }, el("h3", { text: "compare two jobs" }),
        "A ", pick("a", Math.min(1, jobs.length - 1)), " B ", pick("b", 0), " ", el("button", { type: "submit", text: "compare" })));
  }

  function refreshProgress() {
    if (!DATA.job_list.some((j) => j.status === "queued" || j.status === "running")) return;
    fetch("/api/jobs").then((r) => r.json()).then((jobs) => {
      DATA.job_list = jobs;
      render();
    }).catch(() => {}).finally(() => setTimeout(refreshProgress, 2000));
  }

  // --- the page --------------------------------------------------------------------------------------

  function render() {
    const app = document.getElementById("app");
    app.replaceChildren();
    if (DATA.page === "list") {
      app.append(jobList());
      return;
    }
    app.append(controls());
    for (const report of DATA.jobs) app.append(jobSection(report));
    app.append(comparisonSection() || "");
  }

  render();
  if (DATA.page === "list" && DATA.live) setTimeout(refreshProgress, 2000);
})();
