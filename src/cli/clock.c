/* clock — what the commands measure time and draw ids with: the monotonic
 * clock (as the library uses for every timeout) and the OS random source. */
#include <stdatomic.h>
#include <sys/random.h>
#include <time.h>

#include "cli/cli.h"

uint64_t cli_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t cli_now_ms(void) { return cli_now_ns() / 1000000ull; }

uint64_t cli_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t cli_random_u64(void) {
    uint64_t v;
    if (getrandom(&v, sizeof v, 0) == (ssize_t)sizeof v) return v;
    /* no entropy source: a counter through the splitmix64 finalizer */
    static atomic_uint_fast64_t n;
    v = atomic_fetch_add(&n, 0x9E3779B97F4A7C15ull) + cli_now_ns();
    v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ull;
    return v ^ (v >> 31);
}

void cli_random_id(char out[33]) {
    static const char hex[] = "0123456789abcdef";
    for (int w = 0; w < 2; w++) {
        uint64_t v = cli_random_u64();
        for (int i = 0; i < 16; i++) out[16 * w + i] = hex[(v >> (4 * i)) & 15];
    }
    out[32] = '\0';
}
