/* A stand-in for libcudart, built as `libcudart.so.12` for the RTLD_DEEPBIND test: it finds
 * the driver the way cudart does (dlopen, dlsym of cuGetProcAddress_v2, then everything through
 * it) and allocates. Its `dlsym` reference is resolved like any library's — through the
 * interposer normally, inside its own scope (glibc's) when it is loaded with RTLD_DEEPBIND. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

typedef int (*gpa2_t)(const char *, void **, int, unsigned long long, int *);
typedef int (*alloc_t)(unsigned long long *, size_t);

int fake_cudart_malloc(size_t bytes) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return -1;
    gpa2_t gpa = (gpa2_t)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) return -2;
    alloc_t alloc = NULL;
    int status = -1;
    if (gpa("cuMemAlloc", (void **)&alloc, 12080, 0, &status) || !alloc) return -3;
    unsigned long long p = 0;
    return alloc(&p, bytes);
}
