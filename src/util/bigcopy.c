/* bigcopy — see bigcopy.h: one large memcpy on the caller's thread and a
 * process-wide copy helper, chunks taken from both ends of one counter. */
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "util/bigcopy.h"
#include "util/util.h"

#define MOD "bigcopy"

/* The caller spins this many times (a pause each, 30-50 ns here: ~15-25 us
 * in all, one chunk's copy at 12 GB/s) for the helper's last chunk before it
 * sleeps on the futex; longer would only burn the CPU when the helper was
 * put on the caller's own core (2 busy cores) and cannot run meanwhile. */
#define WAIT_SPINS 500u

typedef struct bc_job {
    uint8_t *dst;
    const uint8_t *src;
    size_t n;
    uint64_t ends;        /* next front chunk << 32 | the back chunk's end (exclusive) */
    uint32_t helper_done; /* the helper is done with the job (it may be gone after) */
} bc_job;

static bc_job *slot;      /* a posted job not yet taken by the helper */
static uint32_t wake_seq; /* futex: bumped on each post */
static uint32_t done_seq; /* futex: bumped when the helper is done with a job */
static int mode = ECT_BIGCOPY_NORMAL;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool helper_up;
static pid_t helper_tid, helper_pid; /* set by the helper; pid: not a forked child's copy */
static cpu_set_t allowed;            /* the helper's CPUs as it started */
static int pinned_off = -1;          /* the CPU the helper was last kept off */
static uint64_t n_posted, n_joined, n_chunks;

static void futex_wait(uint32_t *w, uint32_t val) {
    syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(uint32_t *w, int n) {
    syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void copy_chunk(bc_job *j, uint32_t i) {
    size_t off = (size_t)i * ECT_BIGCOPY_CHUNK, left = j->n - off;
    memcpy(j->dst + off, j->src + off, left < ECT_BIGCOPY_CHUNK ? left : ECT_BIGCOPY_CHUNK);
}

/* The next chunk from the front (the caller) or the back (the helper): its
 * index, or -1 once the two ends met. */
static int64_t claim(bc_job *j, bool back) {
    uint64_t e = __atomic_load_n(&j->ends, __ATOMIC_RELAXED);
    for (;;) {
        uint32_t f = (uint32_t)(e >> 32), b = (uint32_t)e;
        if (f >= b) return -1;
        uint64_t ne = back ? e - 1 : e + (1ull << 32);
        if (__atomic_compare_exchange_n(&j->ends, &e, ne, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return back ? (int64_t)b - 1 : (int64_t)f;
    }
}

static void *helper_main(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "ect-copy");
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
        __atomic_store_n(&helper_pid, getpid(), __ATOMIC_RELAXED);
        __atomic_store_n(&helper_tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    }
    for (;;) {
        uint32_t seq = __atomic_load_n(&wake_seq, __ATOMIC_ACQUIRE);
        bc_job *j = __atomic_exchange_n(&slot, NULL, __ATOMIC_ACQ_REL);
        if (!j) {
            futex_wait(&wake_seq, seq); /* returns at once if a post came since */
            continue;
        }
        uint64_t k = 0;
        for (int64_t i; (i = claim(j, true)) >= 0; k++) copy_chunk(j, (uint32_t)i);
        __atomic_add_fetch(&n_joined, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&n_chunks, k, __ATOMIC_RELAXED);
        __atomic_store_n(&j->helper_done, 1, __ATOMIC_RELEASE); /* j may be gone from here */
        __atomic_add_fetch(&done_seq, 1, __ATOMIC_RELEASE);
        futex_wake(&done_seq, INT_MAX);
    }
    return NULL;
}

/* The helper thread, detached, with every signal blocked (they belong to
 * the application's threads); none with ECT_COPY_THREADS=1. */
static void helper_start(void) {
    const char *e = getenv("ECT_COPY_THREADS");
    if (e && strcmp(e, "2") != 0) {
        if (strcmp(e, "1") == 0) return; /* every copy on its caller's thread */
        ECT_LOGW(MOD, "ECT_COPY_THREADS=%.32s: must be 1 or 2; using 2", e);
    }
    pthread_attr_t a;
    if (pthread_attr_init(&a) != 0) return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    helper_up = pthread_create(&t, &a, helper_main, NULL) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&a);
}

/* Waits until the helper, which took job j, is done with it: its last
 * chunk takes microseconds, so a short spin first. */
static void wait_helper(bc_job *j) {
    for (unsigned spins = 0;; spins++) {
        uint32_t d = __atomic_load_n(&done_seq, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&j->helper_done, __ATOMIC_ACQUIRE)) return;
        if (spins < WAIT_SPINS)
            cpu_relax();
        else
            futex_wait(&done_seq, d);
    }
}

/* Keeps the helper off the caller's CPU: a woken thread is often queued on
 * its waker's CPU, where the two would take turns instead of copying at
 * once. Only when the CPU changed since last time, and only within the
 * CPUs the helper may use (two callers at once at worst both set it). */
static void keep_off_caller_cpu(void) {
    pid_t tid = __atomic_load_n(&helper_tid, __ATOMIC_ACQUIRE);
    int cpu = sched_getcpu();
    if (!tid || cpu < 0 || cpu >= CPU_SETSIZE ||
        cpu == __atomic_load_n(&pinned_off, __ATOMIC_RELAXED) ||
        __atomic_load_n(&helper_pid, __ATOMIC_RELAXED) != getpid())
        return;
    cpu_set_t m = allowed;
    CPU_CLR(cpu, &m);
    if (CPU_COUNT(&m) > 0 && sched_setaffinity(tid, sizeof m, &m) == 0)
        __atomic_store_n(&pinned_off, cpu, __ATOMIC_RELAXED);
}

void ect_bigcopy(void *dst, const void *src, size_t n) {
    int md = __atomic_load_n(&mode, __ATOMIC_RELAXED);
    size_t nch = (n + ECT_BIGCOPY_CHUNK - 1) / ECT_BIGCOPY_CHUNK;
    if (n < ECT_BIGCOPY_MIN || nch > UINT32_MAX || md == ECT_BIGCOPY_ALONE ||
        pthread_once(&once, helper_start) != 0 || !helper_up) {
        memcpy(dst, src, n);
        return;
    }
    bc_job j = {dst, src, n, (uint64_t)nch, 0};
    bc_job *none = NULL;
    if (!__atomic_compare_exchange_n(&slot, &none, &j, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
        memcpy(dst, src, n); /* another caller's job has the helper */
        return;
    }
    __atomic_add_fetch(&n_posted, 1, __ATOMIC_RELAXED);
    keep_off_caller_cpu();
    __atomic_add_fetch(&wake_seq, 1, __ATOMIC_RELEASE);
    futex_wake(&wake_seq, 1);
    if (md != ECT_BIGCOPY_HELPER_ONLY) {
        for (int64_t i; (i = claim(&j, false)) >= 0;) copy_chunk(&j, (uint32_t)i);
        bc_job *mine = &j; /* not taken yet (helper busy, asleep or absent): take it back */
        if (__atomic_compare_exchange_n(&slot, &mine, NULL, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            return;
    }
    wait_helper(&j);
}

void ect_bigcopy_stats_get(ect_bigcopy_stats *s) {
    s->posted = __atomic_load_n(&n_posted, __ATOMIC_RELAXED);
    s->joined = __atomic_load_n(&n_joined, __ATOMIC_RELAXED);
    s->helper_chunks = __atomic_load_n(&n_chunks, __ATOMIC_RELAXED);
}

void ect_bigcopy_mode(int m) { __atomic_store_n(&mode, m, __ATOMIC_RELAXED); }
