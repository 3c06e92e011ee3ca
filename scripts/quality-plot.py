#!/usr/bin/env python3
"""The quality lab's sweeps as a markdown table and an SVG plot of the loss
gap against the traffic reduction (docs/QUALITY.md).

Usage: scripts/quality-plot.py --svg OUT.svg [--title T] [--md OUT.md]
                              [--paired SETTING] [PREFIX@]LAB.json...

Each LAB.json is what `loco lab ... --json` wrote; PREFIX@LAB.json puts
PREFIX before its settings' labels (what the run --set, say). Every setting becomes a
point: x = traffic reduction against data parallel's ring all-reduce (log
scale), y = mean loss gap in percent with its 95% interval as a bar. The
Pareto front (no other point both smaller in gap and larger in reduction)
is joined by a line. With --paired SETTING (a label as the table prints
it) the table gains a column: each setting's DiLoCo loss against that
setting's on the same seed, (L - L_ref) / L_ref, as a mean and a Student's
95% interval over the seeds both ran; pairing removes the seed's share of
the noise, which dominates the gap to data parallel at this scale.
Standard library only: no plotting package needed.
"""
import argparse
import json
import math
import sys


def load(paths):
    pts = []
    for p in paths:
        prefix, _, p = p.rpartition("@")
        with open(p) as f:
            lab = json.load(f)
        for run in lab["runs"]:
            if "gap_mean" not in run:
                continue
            words = [prefix] if prefix else []
            words += [f"{k}={v}" for k, v in run["setting"].items()]
            label = " ".join(words) or p
            seeds = run["seeds"]
            pts.append({
                "label": label,
                "source": p,
                "gap": run["gap_mean"] * 100,
                "lo": run["gap_lo"] * 100,
                "hi": run["gap_hi"] * 100,
                "ratio": run["traffic_ratio"],
                "n": len(seeds),
                "diloco": sum(s["diloco_loss"] for s in seeds) / len(seeds),
                "dp": sum(s["dp_loss"] for s in seeds) / len(seeds),
                "per_seed": [s["gap"] * 100 for s in seeds],
                "by_seed": {s["seed"]: s["diloco_loss"] for s in seeds},
            })
    return pts


def pareto(pts):
    front = []
    for p in pts:
        if not any(q is not p and q["gap"] <= p["gap"] and q["ratio"] >= p["ratio"] and
                   (q["gap"] < p["gap"] or q["ratio"] > p["ratio"]) for q in pts):
            front.append(p)
    return sorted(front, key=lambda p: p["ratio"])


# Student's t, two-sided 95%, by degrees of freedom (1..30); 1.96 beyond.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def paired(p, ref):
    """p's DiLoCo loss against ref's on the seeds both ran, in percent."""
    d = [(p["by_seed"][s] - ref["by_seed"][s]) / ref["by_seed"][s] * 100
         for s in p["by_seed"] if s in ref["by_seed"]]
    if len(d) < 2:
        return "—"
    m = sum(d) / len(d)
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1))
    h = (T975[len(d) - 2] if len(d) - 1 <= len(T975) else 1.96) * sd / math.sqrt(len(d))
    return f"{m:+.2f}% ({m - h:+.2f} .. {m + h:+.2f})"


def markdown(pts, ref=None):
    head = "| setting | seeds | DiLoCo loss | DP loss | gap (mean) | 95% interval | per seed | traffic ÷ |"
    rule = "|---|---|---|---|---|---|---|---|"
    if ref:
        head += f" vs {ref['label']} (paired) |"
        rule += "---|"
    out = [head, rule]
    for p in pts:
        seeds = ", ".join(f"{g:+.2f}" for g in p["per_seed"])
        row = (f"| {p['label']} | {p['n']} | {p['diloco']:.4f} | {p['dp']:.4f} | "
               f"{p['gap']:+.2f}% | {p['lo']:+.2f} .. {p['hi']:+.2f}% | {seeds} | "
               f"{p['ratio']:.0f}× |")
        if ref:
            row += " — |" if p is ref else f" {paired(p, ref)} |"
        out.append(row)
    return "\n".join(out) + "\n"


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def svg(pts, title):
    W, H, L, R, T, B = 760, 460, 70, 230, 40, 50
    xs = [math.log10(p["ratio"]) for p in pts]
    ys = [v for p in pts for v in (p["lo"], p["hi"])] + [0.0, 1.0]
    x0, x1 = math.floor(min(xs) * 2) / 2, math.ceil(max(xs) * 2) / 2
    if x1 <= x0:
        x1 = x0 + 0.5
    y0, y1 = min(ys), max(ys)
    pad = (y1 - y0) * 0.08 or 1
    y0, y1 = y0 - pad, y1 + pad

    def X(v):
        return L + (v - x0) / (x1 - x0) * (W - L - R)

    def Y(v):
        return T + (y1 - v) / (y1 - y0) * (H - T - B)

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'font-family="sans-serif" font-size="11">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{L}" y="22" font-size="14">{esc(title)}</text>']
    # axes and grid
    d = x0
    while d <= x1 + 1e-9:
        o.append(f'<line x1="{X(d):.1f}" y1="{T}" x2="{X(d):.1f}" y2="{H - B}" stroke="#ddd"/>')
        o.append(f'<text x="{X(d):.1f}" y="{H - B + 15}" text-anchor="middle">'
                 f'{10 ** d:.0f}×</text>')
        d += 0.5
    step = 10 ** math.floor(math.log10(max(y1 - y0, 1e-9))) / 2
    v = math.ceil(y0 / step) * step
    while v <= y1:
        o.append(f'<line x1="{L}" y1="{Y(v):.1f}" x2="{W - R}" y2="{Y(v):.1f}" stroke="#eee"/>')
        o.append(f'<text x="{L - 5}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:+.1f}%</text>')
        v += step
    for ref, colour in ((0.0, "#888"), (1.0, "#c33")):
        if y0 <= ref <= y1:
            o.append(f'<line x1="{L}" y1="{Y(ref):.1f}" x2="{W - R}" y2="{Y(ref):.1f}" '
                     f'stroke="{colour}" stroke-dasharray="4 3"/>')
    if x0 <= 3 <= x1:
        o.append(f'<line x1="{X(3):.1f}" y1="{T}" x2="{X(3):.1f}" y2="{H - B}" stroke="#c33" '
                 f'stroke-dasharray="4 3"/>')
    o.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">'
             f'traffic reduction against data parallel (ring all-reduce of fp32 gradients)</text>')
    o.append(f'<text x="16" y="{(T + H - B) / 2}" text-anchor="middle" '
             f'transform="rotate(-90 16 {(T + H - B) / 2})">final validation loss gap, % '
             f'(95% interval)</text>')
    front = pareto(pts)
    if len(front) > 1:
        path = " ".join(f"{X(math.log10(p['ratio'])):.1f},{Y(p['gap']):.1f}" for p in front)
        o.append(f'<polyline points="{path}" fill="none" stroke="#2a7" stroke-width="1.5"/>')
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
               "#7f7f7f", "#bcbd22", "#17becf"]
    for i, p in enumerate(pts):
        c = palette[i % len(palette)]
        x = X(math.log10(p["ratio"]))
        o.append(f'<line x1="{x:.1f}" y1="{Y(p["lo"]):.1f}" x2="{x:.1f}" y2="{Y(p["hi"]):.1f}" '
                 f'stroke="{c}"/>')
        o.append(f'<circle cx="{x:.1f}" cy="{Y(p["gap"]):.1f}" r="4" fill="{c}"><title>'
                 f'{esc(p["label"])}: {p["gap"]:+.2f}% ({p["lo"]:+.2f} .. {p["hi"]:+.2f}), '
                 f'{p["ratio"]:.0f}×</title></circle>')
        ly = T + 14 * i + 8
        o.append(f'<circle cx="{W - R + 12}" cy="{ly - 4}" r="4" fill="{c}"/>')
        o.append(f'<text x="{W - R + 20}" y="{ly}">{esc(p["label"][:34])}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--svg", required=True)
    ap.add_argument("--md")
    ap.add_argument("--title", default="loss gap against traffic")
    ap.add_argument("--paired", metavar="SETTING")
    ap.add_argument("json", nargs="+")
    a = ap.parse_args()
    pts = load(a.json)
    if not pts:
        sys.exit("quality-plot.py: no settings with a data-parallel reference in " +
                 " ".join(a.json))
    with open(a.svg, "w") as f:
        f.write(svg(pts, a.title))
    ref = None
    if a.paired:
        ref = next((p for p in pts if p["label"] == a.paired), None)
        if ref is None:
            sys.exit(f"quality-plot.py: --paired {a.paired}: no such setting; the settings are: " +
                     ", ".join(p["label"] for p in pts))
    table = markdown(pts, ref)
    if a.md:
        with open(a.md, "w") as f:
            f.write(table)
    sys.stdout.write(table)


if __name__ == "__main__":
    main()
