/* Out-of-memory tests for mem: every heap allocation the allocator, the pool and
 * the resident cache make is failed in turn (a countdown over this program's
 * malloc/calloc/realloc), and each failing call must return ECT_ENOMEM, change
 * nothing, and leak nothing (live heap blocks are counted around the call).
 *
 * Interposing malloc conflicts with the sanitizers' own, so under ASan or TSan
 * these tests are skipped (the other mem tests run there). */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "mem/alloc.h"
#include "mem/resident.h"
#include "util/util.h"

#include "oom_inject.h"
#define MiB (UINT64_C(1) << 20)

static void arm(int k) { countdown = k; }
static void disarm(void) { countdown = -1; }

static void test_alloc_create_and_split(void **state) {
    (void)state;
    SKIP_UNDER_SANITIZER();
    alloc *a = NULL;
    int k = 0, rc;
    for (;; k++) {
        long before = live;
        arm(k);
        rc = alloc_create(1 << 20, 256, &a);
        disarm();
        if (rc == 0) break;
        assert_err(rc, ECT_ENOMEM, "out of memory");
        assert_null(a);
        assert_int_equal(live, before);
    }
    assert_true(k >= 2); /* the struct and the first node */
    /* A split needs a node: with none to be had, nothing changes. */
    uint64_t off = 77;
    alloc_stats s0, s1;
    alloc_get_stats(a, &s0);
    arm(0);
    assert_err(alloc_alloc(a, 1000, &off), ECT_ENOMEM, "out of memory");
    disarm();
    assert_int_equal(off, 77);
    alloc_get_stats(a, &s1);
    assert_memory_equal(&s0, &s1, sizeof s0);
    assert_int_equal(alloc_check(a), 0);
    /* Freed nodes are recycled: after a free, the next split needs no heap. */
    assert_int_equal(alloc_alloc(a, 1000, &off), 0);
    uint64_t off2;
    assert_int_equal(alloc_alloc(a, 1000, &off2), 0);
    assert_int_equal(alloc_free(a, off), 0);
    assert_int_equal(alloc_free(a, off2), 0); /* merges: two nodes go spare */
    arm(0);
    assert_int_equal(alloc_alloc(a, 1000, &off), 0);
    disarm();
    assert_int_equal(alloc_check(a), 0);
    alloc_destroy(a);
}

static void test_pool_open(void **state) {
    (void)state;
    SKIP_UNDER_SANITIZER();
    ect_pool_opts o;
    ect_pool_opts_init(&o);
    o.capacity = 4 * MiB;
    for (int memfd = 0; memfd <= 1; memfd++) {
        o.use_memfd = memfd;
        ect_pool *p = NULL;
        int k = 0, rc;
        for (;; k++) {
            long before = live;
            arm(k);
            rc = ect_pool_open(&o, &p);
            disarm();
            if (rc == 0) break;
            assert_err(rc, ECT_ENOMEM, NULL);
            assert_null(p);
            assert_int_equal(live, before);
        }
        assert_true(k >= 3);
        long before = live;
        ect_pool_close(p);
        assert_true(live < before);
    }
}

static void test_put_and_reclaim(void **state) {
    (void)state;
    SKIP_UNDER_SANITIZER();
    ect_pool_opts o;
    ect_pool_opts_init(&o);
    o.capacity = 1 * MiB;
    ect_pool *p;
    assert_int_equal(ect_pool_open(&o, &p), 0);
    /* 256 items of 4 KiB fill the pool; every put fails in each possible
     * place first (entry, either hash table, their growth). */
    int failures = 0;
    for (int i = 0; i < 256; i++) {
        char hash[16];
        snprintf(hash, sizeof hash, "item%d", i);
        uint64_t off, shape[1] = {4096};
        assert_int_equal(ect_pool_alloc(p, 4096, &off), 0);
        for (int k = 0;; k++) {
            long before = live;
            arm(k);
            int rc = ect_pool_put(p, hash, off, 4096, shape, 1, "uint8", 0);
            disarm();
            if (rc == 0) break;
            assert_err(rc, ECT_ENOMEM, "out of memory");
            assert_int_equal(live, before);
            assert_err(ect_pool_lookup(p, hash, NULL), ECT_ENOTFOUND, NULL);
            failures++;
        }
    }
    assert_true(failures > 256); /* the table growth failed somewhere too */
    ect_pool_stat st;
    ect_pool_stats(p, &st);
    assert_int_equal(st.residents, 256);
    assert_int_equal(st.free, 0);
    /* Reclaim needs a victim list: failing it is ENOMEM and nothing is lost. */
    uint64_t off;
    long before = live;
    arm(0);
    assert_err(ect_pool_alloc(p, 4096, &off), ECT_ENOMEM, "out of memory");
    disarm();
    assert_int_equal(live, before);
    ect_pool_stats(p, &st);
    assert_int_equal(st.residents, 256);
    assert_int_equal(st.reclaimed, 0);
    assert_int_equal(ect_pool_alloc(p, 4096, &off), 0);
    ect_pool_stats(p, &st);
    assert_int_equal(st.residents, 255);
    ect_pool_close(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_create_and_split),
        cmocka_unit_test(test_pool_open),
        cmocka_unit_test(test_put_and_reclaim),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
