/* sync — see sync.h: timed waits measured on CLOCK_MONOTONIC. */
#include <errno.h>
#include <time.h>

#include "util/sync.h"
#include "util/util.h"

int ect_cond_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    int rc = pthread_condattr_init(&a);
    if (rc) return rc;
    rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (!rc) rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc;
}

uint64_t ect_deadline_ns(uint64_t ms) {
    uint64_t ns, at;
    if (!ect_mul_u64(ms, 1000000ull, &ns) || !ect_add_u64(ect_now_ns(), ns, &at)) return UINT64_MAX;
    return at;
}

static struct timespec to_ts(uint64_t ns) {
    /* far deadlines are capped: time_t seconds past year 2200 wait "forever" */
    if (ns > UINT64_C(7) * 1000000000ull * 1000000000ull)
        ns = UINT64_C(7) * 1000000000ull * 1000000000ull;
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                          .tv_nsec = (long)(ns % 1000000000ull)};
    return ts;
}

bool ect_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ns) {
    if (ect_now_ns() >= deadline_ns) return true;
    struct timespec ts = to_ts(deadline_ns);
    return pthread_cond_timedwait(cv, mu, &ts) == ETIMEDOUT;
}
