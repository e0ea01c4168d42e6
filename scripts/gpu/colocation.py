"""Two training-like jobs packed on one GPU by time slicing (two CUDA contexts, no MPS, no
pacing): how fast each runs beside the other, against alone — issue 17's question of what
Gandiva-style packing costs when the two jobs' GPU demands do *not* add up to more than the
GPU (the simulator's `truth::colocate` says: nothing).

Each job is a loop of iterations: a GPU burst (k fp32 N x N matmuls, then a synchronize)
followed by a CPU gap (a sleep: data loading, the host side of a step). Its duty cycle alone,
burst / iteration, is the model's `demand`. The two jobs iterate with different periods
(100 and 130 ms) so that their phases do not lock. A real model joins the grid: torchvision's
ResNet-50 (batch 64, synthetic data, SGD) with a gap that sets its duty.

  colocation.py [OUT.json]
  colocation.py --fit OUT.json... each paired job's speed (solo iteration time / paired) against
                                 the law 1 / speed = 1 + k * d_i * d_j (d: duty cycles alone;
                                 beside several jobs, d_j summed), k fitted by least squares
                                 over the jobs that synchronise once a burst; with jobs that
                                 synchronise after every kernel, the simulator's sync terms
                                 too (truth::collision_growth: wait and release, k held)
Env: COLOC_COMBOS (instead of the grid: jobs run together, e.g. "0.3,0.3,0.3 0.1s,0.9" — a
     duty per job, up to four jobs; a duty ending in "s" synchronises after every kernel, as
     a job that reads results back within its step does; first size of COLOC_SIZES),
     COLOC_SECONDS (measured window of a pair, default 4; a solo run gets half),
     COLOC_SIZES (default "1024 4096"), COLOC_DUTIES (default "0.1 0.3 0.5 0.7 0.9"),
     COLOC_RESNET=0 (skip ResNet-50), COLOC_DRY=1 (no GPU: sleeps stand in for kernels, to
     check the orchestration).
Prints one RESULT line per run; OUT.json (rewritten after every run) holds them all.
"""
import json, math, multiprocessing as mp, os, signal, statistics, subprocess, sys, time

PERIODS_MS = (100.0, 130.0, 170.0, 210.0)
LEAD_S = 1.0  # both workers warm up (and meet) before the window opens


class Torch:
    def __init__(self):
        import torch
        self.t = torch
        self.mats = {}
        self.model = None

    def _ab(self, n):
        if n not in self.mats:
            self.mats[n] = (self.t.randn(n, n, device="cuda"), self.t.randn(n, n, device="cuda"))
        return self.mats[n]

    def burst(self, kind, k):
        if kind == "resnet50":
            self._step()
        else:
            a, b = self._ab(int(kind.rstrip("s")))
            for _ in range(k):
                a @ b
                if kind.endswith("s"):
                    self.t.cuda.synchronize()
        self.t.cuda.synchronize()

    def _step(self):
        if self.model is None:
            import torchvision
            t = self.t
            t.backends.cudnn.benchmark = True
            self.model = torchvision.models.resnet50().cuda()
            self.opt = t.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
            self.x = t.randn(64, 3, 224, 224, device="cuda")
            self.y = t.randint(0, 1000, (64,), device="cuda")
            self.loss = t.nn.CrossEntropyLoss()
        self.opt.zero_grad(set_to_none=True)
        self.loss(self.model(self.x), self.y).backward()
        self.opt.step()


class Dry:
    """No GPU: a kernel is a 50 us sleep, a ResNet-50 step 60 ms."""

    def burst(self, kind, k):
        time.sleep(0.06 if kind == "resnet50" else k * (60e-6 if kind.endswith("s") else 50e-6))


def calibrate(backend, kind):
    """Milliseconds of one unit of work alone (a matmul, or a ResNet-50 step)."""
    for _ in range(3 if kind == "resnet50" else 1):
        backend.burst(kind, 20)
    units = 10
    if kind != "resnet50":  # about 0.3 s of matmuls, from a first estimate
        t0 = time.perf_counter()
        backend.burst(kind, 50)
        units = max(50, int(0.3 / max((time.perf_counter() - t0) / 50, 1e-6)))
    t0 = time.perf_counter()
    if kind == "resnet50":
        for _ in range(units):
            backend.burst(kind, 1)
    else:
        backend.burst(kind, units)
    return 1000 * (time.perf_counter() - t0) / units


def run(backend, kind, k, gap_s, start, end):
    while time.time() < start:
        backend.burst(kind, k)
        time.sleep(gap_s)
    iters, busy = [], 0.0
    begin = time.time()
    while time.time() < end:
        t0 = time.perf_counter()
        backend.burst(kind, k)
        t1 = time.perf_counter()
        time.sleep(gap_s)
        iters.append(time.perf_counter() - t0)
        busy += t1 - t0
    wall = time.time() - begin
    return {"iter_ms": 1000 * statistics.mean(iters), "burst_ms": 1000 * busy / len(iters),
            "duty": busy / wall, "iters": len(iters)}


def worker(conn, dry):
    backend = Dry() if dry else Torch()
    while True:
        cmd = conn.recv()
        if cmd[0] == "quit":
            return
        try:
            fn = {"calibrate": calibrate, "run": run}[cmd[0]]
            conn.send(("ok", fn(backend, *cmd[1:])))
        except Exception as e:  # reported to the orchestrator, which stops
            conn.send(("err", repr(e)))


def paired_rows(paths):
    """Every job of every pair or combo in the files: (kind, its duty alone, its sync rate,
    [(duty, sync rate) of each other job], its speed). A sync rate is host synchronisations
    per ms of the job's burst alone (0 for a job that synchronises once a burst)."""
    rows = []
    for path in paths:
        doc = json.load(open(path))
        solo = {}
        for r in doc["runs"]:
            if r["label"].startswith("solo"):
                for w, j in r["jobs"].items():
                    solo[(w, j["kind"], j["duty_target"])] = j

        def sync_rate(w, j, alone):
            if not j["kind"].endswith("s"):
                return 0.0
            unit = doc["unit_ms"][j["kind"].rstrip("s")]
            kernels = max(1, round(j["duty_target"] * PERIODS_MS[int(w)] / unit))
            return kernels / alone["burst_ms"]

        for r in doc["runs"]:
            if not r["label"].startswith(("pair", "combo")):
                continue
            alone = {w: solo.get((w, j["kind"], j["duty_target"])) for w, j in r["jobs"].items()}
            if None in alone.values():
                missing = [w for w, a in alone.items() if a is None]
                print(f"skipped `{r['label']}` in {path}: no solo run of worker(s) {missing}",
                      file=sys.stderr)
                continue
            jobs = {w: (alone[w]["duty"], sync_rate(w, j, alone[w])) for w, j in r["jobs"].items()}
            for w, j in r["jobs"].items():
                others = [jobs[k] for k in r["jobs"] if k != w]
                rows.append((j["kind"], *jobs[w], others, alone[w]["iter_ms"] / j["iter_ms"]))
    return rows


def growth(k, wait, release, d, rate, others):
    """1 / speed by the simulator's law (`truth::collision_growth`)."""
    return 1 + d * sum(dj * (k / (1 + rj * release) + rate * wait) for dj, rj in others)


def fit(paths):
    rows = paired_rows(paths)
    plain = [r for r in rows if r[2] == 0 and all(rj == 0 for _, rj in r[3])]
    syncing = [r for r in rows if r not in plain]
    # 1 / speed = 1 + k * d_i * (the others' duties summed), least squares over the jobs
    # that synchronise once a burst; one job beside one is the pair law
    x = [d * sum(dj for dj, _ in others) for _, d, _, others, _ in plain]
    k = sum((1 / r[4] - 1) * xi for r, xi in zip(plain, x)) / sum(xi * xi for xi in x)
    wait = release = 0.0
    if syncing:
        # then the sync terms with k held: least squares on log speed over a grid
        def loss(w, v):
            return sum(math.log(growth(k, w, v, d, rate, o) * sp) ** 2
                       for _, d, rate, o, sp in syncing)
        wait, release = min(((w / 1000, v / 1000) for w in range(0, 3001, 5)
                             for v in range(0, 2001, 5)), key=lambda wv: loss(*wv))
    err = []
    print("| job (duty alone, syncs/ms) | beside (duties, syncs/ms) | speed | law |")
    print("|---|---|---|---|")
    for kind, d, rate, others, sp in plain + syncing:
        law = 1 / growth(k, wait, release, d, rate, others)
        err.append(abs(law - sp) / sp)
        beside = " + ".join(f"{dj:.2f}" + (f" ({rj:.1f})" if rj else "") for dj, rj in others)
        print(f"| {kind} ({d:.2f}{f', {rate:.1f}' if rate else ''}) | {beside} | {sp:.3f} | {law:.3f} |")
    print(f"k = {k:.3f} over {len(plain)} jobs that synchronise once a burst"
          + (f"; sync wait {wait:.3f} ms, release {release:.3f} ms over {len(syncing)} jobs "
             "beside or being one that synchronises after every kernel" if syncing else "")
          + f"; |law - speed| / speed: mean {sum(err) / len(err):.3%}, max {max(err):.3%}")


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--fit":
        return fit(sys.argv[2:])
    out_path = sys.argv[1] if len(sys.argv) > 1 else None
    secs = float(os.environ.get("COLOC_SECONDS", "4"))
    sizes = os.environ.get("COLOC_SIZES", "1024 4096").split()
    duties = [float(d) for d in os.environ.get("COLOC_DUTIES", "0.1 0.3 0.5 0.7 0.9").split()]
    dry = os.environ.get("COLOC_DRY") == "1"
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    # Stopped from outside (timeout(1)): take the workers down too, or they hold the GPU.
    def stop(*_):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # timeout(1) signals the whole group
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    try:
        measure_all(ctx, pipes, procs, out_path, secs, sizes, duties, dry)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()


def measure_all(ctx, pipes, procs, out_path, secs, sizes, duties, dry):
    combos = [[c for c in combo.split(",")] for combo in os.environ.get("COLOC_COMBOS", "").split()]
    for _ in range(max([2] + [len(c) for c in combos])):
        here, there = ctx.Pipe()
        p = ctx.Process(target=worker, args=(there, dry), daemon=True)
        p.start()
        pipes.append(here)
        procs.append(p)

    def ask(i, *cmd):
        pipes[i].send(cmd)

    def answer(i):
        status, value = pipes[i].recv()
        if status != "ok":
            raise SystemExit(f"worker {i}: {value}")
        return value

    gpu = "dry run" if dry else subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,compute_mode", "--format=csv,noheader"],
        capture_output=True, text=True).stdout.strip()
    doc = {"gpu": gpu, "periods_ms": PERIODS_MS, "seconds": secs, "unit_ms": {}, "runs": []}

    def save():
        if out_path:
            with open(out_path + ".tmp", "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(out_path + ".tmp", out_path)

    def window(s):
        start = time.time() + LEAD_S
        return start, start + s

    def measure(label, jobs):
        """jobs: {worker: (kind, duty, k, gap_s)}; runs them together, records the result."""
        start, end = window(secs if len(jobs) > 1 else secs / 2)
        for i, (kind, _d, k, gap) in jobs.items():
            ask(i, "run", kind, k, gap, start, end)
        got = {i: answer(i) for i in jobs}
        row = {"label": label, "jobs": {str(i): {"kind": jobs[i][0], "duty_target": jobs[i][1],
                                                 **got[i]} for i in jobs}}
        doc["runs"].append(row)
        save()
        print("RESULT", label, " ".join(
            f"w{i}[{jobs[i][0]}@{jobs[i][1]}] iter_ms={got[i]['iter_ms']:.2f} "
            f"burst_ms={got[i]['burst_ms']:.2f} duty={got[i]['duty']:.3f}" for i in jobs), flush=True)
        return got

    def calibrate(size, workers):
        units = []
        for i in workers:  # each worker warms the size up (its cuBLAS handle)
            ask(i, "calibrate", size)
            units.append(answer(i))
        doc["unit_ms"][size] = units[0]
        print(f"matmul {size}^2: {units[0]:.4f} ms alone", flush=True)
        return units[0]

    def run_combos(size):
        """The chosen jobs together, each one alone first."""
        unit = calibrate(size, range(len(procs)))

        def job(i, d):
            p = PERIODS_MS[i] / 1000
            duty = float(d.rstrip("s"))
            kind = size + ("s" if d.endswith("s") else "")
            return (kind, duty, max(1, round(duty * p * 1000 / unit)), (1 - duty) * p)

        done = set()
        for combo in combos:
            for i, d in enumerate(combo):
                if (i, d) not in done:
                    done.add((i, d))
                    measure(f"solo size={size}", {i: job(i, d)})
        for combo in combos:
            measure(f"combo size={size}", {i: job(i, d) for i, d in enumerate(combo)})

    def run_grid(size):
        """Every pair of duties, each alone first."""
        unit = calibrate(size, (0, 1))

        def spec(i, d):
            p = PERIODS_MS[i] / 1000
            return (size, d, max(1, round(d * p * 1000 / unit)), (1 - d) * p)

        for d in duties:
            for i in (0, 1):
                measure(f"solo size={size}", {i: spec(i, d)})
        for a_i, a in enumerate(duties):
            for b in duties[a_i:]:
                measure(f"pair size={size}", {0: spec(0, a), 1: spec(1, b)})

    def run_resnet(mm):
        """torchvision's ResNet-50 beside a matmul job of size `mm` (measured by run_grid)."""
        steps = []
        for i in (0, 1):
            ask(i, "calibrate", "resnet50")
            steps.append(answer(i))
        doc["unit_ms"]["resnet50"] = steps
        print(f"resnet50 step alone: {steps[0]:.2f} / {steps[1]:.2f} ms", flush=True)
        unit = doc["unit_ms"][mm]

        def rn(i, d):
            return ("resnet50", d, 1, steps[i] / 1000 * (1 - d) / d)

        def small(d):
            p = PERIODS_MS[1] / 1000
            return (mm, d, max(1, round(d * p * 1000 / unit)), (1 - d) * p)

        measure("solo resnet50", {0: rn(0, 0.9)})
        measure("solo resnet50", {1: rn(1, 0.9)})
        measure("solo resnet50", {0: rn(0, 0.5)})
        for d in (0.1, 0.3, 0.5):
            if d not in duties:  # the pair's matmul job alone, unless the grid had it
                measure(f"solo size={mm}", {1: small(d)})
            measure(f"pair resnet50+size={mm}", {0: rn(0, 0.9), 1: small(d)})
        measure("pair resnet50+resnet50", {0: rn(0, 0.9), 1: rn(1, 0.9)})
        measure("pair resnet50+resnet50", {0: rn(0, 0.5), 1: rn(1, 0.9)})

    print("gpu:", gpu, flush=True)
    if combos:
        run_combos(sizes[0])
    else:
        for size in sizes:
            run_grid(size)
        if os.environ.get("COLOC_RESNET", "1") != "0":
            run_resnet(sizes[0])

    for i in range(len(procs)):
        ask(i, "quit")
    for p in procs:
        p.join(timeout=10)
    print("done", flush=True)


if __name__ == "__main__":
    main()
