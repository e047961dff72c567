// The dashboard's live training curves, one uPlot chart per panel: the page half of forge_nb/widgets/curves.py.
//
// uPlot (vendor/uPlot.iife.min.js, MIT, v1.6.32) draws: axes and ticks, the legend with the hovered values,
// clicking a legend entry to hide its trace, drag to zoom and double-click to reset, the cursor shared by
// every panel, the min..max band, and the per-pixel decimation of long traces. curves.py prepends uPlot to
// this module, so `uPlot` is a module-level name here. What stays hand-written is what a chart library
// does not know: the points protocol with the kernel, the redraw throttle, drawing only while in view, the
// EMA smoothing control, one zoom shared by all panels, and the hot-change/failure marks.
//
// Why not plotly: on a 2-core machine chromium spent ~120 ms redrawing the nine-panel plotly figure at
// every update, and plotly's FigureWidget answered each update with deltas; 40% of the training steps
// were lost with the dashboard on screen (bench/HISTORY.md). This view gets only the new points, never
// replies to an update, redraws at most once per redraw_interval (2 s), and only while it is on screen.
//
// Two hosts run this module: anywidget in JupyterLab (CurvesView), and panel's JSComponent in the panel
// app (PanelCurves, made in curves.py, shown by forge_nb/widgets/panel/app.py). `adapt` gives the second
// the first's model API; panel has no binary buffers, so there the float64 values come base64-encoded in
// msg.b64.
//
// Kernel -> page, one custom message per flush:
//   {type: "points", traces: [[index, start, count], ...], sync: bool} and one float64 buffer holding,
//   trace after trace, its `count` x values and then its `count` y values. start 0 replaces the trace's
//   points; any other start appends after the first `start` points. A view that holds a different
//   number of points (it opened late, or missed a message) asks for everything again.
// Page -> kernel: {type: "sync"}, when a view opens and after such a gap; and the `smoothing` trait when the
// user moves its slider.
// Synced traits (they change rarely): panels [{title, row, col, empty}], traces [{key, panel, kind, name,
// color, width, dash, smooth}], marks [[step, kind, label]], mark_styles {kind: {name, color, symbol, y}},
// height, redraw_interval (seconds), smoothing (EMA weight, 0..0.99). Tests and benchmarks read
// el.forgeCurves: points(key), drawn(key) (the values drawn, smoothed), hidden(key), xrange(), and stats
// (messages, draws, syncs, draw_ms, the titles of the panels last drawn empty, and errors: "<panel>: <error>"
// for each panel a draw failed on).

const FONT = "11px system-ui, -apple-system, 'Segoe UI', sans-serif";
const TOOLBAR = 26, TITLE = 16, LEGEND = 22, GAP = 16, COLUMN = 300;
let views = 0;

function series() {
  return { x: new Float64Array(64), y: new Float64Array(64), n: 0 };
}

function append(s, xs, ys) {
  const need = s.n + xs.length;
  if (need > s.x.length) {
    let cap = s.x.length;
    while (cap < need) cap *= 2;
    const x = new Float64Array(cap), y = new Float64Array(cap);
    x.set(s.x.subarray(0, s.n));
    y.set(s.y.subarray(0, s.n));
    s.x = x;
    s.y = y;
  }
  s.x.set(xs, s.n);
  s.y.set(ys, s.n);
  s.n = need;
}

function adapt(model) {
  // panel's JSComponent model: attributes instead of get()/set(), send_msg() instead of send(); its on/off
  // take anywidget's "change:<name>" and "msg:custom" names as they are.
  if (typeof model.send_msg !== "function") return model;
  return {
    get: name => model[name],
    set: (name, value) => { model[name] = value; },
    save_changes: () => {},
    send: content => model.send_msg(content),
    on: (event, cb) => model.on(event, cb),
    off: (event, cb) => model.off(event, cb),
  };
}

function decode(b64) {
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  return new Float64Array(bytes.buffer);
}

function float64(view) {
  // A DataView into the websocket frame; its offset need not be 8-aligned, so copy the bytes out.
  const bytes = new Uint8Array(view.buffer, view.byteOffset, view.byteLength).slice();
  return new Float64Array(bytes.buffer);
}

function ema(ys, weight) {
  // TensorBoard's smoothing: an exponential moving average, debiased so that the first points are not
  // pulled towards 0; gaps (null) stay gaps.
  const out = new Array(ys.length);
  let last = 0, n = 0;
  for (let j = 0; j < ys.length; j++) {
    const v = ys[j];
    if (v == null) { out[j] = v; continue; }
    last = last * weight + (1 - weight) * v;
    n++;
    out[j] = last / (1 - Math.pow(weight, n));
  }
  return out;
}

function values(s) {
  const ys = new Array(s.n);
  for (let j = 0; j < s.n; j++) ys[j] = Number.isFinite(s.y[j]) ? s.y[j] : null;
  return ys;
}

function aligned(list) {
  // [x, y per series] on one x axis, as uPlot wants: the traces of a panel come from the same rows, so
  // their steps are usually the same; otherwise uPlot.join merges them (a missing point is skipped).
  const full = list.filter(s => s && s.n);
  if (!full.length) return [[], ...list.map(() => [])];
  const first = full[0], same = full.every(s => s.n === first.n && s.x[0] === first.x[0]
    && s.x[s.n - 1] === first.x[first.n - 1]);
  if (same) {
    const x = Array.from(first.x.subarray(0, first.n));
    return [x, ...list.map(s => (s && s.n ? values(s) : new Array(x.length).fill(null)))];
  }
  const joined = uPlot.join(full.map(s => [Array.from(s.x.subarray(0, s.n)), values(s)]));
  let k = 1;
  return [joined[0], ...list.map(s => (s && s.n ? joined[k++] : new Array(joined[0].length).fill(null)))];
}

function yRange(u, min, max) {
  // uPlot's own y range (its default: 10% padding, soft zero), except for values that differ only by float
  // rounding (a clipped gradient norm: 1.0 give or take 2e-7). uPlot pads those to [1, 1], where its tick
  // loop pushes ticks until the page throws "Invalid array length" (leeoniya/uPlot#1084, left to callers);
  // they are drawn as the flat line they are, ranged as uPlot ranges equal values.
  if (min == null || max == null) return [null, null];
  if (max - min <= 1e-5 * Math.max(Math.abs(min), Math.abs(max))) min = max = (min + max) / 2;
  return uPlot.rangeNum(min, max, 0.1, true);
}

function faint(color) {
  if (color.startsWith("#") && color.length === 7) return color + "40";
  return color;
}

function render({ model: host, el }) {
  const model = adapt(host);
  const key = "forge-curves-" + ++views;  // the cursor is shared by this view's panels only
  el.classList.add("forge-curves");
  const toolbar = document.createElement("div");
  toolbar.className = "forge-curves-toolbar";
  toolbar.innerHTML = "<label>smoothing <input class='forge-smoothing' type='range' min='0' max='0.99' "
    + "step='0.01'> <span class='forge-smoothing-value'></span></label>"
    + "<span class='forge-curves-hint'>drag to zoom, double-click to reset; click a legend entry to hide it</span>";
  const grid = document.createElement("div");
  grid.className = "forge-curves-grid";
  el.append(toolbar, grid);
  const slider = toolbar.querySelector("input"), shown = toolbar.querySelector(".forge-smoothing-value");

  const data = [];  // trace index -> series
  const stats = { messages: 0, draws: 0, syncs: 0, draw_ms: 0, empty: [], errors: [] };
  const hidden = new Set();  // keys of the traces hidden from the legend
  let charts = [];  // per panel: {panel, cols: [{i, role}], plot, box, empty, label}
  let zoom = null;  // [min, max] of the step axis, shared by every panel; null: all steps
  let syncing = false, visible = true, stale = true, frame = 0, timer = 0, last = -Infinity, built = "";

  const askSync = () => {
    if (syncing) return;
    syncing = true;
    stats.syncs++;
    model.send({ type: "sync" });
  };

  const schedule = urgent => {
    // New points are drawn at most once per redraw_interval; a control, a resize or coming back into view
    // is drawn in the next frame.
    stale = true;
    if (!visible || frame) return;
    const wait = urgent === true ? 0 : last + 1000 * model.get("redraw_interval") - performance.now();
    if (wait <= 0) {
      clearTimeout(timer);
      timer = 0;
      frame = requestAnimationFrame(draw);
    } else if (!timer) {
      timer = setTimeout(() => { timer = 0; schedule(true); }, wait);
    }
  };

  const onMessage = (msg, buffers) => {
    if (msg.type !== "points") return;
    stats.messages++;
    if (msg.sync) syncing = false;
    const vals = buffers && buffers.length ? float64(buffers[0]) : decode(msg.b64 || "");
    let at = 0, gap = false;
    for (const [i, start, count] of msg.traces) {
      const xs = vals.subarray(at, at + count), ys = vals.subarray(at + count, at + 2 * count);
      at += 2 * count;
      const s = (data[i] ||= series());
      if (start === 0) s.n = 0;
      else if (s.n !== start) { gap = true; continue; }
      append(s, xs, ys);
    }
    if (gap) askSync();
    schedule();
  };

  function columns() {
    // Two columns of panels where each gets at least COLUMN px, one in a narrow panel beside the notebook.
    return (el.clientWidth || 800) >= 2 * COLUMN + GAP ? 2 : 1;
  }

  function sizes() {
    // Each panel's plot size: rows share the height (the first row 1.6x); a row with one panel spans both
    // columns; in one column every panel is as wide as the view.
    const panels = model.get("panels"), width = Math.max(160, el.clientWidth || 800), two = columns() === 2;
    const rows = Math.max(1, ...panels.map(p => p.row)), weight = r => (r === 1 ? 1.6 : 1);
    let total = 0;
    for (let r = 1; r <= rows; r++) total += weight(r);
    const free = model.get("height") - TOOLBAR - rows * (TITLE + LEGEND + 6);
    return panels.map(p => {
      const alone = panels.filter(q => q.row === p.row).length === 1;
      return { width: Math.floor(alone || !two ? width : (width - GAP) / 2),
               height: Math.max(60, Math.floor((free * weight(p.row)) / total)) };
    });
  }

  function build() {
    // One uPlot per panel; made again only when the panels or the trace styles change.
    for (const c of charts) c.plot.destroy();
    grid.replaceChildren();
    const panels = model.get("panels"), traces = model.get("traces"), dims = sizes();
    const two = columns() === 2;
    grid.style.gridTemplateColumns = `repeat(${two ? 2 : 1}, ${dims.length ? "minmax(0, 1fr)" : "auto"})`;
    charts = panels.map((panel, k) => {
      const mine = traces.map((t, i) => ({ t, i })).filter(({ t }) => t.panel === k && t.kind !== "mark");
      const cols = [], uSeries = [{ label: "step" }], bands = [];
      const band = ["upper", "lower"].map(kind => mine.find(({ t }) => t.kind === kind));
      if (band[0] && band[1]) {
        for (const { t, i } of band) {
          cols.push({ i, role: "band" });
          uSeries.push({ label: t.name, stroke: "transparent", width: 0, points: { show: false },
                         class: t.kind === "upper" ? "forge-nolegend" : undefined });
        }
        bands.push({ series: [1, 2], fill: band[1].t.color });
      }
      const lines = mine.filter(({ t }) => t.kind === "line");
      for (const { t, i } of lines) {  // the raw traces under the smoothed ones
        cols.push({ i, role: "raw", t });
        uSeries.push({ label: t.name + " (raw)", stroke: faint(t.color), width: 1, points: { show: false },
                       class: "forge-nolegend" });
      }
      for (const { t, i } of lines) {
        cols.push({ i, role: "main", t });
        uSeries.push({ label: t.name, stroke: t.color, width: t.width, dash: t.dash ? [6, 3] : undefined,
                       points: { show: false }, show: !hidden.has(t.key) });
      }
      const box = document.createElement("div");
      box.className = "forge-curves-panel";
      box.dataset.title = panel.title;
      if (two && dims[k].width > (el.clientWidth || 800) * 0.6) box.style.gridColumn = "1 / span 2";
      box.innerHTML = "<div class='forge-curves-title'></div><div class='forge-mark-label'></div>"
        + "<div class='forge-curves-empty'></div>";
      box.firstChild.textContent = panel.title;
      grid.appendChild(box);
      const chart = { panel, cols, box, empty: box.querySelector(".forge-curves-empty"),
                      label: box.querySelector(".forge-mark-label") };
      chart.empty.textContent = panel.empty || "";
      chart.plot = new uPlot({
        ...dims[k],
        scales: { x: { time: false }, y: { range: yRange } },
        series: uSeries,
        bands,
        axes: [{ font: FONT, size: 24, space: 70, gap: 2 }, { font: FONT, size: 56, space: 14, gap: 2 }],
        cursor: { sync: { key, setSeries: false }, drag: { x: true, y: false, setScale: false },
                  points: { size: 5 } },
        legend: { live: true },
        hooks: {
          draw: [u => marks(u, k)],
          setSelect: [u => select(u)],
          setSeries: [(u, s, opts) => toggled(chart, s, opts)],
          setCursor: [u => markLabel(chart, u)],
        },
      }, [[], ...cols.map(() => [])], box);
      chart.plot.over.addEventListener("dblclick", () => { zoom = null; schedule(true); });
      for (let s = 1; s <= cols.length; s++) if (cols[s - 1].role === "raw") chart.plot.series[s].show = !hidden.has(cols[s - 1].t.key);
      return chart;
    });
  }

  function toggled(chart, s, opts) {
    // A legend click hides a trace, and its raw trace with it.
    const col = chart.cols[s - 1];
    if (opts.show == null || !col || col.role !== "main") return;
    if (opts.show) hidden.delete(col.t.key); else hidden.add(col.t.key);
    const raw = chart.cols.findIndex(c => c.role === "raw" && c.i === col.i);
    if (raw >= 0) chart.plot.setSeries(raw + 1, { show: opts.show }, false);
  }

  function select(u) {
    // A drag selected steps: every panel shows them.
    if (u.select.width < 4) return;
    zoom = [u.posToVal(u.select.left, "x"), u.posToVal(u.select.left + u.select.width, "x")];
    u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
    schedule(true);
  }

  function marks(u, k) {
    // Hot changes and failures: a dotted line at their step in each panel, and a symbol on the reward panel.
    const all = model.get("marks"), styles = model.get("mark_styles"), ctx = u.ctx, bb = u.bbox;
    if (!all.length) return;
    const dpr = window.devicePixelRatio || 1;
    ctx.save();
    ctx.beginPath();
    ctx.rect(bb.left, bb.top, bb.width, bb.height);
    ctx.clip();
    ctx.lineWidth = dpr;
    ctx.setLineDash([2 * dpr, 3 * dpr]);
    for (const [step, kind] of all) {
      const x = Math.round(u.valToPos(step, "x", true)) + 0.5;
      ctx.strokeStyle = styles[kind].color;
      ctx.beginPath(); ctx.moveTo(x, bb.top); ctx.lineTo(x, bb.top + bb.height); ctx.stroke();
    }
    ctx.setLineDash([]);
    if (k === 0) {
      for (const [step, kind] of all) {
        const st = styles[kind], x = u.valToPos(step, "x", true), y = bb.top + (1 - st.y) * bb.height, d = 4 * dpr;
        ctx.strokeStyle = ctx.fillStyle = st.color;
        ctx.lineWidth = 2 * dpr;
        ctx.beginPath();
        if (st.symbol === "x") {
          ctx.moveTo(x - d, y - d); ctx.lineTo(x + d, y + d); ctx.moveTo(x + d, y - d); ctx.lineTo(x - d, y + d);
          ctx.stroke();
        } else {
          ctx.moveTo(x - d, y - d); ctx.lineTo(x + d, y - d); ctx.lineTo(x, y + d); ctx.closePath(); ctx.fill();
        }
      }
    }
    ctx.restore();
  }

  function markLabel(chart, u) {
    // The labels of the marks under the cursor (within 5 px), above the panel. The legend shows the values
    // at the cursor while it is over a panel (any panel: the cursor is shared) and only the names otherwise:
    // writing the latest values into nine legends at every redraw cost chromium as much as the drawing.
    const left = u.cursor.left, all = model.get("marks"), over = left != null && left >= 0;
    if (chart.box.classList.contains("forge-hovered") !== over) chart.box.classList.toggle("forge-hovered", over);
    const near = over ? all.filter(([step]) => Math.abs(u.valToPos(step, "x") - left) < 5) : [];
    const text = near.map(m => `step ${m[0]}: ${m[2]}`).join("; ");
    if (chart.label.textContent !== text) chart.label.textContent = text;
  }

  function draw() {
    frame = 0;
    if (!visible) return;
    stale = false;
    stats.draws++;
    last = performance.now();
    const shape = JSON.stringify([model.get("panels"), model.get("traces"), model.get("height"), columns()]);
    if (shape !== built) { build(); built = shape; }
    const weight = model.get("smoothing") || 0, dims = sizes();
    let xlo = Infinity, xhi = -Infinity;
    for (const s of data) if (s && s.n) { xlo = Math.min(xlo, s.x[0]); xhi = Math.max(xhi, s.x[s.n - 1]); }
    if (!(xhi > xlo)) { xlo = Number.isFinite(xlo) ? xlo - 1 : 0; xhi = Number.isFinite(xhi) ? xhi + 1 : 1; }
    const [lo, hi] = zoom || [xlo, xhi];
    stats.empty = [];
    charts.forEach((c, k) => {
      try {
        update(c, dims[k], weight, lo, hi);
      } catch (e) {  // one panel that cannot be drawn leaves the others drawn, and says why once
        const why = `${c.panel.title}: ${e}`;
        if (!stats.errors.includes(why)) { stats.errors.push(why); console.error("forge_nb curves", why, e); }
      }
    });
    stats.draw_ms += performance.now() - last;
  }

  function update(c, dim, weight, lo, hi) {
    const table = aligned(c.cols.map(col => data[col.i]));
    const cols = c.cols.map((col, j) => {
      const ys = table[j + 1], smooth = weight > 0 && col.t && col.t.smooth;
      if (col.role === "raw") return smooth ? ys : ys.map(() => null);
      return col.role === "main" && smooth ? ema(ys, weight) : ys;
    });
    const none = !c.cols.some(col => data[col.i] && data[col.i].n);
    c.empty.style.display = none && c.panel.empty ? "" : "none";
    if (none && c.panel.empty) stats.empty.push(c.panel.title);
    c.plot.batch(() => {  // uPlot draws once, at the end of the batch (so a panel's error is thrown here)
      if (c.plot.width !== dim.width || c.plot.height !== dim.height) c.plot.setSize(dim);
      c.plot.setData([table[0], ...cols], false);
      c.plot.setScale("x", { min: lo, max: hi });
    });
    markLabel(c, c.plot);
  }

  const syncSlider = () => {
    const v = model.get("smoothing") || 0;
    slider.value = String(v);
    shown.textContent = v.toFixed(2);
  };
  slider.addEventListener("input", () => {
    model.set("smoothing", Number(slider.value));
    model.save_changes();
    syncSlider();
    schedule(true);
  });
  syncSlider();

  const seen = new IntersectionObserver(entries => {
    visible = entries[entries.length - 1].isIntersecting;
    if (visible && stale) schedule(true);
  });
  seen.observe(el);
  const resized = new ResizeObserver(() => schedule(true));
  resized.observe(el);
  const restyle = () => { syncSlider(); schedule(true); };
  const STRUCTURE = ["change:traces", "change:marks", "change:panels", "change:height", "change:redraw_interval",
                     "change:smoothing"];
  model.on("msg:custom", onMessage);
  for (const name of STRUCTURE) model.on(name, restyle);
  const column = k => {
    for (const c of charts) {
      const s = c.cols.findIndex(col => col.role === "main" && model.get("traces")[col.i].key === k);
      if (s >= 0) return [c.plot, s + 1];
    }
    return [null, -1];
  };
  el.forgeCurves = {
    stats,
    points: k => {
      const i = model.get("traces").findIndex(t => t.key === k);
      return i >= 0 && data[i] ? data[i].n : 0;
    },
    drawn: k => {
      const [plot, s] = column(k);
      return plot ? { x: Array.from(plot.data[0]), y: Array.from(plot.data[s]) } : null;
    },
    hidden: k => {
      const [plot, s] = column(k);
      return plot ? !plot.series[s].show : null;
    },
    xrange: () => (charts.length ? charts.map(c => [c.plot.scales.x.min, c.plot.scales.x.max]) : []),
  };
  askSync();
  schedule(true);
  return () => {
    model.off("msg:custom", onMessage);
    for (const name of STRUCTURE) model.off(name, restyle);
    seen.disconnect();
    resized.disconnect();
    for (const c of charts) c.plot.destroy();
    if (frame) cancelAnimationFrame(frame);
    clearTimeout(timer);
  };
}

export default { render };
