"""Check 1: an allocation beyond the quota raises OutOfMemoryError; mem_get_info shows the quota."""
import sys, torch
quota = int(sys.argv[1])
free, total = torch.cuda.mem_get_info()
print(f"mem_get_info free={free} total={total}")
assert total <= quota, "total must be the quota view"
half = torch.empty(quota // 2, dtype=torch.uint8, device="cuda")
try:
    big = torch.empty(quota, dtype=torch.uint8, device="cuda")
    print("no OOM")
    sys.exit(1)
except torch.cuda.OutOfMemoryError as e:
    print("OOM raised as expected:", str(e).splitlines()[0])
del half
torch.cuda.empty_cache()
ok = torch.empty(quota // 2, dtype=torch.uint8, device="cuda")
print("allocation within quota after free: ok")
