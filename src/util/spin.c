/*
 * spin — see spin.h.
 */
#include "util/spin.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "util/util.h"

#define MOD "spin"

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static uint32_t env_us = ECT_SPIN_DEFAULT_US;
static _Atomic int64_t forced_us = -1;

int ect_spin_parse(const char *what, const char *text, uint32_t *us) {
    uint64_t v = 0;
    const char *p = text ? text : "";
    for (; *p >= '0' && *p <= '9' && v <= ECT_SPIN_MAX_US; p++) v = v * 10 + (uint64_t)(*p - '0');
    if (!text || !*text || *p || v > ECT_SPIN_MAX_US)
        return ect_set_error(ECT_EINVAL,
                             "%s '%.32s': expected a busy-poll budget in microseconds, 0 (off) to %u",
                             what, text ? text : "", ECT_SPIN_MAX_US);
    *us = (uint32_t)v;
    return 0;
}

static void read_env(void) {
    const char *e = getenv("ECT_SPIN_US");
    if (!e || !*e) return;
    if (ect_spin_parse("ECT_SPIN_US", e, &env_us) != 0) {
        ECT_LOGW(MOD, "%s; spinning is off", ect_last_error());
        env_us = 0;
    }
}

uint32_t ect_spin_us(void) {
    int64_t f = atomic_load(&forced_us);
    if (f >= 0) return (uint32_t)f;
    pthread_once(&env_once, read_env);
    return env_us;
}

void ect_spin_set_us(int64_t us) {
    atomic_store(&forced_us, us < 0 ? -1 : us > ECT_SPIN_MAX_US ? (int64_t)ECT_SPIN_MAX_US : us);
}

void ect_spin_init(ect_spin *s) {
    *s = (ect_spin){.us = ect_spin_us(), .gated = atomic_load(&forced_us) < 0};
}

static void spin_missed(ect_spin *s) {
    if (s->misses < 6) s->misses++;
    s->skip = (1u << s->misses) - 1;
    if (s->skip > ECT_SPIN_MAX_SKIP) s->skip = ECT_SPIN_MAX_SKIP;
}

/* How often this thread was switched out while runnable: a sched_yield that
 * handed the CPU to another thread, or a preemption. */
static long involuntary_switches(void) {
    struct rusage ru;
    return getrusage(RUSAGE_THREAD, &ru) == 0 ? ru.ru_nivcsw : 0;
}

/* The checks after the first: until an event, an error or the budget's end.
 * *shared: another thread ran on this CPU meanwhile. */
static int spin_more(const ect_spin *s, struct pollfd *p, nfds_t n, bool *shared) {
    uint64_t end = ect_now_ns() + (uint64_t)s->us * 1000u;
    long sw = involuntary_switches();
    int rc = 0;
    while (rc == 0 && ect_now_ns() < end) {
        sched_yield(); /* a peer queued on this CPU runs now, not after the budget */
        rc = poll(p, n, 0);
    }
    *shared = involuntary_switches() != sw;
    return rc;
}

/* Whether some other CPU was idle at least half of the last ~10 ms
 * (/proc/stat, sampled by whichever waiter comes first after 10 ms): a
 * spin pays only where the peer's vCPU would otherwise halt. */
#define IDLE_SAMPLE_NS 10000000ull
#define IDLE_MAX_CPUS 64
static pthread_mutex_t idle_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t idle_at_ns, idle_prev[IDLE_MAX_CPUS], total_prev[IDLE_MAX_CPUS];
static _Atomic uint64_t idle_mask; /* CPUs idle >= half of the last interval */

static void idle_sample(void) {
    FILE *f = fopen("/proc/stat", "re");
    if (!f) return;
    char line[512];
    uint64_t mask = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned cpu;
        unsigned long long v[8] = {0};
        if (strncmp(line, "cpu", 3) != 0 || line[3] < '0' || line[3] > '9') continue;
        if (sscanf(line, "cpu%u %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &v[0], &v[1],
                   &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) < 5 || cpu >= IDLE_MAX_CPUS)
            continue;
        uint64_t idle = v[3] + v[4], total = 0;
        for (int i = 0; i < 8; i++) total += v[i];
        uint64_t di = idle - idle_prev[cpu], dt = total - total_prev[cpu];
        if (dt > 0 && 2 * di >= dt) mask |= 1ull << cpu;
        idle_prev[cpu] = idle;
        total_prev[cpu] = total;
    }
    fclose(f);
    atomic_store(&idle_mask, mask);
}

static bool idle_elsewhere(void) {
    uint64_t now = ect_now_ns();
    if (now - __atomic_load_n(&idle_at_ns, __ATOMIC_RELAXED) >= IDLE_SAMPLE_NS &&
        pthread_mutex_trylock(&idle_mu) == 0) {
        if (now - idle_at_ns >= IDLE_SAMPLE_NS) {
            idle_sample();
            __atomic_store_n(&idle_at_ns, now, __ATOMIC_RELAXED);
        }
        pthread_mutex_unlock(&idle_mu);
    }
    int me = sched_getcpu();
    uint64_t mask = atomic_load(&idle_mask);
    if (me >= 0 && me < IDLE_MAX_CPUS) mask &= ~(1ull << me);
    return mask != 0;
}

int ect_spin_poll(ect_spin *s, struct pollfd *p, nfds_t n) {
    if (!s->us) return 0;
    if (s->skip) {
        s->skip--;
        return 0;
    }
    if (s->off_until_ns && ect_now_ns() < s->off_until_ns) return 0;
    if (s->gated && !idle_elsewhere()) return 0;
    s->spins++;
    int rc = poll(p, n, 0);
    bool shared = false;
    if (rc == 0) rc = spin_more(s, p, n, &shared);
    if (shared) { /* the CPU is wanted by others: a spinner would be treated as a hog */
        s->off_until_ns = ect_now_ns() + ECT_SPIN_SHARED_OFF_MS * 1000000ull;
        spin_missed(s);
    } else if (rc > 0) {
        s->hits++;
        s->misses = 0;
    } else {
        spin_missed(s);
    }
    return rc > 0 ? rc : 0; /* an error: the sleeping poll says it */
}
