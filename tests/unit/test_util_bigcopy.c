/*
 * Tests for util/bigcopy, a large memcpy on the caller's thread and a copy
 * helper: every byte lands and nothing around the destination is touched,
 * at odd sizes and unaligned addresses, whether the caller copies alone, the
 * helper copies every chunk (its half checked on its own) or the two share;
 * a copy under the threshold never involves the helper; a process with no
 * helper thread (a child forked after it started: the helper's half never
 * runs) still copies every byte, with its job taken back; callers on several
 * threads at once each get their own bytes; ECT_COPY_THREADS=1 makes no
 * helper.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "util/bigcopy.h"

#define GUARD 4096

static const size_t sizes[] = {
    ECT_BIGCOPY_MIN - 1,
    ECT_BIGCOPY_MIN,
    ECT_BIGCOPY_MIN + 1,
    5 * ECT_BIGCOPY_CHUNK + 3,
    4718592 + 13, /* 4.5 MiB and an odd tail */
    9 * 1048576 + 1,
};

/* Buffers for one copy of n bytes: the source from offset 5 of its block,
 * the destination from offset 3 of its block after a guard, both patterned
 * by seed. */
typedef struct bufs {
    uint8_t *sblk, *dblk, *src, *dst;
    size_t n;
} bufs;

static void bufs_make(bufs *b, size_t n, unsigned seed) {
    b->n = n;
    b->sblk = malloc(n + 8);
    b->dblk = malloc(n + 2 * GUARD + 8);
    if (!b->sblk || !b->dblk) abort();
    b->src = b->sblk + 5;
    b->dst = b->dblk + GUARD + 3;
    for (size_t i = 0; i < n; i++) b->src[i] = (uint8_t)(i * 131u + i / 4099u + seed);
    memset(b->dblk, 0xAA, n + 2 * GUARD + 8);
}

/* Every byte of the copy right, every byte around it untouched (no cmocka
 * assert: callers on other threads use it too). */
static bool bufs_ok(const bufs *b) {
    if (memcmp(b->dst, b->src, b->n) != 0) return false;
    for (size_t i = 0; i < GUARD + 3; i++)
        if (b->dblk[i] != 0xAA) return false;
    for (size_t i = GUARD + 3 + b->n; i < b->n + 2 * GUARD + 8; i++)
        if (b->dblk[i] != 0xAA) return false;
    return true;
}

static void bufs_check(const bufs *b) { assert_true(bufs_ok(b)); }

static void bufs_free(bufs *b) {
    free(b->sblk);
    free(b->dblk);
}

static size_t chunks_of(size_t n) { return (n + ECT_BIGCOPY_CHUNK - 1) / ECT_BIGCOPY_CHUNK; }

/* Copies each size in mode m; returns nothing, checks bytes and what the
 * helper did: none of it under the threshold, all of it in HELPER_ONLY. */
static void copy_sizes(int m) {
    ect_bigcopy_mode(m);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        bufs b;
        bufs_make(&b, sizes[k], (unsigned)k + 1);
        ect_bigcopy_stats s0, s1;
        ect_bigcopy_stats_get(&s0);
        ect_bigcopy(b.dst, b.src, b.n);
        ect_bigcopy_stats_get(&s1);
        bufs_check(&b);
        bool big = b.n >= ECT_BIGCOPY_MIN;
        if (!big || m == ECT_BIGCOPY_ALONE) {
            assert_int_equal(s1.posted, s0.posted);
            assert_int_equal(s1.helper_chunks, s0.helper_chunks);
        } else {
            assert_int_equal(s1.posted, s0.posted + 1);
        }
        if (big && m == ECT_BIGCOPY_HELPER_ONLY) {
            assert_int_equal(s1.joined, s0.joined + 1);
            assert_int_equal(s1.helper_chunks, s0.helper_chunks + chunks_of(b.n));
        }
        bufs_free(&b);
    }
    ect_bigcopy_mode(ECT_BIGCOPY_NORMAL);
}

static void test_alone(void **state) {
    (void)state;
    copy_sizes(ECT_BIGCOPY_ALONE);
}

/* In a child whose first large copy comes after ECT_COPY_THREADS=value is
 * set (this process has made no helper yet: test_alone runs first and never
 * asks for one): 0 when the copy is right and it was posted to a helper
 * (want_posted) or not. */
static int child_with_env(const char *value, bool want_posted) {
    pid_t pid = fork();
    if (pid == 0) {
        setenv("ECT_COPY_THREADS", value, 1);
        bufs b;
        bufs_make(&b, 4718592 + 13, 21);
        ect_bigcopy_stats s0, s1;
        ect_bigcopy_stats_get(&s0);
        ect_bigcopy(b.dst, b.src, b.n);
        ect_bigcopy_stats_get(&s1);
        bool ok = bufs_ok(&b) && (s1.posted == s0.posted + 1) == want_posted;
        bufs_free(&b);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
}

/* ECT_COPY_THREADS=1: no helper, every copy on the caller's thread; 2 and
 * a wrong value (warned about) keep the helper. */
static void test_env_copy_threads(void **state) {
    (void)state;
    ect_bigcopy_stats s;
    ect_bigcopy_stats_get(&s);
    assert_int_equal(s.posted, 0); /* no helper asked for yet in this process */
    ect_bigcopy_mode(ECT_BIGCOPY_NORMAL);
    assert_int_equal(child_with_env("1", false), 0);
    assert_int_equal(child_with_env("2", true), 0);
    assert_int_equal(child_with_env("many", true), 0);
}

static void test_helper_only(void **state) {
    (void)state;
    copy_sizes(ECT_BIGCOPY_HELPER_ONLY);
}

static void test_shared(void **state) {
    (void)state;
    for (int r = 0; r < 20; r++) copy_sizes(ECT_BIGCOPY_NORMAL);
}

/* A child forked after the helper started has no helper thread: its large
 * copies post a job nobody takes, copy every chunk on the caller's thread
 * and take the job back (no wait for a helper that never comes). */
static void test_no_helper_thread(void **state) {
    (void)state;
    ect_bigcopy_mode(ECT_BIGCOPY_HELPER_ONLY);
    bufs b;
    bufs_make(&b, ECT_BIGCOPY_MIN, 9);
    ect_bigcopy(b.dst, b.src, b.n); /* the helper exists: it did this one */
    bufs_check(&b);
    bufs_free(&b);
    ect_bigcopy_mode(ECT_BIGCOPY_NORMAL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int bad = 0;
        for (int r = 0; r < 3 && !bad; r++) {
            bufs c;
            bufs_make(&c, 4718592 + 13, (unsigned)r);
            ect_bigcopy_stats s0, s1;
            ect_bigcopy_stats_get(&s0);
            ect_bigcopy(c.dst, c.src, c.n);
            ect_bigcopy_stats_get(&s1);
            bad |= !bufs_ok(&c);
            bad |= s1.posted != s0.posted + 1 || s1.joined != s0.joined;
            bufs_free(&c);
        }
        _exit(bad ? 1 : 0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* Eight copies on this thread: NULL when every one was right. */
static void *copier(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    bool ok = true;
    for (int r = 0; r < 8; r++) {
        bufs b;
        bufs_make(&b, 2 * ECT_BIGCOPY_MIN + seed * 7 + (unsigned)r, seed * 16 + (unsigned)r);
        ect_bigcopy(b.dst, b.src, b.n);
        ok &= bufs_ok(&b);
        bufs_free(&b);
    }
    return ok ? NULL : (void *)((uintptr_t)arg + 1);
}

/* Callers on four threads at once: one has the helper at a time, the
 * others copy alone; each gets its own bytes. */
static void test_callers_at_once(void **state) {
    (void)state;
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, copier, (void *)i), 0);
    for (int i = 0; i < 4; i++) {
        void *bad = (void *)1;
        pthread_join(t[i], &bad);
        assert_null(bad);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alone),
        cmocka_unit_test(test_env_copy_threads), /* before any test makes the helper */
        cmocka_unit_test(test_helper_only),
        cmocka_unit_test(test_shared),
        cmocka_unit_test(test_no_helper_thread),
        cmocka_unit_test(test_callers_at_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
