"""A device tensor's copy to the host, started now and waited for later.

On CUDA the copy goes into pinned memory without blocking and an event marks its end, so the host
can queue more work (the next decode step) before it waits; elsewhere the tensor is already there.
"""

from __future__ import annotations

import torch


class HostCopy:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.event = None
        if tensor.device.type == "cuda":
            self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self.host.copy_(tensor, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = tensor

    def wait(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()
        return self.host
