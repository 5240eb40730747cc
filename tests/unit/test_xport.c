/*
 * test_xport — the data plane. One table of tests runs over every back end
 * compiled in (tcp, shm, ucx); a few tcp-only tests drive the target with a
 * raw socket (garbage, a stalled write, unregister during a receive). Target
 * and initiator are two handles in this process, except for the "target
 * killed mid-batch" test, whose target is a forked child.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#include "ect_config.h"
#include "util/util.h"
#include "xport/shm.h"
#include "xport/tcp_frame.h"
#include "xport/xport.h"

#define MiB (1024u * 1024u)

/* Under ThreadSanitizer the ucx rows are left out: UCX is not instrumented,
 * so the ordering its shared-memory protocol gives between the target's
 * progress thread writing a region and the initiator's flush completing is
 * invisible to TSan (false data races), and its active-message path runs
 * too slowly there to finish in the test timeout. ASan runs them. */
#if defined(__SANITIZE_THREAD__)
#define XP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define XP_TSAN 1
#endif
#endif
#ifndef XP_TSAN
#define XP_TSAN 0
#endif

typedef test_region region;

/* A test's state names a back end, "ucx/TLS" for ucx over UCX_TLS=TLS. */
static const char *kind_of(const char *state) {
    if (strncmp(state, "ucx/", 4) == 0) {
        setenv("UCX_TLS", state + 4, 1);
        return "ucx";
    }
    return state;
}

static ect_xport *open_kind(const char *kind) {
    ect_xport *x = NULL;
    ect_xport_opts o;
    ect_xport_opts_init(&o);
    o.io_timeout_ms = 10000;
    int rc = ect_xport_open(kind, &o, &x);
    if (rc) fail_msg("open %s: %s", kind, ect_last_error());
    return x;
}

/* A registered region of len bytes on t whose own key is refused: writes
 * reach it only through its write windows (docs/PROTOCOL.md "Write windows"). */
static void private_region_open(ect_xport *t, size_t len, region *r) {
    test_region_open(t, len, r);
    assert_int_equal(xp_region_set_private(t, r->key), 0);
}

static ect_write wr(const void *src, const region *r, size_t off, size_t len) {
    ect_write w = {.src = src,
                   .dst_addr = (uint64_t)(uintptr_t)(r->addr + off),
                   .len = len,
                   .dst_key = r->key};
    return w;
}

static int all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

/* ---- table tests; state is the kind name */

static void t_sizes(void **state) {
    const char *kind = kind_of(*state);
    ect_xport *t = open_kind(kind), *i = open_kind(kind);
    region r;
    test_region_open(t, 40 * MiB, &r);
    static const size_t sizes[] = {1, 2, 7, 100, 4096, 65537, MiB + 3, 4 * MiB + MiB / 2, 16 * MiB};
    uint8_t *src = malloc(16 * MiB);
    assert_non_null(src);
    size_t off = 13;
    for (size_t k = 0; k < ECT_ARRAY_LEN(sizes); k++) {
        size_t n = sizes[k];
        test_fill_pattern(src, n, k + 1);
        ect_write w = wr(src, &r, off, n);
        int st = 99;
        int rc = ect_xport_write_batch(i, ect_xport_session(t), &w, 1, &st);
        if (rc) fail_msg("%s write of %zu: %s", kind, n, ect_last_error());
        assert_int_equal(st, 0);
        assert_true(test_check_pattern(r.addr + off, n, k + 1));
        assert_int_equal(r.addr[off - 1], 0); /* nothing before or after */
        assert_int_equal(r.addr[off + n], 0);
        off += n + 4099;
    }
    free(src);
    test_region_close(t, &r);
    ect_xport_close(i);
    ect_xport_close(t);
}

static void t_256m(void **state) {
    const char *kind = kind_of(*state);
    ect_xport *t = open_kind(kind), *i = open_kind(kind);
    region r;
    size_t n = 256 * MiB;
    test_region_open(t, n, &r);
    uint8_t *src = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(src != MAP_FAILED);
    for (size_t k = 0; k < n; k += 4096) memset(src + k, (int)(k / 4096 * 7 + 1), 4096);
    src[n - 1] = 0x5a;
    ect_write w = wr(src, &r, 0, n);
    int rc = ect_xport_write_batch(i, ect_xport_session(t), &w, 1, NULL);
    if (rc) fail_msg("%s 256 MiB: %s", kind, ect_last_error());
    assert_memory_equal(r.addr, src, n);
    munmap(src, n);
    test_region_close(t, &r);
    ect_xport_close(i);
    ect_xport_close(t);
}

static void t_batches(void **state) {
    const char *kind = kind_of(*state);
    ect_xport *t = open_kind(kind), *i = open_kind(kind);
    region r;
    test_region_open(t, 16 * MiB, &r);
    static const size_t counts[] = {1, 2, 17, 256, 1024};
    uint64_t rs = 42;
    uint8_t *src = malloc(8 * MiB);
    ect_write *w = calloc(1024, sizeof *w);
    size_t *off = calloc(1024, sizeof *off);
    int *st = calloc(1024, sizeof *st);
    assert_true(src && w && off && st);
    for (size_t c = 0; c < ECT_ARRAY_LEN(counts); c++) {
        size_t n = counts[c], pos = 0;
        memset(r.addr, 0, r.len);
        test_fill_pattern(src, 8 * MiB, c + 100);
        for (size_t k = 0; k < n; k++) {
            size_t len = 1 + (size_t)(test_rand(&rs) % 8192);
            size_t soff = (size_t)(test_rand(&rs) % (8 * MiB - len));
            off[k] = pos + (size_t)(test_rand(&rs) % 64);
            w[k] = wr(src + soff, &r, off[k], len);
            pos = off[k] + len;
        }
        int rc = ect_xport_write_batch(i, ect_xport_session(t), w, n, st);
        if (rc) fail_msg("%s batch of %zu: %s", kind, n, ect_last_error());
        for (size_t k = 0; k < n; k++) {
            assert_int_equal(st[k], 0);
            assert_memory_equal(r.addr + off[k], w[k].src, w[k].len);
        }
    }
    free(src);
    free(w);
    free(off);
    free(st);
    test_region_close(t, &r);
    ect_xport_close(i);
    ect_xport_close(t);
}

typedef struct thr_arg {
    ect_xport *i;
    const char *session;
    region *r;
    int idx;
    int failures;
} thr_arg;

#define THREADS 8
#define SLICE (512 * 1024)

static void *thr_main(void *p) {
    thr_arg *a = p;
    uint8_t *src = malloc(SLICE);
    uint64_t rs = (uint64_t)a->idx;
    for (int b = 0; b < 20 && src; b++) {
        ect_write w[16];
        size_t base = (size_t)a->idx * SLICE;
        test_fill_pattern(src, SLICE, (uint64_t)(a->idx * 1000 + b));
        for (int k = 0; k < 16; k++) {
            size_t len = SLICE / 16 - (size_t)(test_rand(&rs) % 64);
            w[k] = wr(src + (size_t)k * (SLICE / 16), a->r, base + (size_t)k * (SLICE / 16), len);
        }
        if (ect_xport_write_batch(a->i, a->session, w, 16, NULL) != 0) a->failures++;
        for (int k = 0; k < 16; k++)
            if (memcmp(a->r->addr + base + (size_t)k * (SLICE / 16), w[k].src, w[k].len) != 0)
                a->failures++;
    }
    free(src);
    return NULL;
}

static void t_threads(void **state) {
    const char *kind = kind_of(*state);
    ect_xport *t = open_kind(kind), *i = open_kind(kind);
    region r;
    test_region_open(t, THREADS * SLICE, &r);
    pthread_t th[THREADS];
    thr_arg a[THREADS];
    for (int k = 0; k < THREADS; k++) {
        a[k] = (thr_arg){.i = i, .session = ect_xport_session(t), .r = &r, .idx = k};
        assert_int_equal(pthread_create(&th[k], NULL, thr_main, &a[k]), 0);
    }
    for (int k = 0; k < THREADS; k++) {
        pthread_join(th[k], NULL);
        assert_int_equal(a[k].failures, 0);
    }
    test_region_close(t, &r);
    ect_xport_close(i);
    ect_xport_close(t);
}

/* Batch [good, bad, good]: only the bad one fails; the next batch works. */
static void refused_case(const char *kind, int expect, const char *what) {
    ect_xport *t = open_kind(kind), *i = open_kind(kind);
    region r, r2;
    test_region_open(t, MiB, &r);
    test_region_open(t, MiB, &r2);
    uint8_t src[4096];
    test_fill_pattern(src, sizeof src, 7);
    ect_write w[3] = {wr(src, &r, 0, 100), wr(src, &r, 4096, 100), wr(src, &r, 8192, 100)};
    char badkey[ECT_XPORT_KEY_MAX];
    if (strcmp(what, "key") == 0) {
        w[1].dst_key = r2.key; /* a real key, of another region */
    } else if (strcmp(what, "end") == 0) {
        w[1].dst_addr = (uint64_t)(uintptr_t)(r.addr + MiB - 50); /* crosses the end */
    } else if (strcmp(what, "before") == 0) {
        /* One byte before r2 with r2's key: out of range, or a key mismatch
         * if the kernel happened to place r right below r2. */
        w[1].dst_key = r2.key;
        w[1].dst_addr = (uint64_t)(uintptr_t)(r2.addr - 1);
        if (r2.addr - 1 >= r.addr && r2.addr - 1 < r.addr + r.len) expect = ECT_EACCES;
    } else if (strcmp(what, "unregistered") == 0) {
        region r3;
        test_region_open(t, MiB, &r3);
        snprintf(badkey, sizeof badkey, "%s", r3.key);
        w[1] = wr(src, &r3, 0, 100);
        w[1].dst_key = badkey;
        test_region_close(t, &r3);
    }
    int st[3] = {9, 9, 9};
    int rc = ect_xport_write_batch(i, ect_xport_session(t), w, 3, st);
    assert_int_equal(rc, expect);
    assert_int_equal(st[0], 0);
    assert_int_equal(st[1], expect);
    assert_int_equal(st[2], 0);
    assert_memory_equal(r.addr, src, 100);
    assert_memory_equal(r.addr + 8192, src, 100);
    assert_true(all_zero(r.addr + 4096, 100));
    assert_true(all_zero(r.addr + MiB - 50, 50));
    assert_true(all_zero(r2.addr, 100));
    /* The target keeps serving the same initiator. */
    rc = ect_xport_write_batch(i, ect_xport_session(t), &w[0], 1, st);
    assert_int_equal(rc, 0);
    test_region_close(t, &r);
    test_region_close(t, &r2);
    ect_xport_close(i);
    ect_xport_close(t);
}

static void t_wrong_key(void **state) { refused_case(kind_of(*state), ECT_EACCES, "key"); }
static void t_out_of_range(void **state) {
    const char *kind = kind_of(*state);
    refused_case(kind, ECT_ERANGE, "end");
    /* ucx checks on the initiator: an address outside the key's region is a
     * key that does not cover it. */
    refused_case(kind, strcmp(kind, "ucx") == 0 ? ECT_EACCES : ECT_ERANGE, "before");
}
static void t_unregistered(void **state) {
    const char *kind = kind_of(*state);
    /* One-sided UCX puts over tcp/cma cannot be refused by the target once
     * the region is gone (ucx.c, "Limits"). */
    if (strcmp(kind, "ucx") == 0) skip();
    refused_case(kind, ECT_ENOTFOUND, "unregistered");
}

/* A region written before (so cached by the initiator: shm's fast path)
 * and then unregistered refuses further writes, and nothing lands. */
static void t_unregister_after_use(void **state) {
    const char *kind = kind_of(*state);
    if (strcmp(kind, "ucx") == 0) skip(); /* see t_unregistered */
    ect_xport *t = open_kind(kind), *i = open_kind(kind);
    region r;
    test_region_open(t, MiB, &r);
    uint8_t src[512];
    test_fill_pattern(src, sizeof src, 11);
    ect_write w = wr(src, &r, 0, sizeof src);
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), &w, 1, NULL), 0);
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), &w, 1, NULL), 0);
    assert_int_equal(ect_xport_unregister(t, r.key), 0);
    memset(r.addr, 0, 4096);
    int st = 0;
    assert_err(ect_xport_write_batch(i, ect_xport_session(t), &w, 1, &st), ECT_ENOTFOUND, NULL);
    assert_int_equal(st, ECT_ENOTFOUND);
    assert_true(all_zero(r.addr, 4096));
    test_region_close(NULL, &r);
    ect_xport_close(i);
    ect_xport_close(t);
}

typedef struct race_arg {
    ect_xport *i;
    const char *session;
    ect_write w;
    atomic_int stop;
    atomic_int ok;
    int refused, other;
} race_arg;

static void *race_main(void *p) {
    race_arg *a = p;
    while (!atomic_load(&a->stop)) {
        int rc = ect_xport_write_batch(a->i, a->session, &a->w, 1, NULL);
        if (rc == 0)
            a->ok++;
        else if (rc == ECT_ENOTFOUND)
            a->refused++;
        else
            a->other++;
    }
    return NULL;
}

/* Writes race with unregister: once unregister returns, no byte lands. */
static void t_unregister_race(void **state) {
    const char *kind = kind_of(*state);
    if (strcmp(kind, "ucx") == 0) skip(); /* see t_unregistered */
    ect_xport *t = open_kind(kind), *i = open_kind(kind);
    region r;
    test_region_open(t, 4 * MiB, &r);
    uint8_t *src = malloc(2 * MiB);
    assert_non_null(src);
    memset(src, 0x77, 2 * MiB);
    race_arg a = {.i = i, .session = ect_xport_session(t), .w = wr(src, &r, 4096, 2 * MiB)};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, race_main, &a), 0);
    while (atomic_load(&a.ok) < 3) usleep(1000);
    assert_int_equal(ect_xport_unregister(t, r.key), 0);
    memset(r.addr, 0, r.len);
    usleep(50000);
    atomic_store(&a.stop, 1);
    pthread_join(th, NULL);
    assert_true(all_zero(r.addr, r.len));
    assert_true(a.refused > 0);
    assert_int_equal(a.other, 0);
    free(src);
    test_region_close(NULL, &r);
    ect_xport_close(i);
    ect_xport_close(t);
}

static void t_bad_key_text(void **state) {
    const char *kind = kind_of(*state);
    ect_xport *t = open_kind(kind), *i = open_kind(kind);
    region r;
    test_region_open(t, MiB, &r);
    uint8_t src[16] = {1};
    ect_write w = wr(src, &r, 0, 16);
    w.dst_key = "not-a-key";
    int st = 0;
    assert_err(ect_xport_write_batch(i, ect_xport_session(t), &w, 1, &st), ECT_EINVAL, "dst_key");
    assert_int_equal(st, ECT_EINVAL);
    assert_true(all_zero(r.addr, 16));
    test_region_close(t, &r);
    ect_xport_close(i);
    ect_xport_close(t);
}

static void t_refused(void **state) {
    const char *kind = kind_of(*state);
    ect_xport *t = open_kind(kind), *i = open_kind(kind);
    char session[300];
    snprintf(session, sizeof session, "%s", ect_xport_session(t));
    ect_xport_close(t);
    uint8_t src[8] = {0};
    ect_write w = {.src = src, .dst_addr = 4096, .len = 8, .dst_key = "0123456789abcdef"};
    int st = 0;
    uint64_t t0 = ect_now_ms();
    assert_err(ect_xport_write_batch(i, session, &w, 1, &st), ECT_ECONNREFUSED, NULL);
    assert_int_equal(st, ECT_ECONNREFUSED);
    assert_true(ect_now_ms() - t0 < 5000);
    ect_xport_close(i);
}

static void t_restart(void **state) {
    const char *kind = kind_of(*state);
    ect_xport *t = open_kind(kind), *i = open_kind(kind);
    region r;
    test_region_open(t, MiB, &r);
    uint8_t src[4096];
    test_fill_pattern(src, sizeof src, 3);
    ect_write w = wr(src, &r, 0, sizeof src);
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), &w, 1, NULL), 0);
    char old[300];
    snprintf(old, sizeof old, "%s", ect_xport_session(t));
    test_region_close(t, &r);
    ect_xport_close(t);
    /* The cached connection to the old target is dead; the write fails fast. */
    int st = 0;
    int rc = ect_xport_write_batch(i, old, &w, 1, &st);
    assert_true(rc == ECT_ECONNREFUSED || rc == ECT_ECLOSED);
    assert_int_equal(st, rc);
    /* A new target (new session) works with the same initiator. */
    t = open_kind(kind);
    assert_string_not_equal(old, ect_xport_session(t));
    test_region_open(t, MiB, &r);
    w = wr(src, &r, 100, sizeof src);
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), &w, 1, NULL), 0);
    assert_memory_equal(r.addr + 100, src, sizeof src);
    test_region_close(t, &r);
    ect_xport_close(t);
    ect_xport_close(i);
}

/* The target is a forked child that is SIGKILLed while batches run. */
typedef struct target_info {
    char session[300];
    char key[ECT_XPORT_KEY_MAX];
    uint64_t addr;
} target_info;

static void child_target(const char *kind, int wfd) __attribute__((noreturn));
static void child_target(const char *kind, int wfd) {
    ect_xport *t = NULL;
    ect_xport_opts o;
    ect_xport_opts_init(&o);
    if (ect_xport_open(kind, &o, &t) != 0) _exit(3);
    int fd = memfd_create("child", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, 64 * MiB) != 0) _exit(4);
    void *a = mmap(NULL, 64 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    target_info ti = {0};
    if (a == MAP_FAILED || ect_xport_register(t, a, 64 * MiB, fd, 0, ti.key) != 0) _exit(5);
    snprintf(ti.session, sizeof ti.session, "%s", ect_xport_session(t));
    ti.addr = (uint64_t)(uintptr_t)a;
    if (write(wfd, &ti, sizeof ti) != (ssize_t)sizeof ti) _exit(6);
    for (;;) pause();
}

typedef struct killer {
    pid_t pid;
    int delay_ms;
} killer;

static void *killer_main(void *p) {
    killer *k = p;
    usleep((useconds_t)k->delay_ms * 1000);
    kill(k->pid, SIGKILL);
    return NULL;
}

static void t_killed(void **state) {
    const char *kind = kind_of(*state);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* exec, so the child starts clean (no inherited UCX or ASan state). */
        char fdarg[16];
        snprintf(fdarg, sizeof fdarg, "%d", pfd[1]);
        close(pfd[0]);
        execl("/proc/self/exe", "test_xport", "--child-target", kind, fdarg, (char *)NULL);
        _exit(7);
    }
    close(pfd[1]);
    target_info ti;
    assert_int_equal(read(pfd[0], &ti, sizeof ti), (ssize_t)sizeof ti);
    close(pfd[0]);
    ect_xport *i = open_kind(kind);
    size_t n = 32;
    uint8_t *src = malloc(2 * MiB);
    ect_write w[32];
    int st[32];
    for (size_t k = 0; k < n; k++)
        w[k] = (ect_write){
            .src = src, .dst_addr = ti.addr + k * 2 * MiB, .len = 2 * MiB, .dst_key = ti.key};
    assert_int_equal(ect_xport_write_batch(i, ti.session, w, n, st), 0);
    killer k = {.pid = pid, .delay_ms = 30};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, killer_main, &k), 0);
    uint64_t t0 = ect_now_ms();
    int rc = 0, rounds = 0;
    while (rc == 0 && ect_now_ms() - t0 < 8000) {
        rc = ect_xport_write_batch(i, ti.session, w, n, st);
        rounds++;
    }
    pthread_join(th, NULL);
    int ws;
    waitpid(pid, &ws, 0);
    assert_true(WIFSIGNALED(ws));
    if (rc != ECT_ECLOSED && rc != ECT_ECONNREFUSED)
        fail_msg("%s: expected a closed/refused error after the kill, got %d (%s) after %d rounds",
                 kind, rc, ect_last_error(), rounds);
    int failed = 0;
    for (size_t j = 0; j < n; j++) {
        assert_true(st[j] == 0 || st[j] == ECT_ECLOSED || st[j] == ECT_ECONNREFUSED);
        failed += st[j] != 0;
    }
    assert_true(failed > 0);
    /* Further writes fail fast, without hanging. */
    t0 = ect_now_ms();
    rc = ect_xport_write_batch(i, ti.session, w, 1, st);
    assert_true(rc == ECT_ECONNREFUSED || rc == ECT_ECLOSED);
    assert_true(ect_now_ms() - t0 < 3000);
    free(src);
    ect_xport_close(i);
}

static void t_args(void **state) {
    const char *kind = kind_of(*state);
    ect_xport *t = open_kind(kind);
    char key[ECT_XPORT_KEY_MAX];
    uint8_t buf[64];
    assert_err(ect_xport_register(t, NULL, 10, -1, 0, key), ECT_EINVAL, "addr");
    assert_err(ect_xport_register(t, buf, 0, -1, 0, key), ECT_EINVAL, "len");
    assert_err(ect_xport_unregister(t, "0000000000000000"), ECT_ENOTFOUND, "key");
    region r;
    test_region_open(t, MiB, &r);
    assert_err(ect_xport_register(t, r.addr + 10, 10, r.fd, 10, key), ECT_EEXIST, "overlaps");
    assert_err(ect_xport_register(t, buf, sizeof buf, r.fd, MiB - 10, key), ECT_ERANGE,
               "fd_offset");
    const char *other = strcmp(kind, "shm") == 0 ? "127.0.0.1:1" : "shm:@x";
    ect_write w = wr(buf, &r, 0, 1);
    assert_err(ect_xport_write_batch(t, other, &w, 1, NULL), ECT_EINVAL, "peer_session");
    w.src = NULL;
    assert_err(ect_xport_write_batch(t, ect_xport_session(t), &w, 1, NULL), ECT_EINVAL, "src");
    assert_int_equal(ect_xport_write_batch(t, ect_xport_session(t), NULL, 0, NULL), 0);
    assert_string_equal(ect_xport_kind(t), kind);
    test_region_close(t, &r);
    ect_xport_close(t);
}

/* ---- not per back end */

static void test_open_errors(void **state) {
    (void)state;
    ect_xport *x = (ect_xport *)1;
    assert_err(ect_xport_open("carrier-pigeon", NULL, &x), ECT_EINVAL, "kind");
    assert_null(x);
    ect_xport_opts o;
    ect_xport_opts_init(&o);
    o.listen = "nohostport";
    assert_err(ect_xport_open("tcp", &o, &x), ECT_EINVAL, "opts.listen");
    ect_xport_opts_init(&o);
    o.conns_per_peer = 0;
    assert_err(ect_xport_open("tcp", &o, &x), ECT_EINVAL, "conns_per_peer");
    ect_xport_opts_init(&o);
    o.io_timeout_ms = 0;
    assert_err(ect_xport_open("shm", &o, &x), ECT_EINVAL, "io_timeout_ms");
#if !ECT_HAVE_UCX
    assert_err(ect_xport_open("ucx", NULL, &x), ECT_ENOTSUP, "ucx");
#endif
    assert_int_equal(ect_xport_open("shm", NULL, &x), 0);
    char key[ECT_XPORT_KEY_MAX];
    uint8_t buf[64];
    assert_err(ect_xport_register(x, buf, sizeof buf, -1, 0, key), ECT_ENOTSUP, "fd");
    assert_int_equal(strncmp(ect_xport_session(x), "shm:@", 5), 0);
    ect_xport_close(x);
    ect_xport_close(NULL);
}

static int raw_connect(const char *session) {
    char host[256];
    int port, fd;
    assert_int_equal(xp_parse_hostport("s", session, host, sizeof host, &port), 0);
    assert_int_equal(xp_tcp_connect(host, port, 2000, &fd), 0);
    return fd;
}

static void raw_hello(int fd) {
    uint8_t h[TCP_HELLO_LEN];
    tcp_encode_hello(h, TCP_ROLE_INITIATOR);
    assert_int_equal(xp_send_all(fd, h, sizeof h, 2000), 0);
    assert_int_equal(xp_recv_all(fd, h, sizeof h, 2000), 0);
    assert_int_equal(tcp_decode_hello(h, TCP_ROLE_TARGET), 0);
}

/* Garbage, a bad version and a bad frame each cost only their connection. */
static void test_tcp_garbage(void **state) {
    (void)state;
    ect_xport *t = open_kind("tcp"), *i = open_kind("tcp");
    region r;
    test_region_open(t, MiB, &r);
    uint64_t rs = 9;
    for (int round = 0; round < 20; round++) {
        int fd = raw_connect(ect_xport_session(t));
        if (round % 2) raw_hello(fd);
        uint8_t junk[512];
        for (size_t k = 0; k < sizeof junk; k++) junk[k] = (uint8_t)test_rand(&rs);
        if (round == 3) { /* a valid header that points at our region, with a wrong key */
            tcp_encode_write(junk, 1, (uint64_t)(uintptr_t)r.addr, 100, 1);
        }
        xp_send_all(fd, junk, sizeof junk, 2000);
        close(fd);
    }
    /* Bad version: the target answers its own hello and closes. */
    int fd = raw_connect(ect_xport_session(t));
    uint8_t h[TCP_HELLO_LEN];
    tcp_encode_hello(h, TCP_ROLE_INITIATOR);
    h[4] = 9;
    assert_int_equal(xp_send_all(fd, h, sizeof h, 2000), 0);
    assert_int_equal(xp_recv_all(fd, h, sizeof h, 2000), 0);
    assert_int_equal(tcp_decode_hello(h, TCP_ROLE_TARGET), 0);
    assert_int_equal(xp_recv_all(fd, h, 1, 2000), ECT_ECLOSED);
    close(fd);
    assert_true(all_zero(r.addr, r.len));
    uint8_t src[100];
    test_fill_pattern(src, sizeof src, 5);
    ect_write w = wr(src, &r, 0, sizeof src);
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), &w, 1, NULL), 0);
    assert_memory_equal(r.addr, src, sizeof src);
    test_region_close(t, &r);
    ect_xport_close(i);
    ect_xport_close(t);
}

typedef struct unreg_arg {
    ect_xport *t;
    const char *key;
    atomic_int done;
} unreg_arg;

static void *unreg_main(void *p) {
    unreg_arg *a = p;
    assert_int_equal(ect_xport_unregister(a->t, a->key), 0);
    atomic_store(&a->done, 1);
    return NULL;
}

/* Unregister waits while a write into the region is half received. */
static void test_tcp_unregister_waits(void **state) {
    (void)state;
    ect_xport *t = open_kind("tcp");
    region r;
    test_region_open(t, MiB, &r);
    int fd = raw_connect(ect_xport_session(t));
    raw_hello(fd);
    uint64_t token;
    assert_int_equal(xp_key_parse(r.key, &token), 0);
    uint8_t hdr[TCP_HDR_LEN], half[1000] = {0};
    tcp_encode_write(hdr, 77, (uint64_t)(uintptr_t)r.addr, 2000, token);
    assert_int_equal(xp_send_all(fd, hdr, sizeof hdr, 2000), 0);
    assert_int_equal(xp_send_all(fd, half, sizeof half, 2000), 0);
    /* the target took it: unregister must meet the write in progress (a
     * 50 ms sleep here let a descheduled target take it after unregister) */
    while (!xp_range_busy(t, r.addr, 2000)) usleep(1000);
    unreg_arg a = {.t = t, .key = r.key};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, unreg_main, &a), 0);
    usleep(150000);
    assert_int_equal(atomic_load(&a.done), 0);
    /* Finishing the payload lets unregister return; the ack says success. */
    assert_int_equal(xp_send_all(fd, half, sizeof half, 2000), 0);
    uint8_t ack[TCP_ACK_LEN];
    assert_int_equal(xp_recv_all(fd, ack, sizeof ack, 2000), 0);
    uint64_t id;
    int32_t s;
    assert_int_equal(tcp_decode_ack(ack, &id, &s), 0);
    assert_int_equal(id, 77);
    assert_int_equal(s, 0);
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&a.done), 1);
    /* Now the region is gone: the same write is refused, payload consumed. */
    assert_int_equal(xp_send_all(fd, hdr, sizeof hdr, 2000), 0);
    assert_int_equal(xp_send_all(fd, half, sizeof half, 2000), 0);
    assert_int_equal(xp_send_all(fd, half, sizeof half, 2000), 0);
    assert_int_equal(xp_recv_all(fd, ack, sizeof ack, 2000), 0);
    assert_int_equal(tcp_decode_ack(ack, &id, &s), 0);
    assert_int_equal(s, ECT_ENOTFOUND);
    close(fd);
    test_region_close(NULL, &r);
    ect_xport_close(t);
}

/* Write windows (docs/PROTOCOL.md "Write windows"): a private region
 * refuses its own key; a window's key writes only inside the window; closing
 * a window never waits, a write it accepted finishes landing (the range
 * stays busy until then), and later writes with its key are refused. */
static void test_tcp_window(void **state) {
    (void)state;
    ect_xport *t = open_kind("tcp");
    region r;
    private_region_open(t, MiB, &r);
    char wk[ECT_XPORT_KEY_MAX], wk2[ECT_XPORT_KEY_MAX];
    assert_int_equal(xp_window_open(t, r.key, 4096, 2000, wk), 0);
    assert_err(xp_window_open(t, r.key, 5000, 10, wk2), ECT_EEXIST, "overlaps");
    assert_err(xp_window_open(t, r.key, MiB - 10, 11, wk2), ECT_ERANGE, "outside");
    assert_err(xp_window_open(t, "0000000000000001", 0, 10, wk2), ECT_ENOTFOUND, NULL);
    assert_string_not_equal(wk, r.key);
    uint64_t rtok, wtok;
    assert_int_equal(xp_key_parse(r.key, &rtok), 0);
    assert_int_equal(xp_key_parse(wk, &wtok), 0);
    uint64_t base = (uint64_t)(uintptr_t)r.addr;
    int fd = raw_connect(ect_xport_session(t));
    raw_hello(fd);
    uint8_t hdr[TCP_HDR_LEN], half[1000], ack[TCP_ACK_LEN];
    test_fill_pattern(half, sizeof half, 3);
    uint64_t id;
    int32_t s;
    /* The region's own key: refused (private), payload consumed. */
    tcp_encode_write(hdr, 1, base + 4096, 16, rtok);
    assert_int_equal(xp_send_all(fd, hdr, sizeof hdr, 2000), 0);
    assert_int_equal(xp_send_all(fd, half, 16, 2000), 0);
    assert_int_equal(xp_recv_all(fd, ack, sizeof ack, 2000), 0);
    assert_int_equal(tcp_decode_ack(ack, &id, &s), 0);
    assert_int_equal(s, ECT_EACCES);
    /* The window's key, running one byte past the window: refused. */
    tcp_encode_write(hdr, 2, base + 4096 + 1999, 2, wtok);
    assert_int_equal(xp_send_all(fd, hdr, sizeof hdr, 2000), 0);
    assert_int_equal(xp_send_all(fd, half, 2, 2000), 0);
    assert_int_equal(xp_recv_all(fd, ack, sizeof ack, 2000), 0);
    assert_int_equal(tcp_decode_ack(ack, &id, &s), 0);
    assert_int_equal(s, ECT_EACCES);
    /* The window's key elsewhere in the pool: refused. */
    tcp_encode_write(hdr, 5, base, 2, wtok);
    assert_int_equal(xp_send_all(fd, hdr, sizeof hdr, 2000), 0);
    assert_int_equal(xp_send_all(fd, half, 2, 2000), 0);
    assert_int_equal(xp_recv_all(fd, ack, sizeof ack, 2000), 0);
    assert_int_equal(tcp_decode_ack(ack, &id, &s), 0);
    assert_int_equal(s, ECT_EACCES);
    /* Half a write into the window, then close it. */
    tcp_encode_write(hdr, 3, base + 4096, 2000, wtok);
    assert_int_equal(xp_send_all(fd, hdr, sizeof hdr, 2000), 0);
    assert_int_equal(xp_send_all(fd, half, sizeof half, 2000), 0);
    while (!xp_range_busy(t, r.addr + 4096, 2000)) usleep(1000); /* the target took it */
    assert_int_equal(xp_window_close(t, wk), 0);                 /* never waits */
    assert_true(xp_range_busy(t, r.addr + 4096, 2000));
    assert_err(xp_window_close(t, wk), ECT_ENOTFOUND, NULL);
    assert_int_equal(xp_send_all(fd, half, sizeof half, 2000), 0);
    assert_int_equal(xp_recv_all(fd, ack, sizeof ack, 2000), 0);
    assert_int_equal(tcp_decode_ack(ack, &id, &s), 0);
    assert_int_equal(id, 3);
    assert_int_equal(s, 0); /* accepted while open: it lands */
    assert_memory_equal(r.addr + 4096, half, sizeof half);
    assert_memory_equal(r.addr + 4096 + 1000, half, sizeof half);
    while (xp_range_busy(t, r.addr + 4096, 2000)) usleep(1000);
    /* The closed window's key: refused, bytes unchanged. */
    uint8_t zero[1000] = {0};
    tcp_encode_write(hdr, 4, base + 4096, 1000, wtok);
    assert_int_equal(xp_send_all(fd, hdr, sizeof hdr, 2000), 0);
    assert_int_equal(xp_send_all(fd, zero, sizeof zero, 2000), 0);
    assert_int_equal(xp_recv_all(fd, ack, sizeof ack, 2000), 0);
    assert_int_equal(tcp_decode_ack(ack, &id, &s), 0);
    assert_int_equal(s, ECT_EACCES);
    assert_memory_equal(r.addr + 4096, half, sizeof half);
    assert_int_equal(xp_refused(t), 4);
    close(fd);
    /* A window left open goes with its region. */
    assert_int_equal(xp_window_open(t, r.key, 0, 100, wk2), 0);
    test_region_close(t, &r);
    ect_xport_close(t);
}

/* Window overlap (xp_window_open keeps each region's open windows in
 * address order and checks only the neighbours of a new one's place):
 * random opens and closes over two regions, each open's outcome checked
 * against a walk of every window still open. Ranges touching end to end are
 * accepted, any shared byte refused, the same offsets on the other region
 * are independent, a closed window frees its range, and every key is
 * distinct and not the region's. */
/* xp_window_close_many: the named windows close under one lock (their
 * ranges free again, their keys refused by a second close), the others stay
 * open, and unknown or NULL keys are counted and skipped. */
static void test_window_close_many(void **state) {
    (void)state;
    ect_xport *t = open_kind("tcp");
    region r;
    private_region_open(t, 64 * 1024, &r);
    char k[5][ECT_XPORT_KEY_MAX], again[ECT_XPORT_KEY_MAX];
    for (int i = 0; i < 5; i++)
        assert_int_equal(xp_window_open(t, r.key, 4096u * (unsigned)i, 4096, k[i]), 0);
    const char *some[] = {k[0], "0123456789abcdef", k[2], NULL, k[4]};
    assert_int_equal(xp_window_close_many(t, some, 5), 2);
    assert_int_equal(xp_window_close_many(t, some, 5), 5); /* all gone now */
    assert_int_equal(xp_window_close_many(t, some, 0), 0);
    for (int i = 0; i < 5; i++) {
        int rc = xp_window_open(t, r.key, 4096u * (unsigned)i, 4096, again);
        if (i % 2 == 0) {
            assert_int_equal(rc, 0); /* its range is free again */
            assert_int_equal(xp_window_close(t, again), 0);
        } else {
            assert_int_equal(rc, ECT_EEXIST); /* still open */
            assert_int_equal(xp_window_close(t, k[i]), 0);
        }
    }
    test_region_close(t, &r);
    ect_xport_close(t);
}

/* Closed windows' entries are reused (xp_windows_allocated): three rounds
 * of 80 one-page windows opened and closed in one close_many allocate 80
 * entries in all (nothing writes them: a window still being written is
 * freed by its last write's release, whenever that comes). Then three rounds
 * written through the initiator: a reused entry's new key is not its old
 * one, the old key is refused, and the bytes land. Over tcp and shm (whose
 * slots the windows take and give back). */
#define REUSE_WINS 80
static void reuse_round(ect_xport *t, const region *r, char keys[][ECT_XPORT_KEY_MAX],
                        char prev[][ECT_XPORT_KEY_MAX]) {
    for (int k = 0; k < REUSE_WINS; k++) {
        assert_int_equal(xp_window_open(t, r->key, (uint64_t)k * 4096, 4096, keys[k]), 0);
        if (prev) assert_string_not_equal(keys[k], prev[k]);
    }
}

static void reuse_close(ect_xport *t, char keys[][ECT_XPORT_KEY_MAX]) {
    const char *names[REUSE_WINS];
    for (int k = 0; k < REUSE_WINS; k++) names[k] = keys[k];
    assert_int_equal(xp_window_close_many(t, names, REUSE_WINS), 0);
}

static void window_entries_reused(const char *kind) {
    ect_xport *t = open_kind(kind), *i = open_kind(kind);
    region r;
    private_region_open(t, REUSE_WINS * 4096, &r);
    uint64_t base = (uint64_t)(uintptr_t)r.addr;
    static uint8_t src[REUSE_WINS * 4096];
    static char keys[6][REUSE_WINS][ECT_XPORT_KEY_MAX];
    ect_write w[REUSE_WINS];
    int st[REUSE_WINS];
    for (int round = 0; round < 6; round++) {
        reuse_round(t, &r, keys[round], round ? keys[round - 1] : NULL);
        if (round < 3) {
            reuse_close(t, keys[round]);
            assert_int_equal(xp_windows_allocated(t), REUSE_WINS);
            continue;
        }
        test_fill_pattern(src, sizeof src, (uint64_t)round);
        for (int k = 0; k < REUSE_WINS; k++)
            w[k] = (ect_write){src + (size_t)k * 4096, base + (uint64_t)k * 4096, 4096,
                               keys[round][k]};
        assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), w, REUSE_WINS, st), 0);
        assert_memory_equal(r.addr, src, sizeof src);
        ect_write old = {src, base, 64, keys[round - 1][0]}; /* on its own page: refused */
        int ost;
        assert_int_not_equal(ect_xport_write_batch(i, ect_xport_session(t), &old, 1, &ost), 0);
        reuse_close(t, keys[round]);
    }
    test_region_close(t, &r);
    ect_xport_close(i);
    ect_xport_close(t);
}

static void test_window_entries_reused(void **state) {
    (void)state;
    window_entries_reused("tcp");
    window_entries_reused("shm");
}

#define OV_SLOTS 64
typedef struct ov_win {
    int reg; /* -1: closed */
    uint64_t off, len;
    char key[ECT_XPORT_KEY_MAX];
} ov_win;

static bool ov_overlaps(const ov_win *w, int reg, uint64_t off, uint64_t len) {
    for (int k = 0; k < OV_SLOTS; k++)
        if (w[k].reg == reg && w[k].off < off + len && off < w[k].off + w[k].len) return true;
    return false;
}

static void test_window_overlap_model(void **state) {
    (void)state;
    ect_xport *t = open_kind("tcp");
    region r[2];
    private_region_open(t, 64 * 1024, &r[0]);
    private_region_open(t, 64 * 1024, &r[1]);
    ov_win w[OV_SLOTS];
    for (int k = 0; k < OV_SLOTS; k++) w[k].reg = -1;
    uint64_t seed = 0x13c71ull;
    int opened = 0, refused = 0, touching = 0;
    for (int step = 0; step < 20000; step++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t rnd = (uint32_t)(seed >> 33);
        int k = (int)(rnd % OV_SLOTS);
        if (w[k].reg >= 0) { /* close it */
            assert_int_equal(xp_window_close(t, w[k].key), 0);
            w[k].reg = -1;
            continue;
        }
        int reg = (int)((rnd >> 8) & 1);
        uint64_t off = ((rnd >> 9) % 1024) * 64, len = 64 * (1 + ((rnd >> 19) % 16));
        if (off + len > 64 * 1024) len = 64 * 1024 - off;
        bool want_refused = ov_overlaps(w, reg, off, len);
        touching += !want_refused && (ov_overlaps(w, reg, off ? off - 1 : 0, 1) ||
                                      ov_overlaps(w, reg, off + len, 1));
        char key[ECT_XPORT_KEY_MAX];
        int rc = xp_window_open(t, r[reg].key, off, len, key);
        if (want_refused) {
            assert_int_equal(rc, ECT_EEXIST);
            refused++;
            continue;
        }
        assert_int_equal(rc, 0);
        assert_string_not_equal(key, r[0].key);
        assert_string_not_equal(key, r[1].key);
        for (int j = 0; j < OV_SLOTS; j++)
            if (w[j].reg >= 0) assert_string_not_equal(key, w[j].key);
        w[k] = (ov_win){.reg = reg, .off = off, .len = len};
        strcpy(w[k].key, key);
        opened++;
    }
    assert_true(opened > 1000 && refused > 1000 && touching > 100); /* each case ran */
    for (int k = 0; k < OV_SLOTS; k++)
        if (w[k].reg == 0) assert_int_equal(xp_window_close(t, w[k].key), 0);
    test_region_close(t, &r[0]); /* region 1 goes with its windows still open */
    test_region_close(t, &r[1]);
    ect_xport_close(t);
}

#if ECT_HAVE_UCX && !XP_TSAN
/* ucx windows (docs/PROTOCOL.md "Write windows"): a window is its own
 * ucp_mem_map of exactly its bytes with its own packed rkey, so its key
 * names the window's address and length (not the pool's); a write through it
 * inside the window lands, one outside is refused by the initiator before
 * any put (ECT_EACCES before the window, ECT_ERANGE across its end), and a
 * closed window's key is found no more on the target. The pool key itself
 * still works on the initiator (ucx puts are one-sided: the target cannot
 * refuse it; the consumers simply never hand it out). */
static uint64_t hex_u64(const char *s) { /* 16 hex digits of a little-endian u64 */
    uint64_t v = 0;
    for (int k = 0; k < 16; k++) {
        char c = s[k];
        uint64_t d = (uint64_t)(c <= '9' ? c - '0' : c - 'a' + 10);
        v |= d << (8 * (k / 2) + (k % 2 ? 0 : 4));
    }
    return v;
}

static void t_ucx_window(void **state) {
    const char *kind = kind_of(*state);
    ect_xport *t = open_kind(kind), *i = open_kind(kind);
    region r;
    private_region_open(t, MiB, &r); /* found by its ucx key */
    char wk[ECT_XPORT_KEY_MAX], wk2[ECT_XPORT_KEY_MAX];
    assert_int_equal(xp_window_open(t, r.key, 4096, 2000, wk), 0);
    assert_err(xp_window_open(t, r.key, 5000, 10, wk2), ECT_EEXIST, "overlaps");
    assert_err(xp_window_open(t, r.key, MiB - 10, 11, wk2), ECT_ERANGE, "outside");
    assert_string_not_equal(wk, r.key);
    assert_true(strlen(wk) > 32);
    /* The key carries the window's own range, not the pool's. */
    assert_true(hex_u64(wk) == (uint64_t)(uintptr_t)(r.addr + 4096));
    assert_true(hex_u64(wk + 16) == 2000);
    assert_true(hex_u64(r.key + 16) == MiB);

    uint8_t src[2000];
    test_fill_pattern(src, sizeof src, 7);
    const char *sess = ect_xport_session(t);
    /* Inside the window: lands. */
    ect_write w = wr(src, &r, 4096, 2000);
    w.dst_key = wk;
    int st = 99;
    assert_int_equal(ect_xport_write_batch(i, sess, &w, 1, &st), 0);
    assert_int_equal(st, 0);
    assert_memory_equal(r.addr + 4096, src, sizeof src);
    /* One byte across the window's end: refused, nothing written. */
    w = wr(src, &r, 4096 + 2000, 1);
    w.dst_key = wk;
    assert_int_equal(ect_xport_write_batch(i, sess, &w, 1, &st), ECT_EACCES);
    assert_int_equal(st, ECT_EACCES);
    w = wr(src, &r, 4096 + 1999, 2);
    w.dst_key = wk;
    assert_int_equal(ect_xport_write_batch(i, sess, &w, 1, &st), ECT_ERANGE);
    assert_int_equal(st, ECT_ERANGE);
    assert_int_equal(r.addr[4096 + 2000], 0);
    /* Elsewhere in the pool through the window's key: refused. */
    w = wr(src, &r, 0, 100);
    w.dst_key = wk;
    assert_int_equal(ect_xport_write_batch(i, sess, &w, 1, &st), ECT_EACCES);
    assert_int_equal(st, ECT_EACCES);
    assert_true(all_zero(r.addr, 4096));

    /* A second window: its own key, lands in its own range. */
    assert_int_equal(xp_window_open(t, r.key, 8192, 100, wk2), 0);
    assert_string_not_equal(wk2, wk);
    w = wr(src, &r, 8192, 100);
    w.dst_key = wk2;
    assert_int_equal(ect_xport_write_batch(i, sess, &w, 1, &st), 0);
    assert_memory_equal(r.addr + 8192, src, 100);

    /* Closed: the target no longer finds the window's key. */
    assert_int_equal(xp_window_close(t, wk), 0);
    assert_err(xp_window_close(t, wk), ECT_ENOTFOUND, NULL);
    assert_err(ect_xport_unregister(t, wk), ECT_ENOTFOUND, NULL);
    /* The range can be opened again, with a new registration (over UCX's tcp
     * and sm transports its packed rkey may equal the closed one's: they
     * carry no per-registration secret; RDMA hardware's do), and it works. */
    char wk3[ECT_XPORT_KEY_MAX];
    assert_int_equal(xp_window_open(t, r.key, 4096, 2000, wk3), 0);
    test_fill_pattern(src, sizeof src, 8);
    w = wr(src, &r, 4096, 2000);
    w.dst_key = wk3;
    assert_int_equal(ect_xport_write_batch(i, sess, &w, 1, &st), 0);
    assert_memory_equal(r.addr + 4096, src, sizeof src);
    assert_int_equal(xp_window_close(t, wk3), 0);
    assert_err(ect_xport_unregister(t, wk3), ECT_ENOTFOUND, NULL);
    /* More windows than the initiator caches rkeys for (each reservation
     * brings a new key; the oldest unpacked ones are dropped): all land. */
    for (size_t k = 0; k < 300; k++) {
        size_t off = 65536 + k * 1024;
        assert_int_equal(xp_window_open(t, r.key, off, 1024, wk3), 0);
        w = wr(src, &r, off, 1024);
        w.dst_key = wk3;
        assert_int_equal(ect_xport_write_batch(i, sess, &w, 1, &st), 0);
        assert_memory_equal(r.addr + off, src, 1024);
        assert_int_equal(xp_window_close(t, wk3), 0);
    }
    /* A window left open (wk2) goes with its region. */
    test_region_close(t, &r);
    ect_xport_close(i);
    ect_xport_close(t);
}
#endif

/* This process's mappings of the test regions' memfds (testutil) smaller than `below` bytes
 * (the shm initiator's window mappings; the regions' own are larger) whose permissions are
 * `perms` ("rw-s": live, "---s": parked): how many, the address and size of the last one,
 * their total size. */
typedef struct maps_seen {
    int n;
    uint8_t *addr;
    size_t size, total;
} maps_seen;

static maps_seen window_maps(const char *perms, size_t below) {
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[512], p[8];
    maps_seen m = {0};
    while (fgets(line, sizeof line, f)) {
        unsigned long long a, b;
        if (!strstr(line, "memfd:ect-test-region") ||
            sscanf(line, "%llx-%llx %7s", &a, &b, p) != 3 || strcmp(p, perms) != 0)
            continue;
        if (b - a < below) {
            m.n++;
            m.addr = (uint8_t *)(uintptr_t)a;
            m.size = (size_t)(b - a);
            m.total += m.size;
        }
    }
    fclose(f);
    return m;
}

/* The initiator's writable window mappings below `below` bytes: how many, the last one's size. */
static int small_maps(size_t below, size_t *size) {
    maps_seen m = window_maps("rw-s", below);
    *size = m.size;
    return m.n;
}

/* The parked (PROT_NONE) ones. */
static maps_seen parked_maps(size_t below) { return window_maps("---s", below); }

/* shm: a new window on the pages of a closed one (the pool reuses ranges)
 * takes over the closed window's mapping instead of mapping afresh; what
 * the initiator maps is still only the pages that cover the live window
 * (a smaller window trims it), the bytes land, and the closed window's key
 * is refused. */
static void test_shm_window_reuse(void **state) {
    (void)state;
    ect_xport *t = open_kind("shm"), *i = open_kind("shm");
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), sz;
    region r;
    private_region_open(t, 64 * pg, &r);
    const char *ses = ect_xport_session(t);
    uint64_t base = (uint64_t)(uintptr_t)r.addr;
    static uint8_t src[16 * 4096];
    int st;
    char ka[ECT_XPORT_KEY_MAX], kb[ECT_XPORT_KEY_MAX], kc[ECT_XPORT_KEY_MAX];
    /* A: 4 pages and 100 bytes from page 2 (5 pages mapped). */
    size_t alen = 4 * pg + 100;
    assert_int_equal(xp_window_open(t, r.key, 2 * pg, alen, ka), 0);
    test_fill_pattern(src, alen, 1);
    ect_write w = {src, base + 2 * pg, alen, ka};
    assert_int_equal(ect_xport_write_batch(i, ses, &w, 1, &st), 0);
    assert_memory_equal(r.addr + 2 * pg, src, alen);
    assert_int_equal(small_maps(64 * pg, &sz), 1);
    assert_int_equal(sz, 5 * pg);
    /* B: one page inside A's, after A closed. */
    assert_int_equal(xp_window_close(t, ka), 0);
    assert_int_equal(xp_window_open(t, r.key, 3 * pg, pg, kb), 0);
    test_fill_pattern(src, pg, 2);
    w = (ect_write){src, base + 3 * pg, pg, kb};
    assert_int_equal(ect_xport_write_batch(i, ses, &w, 1, &st), 0);
    assert_memory_equal(r.addr + 3 * pg, src, pg);
    assert_int_equal(small_maps(64 * pg, &sz), 1); /* A's pages beyond B's are gone */
    assert_int_equal(sz, pg);
    /* A's key (closed) on A's first page, and B's key past B: refused, nothing lands. */
    uint8_t before[64];
    memcpy(before, r.addr + 2 * pg, sizeof before);
    w = (ect_write){src, base + 2 * pg, sizeof before, ka};
    assert_err(ect_xport_write_batch(i, ses, &w, 1, &st), ECT_EACCES, NULL);
    w = (ect_write){src, base + 4 * pg - 1, 2, kb};
    assert_err(ect_xport_write_batch(i, ses, &w, 1, &st), ECT_EACCES, NULL);
    assert_memory_equal(r.addr + 2 * pg, before, sizeof before);
    /* C: larger than B, on B's page and the next 8: mapped afresh, B's unmapped. */
    assert_int_equal(xp_window_close(t, kb), 0);
    assert_int_equal(xp_window_open(t, r.key, 3 * pg, 9 * pg, kc), 0);
    test_fill_pattern(src, 9 * pg, 3);
    w = (ect_write){src, base + 3 * pg, 9 * pg, kc};
    assert_int_equal(ect_xport_write_batch(i, ses, &w, 1, &st), 0);
    assert_memory_equal(r.addr + 3 * pg, src, 9 * pg);
    assert_int_equal(small_maps(64 * pg, &sz), 1);
    assert_int_equal(sz, 9 * pg);
    assert_int_equal(parked_maps(64 * pg).n, 1); /* B's, no longer writable */
    assert_int_equal(parked_maps(64 * pg).size, pg);
    assert_int_equal(xp_window_close(t, kc), 0);
    test_region_close(t, &r);
    ect_xport_close(i);
    ect_xport_close(t);
}

/* How many of this process's fds are the memory file with inode ino. */
static int fds_of(uint64_t ino) {
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        if (e->d_name[0] == '.' || fstatat(dirfd(d), e->d_name, &st, 0) != 0) continue;
        n += (uint64_t)st.st_ino == ino && S_ISREG(st.st_mode);
    }
    closedir(d);
    return n;
}

/* A raw shm initiator: HELLO with `flags`, the reply (its control segment
 * fd closed); returns the socket. */
static int shm_raw_hello(const char *session, uint16_t flags) {
    struct sockaddr_un sa;
    socklen_t sl;
    assert_int_equal(shm_make_addr(session + 5, &sa, &sl), 0); /* "shm:@NAME" */
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sl), 0);
    uint8_t b[SHM_HELLO_REPLY_LEN];
    shm_hello_encode(b);
    xp_put_u16(b + 6, flags);
    assert_int_equal(shm_msg_send(fd, b, SHM_HELLO_LEN, NULL, 0, 10000), 0);
    shm_set_timeouts(fd, 60000);
    size_t len;
    int seg = -1, nf = 0;
    assert_int_equal(shm_msg_recv(fd, b, sizeof b, &len, &seg, 1, &nf, false, 60000), 0);
    assert_int_equal(shm_hello_reply_decode(b, len), 0);
    assert_int_equal(nf, 1);
    close(seg);
    return fd;
}

/* One BEGIN of one write and its GRANT's entry and drops (up to `max` in
 * drops, their count in *ndrop; drops NULL: not read); the fds that came
 * with it closed (their count in *nfds), DONE sent. */
static void shm_raw_grant_drops(int fd, uint64_t addr, uint64_t len, const char *key,
                                shm_grant_entry *e, int *nfds, uint8_t *buf, uint64_t *drops,
                                uint32_t max, uint32_t *ndrop) {
    shm_begin_entry be = {addr, len, 0};
    assert_int_equal(xp_key_parse(key, &be.token), 0);
    size_t n = shm_begin_encode(buf, &be, 1), glen;
    assert_int_equal(shm_msg_send(fd, buf, n, NULL, 0, 10000), 0);
    int fds[SHM_CHUNK];
    assert_int_equal(
        shm_msg_recv(fd, buf, SHM_GRANT_MAX, &glen, fds, SHM_CHUNK, nfds, false, 60000), 0);
    for (int k = 0; k < *nfds; k++) close(fds[k]);
    shm_grant g;
    uint32_t seen = 0;
    assert_int_equal(shm_grant_decode(buf, glen, 1, *nfds, &g), 0);
    shm_grant_entry_get(buf, &g, 0, &seen, e);
    if (drops) {
        assert_true(g.ndrop <= max);
        for (uint32_t k = 0; k < g.ndrop; k++) drops[k] = xp_get_u64(g.drops + 8 * (size_t)k);
        *ndrop = g.ndrop;
    }
    uint8_t d[SHM_DONE_LEN];
    shm_done_encode(d, 1);
    assert_int_equal(shm_msg_send(fd, d, SHM_DONE_LEN, NULL, 0, 10000), 0);
}

static void shm_raw_grant(int fd, uint64_t addr, uint64_t len, const char *key, shm_grant_entry *e,
                          int *nfds, uint8_t *buf) {
    shm_raw_grant_drops(fd, addr, len, key, e, nfds, buf, NULL, 0, NULL);
}

/* shm drops from the regions' gone log: a GRANT lists exactly the windows
 * this connection was given and that closed since, without a walk of every
 * region open (shm_target_drop_walks stays 0); a connection that fell more
 * than XP_GONE_LOG closes behind gets its drops by one walk, then reads the
 * log again. */
static void test_shm_drops_from_log(void **state) {
    (void)state;
    ect_xport *t = open_kind("shm");
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    region r;
    private_region_open(t, 8 * pg, &r);
    uint64_t base = (uint64_t)(uintptr_t)r.addr;
    char k[6][ECT_XPORT_KEY_MAX], other[ECT_XPORT_KEY_MAX];
    uint8_t *buf = malloc(SHM_GRANT_MAX);
    assert_non_null(buf);
    int fd = shm_raw_hello(ect_xport_session(t), 0), nf;
    shm_grant_entry e[6];
    uint64_t drops[SHM_MAX_DROP];
    uint32_t nd = 99;
    for (int i = 0; i < 3; i++) { /* A, B, C given */
        assert_int_equal(xp_window_open(t, r.key, (uint64_t)i * pg, pg, k[i]), 0);
        shm_raw_grant_drops(fd, base + i * pg, pg, k[i], &e[i], &nf, buf, drops, SHM_MAX_DROP, &nd);
        assert_int_equal(e[i].status, 0);
        assert_int_equal(nd, 0);
    }
    assert_int_equal(xp_window_close(t, k[0]), 0);
    assert_int_equal(xp_window_close(t, k[2]), 0);
    assert_int_equal(xp_window_open(t, r.key, 3 * pg, pg, k[3]), 0);
    shm_raw_grant_drops(fd, base + 3 * pg, pg, k[3], &e[3], &nf, buf, drops, SHM_MAX_DROP, &nd);
    assert_int_equal(nd, 2); /* A and C, nothing else */
    assert_true((drops[0] == e[0].rid && drops[1] == e[2].rid) ||
                (drops[0] == e[2].rid && drops[1] == e[0].rid));
    assert_int_equal(shm_target_drop_walks(t), 0);
    /* More than the log holds closes, never given to this connection. */
    for (int i = 0; i <= XP_GONE_LOG; i++) {
        assert_int_equal(xp_window_open(t, r.key, 5 * pg, pg, other), 0);
        assert_int_equal(xp_window_close(t, other), 0);
    }
    assert_int_equal(xp_window_close(t, k[1]), 0);
    assert_int_equal(xp_window_open(t, r.key, 4 * pg, pg, k[4]), 0);
    shm_raw_grant_drops(fd, base + 4 * pg, pg, k[4], &e[4], &nf, buf, drops, SHM_MAX_DROP, &nd);
    assert_int_equal(nd, 1);
    assert_true(drops[0] == e[1].rid); /* B */
    assert_int_equal(shm_target_drop_walks(t), 1);
    assert_int_equal(xp_window_close(t, k[3]), 0); /* D: from the log again */
    assert_int_equal(xp_window_open(t, r.key, 0, pg, k[5]), 0);
    shm_raw_grant_drops(fd, base, pg, k[5], &e[5], &nf, buf, drops, SHM_MAX_DROP, &nd);
    assert_int_equal(nd, 1);
    assert_true(drops[0] == e[3].rid);
    assert_int_equal(shm_target_drop_walks(t), 1);
    assert_int_equal(xp_window_close(t, k[4]), 0);
    assert_int_equal(xp_window_close(t, k[5]), 0);
    close(fd);
    free(buf);
    test_region_close(t, &r);
    ect_xport_close(t);
}

/* shm slots, next fit: a window takes the slot after the one taken last,
 * not the first free one, so a shard with many windows open finds a free
 * slot in one probe (windows close about in the order they opened). A
 * closed window's slot is taken again once the search wraps round to it. */
static void test_shm_slots_next_fit(void **state) {
    (void)state;
    ect_xport *t = open_kind("shm");
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    region r;
    private_region_open(t, 8 * pg, &r);
    uint64_t base = (uint64_t)(uintptr_t)r.addr;
    char k[3][ECT_XPORT_KEY_MAX];
    uint8_t *buf = malloc(SHM_GRANT_MAX);
    assert_non_null(buf);
    int fd = shm_raw_hello(ect_xport_session(t), 0), nf;
    shm_grant_entry e[3];
    assert_int_equal(xp_window_open(t, r.key, 0, pg, k[0]), 0);
    assert_int_equal(xp_window_open(t, r.key, pg, pg, k[1]), 0);
    shm_raw_grant(fd, base, pg, k[0], &e[0], &nf, buf);
    shm_raw_grant(fd, base + pg, pg, k[1], &e[1], &nf, buf);
    /* The target answered the second BEGIN after the first DONE: nothing
     * writes k[0] now, so its close frees its slot at once. */
    assert_int_equal(e[1].slot, e[0].slot + 1);
    assert_int_equal(xp_window_close(t, k[0]), 0);
    assert_int_equal(xp_window_open(t, r.key, 2 * pg, pg, k[2]), 0);
    shm_raw_grant(fd, base + 2 * pg, pg, k[2], &e[2], &nf, buf);
    assert_int_equal(e[2].status, 0);
    assert_int_equal(e[2].slot, e[1].slot + 1); /* not the closed window's, the first free */
    assert_int_equal(xp_window_close(t, k[1]), 0);
    assert_int_equal(xp_window_close(t, k[2]), 0);
    close(fd);
    free(buf);
    test_region_close(t, &r);
    ect_xport_close(t);
}

/* shm, memory files once per connection: an initiator that says
 * SHM_HELLO_FILES gets a pool's fd with its first window, numbered, and the
 * later windows of the same pool with that number and no fd; one that does
 * not gets the fd with every window, as before. Our initiator holds one fd
 * per pool (not one per window), writes land through windows mapped from
 * it, and once the pool is unregistered the next GRANT drops the file and
 * the initiator closes its fd. */
static void test_shm_file_once(void **state) {
    (void)state;
    ect_xport *t = open_kind("shm"), *i = open_kind("shm");
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), sz;
    region r;
    private_region_open(t, 64 * pg, &r);
    struct stat rst;
    assert_int_equal(fstat(r.fd, &rst), 0);
    const char *ses = ect_xport_session(t);
    uint64_t base = (uint64_t)(uintptr_t)r.addr;
    char ka[ECT_XPORT_KEY_MAX], kb[ECT_XPORT_KEY_MAX];
    assert_int_equal(xp_window_open(t, r.key, 0, 2 * pg, ka), 0);
    assert_int_equal(xp_window_open(t, r.key, 4 * pg, 3 * pg, kb), 0);
    uint8_t *buf = malloc(SHM_GRANT_MAX);
    assert_non_null(buf);
    shm_grant_entry ea, eb;
    int na, nb;
    for (int files = 0; files < 2; files++) {
        int fd = shm_raw_hello(ses, files ? SHM_HELLO_FILES : 0);
        shm_raw_grant(fd, base, pg, ka, &ea, &na, buf);
        shm_raw_grant(fd, base + 4 * pg, pg, kb, &eb, &nb, buf);
        assert_int_equal(ea.status, 0);
        assert_int_equal(eb.status, 0);
        assert_int_equal(ea.flags, SHM_GF_FD);
        assert_int_equal(na, 1);
        if (files) {
            assert_int_not_equal(ea.file, 0);
            assert_int_equal(eb.flags, SHM_GF_FILE);
            assert_int_equal(eb.file, ea.file);
            assert_int_equal(nb, 0);
        } else {
            assert_int_equal(ea.file, 0);
            assert_int_equal(eb.flags, SHM_GF_FD);
            assert_int_equal(eb.file, 0);
            assert_int_equal(nb, 1);
        }
        close(fd);
    }
    int own = fds_of((uint64_t)rst.st_ino); /* the test's and the target's */
    static uint8_t src[4 * 4096];
    int st;
    test_fill_pattern(src, 2 * pg, 5);
    ect_write w = {src, base, 2 * pg, ka};
    assert_int_equal(ect_xport_write_batch(i, ses, &w, 1, &st), 0);
    assert_int_equal(fds_of((uint64_t)rst.st_ino), own + 1);
    test_fill_pattern(src, 3 * pg, 6);
    w = (ect_write){src, base + 4 * pg, 3 * pg, kb};
    assert_int_equal(ect_xport_write_batch(i, ses, &w, 1, &st), 0);
    assert_memory_equal(r.addr + 4 * pg, src, 3 * pg);
    assert_int_equal(fds_of((uint64_t)rst.st_ino), own + 1); /* one per pool, not per window */
    assert_int_equal(small_maps(64 * pg, &sz), 2);           /* each window its own pages */
    assert_int_equal(xp_window_close(t, ka), 0);
    assert_int_equal(xp_window_close(t, kb), 0);
    test_region_close(t, &r);
    /* The next GRANT (a write into another region) drops the pool's file. */
    region r2;
    test_region_open(t, 4 * pg, &r2);
    w = (ect_write){src, (uint64_t)(uintptr_t)r2.addr, pg, r2.key};
    assert_int_equal(ect_xport_write_batch(i, ses, &w, 1, &st), 0);
    assert_int_equal(fds_of((uint64_t)rst.st_ino), 0);
    /* r2's own mapping and the initiator's of it; the windows' are gone,
     * parked ones too. */
    assert_int_equal(small_maps(64 * pg, &sz), 2);
    assert_int_equal(parked_maps(64 * pg).n, 0);
    test_region_close(t, &r2);
    free(buf);
    ect_xport_close(i);
    ect_xport_close(t);
}

/* Forks a child that writes one byte at p with SIGSEGV at its default action
 * (set by the raw system call, past any sanitizer's handler; an all-zero
 * kernel sigaction is SIG_DFL) and no core file; returns its wait status. */
static int child_writes(uint8_t *p) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uint64_t dfl[8] = {0};
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        syscall(SYS_rt_sigaction, SIGSEGV, dfl, NULL, (size_t)8);
        *(volatile uint8_t *)p = 0xEE;
        _exit(0);
    }
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    return ws;
}

/* One window of `len` bytes at page `page` of r, written through the
 * initiator and closed: its write GRANT drops the window closed before it. */
static void write_window(ect_xport *t, ect_xport *i, const region *r, size_t off, size_t len,
                         uint8_t seed) {
    static uint8_t src[16 * 4096];
    char k[ECT_XPORT_KEY_MAX];
    int st;
    size_t n = len < sizeof src ? len : sizeof src;
    assert_int_equal(xp_window_open(t, r->key, off, len, k), 0);
    test_fill_pattern(src, n, seed);
    ect_write w = {src, (uint64_t)(uintptr_t)(r->addr + off), n, k};
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), &w, 1, &st), 0);
    assert_memory_equal(r->addr + off, src, n);
    assert_int_equal(xp_window_close(t, k), 0);
}

/* shm, parked mappings (docs/PROTOCOL.md "shm: a window is its own region to
 * the initiator"): a dropped window's mapping that no window of its GRANT
 * takes over stays as PROT_NONE, so a write through its address faults
 * (a child doing it dies of SIGSEGV, nothing lands); a later window that
 * starts on its pages revives it (the same address, trimmed to the new
 * window, read-write: the write lands); at most SHM_PARK_MAPS and
 * SHM_PARK_BYTES are parked per connection; the connection's close and the
 * pool file's drop unmap them. */
static void test_shm_parked_windows(void **state) {
    (void)state;
    ect_xport *t = open_kind("shm"), *i = open_kind("shm");
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), sz, below = 64 * pg;
    size_t big = (size_t)(SHM_PARK_BYTES / 4) + pg, npg = SHM_PARK_MAPS + 64;
    region r;
    private_region_open(t, npg * pg + 5 * (big + pg), &r);
    /* A: 4 pages from page 2; then B elsewhere: A is parked, B live. */
    write_window(t, i, &r, 2 * pg, 4 * pg, 1);
    maps_seen a = window_maps("rw-s", below);
    assert_int_equal(a.n, 1);
    write_window(t, i, &r, 20 * pg, 2 * pg, 2);
    /* A write through A's mapping's address faults; the pool's bytes stay. */
    uint8_t before[16];
    memcpy(before, r.addr + 2 * pg, sizeof before);
    int ws = child_writes(a.addr);
    assert_true(WIFSIGNALED(ws));
    assert_int_equal(WTERMSIG(ws), SIGSEGV);
    assert_memory_equal(r.addr + 2 * pg, before, sizeof before);
    maps_seen pa = parked_maps(below); /* there, PROT_NONE */
    assert_int_equal(pa.n, 1);
    assert_ptr_equal(pa.addr, a.addr);
    assert_int_equal(pa.size, 4 * pg);
    assert_int_equal(small_maps(below, &sz), 1); /* B's: closed, dropped with the next GRANT */
    assert_int_equal(sz, 2 * pg);
    /* C: 3 pages from page 2 revives A's mapping (trimmed); B is parked. */
    char kc[ECT_XPORT_KEY_MAX];
    static uint8_t src[4 * 4096];
    int st;
    assert_int_equal(xp_window_open(t, r.key, 2 * pg, 3 * pg, kc), 0);
    test_fill_pattern(src, 3 * pg, 3);
    ect_write w = {src, (uint64_t)(uintptr_t)(r.addr + 2 * pg), 3 * pg, kc};
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), &w, 1, &st), 0);
    assert_memory_equal(r.addr + 2 * pg, src, 3 * pg);
    maps_seen c = window_maps("rw-s", below);
    assert_int_equal(c.n, 1);
    assert_ptr_equal(c.addr, a.addr);
    assert_int_equal(c.size, 3 * pg);
    assert_int_equal(parked_maps(below).n, 1);
    assert_int_equal(parked_maps(below).size, 2 * pg);
    assert_int_equal(xp_window_close(t, kc), 0);
    /* More windows than the bound, one page each on pages of their own
     * (counted in pages: the kernel may merge neighbours in the address space
     * and the file into one line of /proc/self/maps). */
    for (size_t k = 0; k < SHM_PARK_MAPS + 8; k++)
        write_window(t, i, &r, (32 + k) * pg, pg, (uint8_t)k);
    assert_int_equal(parked_maps(below).total, SHM_PARK_MAPS * pg);
    /* Larger windows (a page apart: never merged): at most SHM_PARK_BYTES of them. */
    for (size_t k = 0; k < 5; k++) write_window(t, i, &r, npg * pg + k * (big + pg), big, 9);
    maps_seen p = parked_maps(2 * big);
    assert_true(p.total <= SHM_PARK_BYTES);
    assert_int_equal(p.total, 3 * big); /* the newest three; the one-page ones went first */
    /* The connection's close unmaps them. */
    ect_xport_close(i);
    assert_int_equal(parked_maps(2 * big).n, 0);
    /* A new connection parks again; the pool file's drop unmaps them. */
    i = open_kind("shm");
    write_window(t, i, &r, 2 * pg, 4 * pg, 4);
    write_window(t, i, &r, 20 * pg, 2 * pg, 5);
    assert_int_equal(parked_maps(below).n, 1);
    test_region_close(t, &r);
    region r2;
    test_region_open(t, 4 * pg, &r2);
    w = (ect_write){src, (uint64_t)(uintptr_t)r2.addr, pg, r2.key};
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), &w, 1, &st), 0);
    assert_int_equal(parked_maps(2 * big).n, 0);
    test_region_close(t, &r2);
    ect_xport_close(i);
    ect_xport_close(t);
}

/* shm, parking what one GRANT drops together: the initiator makes retired
 * mappings that lie end to end in its address space PROT_NONE with one
 * mprotect per run (shm_initiator.c retired_park). Five windows mapped by
 * one batch (the kernel places such mappings side by side), all but the
 * middle one closed, then dropped by the next GRANT: the four are parked,
 * every page of them and nothing more (a run stretched over the live
 * window, or cut short, fails here), and the live window stays writable
 * (its key still writes the pool through its mapping). Then three new
 * windows on parked pages, one batch, revive their mappings by runs. */
static void test_shm_parked_runs(void **state) {
    (void)state;
    enum { W = 5, LIVE = 2 };
    ect_xport *t = open_kind("shm"), *i = open_kind("shm");
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), below = 64 * pg;
    region r;
    private_region_open(t, 64 * pg, &r);
    static uint8_t src[W][2 * 4096];
    char k[W][ECT_XPORT_KEY_MAX];
    ect_write w[W];
    int st[W];
    for (int j = 0; j < W; j++) {
        size_t off = (size_t)(2 * j) * pg; /* two pages each, end to end in the pool */
        assert_int_equal(xp_window_open(t, r.key, off, 2 * pg, k[j]), 0);
        test_fill_pattern(src[j], 2 * pg, (uint8_t)(j + 1));
        w[j] = (ect_write){src[j], (uint64_t)(uintptr_t)(r.addr + off), 2 * pg, k[j]};
    }
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), w, W, st), 0);
    for (int j = 0; j < W; j++) assert_int_equal(st[j], 0);
    assert_int_equal(window_maps("rw-s", below).total, W * 2 * pg);
    for (int j = 0; j < W; j++)
        if (j != LIVE) assert_int_equal(xp_window_close(t, k[j]), 0);
    write_window(t, i, &r, 40 * pg, pg, 9); /* its GRANT drops the four */
    maps_seen p = parked_maps(below);
    assert_int_equal(p.total, (W - 1) * 2 * pg);
    /* The live window's and the last window's pages: both read-write once more. */
    assert_int_equal(window_maps("rw-s", below).total, 2 * pg + pg);
    test_fill_pattern(src[LIVE], 2 * pg, 42);
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), &w[LIVE], 1, st), 0);
    assert_memory_equal(r.addr + 2 * LIVE * pg, src[LIVE], 2 * pg);
    /* New windows on the pages of windows 0, 1 and 3, one batch: their GRANT
     * revives the three parked mappings (one mprotect per run: 0 and 1 lie
     * end to end) and parks the last window's; window 4's stays parked (a
     * run stretched over it, or cut short, fails here or faults in the copy). */
    int re[] = {0, 1, 3};
    ect_write rw[3];
    char rk[3][ECT_XPORT_KEY_MAX];
    for (int j = 0; j < 3; j++) {
        size_t off = (size_t)(2 * re[j]) * pg;
        assert_int_equal(xp_window_open(t, r.key, off, 2 * pg, rk[j]), 0);
        test_fill_pattern(src[re[j]], 2 * pg, (uint8_t)(50 + j));
        rw[j] = (ect_write){src[re[j]], (uint64_t)(uintptr_t)(r.addr + off), 2 * pg, rk[j]};
    }
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), rw, 3, st), 0);
    for (int j = 0; j < 3; j++) {
        assert_int_equal(st[j], 0);
        assert_memory_equal(r.addr + 2 * re[j] * pg, src[re[j]], 2 * pg);
        assert_int_equal(xp_window_close(t, rk[j]), 0);
    }
    assert_int_equal(parked_maps(below).total, 2 * pg + pg);
    assert_int_equal(window_maps("rw-s", below).total, 4 * 2 * pg);
    assert_int_equal(xp_window_close(t, k[LIVE]), 0);
    test_region_close(t, &r);
    ect_xport_close(i);
    ect_xport_close(t);
}

/* shm: parked mappings are bounded in the process too (SHM_PARK_PROCESS):
 * enough connections (one per initiator) that each parks SHM_PARK_MAPS
 * hold no more than that between them; closing them unmaps all. */
static void test_shm_parked_process_bound(void **state) {
    (void)state;
    enum { N = SHM_PARK_PROCESS / SHM_PARK_MAPS + 1 };
    ect_xport *t = open_kind("shm"), *in[N];
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), below = 64 * pg;
    region r;
    private_region_open(t, (SHM_PARK_MAPS + 64) * pg, &r);
    for (int j = 0; j < N; j++) {
        in[j] = open_kind("shm");
        for (size_t k = 0; k <= SHM_PARK_MAPS; k++)
            write_window(t, in[j], &r, (k + 1) * pg, pg, (uint8_t)j);
    }
    /* in pages: neighbours in the address space and the file may merge */
    assert_int_equal(parked_maps(below).total, SHM_PARK_PROCESS * pg);
    for (int j = 0; j < N; j++) ect_xport_close(in[j]);
    assert_int_equal(parked_maps(below).n, 0);
    test_region_close(t, &r);
    ect_xport_close(t);
}

/* A peer that stalls mid-frame is dropped after io_timeout_ms. */

/* ---- shm offers (docs/PROTOCOL.md "shm", "Offers") */

static uint64_t shm_begins(ect_xport *i) {
    uint64_t b, o;
    shm_counts(i, &b, &o);
    return b;
}

static uint64_t shm_offers(ect_xport *i) {
    uint64_t b, o;
    shm_counts(i, &b, &o);
    return o;
}

/* Offers keys[0..n) to id until the target takes the offer: it skips one
 * while the connection's thread is still sending a GRANT (it never waits
 * in the control server's path). */
static void offer_until_taken(ect_xport *t, uint64_t id, const char *const *keys, size_t n) {
    while (xp_window_offer(t, id, keys, n) != 0) test_nap_ms(1);
}

/* Our target and initiator: a window offered to the initiator's id before
 * its write is written with no BEGIN (the initiator's count of BEGINs does
 * not move, its count of applied OFFERs does) and the bytes land; once the
 * window is closed its key is refused (the fast path sees the slot cleared,
 * the BEGIN is refused); the next offer drops the closed offered windows
 * (their mappings parked, none left writable). An offer to an id no
 * connection named, or to an initiator that did not ask for offers (an
 * older one), fails and changes nothing: that initiator writes with BEGINs
 * as before. */
static void test_shm_offers(void **state) {
    (void)state;
    ect_xport *t = open_kind("shm"), *i = open_kind("shm"), *old = open_kind("shm");
    xp_set_offer_id(i, 0x1234);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), sz;
    region r;
    private_region_open(t, 64 * pg, &r);
    const char *ses = ect_xport_session(t);
    /* The first write connects (a BEGIN: there was no connection to offer to). */
    write_window(t, i, &r, 0, pg, 1);
    assert_int_equal(shm_begins(i), 1);
    char kb[ECT_XPORT_KEY_MAX], kc[ECT_XPORT_KEY_MAX];
    const char *keys[1] = {kb};
    assert_int_equal(xp_window_open(t, r.key, 4 * pg, 2 * pg, kb), 0);
    assert_err(xp_window_offer(t, 0x9999, keys, 1), ECT_ENOTFOUND, NULL);
    offer_until_taken(t, 0x1234, keys, 1);
    static uint8_t src[4 * 4096];
    int st;
    test_fill_pattern(src, 2 * pg, 2);
    ect_write w = {src, (uint64_t)(uintptr_t)(r.addr + 4 * pg), 2 * pg, kb};
    assert_int_equal(ect_xport_write_batch(i, ses, &w, 1, &st), 0);
    assert_memory_equal(r.addr + 4 * pg, src, 2 * pg);
    assert_int_equal(shm_begins(i), 1); /* no BEGIN: offered */
    assert_int_equal(shm_offers(i), 1);
    /* Closed: the key is refused, nothing lands. */
    assert_int_equal(xp_window_close(t, kb), 0);
    uint8_t before[64];
    memcpy(before, r.addr + 4 * pg, sizeof before);
    test_fill_pattern(src, 2 * pg, 3);
    ect_xport_write_batch(i, ses, &w, 1, &st);
    assert_int_equal(st, ECT_EACCES);
    assert_memory_equal(r.addr + 4 * pg, before, sizeof before);
    assert_int_equal(shm_begins(i), 2);
    /* Another offered window: its OFFER drops B's mapping, parked. */
    assert_int_equal(xp_window_open(t, r.key, 16 * pg, pg, kc), 0);
    keys[0] = kc;
    offer_until_taken(t, 0x1234, keys, 1);
    w = (ect_write){src, (uint64_t)(uintptr_t)(r.addr + 16 * pg), pg, kc};
    assert_int_equal(ect_xport_write_batch(i, ses, &w, 1, &st), 0);
    assert_memory_equal(r.addr + 16 * pg, src, pg);
    assert_int_equal(shm_begins(i), 2);
    assert_int_equal(shm_offers(i), 2);
    /* B and C, each offered alone, were written without a mapping (direct:
     * test_shm_direct_windows); the first window's mapping, dropped by B's
     * OFFER, is parked: nothing writable is left. */
    assert_int_equal(shm_direct_count(i), 2);
    assert_int_equal(small_maps(64 * pg, &sz), 0);
    assert_int_equal(parked_maps(64 * pg).total, pg);
    assert_int_equal(xp_window_close(t, kc), 0);
    /* An initiator that did not ask for offers: none is sent, BEGINs as before. */
    write_window(t, old, &r, 32 * pg, pg, 4);
    assert_int_equal(xp_window_open(t, r.key, 36 * pg, pg, kc), 0);
    assert_int_equal(xp_window_offer(t, 0, keys, 1), 0); /* id 0: no one */
    w = (ect_write){src, (uint64_t)(uintptr_t)(r.addr + 36 * pg), pg, kc};
    assert_int_equal(ect_xport_write_batch(old, ses, &w, 1, &st), 0);
    assert_int_equal(shm_begins(old), 2);
    assert_int_equal(shm_offers(old), 0);
    assert_int_equal(xp_window_close(t, kc), 0);
    test_region_close(t, &r);
    ect_xport_close(old);
    ect_xport_close(i);
    ect_xport_close(t);
}

/* Offers a window of len bytes at off of r alone (an OFFER of one entry)
 * to id and writes it through i with seed's pattern; its key to k. */
static void offered_write(ect_xport *t, ect_xport *i, uint64_t id, const region *r, size_t off,
                          size_t len, uint8_t seed, char k[ECT_XPORT_KEY_MAX]) {
    static uint8_t src[80 * 4096];
    const char *keys[1] = {k};
    int st;
    assert_true(len <= sizeof src);
    assert_int_equal(xp_window_open(t, r->key, off, len, k), 0);
    offer_until_taken(t, id, keys, 1);
    test_fill_pattern(src, len, seed);
    ect_write w = {src, (uint64_t)(uintptr_t)(r->addr + off), len, k};
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), &w, 1, &st), 0);
    assert_int_equal(st, 0);
    assert_memory_equal(r->addr + off, src, len);
}

/* shm, direct windows (shm_initiator.c, SHM_DIRECT_MAX): a window offered
 * alone, small, in a pool file the connection holds is written by pwrite
 * into the file without any mapping (no BEGIN, the bytes land, nothing of
 * the pool is mapped in the initiator: neither read-write nor parked, so
 * no mprotect is needed to revive or park it), and alternating two such
 * windows (a lone step's spares) maps nothing either; once closed its key
 * is refused and nothing lands. Offered with another window, or larger
 * than SHM_DIRECT_MAX, a window is mapped as before. */
static void test_shm_direct_windows(void **state) {
    (void)state;
    shm_remap_mode(SHM_REMAP_CHEAP); /* the larger window's rule: test_shm_large_windows */
    ect_xport *t = open_kind("shm"), *i = open_kind("shm");
    xp_set_offer_id(i, 0x77);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), below = 128 * pg;
    region r;
    private_region_open(t, 512 * pg, &r);
    const char *ses = ect_xport_session(t);
    char k[4][ECT_XPORT_KEY_MAX];
    /* The first write connects (a BEGIN; the pool's file comes with it, held). */
    write_window(t, i, &r, 0, pg, 1);
    assert_int_equal(shm_begins(i), 1);
    /* Windows of 16 pages on two ranges in turn, each offered alone. */
    for (int j = 0; j < 6; j++) {
        offered_write(t, i, 0x77, &r, (size_t)(8 + 16 * (j & 1)) * pg, 16 * pg, (uint8_t)(10 + j),
                      k[0]);
        assert_int_equal(window_maps("rw-s", below).n, 0);
        assert_int_equal(xp_window_close(t, k[0]), 0);
    }
    assert_int_equal(shm_direct_count(i), 6);
    assert_int_equal(shm_begins(i), 1);
    assert_int_equal(parked_maps(below).total, pg); /* the first window's, only */
    /* Closed: its key is refused (the slot shows it gone), nothing lands. */
    static uint8_t src[16 * 4096];
    uint8_t before[64];
    int st;
    memcpy(before, r.addr + 24 * pg, sizeof before);
    test_fill_pattern(src, 16 * pg, 99);
    ect_write w = {src, (uint64_t)(uintptr_t)(r.addr + 24 * pg), 16 * pg, k[0]};
    ect_xport_write_batch(i, ses, &w, 1, &st);
    assert_int_equal(st, ECT_EACCES);
    assert_memory_equal(r.addr + 24 * pg, before, sizeof before);
    assert_int_equal(shm_begins(i), 2); /* the refused one's */
    /* Two windows in one OFFER: mapped, as a step of many's are. */
    const char *two[2] = {k[1], k[2]};
    assert_int_equal(xp_window_open(t, r.key, 40 * pg, 2 * pg, k[1]), 0);
    assert_int_equal(xp_window_open(t, r.key, 44 * pg, 2 * pg, k[2]), 0);
    offer_until_taken(t, 0x77, two, 2);
    ect_write w2[2] = {{src, (uint64_t)(uintptr_t)(r.addr + 40 * pg), 2 * pg, k[1]},
                       {src, (uint64_t)(uintptr_t)(r.addr + 44 * pg), 2 * pg, k[2]}};
    int st2[2];
    assert_int_equal(ect_xport_write_batch(i, ses, w2, 2, st2), 0);
    assert_int_equal(st2[0] | st2[1], 0);
    assert_memory_equal(r.addr + 44 * pg, src, 2 * pg);
    assert_int_equal(window_maps("rw-s", below).total, 4 * pg);
    assert_int_equal(shm_direct_count(i), 6);
    assert_int_equal(xp_window_close(t, k[1]), 0);
    assert_int_equal(xp_window_close(t, k[2]), 0);
    /* Larger than SHM_DIRECT_MAX, alone: mapped. */
    size_t big = SHM_DIRECT_MAX + pg;
    offered_write(t, i, 0x77, &r, 200 * pg, big, 7, k[3]);
    assert_int_equal(window_maps("rw-s", below).total, big);
    assert_int_equal(shm_direct_count(i), 6);
    assert_int_equal(shm_begins(i), 2);
    assert_int_equal(xp_window_close(t, k[3]), 0);
    test_region_close(t, &r);
    ect_xport_close(i);
    ect_xport_close(t);
    shm_remap_mode(SHM_REMAP_MEASURE);
}

/* Offers two windows of len bytes at offs a and b of r in one OFFER to id
 * and writes both through i; closes them after (the next OFFER drops
 * them). Returns the bytes of read-write shared mappings below `below`
 * while they were open. */
static size_t offered_pair(ect_xport *t, ect_xport *i, uint64_t id, const region *r, size_t a,
                           size_t b, size_t len, uint8_t seed, size_t below) {
    static uint8_t src[2][256 * 4096];
    char k[2][ECT_XPORT_KEY_MAX];
    const char *keys[2] = {k[0], k[1]};
    assert_true(len <= sizeof src[0]);
    assert_int_equal(xp_window_open(t, r->key, a, len, k[0]), 0);
    assert_int_equal(xp_window_open(t, r->key, b, len, k[1]), 0);
    offer_until_taken(t, id, keys, 2);
    test_fill_pattern(src[0], len, seed);
    test_fill_pattern(src[1], len, (uint8_t)(seed + 1));
    ect_write w[2] = {{src[0], (uint64_t)(uintptr_t)(r->addr + a), len, k[0]},
                      {src[1], (uint64_t)(uintptr_t)(r->addr + b), len, k[1]}};
    int st[2] = {-1, -1};
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), w, 2, st), 0);
    assert_int_equal(st[0], 0);
    assert_int_equal(st[1], 0);
    assert_memory_equal(r->addr + a, src[0], len);
    assert_memory_equal(r->addr + b, src[1], len);
    size_t rw = window_maps("rw-s", below).total;
    assert_int_equal(xp_window_close(t, k[0]), 0);
    assert_int_equal(xp_window_close(t, k[1]), 0);
    return rw;
}

/* shm, the reuse score (shm_initiator.c, SHM_REUSE_MAP): windows offered
 * together are mapped while new windows land on the pages their OFFER
 * dropped (each takes the dropped window's mapping over: no mprotect, no
 * mmap, nothing new parked); once they keep landing on other pages (four
 * steps in flight: the dropped ranges are still held by items not yet
 * consumed), a mapping would cost a revival or a fresh mmap and a park that
 * nothing reuses, so they are written direct (pwrite, nothing mapped, the
 * bytes land all the same); when they land on freed pages again, they are
 * mapped again and taken over from then on. */
static void test_shm_reuse_score(void **state) {
    (void)state;
    ect_xport *t = open_kind("shm"), *i = open_kind("shm");
    xp_set_offer_id(i, 0x99);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), below = 128 * pg, len = 8 * pg;
    region r;
    private_region_open(t, 512 * pg, &r);
    write_window(t, i, &r, 0, pg, 1); /* connects: the pool's file held */
    /* Pairs on the same two ranges: mapped once, then taken over. */
    for (int j = 0; j < 8; j++)
        assert_int_equal(offered_pair(t, i, 0x99, &r, 16 * pg, 32 * pg, len, (uint8_t)j, below),
                         2 * len);
    assert_int_equal(shm_direct_count(i), 0);
    /* Pairs on ranges their OFFER did not drop (eight slots in turn). */
    int first_direct = -1;
    uint64_t before_first = 0;
    size_t parked = 0;
    for (int j = 0; j < 40; j++) {
        size_t a = (size_t)(64 + 32 * (j % 8)) * pg;
        uint64_t d = shm_direct_count(i);
        size_t rw = offered_pair(t, i, 0x99, &r, a, a + 16 * pg, len, (uint8_t)j, below);
        if (rw == 0 && first_direct < 0) {
            first_direct = j;
            before_first = d;
            parked = parked_maps(below).total; /* the last mapped pair's, by now */
        }
        if (first_direct >= 0) assert_int_equal(rw, 0); /* stays direct */
    }
    /* the score falls by 1/SHM_REUSE_SPAN of itself a window: ~17 windows */
    assert_true(first_direct > 4 && first_direct < 20);
    assert_int_equal(shm_direct_count(i) - before_first, 2 * (uint64_t)(40 - first_direct));
    /* Direct windows park nothing. */
    assert_true(parked > 0);
    assert_int_equal(parked_maps(below).total, parked);
    /* A direct pair's windows once closed: their keys are refused (the
     * slots show them gone), nothing lands. */
    char k[2][ECT_XPORT_KEY_MAX];
    const char *keys[2] = {k[0], k[1]};
    assert_int_equal(xp_window_open(t, r.key, 400 * pg, len, k[0]), 0);
    assert_int_equal(xp_window_open(t, r.key, 420 * pg, len, k[1]), 0);
    offer_until_taken(t, 0x99, keys, 2);
    assert_int_equal(xp_window_close(t, k[0]), 0);
    assert_int_equal(xp_window_close(t, k[1]), 0);
    static uint8_t src[8 * 4096];
    uint8_t before[2][64];
    memcpy(before[0], r.addr + 400 * pg, sizeof before[0]);
    memcpy(before[1], r.addr + 420 * pg, sizeof before[1]);
    test_fill_pattern(src, len, 77);
    ect_write w[2] = {{src, (uint64_t)(uintptr_t)(r.addr + 400 * pg), len, k[0]},
                      {src, (uint64_t)(uintptr_t)(r.addr + 420 * pg), len, k[1]}};
    int st[2] = {0, 0};
    ect_xport_write_batch(i, ect_xport_session(t), w, 2, st);
    assert_int_equal(st[0], ECT_EACCES);
    assert_int_equal(st[1], ECT_EACCES);
    assert_memory_equal(r.addr + 400 * pg, before[0], sizeof before[0]);
    assert_memory_equal(r.addr + 420 * pg, before[1], sizeof before[1]);
    /* Back on the same two ranges: direct until the score is back, then
     * mapped, then taken over (no more direct windows). */
    int mapped_again = -1;
    for (int j = 0; j < 200 && mapped_again < 0; j++)
        if (offered_pair(t, i, 0x99, &r, 16 * pg, 32 * pg, len, (uint8_t)j, below) == 2 * len)
            mapped_again = j;
    assert_true(mapped_again > 0);
    uint64_t directs = shm_direct_count(i);
    for (int j = 0; j < 8; j++)
        assert_int_equal(offered_pair(t, i, 0x99, &r, 16 * pg, 32 * pg, len, (uint8_t)j, below),
                         2 * len);
    assert_int_equal(shm_direct_count(i), directs);
    test_region_close(t, &r);
    ect_xport_close(i);
    ect_xport_close(t);
}

/* shm, larger offered windows (1 MiB: over SHM_DIRECT_MAX), with page-table
 * changes taken as dear and as cheap (shm_remaps_dear; set here). Where
 * they are dear, a window that does not lie on pages its own OFFER freed
 * goes direct (nothing mapped, the bytes land all the same), and one that
 * does is mapped and its successors take the mapping over: a pair's first
 * OFFER (nothing freed) is direct, the next pair on the same pages is
 * mapped, the ones after are taken over; pairs on other pages are direct
 * every time. Where page-table changes are cheap, every pair is mapped
 * (taken over, revived or fresh), as before. */
static void test_shm_large_windows(void **state) {
    (void)state;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), len = 4 * SHM_DIRECT_MAX, below = 2048 * pg;
    assert_true(len == 256 * pg); /* the pairs' ranges below are in 4 KiB pages */
    for (int dear = 1; dear >= 0; dear--) {
        shm_remap_mode(dear ? SHM_REMAP_IS_DEAR : SHM_REMAP_CHEAP);
        assert_int_equal(shm_remaps_dear(), dear);
        ect_xport *t = open_kind("shm"), *i = open_kind("shm");
        xp_set_offer_id(i, 0x55);
        region r;
        private_region_open(t, 5120 * pg, &r);
        write_window(t, i, &r, 0, pg, 1); /* connects: the pool's file held */
        /* Pairs on the same two ranges. */
        size_t rw = offered_pair(t, i, 0x55, &r, 16 * pg, 300 * pg, len, 1, below);
        assert_int_equal(rw, dear ? 0 : 2 * len);
        assert_int_equal(shm_direct_count(i), dear ? 2 : 0);
        for (int j = 0; j < 8; j++)
            assert_int_equal(
                offered_pair(t, i, 0x55, &r, 16 * pg, 300 * pg, len, (uint8_t)j, below), 2 * len);
        assert_int_equal(shm_direct_count(i), dear ? 2 : 0);
        /* Pairs on other pages (eight ranges in turn). */
        for (int j = 0; j < 16; j++) {
            size_t a = (size_t)(600 + 520 * (j % 8)) * pg;
            rw = offered_pair(t, i, 0x55, &r, a, a + 260 * pg, len, (uint8_t)j, below);
            assert_int_equal(rw, dear ? 0 : 2 * len);
        }
        assert_int_equal(shm_direct_count(i), dear ? 2 + 32 : 0);
        test_region_close(t, &r);
        ect_xport_close(i);
        ect_xport_close(t);
    }
    shm_remap_mode(SHM_REMAP_MEASURE);
}

/* Two OFFERs queued before a write of both their windows (and before a
 * write into the second one's alone): leaving the cache reads only the
 * first, and the windows the write misses are looked for behind it before
 * any BEGIN, so every copy takes the fast path (no BEGIN) and lands. */
static void test_shm_offers_queued(void **state) {
    (void)state;
    ect_xport *t = open_kind("shm"), *i = open_kind("shm");
    xp_set_offer_id(i, 0x4321);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    region r;
    private_region_open(t, 64 * pg, &r);
    const char *ses = ect_xport_session(t);
    write_window(t, i, &r, 0, pg, 1); /* connects: one BEGIN */
    assert_int_equal(shm_begins(i), 1);
    char k[4][ECT_XPORT_KEY_MAX];
    for (int j = 0; j < 4; j++)
        assert_int_equal(xp_window_open(t, r.key, (size_t)(4 + 4 * j) * pg, pg, k[j]), 0);
    const char *first[1] = {k[0]}, *second[1] = {k[1]}, *third[1] = {k[2]}, *fourth[1] = {k[3]};
    offer_until_taken(t, 0x4321, first, 1);
    offer_until_taken(t, 0x4321, second, 1);
    static uint8_t src[2][4096];
    test_fill_pattern(src[0], pg, 5);
    test_fill_pattern(src[1], pg, 6);
    ect_write w[2] = {{src[0], (uint64_t)(uintptr_t)(r.addr + 4 * pg), pg, k[0]},
                      {src[1], (uint64_t)(uintptr_t)(r.addr + 8 * pg), pg, k[1]}};
    int st[2] = {-1, -1};
    assert_int_equal(ect_xport_write_batch(i, ses, w, 2, st), 0);
    assert_int_equal(st[0], 0);
    assert_int_equal(st[1], 0);
    assert_memory_equal(r.addr + 4 * pg, src[0], pg);
    assert_memory_equal(r.addr + 8 * pg, src[1], pg);
    assert_int_equal(shm_begins(i), 1);
    assert_int_equal(shm_offers(i), 2);
    /* the window of the second of two queued OFFERs, written alone */
    offer_until_taken(t, 0x4321, third, 1);
    offer_until_taken(t, 0x4321, fourth, 1);
    w[0] = (ect_write){src[1], (uint64_t)(uintptr_t)(r.addr + 16 * pg), pg, k[3]};
    assert_int_equal(ect_xport_write_batch(i, ses, w, 1, st), 0);
    assert_int_equal(st[0], 0);
    assert_memory_equal(r.addr + 16 * pg, src[1], pg);
    assert_int_equal(shm_begins(i), 1);
    assert_int_equal(shm_offers(i), 4);
    for (int j = 0; j < 4; j++) assert_int_equal(xp_window_close(t, k[j]), 0);
    test_region_close(t, &r);
    ect_xport_close(i);
    ect_xport_close(t);
}

/* A raw shm target for the initiator's side of offers: one connection;
 * region file `mem` (4 pages), windows A (page 0, rid 7, slot 3) and B
 * (page 2, rid 8, slot 5), both live in the control segment. With offers
 * it answers the HELLO with SHM_HELLO_OFFERS, reads the ID, and answers the
 * BEGIN (for A) with an OFFER of B (B's fd, file 1) first and then the
 * GRANT of A (file 1 by number: the OFFER must have been applied); without
 * offers (an older target) it replies flags 0 and the next message must be
 * the BEGIN. Then it waits for DONE and for the connection's end. */
typedef struct raw_target {
    int lfd;
    bool offers;
    int mem;
    uint64_t got_id;
    uint16_t hello_flags;
    bool ok;
} raw_target;

#define RAW_BASE 0x100000ull

static void raw_entry(shm_grant_entry *e, uint64_t rid, uint32_t page, uint32_t slot, size_t pg) {
    *e = (shm_grant_entry){.rid = rid,
                           .raddr = RAW_BASE + page * pg,
                           .rlen = pg,
                           .fd_off = page * pg,
                           .slot = slot,
                           .file = 1};
}

static void *raw_target_main(void *p) {
    raw_target *rt = p;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), len;
    int fd = accept(rt->lfd, NULL, NULL);
    uint8_t *buf = malloc(SHM_GRANT_MAX);
    if (fd < 0 || !buf) return NULL;
    shm_set_timeouts(fd, 60000);
    shm_slot *sl = MAP_FAILED;
    int seg = memfd_create("raw-seg", MFD_CLOEXEC);
    if (shm_msg_recv(fd, buf, SHM_GRANT_MAX, &len, NULL, 0, NULL, false, 60000) != 0 ||
        shm_hello_decode(buf, len) != 0 || seg < 0 || ftruncate(seg, SHM_SEG_LEN) != 0)
        goto out;
    rt->hello_flags = shm_hello_flags(buf);
    sl = mmap(NULL, SHM_SEG_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, seg, 0);
    if (sl == MAP_FAILED) goto out;
    sl[3].state = (7 << 1) | 1;
    sl[5].state = (8 << 1) | 1;
    shm_hello_reply_encode(buf, rt->offers ? SHM_HELLO_OFFERS : 0);
    if (shm_msg_send(fd, buf, SHM_HELLO_REPLY_LEN, &seg, 1, 10000) != 0) goto out;
    if (rt->offers && (shm_msg_recv(fd, buf, SHM_GRANT_MAX, &len, NULL, 0, NULL, false, 60000) ||
                       shm_id_decode(buf, len, &rt->got_id)))
        goto out;
    uint32_t n;
    if (shm_msg_recv(fd, buf, SHM_GRANT_MAX, &len, NULL, 0, NULL, false, 60000) ||
        shm_begin_decode(buf, len, &n) || n != 1)
        goto out;
    shm_grant_entry e;
    if (rt->offers) {
        raw_entry(&e, 8, 2, 5, pg);
        e.flags = SHM_GF_FD;
        e.key = 0xB0B;
        shm_offer_put_entry(buf, 0, &e);
        len = shm_offer_finish(buf, 1, 0, 1);
        if (shm_msg_send(fd, buf, len, &rt->mem, 1, 10000) != 0) goto out;
        raw_entry(&e, 7, 0, 3, pg);
        e.flags = SHM_GF_FILE;
        shm_grant_put_entry(buf, 0, &e);
        len = shm_grant_finish(buf, 1, 0, 0, NULL, 0);
        if (shm_msg_send(fd, buf, len, NULL, 0, 10000) != 0) goto out;
    } else {
        raw_entry(&e, 7, 0, 3, pg);
        e.flags = SHM_GF_FD;
        shm_grant_put_entry(buf, 0, &e);
        len = shm_grant_finish(buf, 1, 0, 1, NULL, 0);
        if (shm_msg_send(fd, buf, len, &rt->mem, 1, 10000) != 0) goto out;
    }
    if (shm_msg_recv(fd, buf, SHM_GRANT_MAX, &len, NULL, 0, NULL, false, 60000) ||
        shm_done_decode(buf, len, 1))
        goto out;
    rt->ok = true;
    /* Until the initiator closes: anything more (a BEGIN for B) fails. */
    if (shm_msg_recv(fd, buf, SHM_GRANT_MAX, &len, NULL, 0, NULL, false, 60000) != ECT_ECLOSED)
        rt->ok = false;
out:
    if (sl != MAP_FAILED) munmap(sl, SHM_SEG_LEN);
    if (seg >= 0) close(seg);
    free(buf);
    if (fd >= 0) close(fd);
    return NULL;
}

/* Our initiator against a raw target (raw_target_main): with a target that
 * offers, it names itself with the ID right after the reply, applies an
 * OFFER that arrives while it waits for a GRANT (the GRANT then names the
 * file the OFFER brought), and writes the offered window with no BEGIN;
 * against an older target (reply flags 0) it sends no ID and writes with
 * BEGINs only. */
static void shm_offer_raw_case(bool offers) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), len;
    char name[64], ses[80];
    snprintf(name, sizeof name, "ect-test-raw-%d-%d", (int)getpid(), offers);
    snprintf(ses, sizeof ses, "shm:@%s", name);
    struct sockaddr_un sa;
    socklen_t sl;
    assert_int_equal(shm_make_addr(name, &sa, &sl), 0);
    raw_target rt = {.offers = offers};
    rt.lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_int_equal(bind(rt.lfd, (struct sockaddr *)&sa, sl), 0);
    assert_int_equal(listen(rt.lfd, 4), 0);
    rt.mem = memfd_create("ect-test-region", MFD_CLOEXEC);
    assert_int_equal(ftruncate(rt.mem, (off_t)(4 * pg)), 0);
    uint8_t *mem = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_SHARED, rt.mem, 0);
    assert_true(mem != MAP_FAILED);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, raw_target_main, &rt), 0);
    ect_xport *i = open_kind("shm");
    xp_set_offer_id(i, 0xABCDEF);
    static uint8_t src[4096];
    int st;
    test_fill_pattern(src, pg, 1);
    ect_write w = {src, RAW_BASE, pg, "0000000000000a0a"};
    assert_int_equal(ect_xport_write_batch(i, ses, &w, 1, &st), 0);
    assert_memory_equal(mem, src, pg);
    if (offers) {
        test_fill_pattern(src, pg, 2);
        w = (ect_write){src, RAW_BASE + 2 * pg, pg, "0000000000000b0b"};
        assert_int_equal(ect_xport_write_batch(i, ses, &w, 1, &st), 0);
        assert_memory_equal(mem + 2 * pg, src, pg);
        assert_int_equal(shm_offers(i), 1);
    }
    assert_int_equal(shm_begins(i), 1);
    ect_xport_close(i);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_true(rt.ok);
    assert_true(rt.hello_flags & SHM_HELLO_OFFERS);
    assert_int_equal(rt.got_id, offers ? 0xABCDEF : 0);
    (void)len;
    munmap(mem, 4 * pg);
    close(rt.mem);
    close(rt.lfd);
}

static void test_shm_offer_raw(void **state) {
    (void)state;
    shm_offer_raw_case(true);
    shm_offer_raw_case(false);
}

/* Our target against raw initiators: one that asks for offers gets
 * SHM_HELLO_OFFERS in its reply and, after its ID, an OFFER of the window
 * (the fd attached, file numbered, the key and slot in the entry, the
 * window's range); one that does not (an older one) gets flags 0 and no
 * offer can reach it. A malformed ID closes the connection. */
static void test_shm_offer_target(void **state) {
    (void)state;
    ect_xport *t = open_kind("shm");
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), len;
    region r;
    private_region_open(t, 16 * pg, &r);
    const char *ses = ect_xport_session(t);
    struct sockaddr_un sa;
    socklen_t sl;
    assert_int_equal(shm_make_addr(ses + 5, &sa, &sl), 0);
    uint8_t *buf = malloc(SHM_GRANT_MAX);
    assert_non_null(buf);
    char k[ECT_XPORT_KEY_MAX];
    const char *keys[1] = {k};
    assert_int_equal(xp_window_open(t, r.key, 2 * pg, pg, k), 0);
    for (int asks = 0; asks < 3; asks++) {
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        assert_int_equal(connect(fd, (struct sockaddr *)&sa, sl), 0);
        shm_set_timeouts(fd, 60000);
        shm_hello_encode(buf);
        xp_put_u16(buf + 6, (uint16_t)(SHM_HELLO_FILES | (asks ? SHM_HELLO_OFFERS : 0)));
        assert_int_equal(shm_msg_send(fd, buf, SHM_HELLO_LEN, NULL, 0, 10000), 0);
        int seg = -1, nf = 0;
        assert_int_equal(shm_msg_recv(fd, buf, SHM_GRANT_MAX, &len, &seg, 1, &nf, false, 60000), 0);
        assert_int_equal(shm_hello_reply_decode(buf, len), 0);
        close(seg);
        assert_int_equal(shm_hello_flags(buf), asks ? SHM_HELLO_OFFERS : 0);
        if (asks == 2) { /* a bad ID (id 0): closed */
            shm_id_encode(buf, 0);
            assert_int_equal(shm_msg_send(fd, buf, SHM_ID_LEN, NULL, 0, 10000), 0);
            assert_int_equal(
                shm_msg_recv(fd, buf, SHM_GRANT_MAX, &len, NULL, 0, NULL, false, 60000),
                ECT_ECLOSED);
            close(fd);
            continue;
        }
        if (asks) {
            shm_id_encode(buf, 0x77);
            assert_int_equal(shm_msg_send(fd, buf, SHM_ID_LEN, NULL, 0, 10000), 0);
            /* The target reads the ID on its own thread: offer until it has
             * (offer_until_taken). */
            offer_until_taken(t, 0x77, keys, 1);
            int fds[SHM_CHUNK], nfds = 0;
            assert_int_equal(
                shm_msg_recv(fd, buf, SHM_GRANT_MAX, &len, fds, SHM_CHUNK, &nfds, false, 60000), 0);
            shm_grant g;
            assert_int_equal(shm_offer_decode(buf, len, nfds, &g), 0);
            assert_int_equal(g.n, 1);
            assert_int_equal(nfds, 1);
            close(fds[0]);
            shm_grant_entry e;
            uint32_t seen = 0;
            shm_grant_entry_get(buf, &g, 0, &seen, &e);
            uint64_t tok;
            assert_int_equal(xp_key_parse(k, &tok), 0);
            assert_int_equal(e.key, tok);
            assert_int_equal(e.flags, SHM_GF_FD);
            assert_int_equal(e.file, 1);
            assert_int_equal(e.raddr, (uint64_t)(uintptr_t)(r.addr + 2 * pg));
            assert_int_equal(e.rlen, pg);
            /* Offered once: a second offer of the same window sends nothing. */
            assert_int_equal(xp_window_offer(t, 0x77, keys, 1), 0);
            assert_true(xp_fd_quiet(fd));
        } else {
            assert_int_equal(xp_window_offer(t, 0, keys, 1), 0); /* id 0: no one */
            assert_true(xp_fd_quiet(fd));
        }
        close(fd);
    }
    assert_int_equal(xp_window_close(t, k), 0);
    free(buf);
    test_region_close(t, &r);
    ect_xport_close(t);
}

/* Our target, an initiator that asked for offers and does not read: offers
 * of one new window each fill its socket until one cannot be sent (never
 * waited for); that failed offer leaves the connection's state as it was,
 * so once the initiator has read the queued OFFERs, its BEGIN for the
 * window whose offer failed is granted with the mapping details (the pool's
 * file by number), not as a window it was already given. */
static void test_shm_offer_full_socket(void **state) {
    (void)state;
    enum { MAXW = 1000 };
    ect_xport *t = open_kind("shm");
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), len;
    region r;
    private_region_open(t, MAXW * pg, &r);
    struct sockaddr_un sa;
    socklen_t sl;
    assert_int_equal(shm_make_addr(ect_xport_session(t) + 5, &sa, &sl), 0);
    uint8_t *buf = malloc(SHM_GRANT_MAX);
    assert_non_null(buf);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sl), 0);
    shm_set_timeouts(fd, 60000);
    shm_hello_encode(buf);
    xp_put_u16(buf + 6, SHM_HELLO_FILES | SHM_HELLO_OFFERS);
    assert_int_equal(shm_msg_send(fd, buf, SHM_HELLO_LEN, NULL, 0, 10000), 0);
    int seg = -1, nf = 0, fds[SHM_CHUNK], nfds;
    assert_int_equal(shm_msg_recv(fd, buf, SHM_GRANT_MAX, &len, &seg, 1, &nf, false, 60000), 0);
    close(seg);
    shm_id_encode(buf, 0x55);
    assert_int_equal(shm_msg_send(fd, buf, SHM_ID_LEN, NULL, 0, 10000), 0);
    static char keys[MAXW][ECT_XPORT_KEY_MAX];
    int n = 0, failed = -1;
    assert_int_equal(xp_window_open(t, r.key, 0, pg, keys[0]), 0);
    const char *k0 = keys[0];
    offer_until_taken(t, 0x55, &k0, 1); /* the ID has been read */
    for (n = 1; n < MAXW && failed < 0; n++) {
        const char *k = keys[n];
        assert_int_equal(xp_window_open(t, r.key, (size_t)n * pg, pg, keys[n]), 0);
        if (xp_window_offer(t, 0x55, &k, 1) != 0) failed = n;
    }
    assert_true(failed > 0); /* the socket filled before MAXW windows */
    int offers = 0;
    while (shm_msg_recv_now(fd, buf, SHM_GRANT_MAX, &len, fds, SHM_CHUNK, &nfds) == 0) {
        shm_grant g;
        assert_int_equal(shm_offer_decode(buf, len, nfds, &g), 0);
        for (int i = 0; i < nfds; i++) close(fds[i]);
        offers++;
    }
    assert_int_equal(offers, failed); /* windows 0 .. failed - 1 */
    shm_grant_entry e;
    shm_raw_grant(fd, (uint64_t)(uintptr_t)(r.addr + (size_t)failed * pg), pg, keys[failed], &e,
                  &nfds, buf);
    assert_int_equal(e.status, 0);
    assert_int_equal(e.flags, SHM_GF_FILE);
    assert_int_equal(e.file, 1);
    close(fd);
    for (int i = 0; i < n; i++) assert_int_equal(xp_window_close(t, keys[i]), 0);
    free(buf);
    test_region_close(t, &r);
    ect_xport_close(t);
}

static void test_tcp_stall(void **state) {
    (void)state;
    ect_xport *t = NULL;
    ect_xport_opts o;
    ect_xport_opts_init(&o);
    o.io_timeout_ms = 200;
    assert_int_equal(ect_xport_open("tcp", &o, &t), 0);
    region r;
    test_region_open(t, MiB, &r);
    int fd = raw_connect(ect_xport_session(t));
    raw_hello(fd);
    uint8_t hdr[TCP_HDR_LEN];
    tcp_encode_write(hdr, 1, (uint64_t)(uintptr_t)r.addr, 2000, 5);
    assert_int_equal(xp_send_all(fd, hdr, 20, 2000), 0); /* half a header */
    uint64_t t0 = ect_now_ms();
    uint8_t b;
    assert_int_equal(xp_recv_all(fd, &b, 1, 3000), ECT_ECLOSED);
    assert_true(ect_now_ms() - t0 < 2000);
    close(fd);
    test_region_close(t, &r);
    ect_xport_close(t);
}

#define KIND_TESTS(k)                                                                              \
    cmocka_unit_test_prestate(t_args, (void *)k), cmocka_unit_test_prestate(t_sizes, (void *)k),   \
        cmocka_unit_test_prestate(t_batches, (void *)k),                                           \
        cmocka_unit_test_prestate(t_threads, (void *)k),                                           \
        cmocka_unit_test_prestate(t_wrong_key, (void *)k),                                         \
        cmocka_unit_test_prestate(t_out_of_range, (void *)k),                                      \
        cmocka_unit_test_prestate(t_unregistered, (void *)k),                                      \
        cmocka_unit_test_prestate(t_bad_key_text, (void *)k),                                      \
        cmocka_unit_test_prestate(t_unregister_after_use, (void *)k),                              \
        cmocka_unit_test_prestate(t_unregister_race, (void *)k),                                   \
        cmocka_unit_test_prestate(t_refused, (void *)k),                                           \
        cmocka_unit_test_prestate(t_restart, (void *)k),                                           \
        cmocka_unit_test_prestate(t_killed, (void *)k),                                            \
        cmocka_unit_test_prestate(t_256m, (void *)k)

/* Both ends of a transport connection send small frames at once (acks,
 * headers): the accepted socket and the connecting one have TCP_NODELAY, so
 * no ack waits behind Nagle and the peer's delayed ACK (a 40 ms class stall
 * of many small writes in one batch). */
static atomic_int nodelay_seen = -1;

static void nodelay_conn(void *ctx, int fd, int stopfd) {
    (void)ctx;
    (void)stopfd;
    int v = 0;
    socklen_t l = sizeof v;
    atomic_store(&nodelay_seen, getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &l) == 0 ? v : -2);
}

static void test_tcp_nodelay(void **st) {
    (void)st;
    int lfd = -1, port = 0, cfd = -1;
    assert_int_equal(xp_tcp_listen("127.0.0.1", 0, &lfd, &port), 0);
    xp_server *srv = NULL;
    assert_int_equal(xp_server_start(lfd, nodelay_conn, NULL, 0, 0, &srv), 0);
    assert_int_equal(xp_tcp_connect("127.0.0.1", port, 10000, &cfd), 0);
    int v = 0;
    socklen_t l = sizeof v;
    assert_int_equal(getsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &v, &l), 0);
    assert_int_not_equal(v, 0);
    for (int i = 0; i < 60000 && atomic_load(&nodelay_seen) == -1; i++) usleep(1000);
    assert_true(atomic_load(&nodelay_seen) > 0);
    close(cfd);
    xp_server_stop(srv);
}

/* How many connections a tcp batch uses (the target runs one thread per
 * accepted connection, `ect-tcp-target`, alive while the initiator caches
 * it): a batch of small writes keeps to one, however many bytes it carries
 * in all (32 x 64 KiB = 2 MiB, twice stripe_min); a write of at least twice
 * stripe_min is cut over conns_per_peer (docs/PROTOCOL.md "tcp",
 * "Initiator behaviour"). Every byte lands either way. */
static void test_tcp_stripe_conns(void **st) {
    (void)st;
    ect_xport *t = open_kind("tcp"), *i = open_kind("tcp");
    region r;
    test_region_open(t, 8 * MiB, &r);
    uint8_t *src = malloc(4 * MiB);
    assert_non_null(src);
    test_fill_pattern(src, 4 * MiB, 7);
    int before = test_threads_named("ect-tcp-target");
    ect_write w[32];
    int wst[32];
    for (size_t k = 0; k < 32; k++) w[k] = wr(src + k * 64 * 1024, &r, k * 64 * 1024, 64 * 1024);
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), w, 32, wst), 0);
    for (size_t k = 0; k < 32; k++) assert_int_equal(wst[k], 0);
    assert_memory_equal(r.addr, src, 2 * MiB);
    /* the write is acknowledged, so its connection's thread has read it */
    assert_int_equal(test_threads_named("ect-tcp-target") - before, 1);
    memset(r.addr, 0, 4 * MiB);
    w[0] = wr(src, &r, 0, 4 * MiB); /* 4 MiB >= 2 x 1 MiB: cut over both */
    assert_int_equal(ect_xport_write_batch(i, ect_xport_session(t), w, 1, wst), 0);
    assert_int_equal(wst[0], 0);
    assert_memory_equal(r.addr, src, 4 * MiB);
    assert_int_equal(test_threads_named("ect-tcp-target") - before, 2);
    free(src);
    test_region_close(t, &r);
    ect_xport_close(i);
    ect_xport_close(t);
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc == 4 && strcmp(argv[1], "--child-target") == 0) child_target(argv[2], atoi(argv[3]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_tcp_garbage),
        cmocka_unit_test(test_tcp_unregister_waits),
        cmocka_unit_test(test_tcp_window),
        cmocka_unit_test(test_window_overlap_model),
        cmocka_unit_test(test_window_close_many),
        cmocka_unit_test(test_window_entries_reused),
        cmocka_unit_test(test_shm_slots_next_fit),
        cmocka_unit_test(test_shm_drops_from_log),
        cmocka_unit_test(test_shm_window_reuse),
        cmocka_unit_test(test_shm_file_once),
        cmocka_unit_test(test_shm_parked_windows),
        cmocka_unit_test(test_shm_direct_windows),
        cmocka_unit_test(test_shm_reuse_score),
        cmocka_unit_test(test_shm_large_windows),
        cmocka_unit_test(test_shm_parked_runs),
        cmocka_unit_test(test_shm_parked_process_bound),
        cmocka_unit_test(test_shm_offers),
        cmocka_unit_test(test_shm_offers_queued),
        cmocka_unit_test(test_shm_offer_raw),
        cmocka_unit_test(test_shm_offer_target),
        cmocka_unit_test(test_shm_offer_full_socket),
        cmocka_unit_test(test_tcp_stall),
        cmocka_unit_test(test_tcp_nodelay),
        cmocka_unit_test(test_tcp_stripe_conns),
        KIND_TESTS("tcp"),
        KIND_TESTS("shm"),
#if ECT_HAVE_UCX && !XP_TSAN
        KIND_TESTS("ucx/tcp"),
        KIND_TESTS("ucx/sm"),
        cmocka_unit_test_prestate(t_ucx_window, (void *)"ucx/tcp"),
        cmocka_unit_test_prestate(t_ucx_window, (void *)"ucx/sm"),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
