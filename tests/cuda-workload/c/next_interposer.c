/* A second LD_PRELOAD interposer, loaded after libarbiter_interpose.so, written the usual way:
 * its getppid finds "the next definition" with dlsym(RTLD_NEXT, "getppid") and calls it, its
 * getpgrp the same with dlvsym(RTLD_NEXT, "getpgrp", "GLIBC_2.2.5").
 * If the lookup resolves relative to libarbiter instead of this library, "next" is this very
 * function and it recurses; we stop at depth 64 and exit with 97 instead of overflowing the
 * stack, so a test can tell the failure apart from a crash. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

static __thread int depth;

pid_t getppid(void) {
    if (++depth > 64) {
        static const char msg[] = "next_interposer: dlsym(RTLD_NEXT) returned ourselves\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(97);
    }
    pid_t (*next)(void) = (pid_t (*)(void))dlsym(RTLD_NEXT, "getppid");
    pid_t r = next ? next() : -1;
    depth--;
    return r;
}

static __thread int pgrp_depth;

pid_t getpgrp(void) {
    if (++pgrp_depth > 64) {
        static const char msg[] = "next_interposer: dlvsym(RTLD_NEXT) returned ourselves\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(97);
    }
    pid_t (*next)(void) = (pid_t (*)(void))dlvsym(RTLD_NEXT, "getpgrp", "GLIBC_2.2.5");
    pid_t r = next ? next() : -1;
    pgrp_depth--;
    return r;
}
