#!/usr/bin/env python3
"""Draws scripts/memory_curve.py's results as a self-contained HTML page (inline SVG, no network).

Tokens/s against the memory budget: `auto` at each budget, each fixed policy as a flat line from its
own peak (below that it does not fit and smelt refuses before allocating), and the fixed policies
re-run at their own peak + 1% (the "no cliff" points).

  scripts/plot_memory_curve.py docs/data/memory_curve_fp8_proxy.json --output curve.html \\
      --title "Llama-3 8B proxy, fp8 tensorwise, one H200"
Screenshot it to PNG with a headless browser (docs/memory_plan.md shows the command).
"""
import argparse
import html
import json

from html_page import write_page

WIDTH, HEIGHT = 900, 520
LEFT, RIGHT, TOP, BOTTOM = 80, 200, 50, 60
COLORS = {"none": "#d62728", "selective-op": "#1f77b4", "full": "#2ca02c", "auto": "#111111"}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results")
    p.add_argument("--output", required=True)
    p.add_argument("--title", default="tokens/s against the memory budget")
    args = p.parse_args()
    with open(args.results) as f:
        data = json.load(f)
    rows = [r for r in data["results"] if r.get("ok")]
    if not rows:
        raise SystemExit(f"plot_memory_curve: no successful runs in {args.results}")

    peaks = {r["mode"]: r["predicted_bytes"] / 1e9 for r in rows if r["mode"] != "auto" and not r["budget_gb"]}
    unlimited = {r["mode"]: r["tokens_per_second"] for r in rows if not r["budget_gb"]}
    capped = [r for r in rows if r["mode"] != "auto" and r["budget_gb"]]
    auto = sorted((r["budget_gb"], r["tokens_per_second"], r["predicted_bytes"] / 1e9)
                  for r in rows if r["mode"] == "auto" and r["budget_gb"])
    budgets = [r["budget_gb"] for r in rows if r["budget_gb"]] + list(peaks.values())
    x_low, x_high = min(budgets) - 0.5, max(budgets) + 1.5
    speeds = [r["tokens_per_second"] for r in rows]
    y_low, y_high = min(speeds) * 0.97, max(speeds) * 1.02

    def x(gb):
        return LEFT + (gb - x_low) / (x_high - x_low) * (WIDTH - LEFT - RIGHT)

    def y(tps):
        return HEIGHT - BOTTOM - (tps - y_low) / (y_high - y_low) * (HEIGHT - TOP - BOTTOM)

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="13">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{LEFT}" y="28" font-size="16" font-weight="bold">{html.escape(args.title)}</text>']
    # Axes and grid.
    step = 1000 if y_high - y_low < 12000 else 2000
    tick = int(y_low // step + 1) * step
    while tick < y_high:
        svg.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#e5e5e5"/>')
        svg.append(f'<text x="{LEFT - 8}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:,}</text>')
        tick += step
    gb = int(x_low) + 1
    while gb < x_high:
        svg.append(f'<line x1="{x(gb):.1f}" x2="{x(gb):.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" stroke="#f0f0f0"/>')
        svg.append(f'<text x="{x(gb):.1f}" y="{HEIGHT - BOTTOM + 18}" text-anchor="middle">{gb}</text>')
        gb += 1
    svg.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 15}" text-anchor="middle">memory budget (GB, enforced on the device)</text>')
    svg.append(f'<text transform="translate(22,{(TOP + HEIGHT - BOTTOM) / 2}) rotate(-90)" text-anchor="middle">tokens/s (median)</text>')
    svg.append(f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{HEIGHT - TOP - BOTTOM}" fill="none" stroke="#888"/>')

    legend_y = TOP + 10
    def legend(color, label, dash=""):
        nonlocal legend_y
        svg.append(f'<line x1="{WIDTH - RIGHT + 15}" x2="{WIDTH - RIGHT + 40}" y1="{legend_y}" y2="{legend_y}" '
                   f'stroke="{color}" stroke-width="3" {dash}/>')
        svg.append(f'<text x="{WIDTH - RIGHT + 46}" y="{legend_y + 4}">{html.escape(label)}</text>')
        legend_y += 22

    # Fixed policies: flat from their peak (they fit from there on), with the capped re-run as a marker.
    for mode, peak in sorted(peaks.items(), key=lambda kv: kv[1]):
        color = COLORS.get(mode, "#777")
        tps = unlimited[mode]
        svg.append(f'<line x1="{x(peak):.1f}" x2="{x(x_high):.1f}" y1="{y(tps):.1f}" y2="{y(tps):.1f}" stroke="{color}" '
                   f'stroke-width="2" stroke-dasharray="6,4"><title>{mode}: {tps:,.0f} tokens/s from {peak:.2f} GB</title></line>')
        svg.append(f'<line x1="{x(peak):.1f}" x2="{x(peak):.1f}" y1="{y(tps) - 6:.1f}" y2="{y(tps) + 6:.1f}" stroke="{color}" stroke-width="2"/>')
        legend(color, f"{mode} ({peak:.1f} GB)", 'stroke-dasharray="6,4"')
    for r in capped:
        color = COLORS.get(r["mode"], "#777")
        change = 100 * (r["tokens_per_second"] / unlimited[r["mode"]] - 1)
        svg.append(f'<rect x="{x(r["budget_gb"]) - 5:.1f}" y="{y(r["tokens_per_second"]) - 5:.1f}" width="10" height="10" '
                   f'fill="white" stroke="{color}" stroke-width="2"><title>{r["mode"]} at budget {r["budget_gb"]:.2f} GB '
                   f'(peak + 1%): {r["tokens_per_second"]:,.0f} tokens/s ({change:+.2f}%)</title></rect>')
    if auto:
        points = " ".join(f"{x(b):.1f},{y(t):.1f}" for b, t, _ in auto)
        svg.append(f'<polyline points="{points}" fill="none" stroke="{COLORS["auto"]}" stroke-width="2.5"/>')
        for b, t, arena in auto:
            svg.append(f'<circle cx="{x(b):.1f}" cy="{y(t):.1f}" r="5" fill="{COLORS["auto"]}"><title>auto at {b:.2f} GB: '
                       f'{t:,.0f} tokens/s, arena {arena:.2f} GB</title></circle>')
        legend(COLORS["auto"], "auto")
    svg.append(f'<rect x="{WIDTH - RIGHT + 20}" y="{legend_y - 5}" width="10" height="10" fill="white" stroke="#555" stroke-width="2"/>')
    svg.append(f'<text x="{WIDTH - RIGHT + 46}" y="{legend_y + 4}">fixed, budget = peak + 1%</text>')
    svg.append("</svg>")

    table = ["<table><tr><th>policy</th><th>budget GB</th><th>tokens/s</th><th>plan GB</th><th>driver GB</th></tr>"]
    for r in rows:
        budget = f'{r["budget_gb"]:.2f}' if r["budget_gb"] else "unlimited"
        table.append(f'<tr><td>{r["mode"]}</td><td>{budget}</td><td>{r["tokens_per_second"]:,.0f}</td>'
                     f'<td>{r["predicted_bytes"] / 1e9:.2f}</td><td>{r["measured_bytes"] / 1e9:.2f}</td></tr>')
    table.append("</table>")
    write_page(args.output, args.title, svg, table)
    print(f"plot_memory_curve: {args.output}")


if __name__ == "__main__":
    main()
