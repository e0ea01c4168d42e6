"""4096x4096 fp32 matmuls for SECONDS; prints its_per_s=N (pacing and MPS checks)."""
import sys, time, torch
secs = float(sys.argv[1])
a = torch.randn(4096, 4096, device="cuda"); b = torch.randn(4096, 4096, device="cuda")
for _ in range(10): a @ b
torch.cuda.synchronize()
n, t0 = 0, time.time()
while time.time() - t0 < secs:
    c = a @ b; n += 1
    if n % 10 == 0: torch.cuda.synchronize()
torch.cuda.synchronize()
print(f"its_per_s={n / (time.time() - t0):.2f}")
