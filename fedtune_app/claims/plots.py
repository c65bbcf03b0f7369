"""The report's figures."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fedtune_app.claims import stats as cs
from fedtune_app.claims.registry import (
    ARMS,
)


def plot_setting(tier: str, setting_id: str, records: dict, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy import stats

    arms = [a for a in ARMS if any(k[0] == setting_id and k[1] == a for k in records)]
    if not arms:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    for arm in arms:
        rs = [records[k] for k in sorted(records) if k[0] == setting_id and k[1] == arm]
        rounds = [p["round"] for p in rs[0]["curve"]]
        rs = [r for r in rs if [p["round"] for p in r["curve"]] == rounds]
        values = 100 * np.array([[p["accuracy"] for p in r["curve"]] for r in rs])
        mean = values.mean(0)
        line, = ax.plot(rounds, mean, label=f"{arm} (n={len(rs)})")
        if len(rs) > 1:
            half = stats.t.ppf(0.975, len(rs) - 1) * values.std(0, ddof=1) / np.sqrt(len(rs))
            # few seeds give t-bands wider than accuracy can go: drawn within 0-100 only
            ax.fill_between(rounds, np.clip(mean - half, 0, 100), np.clip(mean + half, 0, 100),
                            alpha=0.15, color=line.get_color())
    ax.set_ylim(0, 100)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{setting_id} ({tier} tier): mean over seeds, 95% band", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


VERDICT_COLOURS = {cs.REPRODUCED: "tab:green", cs.REFUTED: "tab:red",
                   cs.INCONCLUSIVE: "tab:gray", cs.UNSTABLE: "tab:orange",
                   cs.NOT_DISCRIMINATIVE: "tab:purple"}


def forest_plot(rows: list[dict], words: dict, path: Path, title: str) -> bool:
    """Every claim's difference with its interval (seeds and test set), the paper's difference
    marked on the same axis, the verdict by colour and in words, with ``words`` (claim id ->
    its robustness word) beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["verdict"].difference is not None
             and r["verdict"].difference.n > 1]
    if not shown:
        return False
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(shown) + 1.4), dpi=110)
    for y, row in enumerate(reversed(shown)):
        c, v = row["claim"], row["verdict"]
        d = v.difference
        colour = VERDICT_COLOURS.get(v.verdict, "black")
        ax.errorbar(d.mean, y, xerr=[[d.mean - d.low], [d.high - d.mean]], fmt="o", ms=4,
                    color=colour, capsize=2, lw=1.2)
        if c.paper_difference is not None and math.isfinite(c.paper_difference):
            ax.plot(c.paper_difference, y, "kx", ms=6)
        if c.margin:
            ax.plot([-c.margin, c.margin] if c.direction == "similar" else [-c.margin], [y] *
                    (2 if c.direction == "similar" else 1), "|", color="0.5", ms=8)
        word = words.get(c.id, "")
        ax.text(1.01, y, f"{v.verdict}{'; ' + word if word else ''}", va="center",
                transform=ax.get_yaxis_transform(), fontsize=6.5, color=colour)
    ax.axvline(0, color="0.3", lw=0.8)
    ax.set_yticks(range(len(shown)), [r["claim"].id for r in reversed(shown)], fontsize=6.5)
    ax.set_xlabel("difference in accuracy points (claimed side minus the other): ours, "
                  "95% / 90% interval with the test set's error; x: the paper's; |: margins",
                  fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return True
