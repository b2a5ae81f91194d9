#!/usr/bin/env python3
"""Plot training-step time against batch size, one panel per device, from the JSON tables of
tools/benchmark_training_step.py (--json): netcl solid, PyTorch dashed, tinygrad dotted, a colour
per model, log-log axes.

    python tools/plot_training_steps.py h200.json:H200 pocl.json:"PoCL, 2 cores" -o docs/training_steps.png
"""
import argparse
import json
import sys

STYLES = {"netcl_ms": ("-", "o", "netcl"), "torch_ms": ("--", "s", "PyTorch"), "tinygrad_ms": (":", "^", "tinygrad")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("tables", nargs="+", help="JSON file[:panel title], one panel each")
    ap.add_argument("-o", "--out", required=True, help="the PNG to write")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = []
    for spec in args.tables:
        path, _, title = spec.partition(":")
        with open(path) as f:
            tables.append((path, title, json.load(f)))
    # one colour per model in every panel (the panels may hold different models)
    colours = {m: f"C{i}" for i, m in enumerate(sorted({r["model"] for _, _, rows in tables for r in rows}))}
    fig, axes = plt.subplots(1, len(tables), figsize=(6.5 * len(tables), 6.5), squeeze=False)
    for ax, (path, title, rows) in zip(axes[0], tables):
        models = sorted({r["model"] for r in rows})
        for m in models:
            mine = sorted((r for r in rows if r["model"] == m), key=lambda r: r["batch"])
            for key, (line, marker, who) in STYLES.items():
                pts = [(r["batch"], r[key]) for r in mine if r.get(key) == r.get(key) and r.get(key)]  # skip NaN
                if pts:
                    ax.plot(*zip(*pts), line, marker=marker, color=colours[m], label=f"{m}, {who}")
        ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="ms per training step", title=title or path)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14))  # below: the data stay clear
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
