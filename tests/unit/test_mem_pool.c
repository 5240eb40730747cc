/* Tests for mem/pool: options, the region (anonymous, memfd shared with a second
 * mapping, huge pages and mlock falling back), allocation errors, threads. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "mem/pool.h"
#include "util/util.h"

#define MiB (UINT64_C(1) << 20)

static ect_pool *open_pool(uint64_t cap, int memfd, int huge, int lock) {
    ect_pool_opts o;
    ect_pool_opts_init(&o);
    o.capacity = cap;
    o.use_memfd = memfd;
    o.huge_pages = huge;
    o.mlock = lock;
    ect_pool *p = NULL;
    int rc = ect_pool_open(&o, &p);
    if (rc) print_error("ect_pool_open: %s\n", ect_last_error());
    assert_int_equal(rc, 0);
    assert_non_null(p);
    return p;
}

static void test_defaults_and_bad_options(void **state) {
    (void)state;
    ect_pool_opts o;
    ect_pool_opts_init(&o);
    assert_int_equal(o.capacity, 1000000000);
    assert_int_equal(o.alignment, 256);
    assert_int_equal(o.use_memfd, 0);
    assert_int_equal(o.huge_pages, 0);
    assert_int_equal(o.mlock, 0);
    assert_null(o.on_reclaim);

    ect_pool *p = (ect_pool *)1;
    o.capacity = 0;
    assert_err(ect_pool_open(&o, &p), ECT_EINVAL, "capacity");
    assert_null(p);
    ect_pool_opts_init(&o);
    o.alignment = 3;
    assert_err(ect_pool_open(&o, &p), ECT_EINVAL, "alignment");
    o.alignment = 0;
    assert_err(ect_pool_open(&o, &p), ECT_EINVAL, "alignment");
    ect_pool_opts_init(&o);
    o.capacity = (UINT64_C(1) << 62) + 1;
    assert_err(ect_pool_open(&o, &p), ECT_EINVAL, "capacity");
    assert_err(ect_pool_open(&o, NULL), ECT_EINVAL, "out");
    ect_pool_close(NULL);

    /* NULL options: the defaults (1 GB, reserved lazily). */
    assert_int_equal(ect_pool_open(NULL, &p), 0);
    assert_int_equal(ect_pool_capacity(p), 1000000000);
    assert_int_equal(ect_pool_fd(p), -1);
    assert_int_equal((uintptr_t)ect_pool_base(p) % POOL_BASE_ALIGN, 0);
    assert_int_equal(pool_map_length(p) % POOL_BASE_ALIGN, 0);
    assert_true(pool_map_length(p) >= ect_pool_capacity(p));
    ect_pool_close(p);
}

static void test_anonymous_alloc_free_errors(void **state) {
    (void)state;
    ect_pool *p = open_pool(3 * MiB + 1000, 0, 0, 0); /* odd size: mapping rounds up */
    unsigned char *base = ect_pool_base(p);
    assert_int_equal((uintptr_t)base % POOL_BASE_ALIGN, 0);
    assert_int_equal(pool_map_length(p), 4 * MiB);
    assert_int_equal(ect_pool_capacity(p), 3 * MiB + 768);
    ect_pool_stat st;
    ect_pool_stats(p, &st);
    assert_int_equal(st.memfd, 0);
    assert_int_equal(st.fragments, 1);
    assert_int_equal(st.largest_free, 3 * MiB + 768);

    uint64_t a, b, off = 7;
    assert_err(ect_pool_alloc(p, 0, &off), ECT_EINVAL, "nbytes");
    assert_err(ect_pool_alloc(p, 4 * MiB, &off), ECT_EFULL, "pool is full");
    assert_err(ect_pool_alloc(NULL, 1, &off), ECT_EINVAL, NULL);
    assert_err(ect_pool_alloc(p, 1, NULL), ECT_EINVAL, NULL);
    assert_int_equal(off, 7);
    assert_int_equal(ect_pool_alloc(p, MiB, &a), 0);
    assert_int_equal(ect_pool_alloc(p, 100, &b), 0);
    assert_int_equal(a, 0);
    assert_int_equal(b, MiB);
    test_fill_pattern(base + a, MiB, 1);
    test_fill_pattern(base + b, 100, 2);
    assert_true(test_check_pattern(base + a, MiB, 1));
    assert_true(test_check_pattern(base + b, 100, 2));
    /* Everything that is not an allocation's start is refused. */
    assert_err(ect_pool_free(p, b + 256), ECT_ESTATE, "not allocated");
    assert_err(ect_pool_free(p, a + 256), ECT_ENOTFOUND, "not its start");
    assert_err(ect_pool_free(p, 10 * MiB), ECT_ERANGE, "capacity");
    assert_err(ect_pool_free(NULL, 0), ECT_EINVAL, NULL);
    assert_int_equal(ect_pool_free(p, a), 0);
    assert_err(ect_pool_free(p, a), ECT_ESTATE, "double free");
    /* Full: the detail says what is free and resident. */
    assert_int_equal(ect_pool_alloc(p, 2 * MiB, &a), 0);
    assert_err(ect_pool_alloc(p, MiB + 1, &off), ECT_EFULL, "resident items");
    assert_err(ect_pool_reclaim(p, MiB + 1), ECT_EFULL, "pool is full");
    assert_err(ect_pool_reclaim(p, 0), ECT_EINVAL, "nbytes");
    assert_int_equal(ect_pool_reclaim(p, 256), 0); /* fits already */
    ect_pool_stats(p, &st);
    assert_int_equal(st.allocations, 2);
    assert_int_equal(st.used, 2 * MiB + 256);
    assert_int_equal(st.free, MiB + 512);
    ect_pool_close(p); /* outstanding allocations go with it */
}

/* pool_try_alloc: ect_pool_alloc without the text of a full pool (the
 * consumer's table retries after its own eviction and words its own error);
 * it still reclaims the pool's unleased resident items, and other errors keep
 * their words. */
static void test_try_alloc_is_quiet_when_full(void **state) {
    (void)state;
    ect_pool *p = open_pool(2 * MiB, 0, 0, 0);
    uint64_t a, b, off = 7;
    assert_int_equal(pool_try_alloc(p, MiB, &a), 0);
    assert_int_equal(pool_try_alloc(p, MiB, &b), 0);
    ect_set_error(ECT_EIO, "marker");
    assert_int_equal(pool_try_alloc(p, 256, &off), ECT_EFULL);
    assert_string_equal(ect_last_error(), "marker"); /* no text formatted */
    assert_int_equal(off, 7);
    assert_err(ect_pool_alloc(p, 256, &off), ECT_EFULL,
               "pool is full"); /* the public one words it */
    assert_err(pool_try_alloc(p, 0, &off), ECT_EINVAL, "nbytes");
    /* an unleased resident item is reclaimed for it, as by ect_pool_alloc */
    uint64_t shape[1] = {MiB};
    assert_int_equal(ect_pool_put(p, "r", b, MiB, shape, 1, "uint8", 0), 0);
    ect_set_error(ECT_EIO, "marker");
    assert_int_equal(pool_try_alloc(p, 256, &off), 0);
    assert_int_equal(off, b);
    assert_err(ect_pool_lookup(p, "r", NULL), ECT_ENOTFOUND, NULL);
    ect_pool_close(p);
}

/* pool_try_acquire: ect_pool_acquire without the text of a miss (the pull
 * consumer's resident check before every remote pull); a hit leases as
 * ect_pool_acquire does, and other errors keep their words. */
static void test_try_acquire_is_quiet_on_a_miss(void **state) {
    (void)state;
    ect_pool *p = open_pool(2 * MiB, 0, 0, 0);
    uint64_t a;
    ect_resident_info info;
    assert_int_equal(ect_pool_alloc(p, MiB, &a), 0);
    ect_set_error(ECT_EIO, "marker");
    assert_int_equal(pool_try_acquire(p, "r", &info), ECT_ENOTFOUND);
    assert_string_equal(ect_last_error(), "marker"); /* no text formatted */
    assert_err(ect_pool_acquire(p, "r", &info), ECT_ENOTFOUND,
               "not resident"); /* the public one words it */
    uint64_t shape[1] = {MiB};
    assert_int_equal(ect_pool_put(p, "r", a, MiB, shape, 1, "uint8", 0), 0);
    assert_int_equal(pool_try_acquire(p, "r", &info), 0);
    assert_int_equal(info.offset, a);
    assert_int_equal(info.nbytes, MiB);
    assert_err(ect_pool_remove(p, "r"), ECT_EBUSY, NULL); /* the hit took a lease */
    assert_int_equal(ect_pool_release(p, "r"), 0);
    assert_err(pool_try_acquire(p, "", &info), ECT_EINVAL, "empty");
    assert_int_equal(ect_pool_remove(p, "r"), 0);
    ect_pool_close(p);
}

static void test_memfd_shared_with_second_mapping(void **state) {
    (void)state;
    ect_pool *p = open_pool(6 * MiB, 1, 0, 0);
    int fd = ect_pool_fd(p);
    assert_true(fd >= 0);
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    assert_int_equal((uint64_t)sb.st_size, pool_map_length(p));
    ect_pool_stat st;
    ect_pool_stats(p, &st);
    assert_int_equal(st.memfd, 1);
    /* Sealed: a peer holding the fd cannot shrink it under us. */
    int seals = fcntl(fd, F_GET_SEALS);
    assert_true(seals >= 0 && (seals & F_SEAL_SHRINK));
    assert_int_not_equal(ftruncate(fd, 0), 0);

    /* A second mapping of the fd (what a same-host peer does) sees the same bytes. */
    unsigned char *peer = mmap(NULL, pool_map_length(p), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(peer != MAP_FAILED);
    unsigned char *base = ect_pool_base(p);
    assert_int_equal((uintptr_t)base % POOL_BASE_ALIGN, 0);
    uint64_t off;
    assert_int_equal(ect_pool_alloc(p, 3 * MiB, &off), 0);
    test_fill_pattern(base + off, 3 * MiB, 11);
    assert_true(test_check_pattern(peer + off, 3 * MiB, 11));
    test_fill_pattern(peer + off + 4096, 8192, 12);
    assert_true(test_check_pattern(base + off + 4096, 8192, 12));
    /* The same through a fresh open of the fd, as a peer process would via /proc. */
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int fd2 = open(path, O_RDWR);
    assert_true(fd2 >= 0);
    unsigned char probe[16];
    assert_int_equal(pread(fd2, probe, sizeof probe, (off_t)off), (ssize_t)sizeof probe);
    assert_memory_equal(probe, base + off, sizeof probe);
    close(fd2);
    munmap(peer, pool_map_length(p));
    ect_pool_close(p);
}

/* Runs fn with stderr redirected into buf (the library's warnings). */
static void capture_stderr(char *buf, size_t cap, ect_pool **out, const ect_pool_opts *o) {
    char tmpl[] = "/tmp/ect_test_pool_XXXXXX";
    int tfd = mkstemp(tmpl);
    assert_true(tfd >= 0);
    unlink(tmpl);
    int saved = dup(STDERR_FILENO);
    dup2(tfd, STDERR_FILENO);
    int rc = ect_pool_open(o, out);
    dup2(saved, STDERR_FILENO);
    close(saved);
    assert_int_equal(rc, 0);
    ssize_t n = pread(tfd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    close(tfd);
}

static int huge_pages_free(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    int n = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "HugePages_Free: %d", &n) == 1) break;
    if (f) fclose(f);
    return n;
}

static void test_huge_pages_and_mlock_fall_back(void **state) {
    (void)state;
    ect_log_set_level(ECT_LOG_WARN);
    /* Whether this process may pin 4 MiB: the pool must then agree. */
    void *probe = mmap(NULL, 4 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(probe != MAP_FAILED);
    int can_lock = mlock(probe, 4 * MiB) == 0;
    munmap(probe, 4 * MiB);
    int hp_free = huge_pages_free();
    for (int memfd = 0; memfd <= 1; memfd++) {
        ect_pool_opts o;
        ect_pool_opts_init(&o);
        o.capacity = 4 * MiB;
        o.use_memfd = memfd;
        o.huge_pages = 1;
        o.mlock = 1;
        ect_pool *p = NULL;
        char err[4096];
        capture_stderr(err, sizeof err, &p, &o);
        ect_pool_stat st;
        ect_pool_stats(p, &st);
        assert_int_equal(st.memfd, memfd);
        assert_int_equal(st.locked, can_lock);
        if (!can_lock) assert_non_null(strstr(err, "mlock of 4194304 bytes refused"));
        if (hp_free == 0) {
            /* No huge page to be had: the pool must have fallen back and said so. */
            assert_int_equal(st.huge_pages, 0);
            assert_non_null(strstr(err, "huge pages refused"));
        }
        if (!st.huge_pages) assert_non_null(strstr(err, "using normal pages"));
        unsigned char *base = ect_pool_base(p);
        assert_int_equal((uintptr_t)base % POOL_BASE_ALIGN, 0);
        uint64_t off;
        assert_int_equal(ect_pool_alloc(p, 4 * MiB, &off), 0);
        test_fill_pattern(base, 4 * MiB, 5);
        assert_true(test_check_pattern(base, 4 * MiB, 5));
        ect_pool_close(p);
    }
    ect_log_set_level(-1);
}

/* Two threads allocate, fill, verify and free at once: no allocation is ever
 * handed to both, and the pool ends empty. */
typedef struct worker {
    ect_pool *p;
    uint64_t seed;
    int errors;
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    unsigned char *base = ect_pool_base(w->p);
    uint64_t offs[16], lens[16], rs = w->seed;
    int n = 0;
    for (int i = 0; i < 4000; i++) {
        if (n < 16 && (test_rand(&rs) & 1)) {
            uint64_t len = 1 + test_rand(&rs) % 8192;
            int rc = ect_pool_alloc(w->p, len, &offs[n]);
            if (rc == ECT_EFULL) continue;
            if (rc) w->errors++;
            lens[n] = len;
            memset(base + offs[n], (int)(w->seed & 0xff), len);
            n++;
        } else if (n > 0) {
            n--;
            for (uint64_t k = 0; k < lens[n]; k++)
                if (base[offs[n] + k] != (unsigned char)(w->seed & 0xff)) {
                    w->errors++;
                    break;
                }
            if (ect_pool_free(w->p, offs[n])) w->errors++;
        }
    }
    while (n-- > 0)
        if (ect_pool_free(w->p, offs[n])) w->errors++;
    return NULL;
}

static void test_threads_share_one_pool(void **state) {
    (void)state;
    ect_pool *p = open_pool(2 * MiB, 0, 0, 0);
    worker w[2] = {{p, 0x11, 0}, {p, 0x22, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    assert_int_equal(w[0].errors, 0);
    assert_int_equal(w[1].errors, 0);
    ect_pool_stat st;
    ect_pool_stats(p, &st);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.fragments, 1);
    ect_pool_close(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_bad_options),
        cmocka_unit_test(test_anonymous_alloc_free_errors),
        cmocka_unit_test(test_try_alloc_is_quiet_when_full),
        cmocka_unit_test(test_try_acquire_is_quiet_on_a_miss),
        cmocka_unit_test(test_memfd_shared_with_second_mapping),
        cmocka_unit_test(test_huge_pages_and_mlock_fall_back),
        cmocka_unit_test(test_threads_share_one_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
