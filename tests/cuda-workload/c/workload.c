/* Test workload that drives the CUDA driver API the way real programs do.
 *
 * Resolution (env WL_RESOLVE):
 *   gpa       dlopen("libcuda.so.1") -> dlsym("cuGetProcAddress_v2") -> self-lookup
 *             cuGetProcAddress("cuGetProcAddress", 12000) -> everything through it (cudart 12)
 *   gpa-ptds  same, with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (nvcc --default-stream
 *             per-thread)
 *   gpa-v1    dlsym("cuGetProcAddress") -> cuGetProcAddress v1 ABI at version 11080 (cudart 11)
 *   dlsym     dlsym(handle, "<exact export>") for every entry point (pre-11.3 loaders)
 *   direct    (only when compiled with -DDIRECT_LINK -lcuda) plain linked calls
 *
 * Every mode prints "key=value" lines on stdout and exits 0 when its own expectations held.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long u64;
typedef void *Ptr;

typedef struct {
    unsigned grid[3], block[3], shm;
    Ptr stream;
    Ptr attrs;
    unsigned nattrs;
} LaunchConfig;

#define PTDS_FLAG 2ULL

typedef CUresult (*gpa2_t)(const char *, void **, int, u64, int *);
typedef CUresult (*gpa1_t)(const char *, void **, int, u64);

#ifdef DIRECT_LINK
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(u64 *, int);
CUresult cuDevicePrimaryCtxRelease_v2(int);
CUresult cuCtxSetCurrent(u64);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(u64 *, size_t);
CUresult cuMemFree_v2(u64);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuLaunchKernel(Ptr, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        Ptr, Ptr *, Ptr *);
CUresult cuDeviceGetName(char *, int, int);
static void *direct(const char *exact) {
    static const struct { const char *n; void *p; } t[] = {
        {"cuInit", (void *)cuInit},
        {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain},
        {"cuDevicePrimaryCtxRelease_v2", (void *)cuDevicePrimaryCtxRelease_v2},
        {"cuCtxSetCurrent", (void *)cuCtxSetCurrent},
        {"cuCtxSynchronize", (void *)cuCtxSynchronize},
        {"cuMemAlloc_v2", (void *)cuMemAlloc_v2},
        {"cuMemFree_v2", (void *)cuMemFree_v2},
        {"cuMemGetInfo_v2", (void *)cuMemGetInfo_v2},
        {"cuLaunchKernel", (void *)cuLaunchKernel},
        {"cuDeviceGetName", (void *)cuDeviceGetName},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(t[i].n, exact)) return t[i].p;
    return NULL;
}
#endif

static const char *g_resolve = "gpa";
static void *g_handle;
static gpa2_t g_gpa2;
static gpa1_t g_gpa1;
static u64 g_flags;

static void die(const char *what, int rc) {
    printf("FAIL %s rc=%d\n", what, rc);
    fflush(stdout);
    exit(1);
}

static u64 now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (u64)ts.tv_sec * 1000000000ULL + (u64)ts.tv_nsec;
}

static void setup(void) {
    const char *r = getenv("WL_RESOLVE");
    if (r) g_resolve = r;
    if (!strcmp(g_resolve, "direct")) {
#ifndef DIRECT_LINK
        die("direct resolution needs -DDIRECT_LINK", -1);
#endif
        return;
    }
    g_handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!g_handle) die("dlopen libcuda.so.1", -1);
    if (!strcmp(g_resolve, "gpa") || !strcmp(g_resolve, "gpa-ptds")) {
        g_flags = strcmp(g_resolve, "gpa-ptds") ? 0 : PTDS_FLAG;
        gpa2_t boot = (gpa2_t)dlsym(g_handle, "cuGetProcAddress_v2");
        if (!boot) die("dlsym cuGetProcAddress_v2", -1);
        int st = -1;
        CUresult rc = boot("cuGetProcAddress", (void **)&g_gpa2, 12000, 0, &st);
        if (rc || !g_gpa2 || st != 0) die("self-lookup cuGetProcAddress", rc);
    } else if (!strcmp(g_resolve, "gpa-v1")) {
        gpa1_t boot = (gpa1_t)dlsym(g_handle, "cuGetProcAddress");
        if (!boot) die("dlsym cuGetProcAddress", -1);
        CUresult rc = boot("cuGetProcAddress", (void **)&g_gpa1, 11080, 0);
        if (rc || !g_gpa1) die("self-lookup cuGetProcAddress v1", rc);
    }
}

/* base: the name cudart asks cuGetProcAddress for; exact: the exported symbol. */
static void *sym(const char *base, const char *exact) {
    void *p = NULL;
    if (!strcmp(g_resolve, "direct")) {
#ifdef DIRECT_LINK
        p = direct(exact);
#endif
    } else if (!strcmp(g_resolve, "dlsym")) {
        p = dlsym(g_handle, exact);
    } else if (g_gpa2) {
        int st = -1;
        CUresult rc = g_gpa2(base, &p, 12080, g_flags, &st);
        if (rc) p = NULL;
    } else if (g_gpa1) {
        CUresult rc = g_gpa1(base, &p, 11080, 0);
        if (rc) p = NULL;
    }
    if (!p) {
        printf("FAIL resolve %s\n", exact);
        exit(1);
    }
    return p;
}

#define RESOLVE(var, type, base, exact) type var = (type)sym(base, exact)

typedef CUresult (*init_t)(unsigned);
typedef CUresult (*retain_t)(u64 *, int);
typedef CUresult (*ctxset_t)(u64);
typedef CUresult (*sync_t)(void);
typedef CUresult (*alloc_t)(u64 *, size_t);
typedef CUresult (*free_t)(u64);
typedef CUresult (*meminfo_t)(size_t *, size_t *);
typedef CUresult (*launch_t)(Ptr, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, Ptr, Ptr *, Ptr *);

static launch_t g_launch;
static sync_t g_sync;
static alloc_t g_alloc;
static free_t g_free;

static void common_init(void) {
    RESOLVE(init, init_t, "cuInit", "cuInit");
    RESOLVE(retain, retain_t, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain");
    RESOLVE(setcur, ctxset_t, "cuCtxSetCurrent", "cuCtxSetCurrent");
    CUresult rc = init(0);
    if (rc) die("cuInit", rc);
    u64 ctx = 0;
    rc = retain(&ctx, 0);
    if (rc) die("cuDevicePrimaryCtxRetain", rc);
    rc = setcur(ctx);
    if (rc) die("cuCtxSetCurrent", rc);
    g_launch = (launch_t)sym("cuLaunchKernel", "cuLaunchKernel");
    g_sync = (sync_t)sym("cuCtxSynchronize", "cuCtxSynchronize");
    g_alloc = (alloc_t)sym("cuMemAlloc", "cuMemAlloc_v2");
    g_free = (free_t)sym("cuMemFree", "cuMemFree_v2");
}

static CUresult launch1(Ptr stream) {
    return g_launch((Ptr)0x1, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL);
}

/* ---- modes ---------------------------------------------------------------------------- */

static size_t g_chunk;
static u64 g_granted[256];
static u64 *g_ptrs[256];

static void *race_thread(void *arg) {
    size_t i = (size_t)arg;
    size_t cap = 4096, n = 0;
    g_ptrs[i] = calloc(cap, sizeof(u64));
    for (;;) {
        u64 p = 0;
        CUresult rc = g_alloc(&p, g_chunk);
        if (rc == 2) break; /* CUDA_ERROR_OUT_OF_MEMORY */
        if (rc) die("cuMemAlloc_v2 race", rc);
        if (n == cap) break;
        g_ptrs[i][n++] = p;
    }
    g_granted[i] = n;
    return NULL;
}

static int mode_alloc_race(int threads, size_t chunk) {
    g_chunk = chunk;
    pthread_t t[256];
    if (threads > 256) threads = 256;
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, race_thread, (void *)(size_t)i);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    u64 total = 0;
    for (int i = 0; i < threads; i++) total += g_granted[i];
    printf("granted_allocs=%llu granted_bytes=%llu\n", total, total * chunk);
    for (int i = 0; i < threads; i++)
        for (u64 j = 0; j < g_granted[i]; j++)
            if (g_free(g_ptrs[i][j])) die("cuMemFree_v2", -1);
    printf("freed=1\n");
    return 0;
}

typedef CUresult (*pitch_t)(u64 *, size_t *, size_t, size_t, unsigned);
typedef CUresult (*managed_t)(u64 *, size_t, unsigned);
typedef CUresult (*async_t)(u64 *, size_t, Ptr);
typedef CUresult (*pool_t)(u64 *, size_t, Ptr, Ptr);
typedef CUresult (*freeasync_t)(u64, Ptr);
typedef CUresult (*create_t)(u64 *, size_t, const void *, u64);
typedef CUresult (*release_t)(u64);

#define EXPECT(cond, what)                                                                    \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            printf("FAIL expect %s\n", what);                                                 \
            fails++;                                                                          \
        }                                                                                     \
    } while (0)

static int mode_allocators(size_t quota) {
    int fails = 0;
    RESOLVE(pitch, pitch_t, "cuMemAllocPitch", "cuMemAllocPitch_v2");
    RESOLVE(managed, managed_t, "cuMemAllocManaged", "cuMemAllocManaged");
    RESOLVE(aasync, async_t, "cuMemAllocAsync", g_flags ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync");
    RESOLVE(pool, pool_t, "cuMemAllocFromPoolAsync",
            g_flags ? "cuMemAllocFromPoolAsync_ptsz" : "cuMemAllocFromPoolAsync");
    RESOLVE(fasync, freeasync_t, "cuMemFreeAsync", g_flags ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync");
    RESOLVE(create, create_t, "cuMemCreate", "cuMemCreate");
    RESOLVE(release, release_t, "cuMemRelease", "cuMemRelease");
    RESOLVE(info, meminfo_t, "cuMemGetInfo", "cuMemGetInfo_v2");
    const size_t MB = 1 << 20;
    u64 p = 0, h = 0;
    size_t pp = 0;
    /* each allocator: a small one fits, one of the full quota on top does not */
    EXPECT(pitch(&p, &pp, 1000, 1024, 4) == 0 && pp == 1024, "pitch ok");
    u64 q = 0;
    EXPECT(pitch(&q, &pp, quota, 1, 4) == 2, "pitch oom");
    EXPECT(g_free(p) == 0, "pitch free");
    EXPECT(managed(&p, MB, 1) == 0, "managed ok");
    EXPECT(managed(&q, quota, 1) == 2, "managed oom");
    EXPECT(g_free(p) == 0, "managed free");
    EXPECT(aasync(&p, MB, NULL) == 0, "async ok");
    EXPECT(aasync(&q, quota, NULL) == 2, "async oom");
    EXPECT(fasync(p, NULL) == 0, "async free");
    EXPECT(pool(&p, MB, (Ptr)0x1, NULL) == 0, "pool ok");
    EXPECT(pool(&q, quota, (Ptr)0x1, NULL) == 2, "pool oom");
    EXPECT(fasync(p, NULL) == 0, "pool free");
    EXPECT(create(&h, 2 * MB, NULL, 0) == 0, "vmm ok");
    EXPECT(create(&q, quota, NULL, 0) == 2, "vmm oom");
    size_t fr = 0, to = 0;
    EXPECT(info(&fr, &to) == 0 && to == quota && fr == quota - 2 * MB, "meminfo with vmm held");
    EXPECT(release(h) == 0, "vmm release");
    EXPECT(g_alloc(&p, quota) == 0, "full quota after frees");
    EXPECT(g_alloc(&q, 1) == 2, "one byte over");
    EXPECT(g_free(p) == 0, "final free");
    printf("allocator_failures=%d\n", fails);
    return fails ? 1 : 0;
}

typedef struct { size_t w, h; unsigned format, channels; } ArrayDesc;
typedef struct { size_t w, h, d; unsigned format, channels, flags; } Array3dDesc;
typedef CUresult (*arr_t)(u64 *, const ArrayDesc *);
typedef CUresult (*arr3_t)(u64 *, const Array3dDesc *);
typedef CUresult (*mip_t)(u64 *, const Array3dDesc *, unsigned);
typedef CUresult (*destroy_t)(u64);

static size_t used_by_quota_view(meminfo_t info, size_t quota) {
    size_t fr = 0, to = 0;
    if (info(&fr, &to)) die("cuMemGetInfo_v2", -1);
    return quota - fr;
}

/* Arrays: a 16 MiB float 2D array fits a 64 MiB quota, a 64 MiB 3D array on top does not, an
 * 11-level RGBA float mipmapped array of 1024^2 fits; destroying returns everything. */
static int mode_arrays(size_t quota) {
    RESOLVE(a2, arr_t, "cuArrayCreate", "cuArrayCreate_v2");
    RESOLVE(a3, arr3_t, "cuArray3DCreate", "cuArray3DCreate_v2");
    RESOLVE(mip, mip_t, "cuMipmappedArrayCreate", "cuMipmappedArrayCreate");
    RESOLVE(adestroy, destroy_t, "cuArrayDestroy", "cuArrayDestroy");
    RESOLVE(mdestroy, destroy_t, "cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy");
    RESOLVE(info, meminfo_t, "cuMemGetInfo", "cuMemGetInfo_v2");
    ArrayDesc d2 = {2048, 2048, 0x20, 1};
    Array3dDesc d3 = {1024, 1024, 16, 0x01, 4, 0};
    Array3dDesc dm = {1024, 1024, 0, 0x20, 4, 0};
    u64 a = 0, b = 0, m = 0;
    CUresult ra = a2(&a, &d2), rb = a3(&b, &d3), rm = mip(&m, &dm, 11);
    printf("array_rcs=%d,%d,%d\n", ra, rb, rm);
    printf("array_used=%zu\n", used_by_quota_view(info, quota));
    if (ra == 0 && adestroy(a)) die("cuArrayDestroy", -1);
    if (rm == 0 && mdestroy(m)) die("cuMipmappedArrayDestroy", -1);
    printf("array_used_after=%zu\n", used_by_quota_view(info, quota));
    return 0;
}

typedef CUresult (*map_t)(u64, size_t, size_t, u64, u64);
typedef CUresult (*unmap_t)(u64, size_t);
/* VMM: a released handle that is still mapped keeps its memory until the unmap. */
static int mode_vmm(size_t quota) {
    RESOLVE(create, create_t, "cuMemCreate", "cuMemCreate");
    RESOLVE(release, release_t, "cuMemRelease", "cuMemRelease");
    RESOLVE(map, map_t, "cuMemMap", "cuMemMap");
    RESOLVE(unmap, unmap_t, "cuMemUnmap", "cuMemUnmap");
    RESOLVE(info, meminfo_t, "cuMemGetInfo", "cuMemGetInfo_v2");
    const size_t MB = 1 << 20;
    const u64 va = 0x100000000000ULL;
    u64 h = 0, p = 0;
    if (create(&h, 2 * MB, NULL, 0)) die("cuMemCreate", -1);
    if (map(va, 2 * MB, 0, h, 0)) die("cuMemMap", -1);
    if (release(h)) die("cuMemRelease", -1);
    printf("vmm_used_released_mapped=%zu\n", used_by_quota_view(info, quota));
    printf("vmm_over_rc=%d\n", g_alloc(&p, quota - 2 * MB + 1));
    if (unmap(va, 2 * MB)) die("cuMemUnmap", -1);
    printf("vmm_used_unmapped=%zu\n", used_by_quota_view(info, quota));
    CUresult full = g_alloc(&p, quota);
    printf("vmm_full_rc=%d\n", full);
    if (full == 0 && g_free(p)) die("free", -1);
    return 0;
}

/* Two GPUs, one process (DDP-style): allocate CHUNK-sized blocks on device 0 until the quota
 * says no, then on device 1; each device must get its own quota's worth. */
static int mode_multi_gpu(size_t chunk) {
    RESOLVE(retain, retain_t, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain");
    RESOLVE(setcur, ctxset_t, "cuCtxSetCurrent", "cuCtxSetCurrent");
    int counts[2] = {0, 0};
    for (int d = 0; d < 2; d++) {
        u64 ctx = 0;
        if (retain(&ctx, d)) die("retain", d);
        if (setcur(ctx)) die("set current", d);
        for (;;) {
            u64 p = 0;
            CUresult rc = g_alloc(&p, chunk);
            if (rc == 2) break;
            if (rc) die("alloc", rc);
            if (++counts[d] > 1000) break;
        }
    }
    printf("dev0_allocs=%d dev1_allocs=%d\n", counts[0], counts[1]);
    return 0;
}

/* NVML through dlopen + dlsym, as pynvml does, after allocating 4 MiB on device 0 and, with a
 * second device, 8 MiB there: prints what each NVML device reports (v1 and v2). */
typedef struct { u64 total, free, used; } NvmlMem;
typedef struct { unsigned version; u64 total, reserved, free, used; } NvmlMem2;
typedef int (*nvml_init_t)(void);
typedef int (*nvml_count_t)(unsigned *);
typedef int (*nvml_handle_t)(unsigned, void **);
typedef int (*nvml_mem_t)(void *, NvmlMem *);
typedef int (*nvml_mem2_t)(void *, NvmlMem2 *);
typedef CUresult (*count_t)(int *);
static int mode_nvml(const char *lib) {
    RESOLVE(count, count_t, "cuDeviceGetCount", "cuDeviceGetCount");
    RESOLVE(retain, retain_t, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain");
    RESOLVE(setcur, ctxset_t, "cuCtxSetCurrent", "cuCtxSetCurrent");
    u64 p = 0;
    if (g_alloc(&p, 4 << 20)) die("alloc dev0", -1);
    int n = 0;
    if (count(&n)) die("cuDeviceGetCount", -1);
    if (n > 1) {
        u64 ctx = 0;
        if (retain(&ctx, 1) || setcur(ctx)) die("device 1", -1);
        if (g_alloc(&p, 8 << 20)) die("alloc dev1", -1);
    }
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) die("dlopen nvml", -1);
    nvml_init_t init = (nvml_init_t)dlsym(h, "nvmlInit_v2");
    nvml_count_t ncount = (nvml_count_t)dlsym(h, "nvmlDeviceGetCount_v2");
    nvml_handle_t handle = (nvml_handle_t)dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    nvml_mem_t mem = (nvml_mem_t)dlsym(h, "nvmlDeviceGetMemoryInfo");
    nvml_mem2_t mem2 = (nvml_mem2_t)dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    if (!init || !ncount || !handle || !mem || !mem2) die("nvml symbols", -1);
    if (init()) die("nvmlInit_v2", -1);
    unsigned devices = 0;
    if (ncount(&devices)) die("nvmlDeviceGetCount_v2", -1);
    for (unsigned i = 0; i < devices; i++) {
        void *d = NULL;
        NvmlMem m = {0, 0, 0};
        NvmlMem2 m2 = {(unsigned)sizeof(NvmlMem2) | (2u << 24), 0, 0, 0, 0};
        if (handle(i, &d) || mem(d, &m) || mem2(d, &m2)) die("nvml memory", (int)i);
        printf("nvml%u_total=%llu nvml%u_free=%llu nvml%u_used=%llu nvml%u_v2_total=%llu "
               "nvml%u_v2_used=%llu\n",
               i, m.total, i, m.free, i, m.used, i, m2.total, i, m2.used);
    }
    return 0;
}

/* NVML's per-process list as the workload sees it. Allocates (so the process holds a slot in
 * the block), prints its pid and waits for the file GO (the test writes NVML's scenario with
 * this pid in it meanwhile), then queries the list twice: size first, then the records. */
typedef struct { unsigned pid; u64 used; unsigned gi, ci; } NvmlProc;
typedef int (*nvml_procs_t)(void *, unsigned *, NvmlProc *);
static int mode_nvml_procs(const char *lib, const char *go) {
    u64 p = 0;
    if (g_alloc(&p, 1 << 20)) die("alloc", -1);
    printf("pid=%d\n", (int)getpid());
    fflush(stdout);
    while (access(go, F_OK) != 0) usleep(10000);
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) die("dlopen nvml", -1);
    nvml_init_t init = (nvml_init_t)dlsym(h, "nvmlInit_v2");
    nvml_handle_t handle = (nvml_handle_t)dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    nvml_procs_t procs = (nvml_procs_t)dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!init || !handle || !procs || init()) die("nvml", -1);
    void *d = NULL;
    if (handle(0, &d)) die("nvml handle", -1);
    unsigned n = 0;
    int size_rc = procs(d, &n, NULL);
    NvmlProc list[16];
    unsigned cap = 16;
    int rc = procs(d, &cap, list);
    printf("size_rc=%d size=%u rc=%d procs=%u first_pid=%u first_used=%llu\n", size_rc, n, rc, cap,
           cap ? list[0].pid : 0, cap ? list[0].used : 0ULL);
    return 0;
}

typedef CUresult (*totalmem_t)(size_t *, int);
static int mode_meminfo(void) {
    RESOLVE(info, meminfo_t, "cuMemGetInfo", "cuMemGetInfo_v2");
    RESOLVE(tot, totalmem_t, "cuDeviceTotalMem", "cuDeviceTotalMem_v2");
    size_t fr = 0, to = 0, dt = 0;
    u64 p = 0;
    CUresult rc = g_alloc(&p, 1 << 20);
    if (rc) die("alloc", rc);
    rc = info(&fr, &to);
    if (rc) die("cuMemGetInfo_v2", rc);
    rc = tot(&dt, 0);
    if (rc) die("cuDeviceTotalMem_v2", rc);
    printf("meminfo total=%zu free=%zu devtotal=%zu\n", to, fr, dt);
    /* NULL-safety: must not crash (result code is the driver's business) */
    CUresult a = info(NULL, &to), b = info(&fr, NULL), c = info(NULL, NULL);
    CUresult d = tot(NULL, 0);
    printf("null_rcs=%d,%d,%d,%d\n", a, b, c, d);
    return 0;
}

static int mode_pace(long n) {
    printf("ready\n"); /* a test that holds launches knows they have begun */
    fflush(stdout);
    u64 t0 = now_ns();
    for (long i = 0; i < n; i++) {
        CUresult rc = launch1(NULL);
        if (rc) die("launch", rc);
    }
    CUresult rc = g_sync();
    if (rc) die("sync", rc);
    u64 t1 = now_ns();
    printf("launched=%ld wall_ns=%llu\n", n, t1 - t0);
    return 0;
}

/* Launches the driver rejects (NULL function: CUDA_ERROR_INVALID_VALUE). */
static int mode_rejected(long n) {
    u64 t0 = now_ns();
    for (long i = 0; i < n; i++) {
        CUresult rc = g_launch(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        if (rc != 1) die("rejected launch", rc);
    }
    printf("rejected=%ld wall_ns=%llu\n", n, now_ns() - t0);
    return 0;
}

static int mode_launch_loop(long ms) {
    u64 end = now_ns() + (u64)ms * 1000000ULL;
    long n = 0;
    printf("ready\n");
    fflush(stdout);
    while (now_ns() < end) {
        CUresult rc = launch1(NULL);
        if (rc) die("launch", rc);
        n++;
    }
    printf("launched=%ld\n", n);
    return 0;
}

/* A training loop that reports each of its n iterations (every_ms apart, one launch each)
 * through the interposer's exported arbiter_iteration(), found as a framework hook would find
 * it: by name in the process (without an interposer the symbol is absent and the loop runs
 * unreported). */
static int mode_iterations(long n, long every_ms) {
    typedef unsigned long long (*iter_t)(void);
    iter_t report = (iter_t)dlsym(RTLD_DEFAULT, "arbiter_iteration");
    unsigned long long last = 0;
    struct timespec ts = {every_ms / 1000, (every_ms % 1000) * 1000000L};
    for (long i = 0; i < n; i++) {
        CUresult rc = launch1(NULL);
        if (rc) die("launch", rc);
        nanosleep(&ts, NULL);
        if (report) last = report();
    }
    printf("hook=%d reported=%llu\n", report != NULL, last);
    return 0;
}

/* Host spill: the whole quota on the GPU, then 1 MiB more comes from the spill allowance,
 * the allowance itself does not fit on top of that, and fits once the 1 MiB is freed. */
static int mode_spill(size_t quota, size_t spill) {
    int fails = 0;
    const size_t MB = 1 << 20;
    u64 gpu = 0, small = 0, big = 0;
    EXPECT(g_alloc(&gpu, quota) == 0, "the quota on the GPU");
    EXPECT(g_alloc(&small, MB) == 0, "1 MiB over the quota spills");
    EXPECT(g_alloc(&big, spill) == 2, "1 MiB + the allowance does not fit");
    EXPECT(g_free(small) == 0, "free the spilled MiB");
    EXPECT(g_alloc(&big, spill) == 0, "the whole allowance spills");
    EXPECT(g_free(big) == 0 && g_free(gpu) == 0, "free both");
    printf("spill_failures=%d\n", fails);
    return fails ? 1 : 0;
}

/* The cooperative shrink path: hold `chunks` MiB, then poll arbiter_release_requested()
 * every 5 ms (up to 10 s); when it asks, free chunks until it stops asking, then hold on for
 * `hold_ms` (so the test can read the block) and exit. */
static int mode_release(long chunks, long hold_ms) {
    typedef unsigned long long (*req_t)(void);
    req_t requested = (req_t)dlsym(RTLD_DEFAULT, "arbiter_release_requested");
    if (!requested) die("arbiter_release_requested", 1);
    const size_t MB = 1 << 20;
    u64 held[256];
    if (chunks > 256) chunks = 256;
    for (long i = 0; i < chunks; i++)
        if (g_alloc(&held[i], MB)) die("alloc", 2);
    printf("holding=%ld\n", chunks);
    struct timespec tick = {0, 5 * 1000000L};
    long n = chunks, waited = 0;
    while (requested() == 0 && waited < 2000) {
        nanosleep(&tick, NULL);
        waited++;
    }
    while (n > 0 && requested() > 0) g_free(held[--n]);
    printf("released=%ld requested_after=%llu\n", chunks - n, requested());
    struct timespec hold = {hold_ms / 1000, (hold_ms % 1000) * 1000000L};
    nanosleep(&hold, NULL);
    return 0;
}

/* Idle (no CUDA call after init) until the file `go` exists, then a launch loop for run_ms: a
 * neighbour whose share is lent while it is quiet and must come back when it launches. The
 * test says when, rather than a timer that a slow machine can outrun. */
static int mode_launch_when(const char *go, long run_ms) {
    while (access(go, F_OK) != 0) usleep(10000);
    return mode_launch_loop(run_ms);
}

typedef CUresult (*launchex_t)(const LaunchConfig *, Ptr, Ptr *, Ptr *);
typedef CUresult (*coop_t)(Ptr, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, Ptr, Ptr *);
typedef CUresult (*graph_t)(Ptr, Ptr);
typedef CUresult (*streamcreate_t)(Ptr *, unsigned);
typedef CUresult (*begincap_t)(Ptr, int);
typedef CUresult (*endcap_t)(Ptr, Ptr *);
typedef CUresult (*inst_t)(Ptr *, Ptr, u64);
typedef CUresult (*multidev_t)(Ptr, unsigned, unsigned);

static int mode_variants(void) {
    RESOLVE(ex, launchex_t, "cuLaunchKernelEx", g_flags ? "cuLaunchKernelEx_ptsz" : "cuLaunchKernelEx");
    RESOLVE(coop, coop_t, "cuLaunchCooperativeKernel",
            g_flags ? "cuLaunchCooperativeKernel_ptsz" : "cuLaunchCooperativeKernel");
    RESOLVE(multi, multidev_t, "cuLaunchCooperativeKernelMultiDevice",
            "cuLaunchCooperativeKernelMultiDevice");
    RESOLVE(glaunch, graph_t, "cuGraphLaunch", g_flags ? "cuGraphLaunch_ptsz" : "cuGraphLaunch");
    LaunchConfig cfg = {{1, 1, 1}, {32, 1, 1}, 0, NULL, NULL, 0};
    int fails = 0;
    EXPECT(launch1(NULL) == 0, "cuLaunchKernel");
    EXPECT(ex(&cfg, (Ptr)0x1, NULL, NULL) == 0, "cuLaunchKernelEx");
    EXPECT(coop((Ptr)0x1, 1, 1, 1, 1, 1, 1, 0, NULL, NULL) == 0, "cooperative");
    EXPECT(multi((Ptr)0x1, 2, 0) == 0, "multi-device cooperative");
    EXPECT(glaunch((Ptr)0x1, NULL) == 0, "cuGraphLaunch");
    EXPECT(g_sync() == 0, "sync");
    printf("variant_failures=%d\n", fails);
    return fails ? 1 : 0;
}

static int mode_capture(long n) {
    RESOLVE(screate, streamcreate_t, "cuStreamCreate", "cuStreamCreate");
    RESOLVE(begin, begincap_t, "cuStreamBeginCapture", "cuStreamBeginCapture_v2");
    RESOLVE(endc, endcap_t, "cuStreamEndCapture", "cuStreamEndCapture");
    RESOLVE(inst, inst_t, "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags");
    RESOLVE(glaunch, graph_t, "cuGraphLaunch", g_flags ? "cuGraphLaunch_ptsz" : "cuGraphLaunch");
    Ptr s = NULL, g = NULL, e = NULL;
    if (screate(&s, 0)) die("cuStreamCreate", -1);
    if (begin(s, 0)) die("begin capture", -1);
    u64 t0 = now_ns();
    for (long i = 0; i < n; i++)
        if (launch1(s)) die("captured launch", -1);
    u64 t1 = now_ns();
    if (endc(s, &g)) die("end capture", -1);
    if (inst(&e, g, 0)) die("instantiate", -1);
    u64 t2 = now_ns();
    if (glaunch(e, s)) die("graph launch", -1);
    if (glaunch(e, s)) die("graph launch 2", -1);
    u64 t3 = now_ns();
    printf("capture_ns=%llu graph_launch_ns=%llu\n", t1 - t0, t3 - t2);
    (void)t2;
    return 0;
}

static void app_handler(int sig) {
    (void)sig;
    static const char msg[] = "app-handler\n";
    ssize_t w = write(1, msg, sizeof msg - 1);
    (void)w;
    _exit(42);
}

static int mode_train(int own_handler) {
    if (own_handler) {
        /* installed before the driver is initialised, so the interposer chains to it */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = app_handler;
        sigaction(SIGTERM, &sa, NULL);
    }
    (void)own_handler;
    return -1; /* handled in main after common_init */
}

__attribute__((noreturn)) static void train_loop(void) {
    u64 p = 0;
    if (g_alloc(&p, 64 << 20)) die("alloc", -1);
    int first = 1;
    for (;;) {
        if (launch1(NULL)) die("launch", -1);
        if (g_sync()) die("sync", -1);
        if (first) {
            printf("ready\n");
            fflush(stdout);
            first = 0;
        }
    }
}

/* SIGTERM handler with SA_RESETHAND and SIGUSR1 in its sa_mask: reports whether the mask
 * it asked for is in force while it runs, then returns (the program carries on). */
static void chained_handler(int sig) {
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    char msg[] = "app-handler usr1_blocked=0\n";
    msg[sizeof msg - 3] = sigismember(&cur, SIGUSR1) ? '1' : '0';
    ssize_t w = write(1, msg, sizeof msg - 1);
    (void)w;
    (void)sig;
}

static void install_chained_handler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = chained_handler;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGUSR1);
    sigaction(SIGTERM, &sa, NULL);
}

/* How SIGTERM is handled once CUDA is initialised. */
static int mode_sigstate(void) {
    struct sigaction cur;
    sigaction(SIGTERM, NULL, &cur);
    int ignored = cur.sa_handler == SIG_IGN;
    int ours = cur.sa_handler != SIG_DFL && !ignored;
    printf("term_hooked=%d term_onstack=%d term_ignored=%d\n", ours,
           (cur.sa_flags & SA_ONSTACK) != 0, ignored);
    return 0;
}

typedef CUresult (*ctxcreate2_t)(u64 *, unsigned, int);
typedef CUresult (*ctxcreate4_t)(u64 *, void *, unsigned, int);
/* N contexts made with cuCtxCreate_v2 or _v4, one kernel launched, then wait for a signal. */
__attribute__((noreturn)) static void mode_contexts(int n, const char *api) {
    ctxcreate2_t c2 = NULL;
    ctxcreate4_t c4 = NULL;
    if (!strcmp(api, "v4"))
        c4 = (ctxcreate4_t)sym("cuCtxCreate_v4", "cuCtxCreate_v4");
    else
        c2 = (ctxcreate2_t)sym("cuCtxCreate", "cuCtxCreate_v2");
    for (int i = 0; i < n; i++) {
        u64 ctx = 0;
        CUresult rc = c4 ? c4(&ctx, NULL, 0, 0) : c2(&ctx, 0, 0);
        if (rc) die("cuCtxCreate", rc);
    }
    u64 p = 0;
    if (g_alloc(&p, 1 << 20)) die("alloc", -1);
    if (launch1(NULL)) die("launch", -1);
    printf("ready\n");
    fflush(stdout);
    for (;;) pause();
}

typedef CUresult (*name_t)(char *, int, int);
typedef CUresult (*ver_t)(int *);
static int mode_unknown(void) {
    RESOLVE(name, name_t, "cuDeviceGetName", "cuDeviceGetName");
    char buf[64] = {0};
    CUresult rc = name(buf, sizeof buf, 0);
    if (rc) die("cuDeviceGetName", rc);
    printf("device_name=%s\n", buf);
    if (strcmp(g_resolve, "direct")) {
        RESOLVE(ver, ver_t, "cuDriverGetVersion", "cuDriverGetVersion");
        int v = 0;
        if (ver(&v)) die("cuDriverGetVersion", -1);
        printf("driver_version=%d\n", v);
    }
    if (g_gpa2) {
        void *p = (void *)0x1;
        int st = -1;
        rc = g_gpa2("cuNoSuchEntryPoint", &p, 12080, g_flags, &st);
        printf("missing rc=%d null=%d status=%d\n", rc, p == NULL, st);
    }
    if (g_handle) {
        void *p = dlsym(g_handle, "cuNoSuchEntryPoint");
        printf("dlsym_missing_null=%d\n", p == NULL);
        /* RTLD_DEFAULT lookups of libc symbols must be untouched */
        printf("dlsym_default_ok=%d\n", dlsym(RTLD_DEFAULT, "strlen") == (void *)strlen);
    }
    return 0;
}

static int mode_panic(void) {
    RESOLVE(info, meminfo_t, "cuMemGetInfo", "cuMemGetInfo_v2");
    size_t fr = 0, to = 0;
    CUresult rc = info(&fr, &to);
    u64 p = 0;
    CUresult rc2 = g_alloc(&p, 4096);
    CUresult rc3 = launch1(NULL);
    printf("panic_rc=%d after_alloc_rc=%d after_launch_rc=%d\n", rc, rc2, rc3);
    return (rc2 == 0 && rc3 == 0) ? 0 : 1;
}

/* A free made after the interposer's own atexit handler (registered on cuInit) ran: global
 * destructors and atexit handlers registered before CUDA was initialised do exactly this. */
static u64 g_late_ptr;
static void late_free(void) {
    CUresult rc = g_free(g_late_ptr);
    printf("late_free_rc=%d\n", rc);
}

static int mode_free_after_exit(size_t bytes) {
    if (g_alloc(&g_late_ptr, bytes)) die("alloc", -1);
    printf("allocated=%zu\n", bytes);
    return 0;
}

/* Load the stand-in runtime (libcudart.so.12), with RTLD_DEEPBIND if asked, and allocate
 * 8 MiB through it. */
typedef int (*fake_malloc_t)(size_t);
static int mode_runtime(int deepbind) {
    void *h = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL | (deepbind ? RTLD_DEEPBIND : 0));
    if (!h) die("dlopen libcudart.so.12", -1);
    fake_malloc_t m = (fake_malloc_t)dlsym(h, "fake_cudart_malloc");
    if (!m) die("fake_cudart_malloc", -1);
    printf("runtime_alloc_rc=%d\n", m(8 << 20));
    return 0;
}

/* Memory allocated in a context goes with it: allocate half the quota in a created context and
 * destroy the context without freeing; then half the quota in the primary context and reset it.
 * Each time the full quota must be available again. */
typedef CUresult (*reset_t)(int);
static int mode_ctx_memory(size_t quota) {
    RESOLVE(create, ctxcreate2_t, "cuCtxCreate", "cuCtxCreate_v2");
    RESOLVE(destroy, free_t, "cuCtxDestroy", "cuCtxDestroy_v2");
    RESOLVE(setcur, ctxset_t, "cuCtxSetCurrent", "cuCtxSetCurrent");
    RESOLVE(retain, retain_t, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain");
    RESOLVE(reset, reset_t, "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2");
    u64 ctx = 0, primary = 0, p = 0;
    if (create(&ctx, 0, 0)) die("cuCtxCreate", -1);
    if (g_alloc(&p, quota / 2)) die("alloc in created ctx", -1);
    if (destroy(ctx)) die("cuCtxDestroy", -1);
    if (retain(&primary, 0) || setcur(primary)) die("primary", -1);
    CUresult after_destroy = g_alloc(&p, quota);
    printf("full_after_destroy_rc=%d\n", after_destroy);
    if (after_destroy == 0 && g_free(p)) die("free", -1);
    if (g_alloc(&p, quota / 2)) die("alloc in primary ctx", -1);
    if (reset(0)) die("reset", -1);
    if (retain(&primary, 0) || setcur(primary)) die("primary again", -1);
    CUresult after_reset = g_alloc(&p, quota);
    printf("full_after_reset_rc=%d\n", after_reset);
    return 0;
}

/* getppid through whatever interposers are loaded, against the kernel's answer. */
static int mode_getppid(void) {
    pid_t via = getppid();
    pid_t raw = (pid_t)syscall(SYS_getppid);
    pid_t pgrp_via = getpgrp();
    pid_t pgrp_raw = (pid_t)syscall(SYS_getpgid, 0);
    printf("getppid_ok=%d getpgrp_ok=%d\n", via == raw, pgrp_via == pgrp_raw);
    return via == raw && pgrp_via == pgrp_raw ? 0 : 1;
}

/* dlvsym through the interposer answers like glibc's: the driver's symbols are unversioned,
 * which glibc's dlvsym finds under no version; a versioned libc symbol is found. */
static int mode_dlvsym(void) {
    void *driver = dlvsym(g_handle, "cuMemAlloc_v2", "GLIBC_2.2.5");
    void *libc_getpid = dlvsym(RTLD_DEFAULT, "getpid", "GLIBC_2.2.5");
    printf("dlvsym_driver_null=%d dlvsym_libc_ok=%d\n", driver == NULL,
           libc_getpid == (void *)getpid);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: workload MODE [ARGS]\n");
        return 2;
    }
    const char *m = argv[1];
    int own_handler = !strcmp(m, "train-handler");
    if (own_handler) mode_train(1);
    if (!strcmp(m, "free-after-exit")) atexit(late_free);
    if (!strcmp(m, "train-chained")) install_chained_handler();
    setup();
    common_init();
    if (!strcmp(m, "alloc-race")) return mode_alloc_race(atoi(argv[2]), (size_t)atoll(argv[3]));
    if (!strcmp(m, "allocators")) return mode_allocators((size_t)atoll(argv[2]));
    if (!strcmp(m, "meminfo")) return mode_meminfo();
    if (!strcmp(m, "pace")) return mode_pace(atol(argv[2]));
    if (!strcmp(m, "launch-loop")) return mode_launch_loop(atol(argv[2]));
    if (!strcmp(m, "launch-when")) return mode_launch_when(argv[2], atol(argv[3]));
    if (!strcmp(m, "iterations")) return mode_iterations(atol(argv[2]), atol(argv[3]));
    if (!strcmp(m, "spill")) return mode_spill((size_t)atoll(argv[2]), (size_t)atoll(argv[3]));
    if (!strcmp(m, "release")) return mode_release(atol(argv[2]), atol(argv[3]));
    if (!strcmp(m, "rejected")) return mode_rejected(atol(argv[2]));
    if (!strcmp(m, "variants")) return mode_variants();
    if (!strcmp(m, "capture")) return mode_capture(atol(argv[2]));
    if (!strcmp(m, "train") || own_handler || !strcmp(m, "train-chained")) train_loop();
    if (!strcmp(m, "sigstate")) return mode_sigstate();
    if (!strcmp(m, "contexts")) mode_contexts(atoi(argv[2]), argv[3]);
    if (!strcmp(m, "unknown")) return mode_unknown();
    if (!strcmp(m, "panic")) return mode_panic();
    if (!strcmp(m, "getppid")) return mode_getppid();
    if (!strcmp(m, "dlvsym")) return mode_dlvsym();
    if (!strcmp(m, "ctx-memory")) return mode_ctx_memory((size_t)atoll(argv[2]));
    if (!strcmp(m, "arrays")) return mode_arrays((size_t)atoll(argv[2]));
    if (!strcmp(m, "vmm")) return mode_vmm((size_t)atoll(argv[2]));
    if (!strcmp(m, "multi-gpu")) return mode_multi_gpu((size_t)atoll(argv[2]));
    if (!strcmp(m, "nvml")) return mode_nvml(argv[2]);
    if (!strcmp(m, "nvml-procs")) return mode_nvml_procs(argv[2], argv[3]);
    if (!strcmp(m, "runtime")) return mode_runtime(atoi(argv[2]));
    if (!strcmp(m, "free-after-exit")) return mode_free_after_exit((size_t)atoll(argv[2]));
    fprintf(stderr, "unknown mode %s\n", m);
    return 2;
}
