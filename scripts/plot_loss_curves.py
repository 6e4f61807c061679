#!/usr/bin/env python3
"""Draws scripts/float8_quality.py's results as a self-contained HTML page (inline SVG, no network).

Two panels, one colour per recipe: the validation loss at each evaluation, and the training loss
(moving average of --smooth logged steps) over the second half of the run, where the curves differ
by less than the first half's range would show. A table of the final figures follows.

  scripts/plot_loss_curves.py quality.json --output curves.html --title "4 layers of 8B, SOTU, one H200"
Screenshot it to PNG with a headless browser (docs/float8.md shows the command).
"""
import argparse
import html
import json

from html_page import write_page

PANEL_W, PANEL_H = 520, 400
LEFT, RIGHT, TOP, BOTTOM, GAP = 70, 20, 60, 55, 40
COLORS = ["#111111", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]


def nice_step(span, ticks=6):
    raw = span / ticks
    for unit in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000):
        if unit >= raw:
            return unit
    return raw


def panel(svg, left, title, series, x_label, y_label):
    """One chart: series = [(label, colour, [(x, y)...], markers)]."""
    xs = [p[0] for _, _, pts, _ in series for p in pts]
    ys = [p[1] for _, _, pts, _ in series for p in pts]
    x_low, x_high = min(xs), max(xs)
    pad = (max(ys) - min(ys)) * 0.05 or 0.01
    y_low, y_high = min(ys) - pad, max(ys) + pad
    width, height = PANEL_W - LEFT - RIGHT, PANEL_H - TOP - BOTTOM

    def x(v):
        return left + LEFT + (v - x_low) / max(x_high - x_low, 1e-9) * width

    def y(v):
        return TOP + height - (v - y_low) / (y_high - y_low) * height

    svg.append(f'<text x="{left + LEFT}" y="{TOP - 12}" font-weight="bold">{html.escape(title)}</text>')
    step = nice_step(y_high - y_low)
    tick = (y_low // step + 1) * step
    while tick < y_high:
        svg.append(f'<line x1="{left + LEFT}" x2="{left + LEFT + width}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#e8e8e8"/>')
        svg.append(f'<text x="{left + LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:g}</text>')
        tick += step
    step = nice_step(x_high - x_low, 5)
    tick = (x_low // step + 1) * step if x_low % step else x_low
    while tick <= x_high:
        svg.append(f'<text x="{x(tick):.1f}" y="{TOP + height + 18}" text-anchor="middle">{tick:g}</text>')
        tick += step
    svg.append(f'<rect x="{left + LEFT}" y="{TOP}" width="{width}" height="{height}" fill="none" stroke="#888"/>')
    svg.append(f'<text x="{left + LEFT + width / 2}" y="{PANEL_H - 12}" text-anchor="middle">{html.escape(x_label)}</text>')
    svg.append(f'<text transform="translate({left + 18},{TOP + height / 2}) rotate(-90)" text-anchor="middle">'
               f'{html.escape(y_label)}</text>')
    for label, color, pts, markers in series:
        line = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in pts)
        svg.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
        if markers:
            for a, b in pts:
                svg.append(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="3" fill="{color}">'
                           f'<title>{html.escape(label)}, step {a:g}: {b:.4f}</title></circle>')


def moving_average(points, window):
    out = []
    for i in range(len(points)):
        chunk = points[max(0, i - window + 1):i + 1]
        out.append((points[i][0], sum(p[1] for p in chunk) / len(chunk)))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results")
    p.add_argument("--output", required=True)
    p.add_argument("--title", default="float8 recipes against bf16: loss curves")
    p.add_argument("--smooth", type=int, default=5, help="logged steps in the training loss's moving average")
    args = p.parse_args()
    with open(args.results) as f:
        data = json.load(f)
    runs = data.get("runs", [])
    if not runs:
        raise SystemExit(f"plot_loss_curves: no runs in {args.results}")

    validation, training = [], []
    for i, r in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        label = "bf16" if r["recipe"] == "none" else r["recipe"]
        validation.append((label, color, [tuple(v) for v in r["validation_loss"]], True))
        smoothed = moving_average([tuple(v) for v in r["loss"]], max(1, args.smooth))
        half = smoothed[-1][0] / 2
        training.append((label, color, [v for v in smoothed if v[0] >= half], False))

    width = 2 * PANEL_W + GAP
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{PANEL_H + 40}" font-family="sans-serif" font-size="13">',
           f'<rect width="{width}" height="{PANEL_H + 40}" fill="white"/>',
           f'<text x="{LEFT}" y="24" font-size="16" font-weight="bold">{html.escape(args.title)}</text>']
    panel(svg, 0, "validation loss", validation, "step", "loss")
    panel(svg, PANEL_W + GAP, f"training loss, second half (mean of {args.smooth} logs)", training, "step", "loss")
    legend_x = LEFT
    for label, color, _, _ in validation:
        svg.append(f'<line x1="{legend_x}" x2="{legend_x + 24}" y1="{PANEL_H + 22}" y2="{PANEL_H + 22}" stroke="{color}" stroke-width="3"/>')
        svg.append(f'<text x="{legend_x + 30}" y="{PANEL_H + 26}">{html.escape(label)}</text>')
        legend_x += 40 + 9 * len(label)
    svg.append("</svg>")

    table = ["<table><tr><th>recipe</th><th>validation loss</th><th>vs baseline</th><th>training loss</th>"
             "<th>tokens/s</th></tr>"]
    for r in runs:
        gap = r.get("relative_gap", 0.0)
        table.append(f'<tr><td>{html.escape(r["recipe"])}</td><td>{r["final_validation_loss"]:.4f}</td>'
                     f'<td>{100 * gap:+.2f}%</td><td>{r["final_training_loss"]:.4f}</td>'
                     f'<td>{r["tokens_per_second"]:,.0f}</td></tr>')
    table.append("</table>")
    write_page(args.output, args.title, svg, table)
    print(f"plot_loss_curves: {args.output}")


if __name__ == "__main__":
    main()
