"""CPU threads of a stage process.

Every stage is its own process; left alone, torch gives each one a thread per core, so a graph of
six stages on a small machine runs six times as many spinning OpenMP threads as cores (measured on
2 cores: ~20x slower). A graph sets `args.threads` per stage (`StageArgs.threads`) and the stage
applies it at set-up.
"""

from __future__ import annotations


def pin_torch_threads(threads: int) -> None:
    """Apply `threads` (if not 0) to torch's intra-op pool of this process."""
    if not threads:
        return
    import torch

    if torch.get_num_threads() != int(threads):
        torch.set_num_threads(int(threads))
