"""Control-block writer/reader for the GPU scripts.

The layout of interpose/src/control.rs (version 2, BLOCK_SIZE bytes as its
`layout_is_stable` test states), little-endian u64s. Usage:
  block.py create PATH QUOTA_BYTES PACE_INTERVAL_NS [SPILL_LIMIT_BYTES]
  block.py get PATH KEY        (KEY: one of OFF below)
  block.py set PATH KEY VALUE  (what the node does to a running workload)
"""
import mmap, os, struct, sys
MAGIC = int.from_bytes(b"ARBITER1", "little")
VERSION, SIZE = 2, 256 + 64 * 16 + 192 * 64
OFF = {"devices": 88,"quota": 16, "interval": 24, "burst": 32, "epoch": 40, "flags": 48, "period": 56,
       "used": 128, "peak": 136, "launches": 192 + 32, "allocs": 192, "denials": 192 + 16,
       "delay": 192 + 48,
       # device 0's usage line: charged bytes, and the node-written unseen bytes
       "dev0_used": 256, "dev0_unseen": 256 + 16,
       # the workload's reported iterations and the CLOCK_MONOTONIC ns of the last
       "iterations": 128 + 32, "last_iteration_ns": 128 + 40,
       # host spill: the node-written allowance and the bytes spilled now
       "spill_limit": 64 + 40, "spilled": 128 + 48}
def create(path, quota, interval, spill=0):
    with open(path, "wb") as f:
        f.write(bytes(SIZE))
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), SIZE)
        struct.pack_into("<Q", m, 8, VERSION)
        struct.pack_into("<Q", m, OFF["devices"], 1)
        struct.pack_into("<Q", m, OFF["quota"], quota)
        struct.pack_into("<Q", m, OFF["interval"], interval)
        struct.pack_into("<Q", m, OFF["period"], 100_000_000)
        struct.pack_into("<Q", m, OFF["spill_limit"], spill)
        struct.pack_into("<Q", m, 0, MAGIC)
        m.close()
def get(path, key):
    with open(path, "rb") as f:
        return struct.unpack_from("<Q", f.read(SIZE), OFF[key])[0]
def set_(path, key, value):
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), SIZE)
        struct.pack_into("<Q", m, OFF[key], value)
        m.close()
if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "create":
        create(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else 0)
    elif cmd == "get":
        print(get(sys.argv[2], sys.argv[3]))
    elif cmd == "set":
        set_(sys.argv[2], sys.argv[3], int(sys.argv[4]))
