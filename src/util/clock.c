/* clock — the monotonic clock every timeout and TTL is measured on. */
#include <time.h>

#include "util/util.h"

uint64_t ect_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t ect_now_ms(void) { return ect_now_ns() / 1000000ull; }

double ect_now_s(void) { return (double)ect_now_ns() / 1e9; }
