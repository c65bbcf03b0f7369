"""Plots of a run's scenario: how labels and capacities are distributed over the clients.

Drawn from what the nodes reported at start (label counts, group) and the capacities the
strategy used each round, so it shows the real partition in simulation and in deployment."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_partition(clients, history, path: Path, class_names=()) -> list[str]:
    """Left: stacked label counts per client (x labels = partition id and group; the legend
    names the classes, ``class_names`` in label order). Right: each client's capacity per
    round (mean, with min-max bars when capacities are dynamic). Returns the legend's class
    labels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients = sorted(clients, key=lambda c: c.partition_id)
    counts = np.array([c.label_counts for c in clients], dtype=float)
    x = np.arange(len(clients))
    names = [f"{c.partition_id} {c.group}" if not c.group.startswith("client-")
             else str(c.partition_id) for c in clients]
    width = max(6.0, 0.35 * len(clients) + 3)
    fig, (left, right) = plt.subplots(1, 2, figsize=(2 * width, 4.2), dpi=110)
    bottom = np.zeros(len(clients))
    cmap = plt.get_cmap("tab20")
    for label in range(counts.shape[1] if counts.size else 0):
        left.bar(x, counts[:, label], bottom=bottom, color=cmap(label % 20), width=0.85,
                 label=class_names[label] if label < len(class_names) else str(label))
        bottom += counts[:, label]
    left.set_title("training examples per client, by class")
    left.set_xlabel("client")
    left.set_ylabel("examples")
    legend = []
    if counts.shape[1] <= 20:
        legend = left.legend(fontsize=6, title="class", title_fontsize=7, loc="upper left",
                             bbox_to_anchor=(1.0, 1.0)).get_texts()
    used = {c.partition_id: [e.capacities[c.partition_id] for e in history
                             if c.partition_id in e.capacities] for c in clients}
    static = np.array([c.capacity for c in clients], dtype=float)
    mean = np.array([np.mean(used[c.partition_id]) if used[c.partition_id] else np.nan
                     for c in clients])
    low = np.array([min(used[c.partition_id], default=np.nan) for c in clients])
    high = np.array([max(used[c.partition_id], default=np.nan) for c in clients])
    right.bar(x, static, width=0.85, color="lightgrey", label="declared capacity")
    right.errorbar(x, mean, yerr=[mean - low, high - mean], fmt="o", color="tab:blue",
                   capsize=2, label="used per round (mean, min-max)")
    right.set_title("capacity (blocks) per client")
    right.set_xlabel("client")
    right.set_ylabel("blocks")
    right.legend(fontsize=7)
    for ax in (left, right):
        ax.set_xticks(x, names, fontsize=6 if len(clients) > 12 else 8, rotation=60,
                      ha="right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return [t.get_text() for t in legend]
