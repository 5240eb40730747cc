/*
 * checksum_fault — fault injection for tests/cli/demo.sh, kept out of the
 * shipped `ect`. Preloaded (LD_PRELOAD) into `ect demo`, whose children
 * inherit it: with ECT_FAULT=checksum, in the process running `ect
 * push-consumer` the first XXH3_64bits (libxxhash, what the CLI checksums
 * items with: XXH3_64bits_dispatch where the library has it, else
 * XXH3_64bits; both are wrapped) comes back with its lowest bit flipped, as
 * if the first item's bytes had arrived different. The demo must then report
 * that item failed and exit 1. Everywhere else it is XXH3 unchanged.
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

typedef unsigned long long xxh3_fn(const void *input, size_t length);

unsigned long long XXH3_64bits(const void *input, size_t length);
unsigned long long XXH3_64bits_dispatch(const void *input, size_t length);

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

/* The first call in a push-consumer process with ECT_FAULT=checksum: flip. */
static unsigned long long maybe_flip(unsigned long long h) {
    static atomic_bool done;
    const char *f = getenv("ECT_FAULT");
    if (f && strcmp(f, "checksum") == 0 && is_push_consumer() && !atomic_exchange(&done, true))
        h ^= 1;
    return h;
}

/* name's next definition (libxxhash's), else XXH3_64bits (the same value). */
static unsigned long long call_real(xxh3_fn **real, const char *name, const void *input,
                                    size_t length) {
    if (!*real) *real = (xxh3_fn *)dlsym(RTLD_NEXT, name);
    if (!*real) *real = (xxh3_fn *)dlsym(RTLD_NEXT, "XXH3_64bits");
    if (!*real) abort();
    return maybe_flip((*real)(input, length));
}

unsigned long long XXH3_64bits(const void *input, size_t length) {
    static xxh3_fn *real;
    return call_real(&real, "XXH3_64bits", input, length);
}

unsigned long long XXH3_64bits_dispatch(const void *input, size_t length) {
    static xxh3_fn *real;
    return call_real(&real, "XXH3_64bits_dispatch", input, length);
}
