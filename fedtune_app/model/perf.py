"""Process facts a run reports for the performance benchmarks (benchmarks/): peak memory,
torch threads, and how many backbones this process built (it should be one)."""

from __future__ import annotations

import os
import resource

import torch

from fedtune_app.model.backbones import BUILDS


def process_stats() -> dict[str, float | int]:
    return {"pid": os.getpid(),
            "peak-rss-mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
            "torch-threads": torch.get_num_threads(),
            "backbone-builds": BUILDS["count"],
            # peak GPU memory of this process (0 without CUDA): how many clients share a GPU
            "gpu-peak-mb": torch.cuda.max_memory_allocated() / 2**20
            if torch.cuda.is_available() and torch.cuda.is_initialized() else 0.0}
