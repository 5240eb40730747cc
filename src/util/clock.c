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

uint64_t ect_realtime_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

const char *ect_rfc3339_ms(uint64_t realtime_ms, char *buf, size_t cap) {
    time_t secs = (time_t)(realtime_ms / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (unsigned)(realtime_ms % 1000));
    return buf;
}
