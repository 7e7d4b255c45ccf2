"""docs/dataflow.png: what T2MLR and LRT carry from token t-1 to token t.

    python docs/make_figure.py          # rewrites docs/dataflow.png
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dataflow.png")
LAYERS = 6
W, H, GAP = 1.6, 0.5, 0.18
X = {"t-1": 0.0, "t": 3.0}
RED, GREEN = "#c0392b", "#1e8449"


def _y(layer: int) -> float:
  return layer * (H + GAP)


def _arrow(ax, p, q, color, style="-", rad=0.0):
  ax.add_patch(FancyArrowPatch(p, q, arrowstyle="-|>", mutation_scale=12, color=color,
                               linestyle=style, linewidth=1.6,
                               connectionstyle=f"arc3,rad={rad}"))


def panel(ax, title: str, block):
  """One model over two tokens; block=(l_start, l_end) for T2MLR, None for LRT."""
  for tok, x in X.items():
    for layer in range(LAYERS):
      inside = block is not None and block[0] <= layer <= block[1]
      ax.add_patch(FancyBboxPatch((x, _y(layer)), W, H, boxstyle="round,pad=0.02",
                                  fc="#fdebd0" if inside else "#eaf2f8", ec="#444"))
      ax.text(x + W / 2, _y(layer) + H / 2, f"layer {layer}", ha="center", va="center",
              fontsize=9)
      if layer:
        _arrow(ax, (x + W / 2, _y(layer - 1) + H), (x + W / 2, _y(layer)), "#888")
    ax.text(x + W / 2, -0.45, f"token {tok}", ha="center", fontsize=10)
    ax.text(x + W / 2, _y(LAYERS) + 0.05, "logits", ha="center", fontsize=9, color="#555")
  if block is not None:
    l_start, l_end = block
    _arrow(ax, (X["t-1"] + W, _y(l_end) + H / 2), (X["t"], _y(l_start) + H / 2), RED)
    ax.text(2.3, _y(l_end) + H + 0.1, f"R: layer {l_end}'s\noutput, cached", ha="center",
            color=RED, fontsize=9)
    ax.text(X["t"] + W + 0.1, _y(l_start) + H / 2, f"Φ(h, R) before\nlayer {l_start}",
            va="center", color=RED, fontsize=9)
  else:
    src = (X["t-1"] + W, _y(LAYERS - 1) + H / 2)
    for layer in range(LAYERS):
      _arrow(ax, src, (X["t"], _y(layer) + H / 2), GREEN, "-" if layer == 0 else "--")
    ax.text(2.3, _y(LAYERS - 1) + H + 0.1, "m: normed\nh_final", ha="center",
            color=GREEN, fontsize=9)
    ax.text(X["t"] + W + 0.1, _y(2) + H / 2, "every layer:\nγ·m on the residual,\n"
            "gated K/V from m", va="center", color=GREEN, fontsize=9)
  ax.set_title(title, fontsize=11)
  ax.set_xlim(-0.2, 6.4)
  ax.set_ylim(-0.7, _y(LAYERS) + 0.9)
  ax.axis("off")


def main():
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
  panel(axes[0], "T2MLR: one middle-layer vector, into layer l_start", (1, 4))
  panel(axes[1], "LRT: the last hidden state, into every layer", None)
  fig.tight_layout()
  fig.savefig(OUT, dpi=80, metadata={"Software": None})
  print(f"wrote {OUT}")


if __name__ == "__main__":
  main()
