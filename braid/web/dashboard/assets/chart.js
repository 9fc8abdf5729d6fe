// A live line chart in plain SVG: a fixed window of samples per series, redrawn on each poll.
// No chart library: two polylines and an axis need no more than this, and nothing is fetched.

import { h, svg } from "./dom.js";

const WIDTH = 360;
const HEIGHT = 120;
const PAD_LEFT = 44;
const PAD_BOTTOM = 16;
const PAD_TOP = 8;

// The next "round" maximum above value (1, 2, 5 x 10^n), so the axis label stays readable.
function niceCeiling(value) {
  if (value <= 1) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) {
    if (value <= step * power) return step * power;
  }
  return 10 * power;
}

export class LineChart {
  // series: [{id, label}]; capacity: samples kept (the window's width).
  constructor(name, title, series, capacity) {
    this.capacity = capacity;
    this.series = series.map((s, index) => ({ ...s, index, values: [] }));
    this.lines = this.series.map((s) =>
      svg("polyline", { class: `line line-${s.index}`, "data-series": s.id, points: "" }),
    );
    this.maxLabel = svg("text", { x: PAD_LEFT - 4, y: PAD_TOP + 8, class: "axis-label", "text-anchor": "end" }, "1");
    const plotBottom = HEIGHT - PAD_BOTTOM;
    this.figures = this.series.map((s) =>
      h("span", { class: `figure line-${s.index}`, "data-series": s.id, "data-rate": "0" }, "-"),
    );
    this.element = h(
      "figure",
      { class: "chart", "data-chart": name },
      h("figcaption", {}, title),
      svg(
        "svg",
        { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-label": title },
        svg("line", { x1: PAD_LEFT, y1: plotBottom, x2: WIDTH, y2: plotBottom, class: "axis" }),
        svg("line", { x1: PAD_LEFT, y1: PAD_TOP, x2: PAD_LEFT, y2: plotBottom, class: "axis" }),
        svg("text", { x: PAD_LEFT - 4, y: plotBottom, class: "axis-label", "text-anchor": "end" }, "0"),
        this.maxLabel,
        ...this.lines,
      ),
      h(
        "div",
        { class: "legend" },
        this.series.map((s, i) => h("span", { class: "key" }, h("i", { class: `swatch line-${s.index}` }), s.label, " ", this.figures[i])),
      ),
    );
  }

  // values: {seriesId: number}; one sample per series, in per-second units.
  push(values) {
    for (const s of this.series) {
      s.values.push(Math.max(0, values[s.id] || 0));
      if (s.values.length > this.capacity) s.values.shift();
    }
    this.draw();
  }

  draw() {
    const peak = Math.max(0, ...this.series.flatMap((s) => s.values));
    const top = niceCeiling(peak);
    this.maxLabel.textContent = top >= 1000 ? `${top / 1000}k/s` : `${top}/s`;
    const plotWidth = WIDTH - PAD_LEFT;
    const plotHeight = HEIGHT - PAD_BOTTOM - PAD_TOP;
    const step = plotWidth / Math.max(1, this.capacity - 1);
    this.series.forEach((s, i) => {
      // From the left edge until the window is full, then scrolling.
      const points = s.values.map((v, j) => {
        const x = PAD_LEFT + j * step;
        const y = PAD_TOP + plotHeight - (v / top) * plotHeight;
        return `${x.toFixed(1)},${y.toFixed(1)}`;
      });
      this.lines[i].setAttribute("points", points.join(" "));
      const latest = s.values.length ? s.values[s.values.length - 1] : 0;
      this.figures[i].textContent = `${latest >= 100 ? latest.toFixed(0) : latest.toFixed(1)}/s`;
      this.figures[i].dataset.rate = String(latest);
    });
  }
}
