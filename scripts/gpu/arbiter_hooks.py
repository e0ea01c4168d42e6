"""Arbiter's workload hooks for PyTorch: public torch APIs and ctypes only.

`install(optimizer)` registers an optimizer step post-hook that, at each iteration boundary,
1. reports the finished iteration to the node (`arbiter_iteration()`: the node's
   iteration-time signal, which AntMan's coordinator watches), and
2. gives memory back when the node asks (`arbiter_release_requested()` > 0: the node lowered
   the quota below what the workload holds) by emptying the caching allocator's cache
   (`torch.cuda.empty_cache()`): AntMan's shrink path, done cooperatively. Tensors in use stay;
   what the cache kept for reuse goes back to the GPU.
Without the interposer (the symbols are absent) the hook does nothing. Copy this file into a
training script's package, or import it from here.

empty_cache() can only return cached segments with nothing in use, and PyTorch's caching
allocator splits a free cached segment to serve later allocations: with default settings a
big cached segment soon holds a few live tensors and cannot go back (measured on an H100:
nothing released). Run jobs that may be asked to shrink with
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (the cache is released page by page; 3.1 GiB
-> 0.3 GiB in 9.7 ms) or `max_split_size_mb:<n>` (large blocks are never split; 1.1 ms) —
docs/gpu-validation.md, check 6.
"""
import ctypes, time
import torch


def _symbol(name):
    try:
        f = getattr(ctypes.CDLL(None), name)
    except AttributeError:
        return None
    f.restype = ctypes.c_uint64
    return f


class Hooks:
    def __init__(self):
        self.report = _symbol("arbiter_iteration")
        self.requested = _symbol("arbiter_release_requested")
        self.reported = 0      # the interposer's iteration count after the last step
        self.releases = 0      # times the cache was emptied on request
        self.release_ms = []   # how long each empty_cache took

    @property
    def active(self):
        return self.report is not None

    def step_done(self, *_):
        if self.report is not None:
            self.reported = self.report()
        if self.requested is not None and self.requested() > 0:
            t0 = time.perf_counter()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            self.release_ms.append(1000 * (time.perf_counter() - t0))
            self.releases += 1


def install(optimizer):
    """Registers the hooks on `optimizer`; returns them (their counters are for reporting)."""
    hooks = Hooks()
    if hooks.active:
        optimizer.register_step_post_hook(hooks.step_done)
    return hooks
