"""A client that dies of a fatal GPU fault: an out-of-bounds index trips a device-side assert
in PyTorch's indexing kernel (a trap, sticky for the context). For the MPS fault check of
node-gpu-check.sh (`gpu_check --mps-fault`). Prints what CUDA said; exits 3 after the fault."""
import sys, torch
x = torch.zeros(16, device="cuda")
i = torch.tensor([1 << 40], device="cuda")
try:
    y = x[i]
    torch.cuda.synchronize()
    print("no fault raised")
    sys.exit(0)
except Exception as e:  # torch.AcceleratorError / RuntimeError, by version
    print("fault:", type(e).__name__, str(e).splitlines()[0])
    sys.exit(3)
