// autodice's report: draws the data autodice embedded in #report-data with Plotly (vendored, so
// the page works offline). Names from the model are text: they reach the DOM by textContent, and
// Plotly's labels (which read a few HTML tags) get them entity-escaped.
"use strict";
const DATA = JSON.parse(document.getElementById("report-data").textContent);
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
  "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5"];
const CONFIG = {scrollZoom: true, displaylogo: false, responsive: true};
const PARTS = {compute: "compute", recv_wait: "waiting to receive", send_wait: "waiting to send",
  frame_wait: "waiting for a frame"};
const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
const drawn = [];

function human(n) {
  const units = ["B", "KB", "MB", "GB"];
  let k = 0;
  while (n >= 1000 && k < units.length - 1) { n /= 1000; k++; }
  return (k ? n.toFixed(1) : String(n)) + " " + units[k];
}

function listed(names, most) {
  const shown = names.slice(0, most).map(esc).join("<br>");
  return names.length > most ? shown + "<br>... " + (names.length - most) + " more" : shown;
}

function drawPartition(p, keys) {
  const traces = [];
  const line = {x: [], y: []};
  for (const [a, b] of p.links) {
    line.x.push(p.nodes[a].x, p.nodes[b].x, null);
    line.y.push(p.nodes[a].y, p.nodes[b].y, null);
  }
  traces.push({...line, mode: "lines", hoverinfo: "skip", showlegend: false,
    line: {color: "#999", width: 1}});
  const cut = {x: [], y: []}, mark = {x: [], y: [], text: []};
  for (const c of p.cuts) {
    const a = p.nodes[c.from], b = p.nodes[c.to];
    cut.x.push(a.x, b.x, null);
    cut.y.push(a.y, b.y, null);
    mark.x.push((a.x + b.x) / 2);
    mark.y.push((a.y + b.y) / 2);
    mark.text.push(esc(c.tensor) + "<br>" + human(c.bytes) + " per frame<br>" +
      esc(keys[a.rank]) + " → " + esc(keys[b.rank]));
  }
  traces.push({...cut, mode: "lines", hoverinfo: "skip", name: "cut tensor",
    line: {color: "crimson", width: 2.5}});
  traces.push({...mark, mode: "markers", hoverinfo: "text", showlegend: false, name: "cut",
    marker: {symbol: "diamond", size: 9, color: "crimson"}});
  keys.forEach((key, rank) => {
    const mine = p.nodes.filter((n) => n.rank === rank);
    if (!mine.length) return;
    traces.push({type: "scatter", mode: "markers", name: esc("rank " + rank + ": " + key),
      x: mine.map((n) => n.x), y: mine.map((n) => n.y), hoverinfo: "text",
      text: mine.map((n) => "<b>" + esc(key) + "</b> · " + n.layers.length + " layer" +
        (n.layers.length > 1 ? "s" : "") + "<br>" + listed(n.layers, 8) + "<br>" +
        esc(n.ops.join(", ")) + "<br>" + (n.flops / 1e6).toFixed(1) + " MFLOPs, " +
        human(n.param_bytes) + " weights"),
      marker: {size: mine.map((n) => Math.min(22, 9 + 2 * Math.sqrt(n.layers.length))),
        color: COLORS[rank % COLORS.length], line: {color: "#333", width: 0.5}}});
  });
  const width = Math.max(...p.nodes.map((n) => n.x));
  drawn.push(Plotly.newPlot("partition", traces, {
    dragmode: "pan", hovermode: "closest", margin: {l: 10, r: 10, t: 10, b: 10},
    xaxis: {visible: false, range: [-1, Math.min(width, 60) + 1]},
    yaxis: {visible: false}, legend: {orientation: "h"}}, CONFIG));
}

function stackedBars(div, rows, parts, title) {
  const traces = Object.entries(parts).map(([part, label]) => ({
    type: "bar", orientation: "h", name: label, y: rows.map((r) => esc(r.label)),
    x: rows.map((r) => r[part]), hovertemplate: "%{x:.3f} ms<extra>" + label + "</extra>"}));
  drawn.push(Plotly.newPlot(div, traces, {barmode: "stack", margin: {l: 220, r: 20, t: 40, b: 30},
    title: {text: title + " (ms per frame)", x: 0.01, xanchor: "left"},
    yaxis: {autorange: "reversed"},
    legend: {orientation: "h", traceorder: "normal", y: -0.25}}, CONFIG));
}

function drawRun(run) {
  stackedBars("run-ranks", run.ranks, PARTS, "Each rank's frame: computing and waiting");
  if (!run.histogram) return;
  const h = run.histogram, labels = h.le.map((s) => "≤ " + (s * 1e3) + " ms");
  labels.push("> " + h.le[h.le.length - 1] * 1e3 + " ms");
  drawn.push(Plotly.newPlot("run-latency", [{type: "bar", x: labels, y: h.counts,
    marker: {color: "#4c78a8"}, hovertemplate: "%{y} frames %{x}<extra></extra>"}],
  {title: {text: "End-to-end latency per frame", x: 0.01, xanchor: "left"},
    margin: {l: 60, r: 20, t: 40, b: 60},
    yaxis: {title: {text: "frames"}}}, CONFIG));
}

function selectPoint(front, k) {
  const p = front.points[k];
  const text = JSON.stringify(p.mapping, null, 2) + "\n";
  document.getElementById("point-name").textContent = p.name + ": " + p.fps.toFixed(1) +
    " frames/s, " + p.memory_mb.toFixed(1) + " MB, " + p.energy_mj.toFixed(2) + " mJ/frame" +
    (p.agreement == null ? "" : ", agreement " + p.agreement.toFixed(3));
  // What makes it as the search priced it: its int8 keys, the wire between hosts.
  document.getElementById("point-gen").textContent = ["autodice gen OUT",
    ...(p.precision ? ["--precision " + p.precision, "--calibration FRAMES"] : []),
    ...(front.wire !== "fp32" ? ["--wire " + front.wire] : [])].join(" ");
  document.getElementById("point-mapping").textContent = text;
  const save = document.getElementById("point-save");
  save.href = "data:application/json;charset=utf-8," + encodeURIComponent(text);
  save.download = p.name + ".json";
  document.body.dataset.point = p.name;
  Plotly.restyle("front", {x: [[p.fps]], y: [[p.memory_mb]]}, [1]);
  const rows = p.ranks.map((r) => ({label: r.key + (r.int8 ? " (int8)" : ""),
    compute: r.compute_ms, comm: r.comm_ms}));
  stackedBars("point-ranks", rows, {compute: "compute (predicted)", comm: "transfer (predicted)"},
    p.name + ": each rank per frame");
}

function drawFront(front) {
  const pts = front.points, hover = (p) => "<b>" + esc(p.name) + "</b><br>" +
    p.fps.toFixed(1) + " frames/s<br>" + p.memory_mb.toFixed(1) + " MB (largest device)<br>" +
    p.energy_mj.toFixed(2) + " mJ/frame (largest device)<br>" + p.devices + " devices, " +
    "bottleneck " + esc(p.bottleneck) +
    (p.precision ? "<br>int8 keys: " + p.ranks.filter((r) => r.int8).length : "") +
    (p.agreement == null ? "" : "<br>agreement " + p.agreement.toFixed(3) + " (" +
      esc(p.agreement_of) + ")");
  const traces = [{type: "scatter", mode: "markers", name: "front", x: pts.map((p) => p.fps),
    y: pts.map((p) => p.memory_mb), text: pts.map(hover), hoverinfo: "text",
    marker: {size: 11, color: pts.map((p) => p.energy_mj), colorscale: "Viridis",
      colorbar: {title: {text: "mJ/frame"}}, line: {color: "#333", width: 0.5}}},
  {type: "scatter", mode: "markers", name: "chosen", x: [], y: [], hoverinfo: "skip",
    marker: {symbol: "circle-open", size: 22, color: "#222", line: {width: 2}}}];
  front.references.forEach((p, k) => traces.push({type: "scatter", mode: "markers",
    name: esc(p.name), x: [p.fps], y: [p.memory_mb], text: [hover(p)], hoverinfo: "text",
    marker: {symbol: k % 2 ? "triangle-up" : "star", size: 16, color: "crimson"}}));
  const plot = Plotly.newPlot("front", traces, {hovermode: "closest",
    margin: {l: 70, r: 20, t: 20, b: 50}, legend: {orientation: "h", y: -0.2},
    xaxis: {title: {text: "throughput (frames/s)"}},
    yaxis: {title: {text: "memory of the largest device (MB)"}}}, CONFIG);
  drawn.push(plot.then((div) => div.on("plotly_click", (ev) => {
    const hit = ev.points.find((q) => q.curveNumber === 0);
    if (hit) selectPoint(front, hit.pointIndex);
  })));
  const wanted = new URLSearchParams(location.hash.slice(1)).get("point");
  selectPoint(front, Math.max(0, pts.findIndex((p) => p.name === wanted)));
}

if (DATA.partition) drawPartition(DATA.partition, DATA.keys);
if (DATA.run) drawRun(DATA.run);
if (DATA.front) drawFront(DATA.front);
Promise.all(drawn).then(() => { document.body.dataset.rendered = "true"; });
