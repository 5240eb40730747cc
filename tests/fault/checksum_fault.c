/*
 * checksum_fault — fault injection for tests/cli/demo.sh, kept out of the
 * shipped `ect`. Preloaded (LD_PRELOAD) into `ect demo`, whose children
 * inherit it: with ECT_FAULT=checksum, in the process running `ect
 * push-consumer` the first XXH64 (libxxhash, what the CLI checksums items
 * with) comes back with its lowest bit flipped, as if the first item's bytes
 * had arrived different. The demo must then report that item failed and
 * exit 1. Everywhere else it is XXH64 unchanged.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef unsigned long long xxh64_fn(const void *input, size_t length, unsigned long long seed);

unsigned long long XXH64(const void *input, size_t length, unsigned long long seed);

/* argv[1] of this process is "push-consumer" (read from /proc/self/cmdline). */
static bool is_push_consumer(void) {
    char buf[256];
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = '\0';
    size_t first = strlen(buf) + 1;
    return first < (size_t)n && strcmp(buf + first, "push-consumer") == 0;
}

unsigned long long XXH64(const void *input, size_t length, unsigned long long seed) {
    static xxh64_fn *real;
    static atomic_bool done;
    if (!real) real = (xxh64_fn *)dlsym(RTLD_NEXT, "XXH64");
    if (!real) abort();
    unsigned long long h = real(input, length, seed);
    const char *f = getenv("ECT_FAULT");
    if (f && strcmp(f, "checksum") == 0 && is_push_consumer() && !atomic_exchange(&done, true))
        h ^= 1;
    return h;
}
