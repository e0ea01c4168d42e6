/* The real CUDA runtime's first steps, for scripts/real-cuda-check.sh: load libcudart like a
 * Python extension would (dlopen, RTLD_LOCAL), ask for the driver version and the device
 * count. With the real driver and no GPU the count fails with cudaErrorNoDevice (100) after
 * cudart resolved every driver entry point and called cuInit. */
#include <dlfcn.h>
#include <stdio.h>

typedef int (*int_out_t)(int *);

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: cudart_probe libcudart.so.N\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("FAIL dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    int_out_t driver_version = (int_out_t)dlsym(h, "cudaDriverGetVersion");
    int_out_t device_count = (int_out_t)dlsym(h, "cudaGetDeviceCount");
    if (!driver_version || !device_count) {
        printf("FAIL cudart symbols\n");
        return 1;
    }
    int v = -1, n = -1;
    int rv = driver_version(&v);
    int rc = device_count(&n);
    printf("cudaDriverGetVersion rc=%d version=%d\n", rv, v);
    printf("cudaGetDeviceCount rc=%d\n", rc);
    return 0;
}
