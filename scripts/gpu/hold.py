"""Check 4: context memory against the node's reconciliation.

Holds HOLD_MIB of device memory and prints "ready"; the script then reconciles the block with
NVML (unseen = NVML's memory of this process minus what the interposer charged) and writes
the bytes the quota still leaves to GO_FILE. An allocation 64 MiB above that must fail (the
context memory now counts against the quota), one 64 MiB below must succeed.
Usage: hold.py HOLD_MIB GO_FILE
"""
import os, sys, time, torch

MIB = 1 << 20
hold = torch.empty(int(sys.argv[1]) * MIB, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
go = sys.argv[2]
for _ in range(1200):
    if os.path.exists(go) and os.path.getsize(go) > 0:
        break
    time.sleep(0.1)
left = int(open(go).read())
print(f"quota leaves {left >> 20} MiB after reconciliation", flush=True)
try:
    over = torch.empty(left + 64 * MIB, dtype=torch.uint8, device="cuda")
    print("over: allocated (context memory not counted)")
    sys.exit(1)
except torch.cuda.OutOfMemoryError:
    print("over: OutOfMemoryError as expected")
under = torch.empty(max(left - 64 * MIB, MIB), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("under: allocated")
