// A small live chart under a streaming reply: tok/s (solid) and draft acceptance (dashed) over the answer.
const NS = "http://www.w3.org/2000/svg";
const W = 240, H = 40;

export class LiveChart {
  constructor(parent) {
    this.points = []; // [tokens, tok/s, acceptance 0..1]
    this.svg = document.createElementNS(NS, "svg");
    this.svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    this.svg.setAttribute("class", "chart");
    this.svg.setAttribute("role", "img");
    this.svg.setAttribute("aria-label", "tok/s and acceptance over the answer");
    this.speed = this.line("speed");
    this.accept = this.line("accept");
    this.label = document.createElementNS(NS, "text");
    this.label.setAttribute("x", "2");
    this.label.setAttribute("y", "10");
    this.svg.append(this.label);
    parent.append(this.svg);
  }

  line(cls) {
    const l = document.createElementNS(NS, "polyline");
    l.setAttribute("class", cls);
    this.svg.append(l);
    return l;
  }

  add(stats) {
    if (!stats || !stats.tokens || !(stats.generation_s > 0)) return;
    const last = this.points[this.points.length - 1];
    if (last && stats.tokens - last[0] < 4) return; // one point per few tokens is enough to read
    const rate = stats.tokens / stats.generation_s;
    const acceptance = stats.drafted ? stats.accepted / stats.drafted : 0;
    this.points.push([stats.tokens, rate, acceptance]);
    this.draw(rate, acceptance);
  }

  draw(rate, acceptance) {
    const n = this.points[this.points.length - 1][0] || 1;
    const top = Math.max(...this.points.map((p) => p[1])) || 1;
    const xy = (t, v) => `${((t / n) * (W - 2) + 1).toFixed(1)},${(H - 2 - v * (H - 14)).toFixed(1)}`;
    this.speed.setAttribute("points", this.points.map((p) => xy(p[0], p[1] / top)).join(" "));
    this.accept.setAttribute("points", this.points.map((p) => xy(p[0], p[2])).join(" "));
    this.label.textContent = `${rate.toFixed(1)} tok/s · ${Math.round(acceptance * 100)}% accepted`;
  }

  remove() {
    this.svg.remove();
  }
}
