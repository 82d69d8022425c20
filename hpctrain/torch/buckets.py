"""Flat buffers that hold many tensors back to back: the one packing hpctrain uses.

A :class:`FlatBuffer` lays out a list of tensors (one dtype, one device) in one contiguous
vector, each at its own offset. :meth:`FlatBuffer.slot` is a view of one tensor's place,
shaped like the tensor, so that a gradient can *live* in the buffer (``param.grad`` set to
the view, as DDP's ``gradient_as_bucket_view``): backward then accumulates straight into
the buffer, and the reduced values are in ``param.grad`` without a copy back.

Every user of a flat vector of parameters or gradients goes through here: the gradient
buckets of :class:`hpctrain.torch.DistributedOptimizer`, the parameter-server regimes
(weights broadcast or gathered through a bucket's buffer) and the asynchronous server's
messages.
"""

import torch


class FlatBuffer:
    """``tensors`` (same dtype and device) laid out back to back in one flat vector.

    Only shapes, dtype and device are taken from ``tensors``: the buffer starts zeroed and
    holds none of their values until :meth:`pack`. ``device`` puts the buffer elsewhere
    (host memory for messages sent by a non-CUDA-aware MPI); packing then copies across.
    """

    def __init__(self, tensors, device=None):
        tensors = list(tensors)
        if not tensors:
            raise ValueError("a flat buffer needs at least one tensor")
        self.shapes = [t.shape for t in tensors]
        self.offsets, total = [], 0
        for t in tensors:
            self.offsets.append(total)
            total += t.numel()
        where = tensors[0].device if device is None else device
        self.flat = torch.zeros(total, dtype=tensors[0].dtype, device=where)
        self.slots = [self.flat[o:o + t.numel()].view(t.shape)
                      for o, t in zip(self.offsets, tensors)]

    def __len__(self):
        return len(self.slots)

    def slot(self, i):
        """Tensor ``i``'s place in the buffer: a view, shaped like the tensor."""
        return self.slots[i]

    def pack(self, tensors):
        """Copy ``tensors`` into their places (``None`` leaves a place zeroed)."""
        with torch.no_grad():
            for slot, tensor in zip(self.slots, tensors):
                if tensor is None:
                    slot.zero_()
                elif tensor.data_ptr() != slot.data_ptr():
                    slot.copy_(tensor.detach())
        return self.flat

    def unpack(self, tensors):
        """Copy every place back into ``tensors`` (in place)."""
        with torch.no_grad():
            for slot, tensor in zip(self.slots, tensors):
                if tensor.data_ptr() != slot.data_ptr():
                    tensor.copy_(slot)


def assign_buckets(named_params, bucket_bytes):
    """Split ``(name, param)`` pairs, in reverse order, into lists of about ``bucket_bytes``.

    Reverse order because backward produces the last layer's gradients first, so the first
    bucket fills first. A parameter larger than ``bucket_bytes`` gets a bucket of its own; a
    change of dtype or device starts a new bucket (one flat buffer holds one of each).
    """
    buckets, current, size = [], [], 0
    for name, param in reversed(list(named_params)):
        nbytes = param.numel() * param.element_size()
        if current and (size + nbytes > bucket_bytes or param.dtype != current[-1][1].dtype
                        or param.device != current[-1][1].device):
            buckets.append(current)
            current, size = [], 0
        current.append((name, param))
        size += nbytes
    if current:
        buckets.append(current)
    return buckets
