"""The report's figures."""

from __future__ import annotations

from pathlib import Path

import numpy as np

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
