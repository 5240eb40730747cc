/* Tests for mem/alloc: every error case, first-fit order, coalescing, stats, and
 * random operations against a trivial reference model. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "testutil.h"
#include "mem/alloc.h"
#include "util/util.h"

static void test_create_rejects_bad_options(void **state) {
    (void)state;
    alloc *a = (alloc *)1;
    assert_err(alloc_create(1 << 20, 0, &a), ECT_EINVAL, "alignment");
    assert_null(a);
    assert_err(alloc_create(1 << 20, 3, &a), ECT_EINVAL, "alignment");
    assert_err(alloc_create(1ull << 40, 1ull << 31, &a), ECT_EINVAL, "alignment");
    assert_err(alloc_create(0, 256, &a), ECT_EINVAL, "capacity");
    assert_err(alloc_create(255, 256, &a), ECT_EINVAL, "capacity");
    assert_err(alloc_create(ALLOC_MAX_CAPACITY + 1, 256, &a), ECT_EINVAL, "capacity");
    assert_int_equal(alloc_create(256, 256, &a), 0);
    alloc_destroy(a);
    alloc_destroy(NULL);
}

static void test_alloc_and_free_errors(void **state) {
    (void)state;
    alloc *a;
    assert_int_equal(alloc_create(4096, 256, &a), 0);
    uint64_t off = 99;
    assert_err(alloc_alloc(a, 0, &off), ECT_EINVAL, "nbytes");
    assert_err(alloc_alloc(a, 4097, &off), ECT_EFULL, "pool is full");
    assert_err(alloc_alloc(a, UINT64_MAX, &off), ECT_EFULL, "pool is full");
    assert_int_equal(off, 99);
    /* Frees of ranges never allocated, out of range, mid-block, double. */
    assert_err(alloc_free(a, 0), ECT_ESTATE, "not allocated");
    assert_err(alloc_free(a, 4096), ECT_ERANGE, "capacity");
    assert_err(alloc_free(a, UINT64_MAX), ECT_ERANGE, "capacity");
    assert_int_equal(alloc_alloc(a, 1000, &off), 0);
    assert_int_equal(off, 0);
    assert_err(alloc_free(a, 256), ECT_ENOTFOUND, "not its start");
    assert_err(alloc_free(a, 1), ECT_ENOTFOUND, "not its start");
    assert_err(alloc_free(a, 1024), ECT_ESTATE, "not allocated");
    assert_int_equal(alloc_free(a, 0), 0);
    assert_err(alloc_free(a, 0), ECT_ESTATE, "double free");
    assert_int_equal(alloc_check(a), 0);
    /* Completely full, then nothing fits. */
    assert_int_equal(alloc_alloc(a, 4096, &off), 0);
    alloc_stats st;
    alloc_get_stats(a, &st);
    assert_int_equal(st.fragments, 0);
    assert_int_equal(st.largest_free, 0);
    assert_err(alloc_alloc(a, 1, &off), ECT_EFULL, "pool is full");
    assert_int_equal(alloc_check(a), 0);
    alloc_destroy(a);
}

static void test_first_fit_rounding_and_coalescing(void **state) {
    (void)state;
    alloc *a;
    assert_int_equal(alloc_create(10 * 256 + 100, 256, &a), 0);
    alloc_stats st;
    alloc_get_stats(a, &st);
    assert_int_equal(st.capacity, 2560); /* the 100-byte tail is not usable */
    assert_int_equal(alloc_round(a, 1), 256);
    assert_int_equal(alloc_round(a, 256), 256);
    assert_int_equal(alloc_round(a, 257), 512);
    assert_int_equal(alloc_round(a, 0), 0);
    assert_int_equal(alloc_round(a, UINT64_MAX), 0);
    uint64_t o[5];
    for (int i = 0; i < 5; i++) {
        assert_int_equal(alloc_alloc(a, 300, &o[i]), 0); /* 512 each */
        assert_int_equal(o[i], (uint64_t)i * 512);
        assert_int_equal(alloc_size_of(a, o[i]), 512);
    }
    assert_err(alloc_alloc(a, 1, &o[0]), ECT_EFULL, NULL);
    /* Holes at 0 and 1024 (512 each): a 256 request takes the first one. */
    assert_int_equal(alloc_free(a, 0), 0);
    assert_int_equal(alloc_free(a, 1024), 0);
    alloc_get_stats(a, &st);
    assert_int_equal(st.fragments, 2);
    assert_int_equal(st.largest_free, 512);
    assert_int_equal(alloc_size_of(a, 0), 0);
    uint64_t x;
    assert_err(alloc_alloc(a, 513, &x), ECT_EFULL, NULL);
    assert_int_equal(alloc_alloc(a, 256, &x), 0);
    assert_int_equal(x, 0);
    assert_int_equal(alloc_alloc(a, 512, &x), 0);
    assert_int_equal(x, 1024);
    /* Free the middle, then its left neighbour, then the right: one block. */
    assert_int_equal(alloc_free(a, 0), 0);   /* free [0,256) */
    assert_int_equal(alloc_free(a, 512), 0); /* [0,256) free, [256,512) free, [512,1024) */
    alloc_get_stats(a, &st);                 /* coalesced with both neighbours */
    assert_int_equal(st.fragments, 1);
    assert_int_equal(st.largest_free, 1024);
    assert_int_equal(alloc_free(a, 1536), 0);
    assert_int_equal(alloc_free(a, 1024), 0); /* joins left [0,1024) and right [1536,2048) */
    assert_int_equal(alloc_free(a, 2048), 0);
    alloc_get_stats(a, &st);
    assert_int_equal(st.fragments, 1);
    assert_int_equal(st.largest_free, 2560);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.allocations, 0);
    assert_int_equal(alloc_check(a), 0);
    alloc_destroy(a);
}

static void test_huge_capacities(void **state) {
    (void)state;
    alloc *a;
    assert_int_equal(alloc_create(ALLOC_MAX_CAPACITY, 256, &a), 0);
    uint64_t o1, o2, o3;
    assert_int_equal(alloc_alloc(a, 1ull << 61, &o1), 0);
    assert_int_equal(alloc_alloc(a, (1ull << 40) + 1, &o2), 0);
    assert_int_equal(o2, 1ull << 61);
    assert_int_equal(alloc_alloc(a, 5, &o3), 0);
    assert_int_equal(o3, (1ull << 61) + (1ull << 40) + 256);
    assert_err(alloc_alloc(a, 1ull << 61, &o1), ECT_EFULL, NULL);
    assert_int_equal(alloc_free(a, o2), 0);
    assert_int_equal(alloc_free(a, 0), 0);
    assert_int_equal(alloc_free(a, o3), 0);
    alloc_stats st;
    alloc_get_stats(a, &st);
    assert_int_equal(st.largest_free, ALLOC_MAX_CAPACITY);
    assert_int_equal(st.fragments, 1);
    alloc_destroy(a);
}

/* ---- the reference model -------------------------------------------------
 * A map with one byte per alignment unit of the capacity (every offset and size
 * the allocator deals in is a multiple of the alignment, so this is exact): 0 =
 * free, 1 = allocated. Its first fit is the plainest scan there is. Live
 * allocations are kept in an array for random frees. */
typedef struct model {
    uint64_t align, units;
    unsigned char *map;
    uint64_t *len; /* units of the allocation starting at a unit, 0 elsewhere */
    uint64_t *live;
    size_t nlive;
    uint64_t used_units;
} model;

static void model_init(model *m, uint64_t cap, uint64_t align) {
    m->align = align;
    m->units = cap / align;
    m->map = calloc(m->units, 1);
    m->len = calloc(m->units, sizeof *m->len);
    m->live = calloc(m->units, sizeof *m->live);
    m->nlive = 0;
    m->used_units = 0;
    assert_non_null(m->map);
    assert_non_null(m->len);
    assert_non_null(m->live);
}

static void model_fini(model *m) {
    free(m->map);
    free(m->len);
    free(m->live);
}

/* First unit of the first free run of `need` units, or -1. */
static int64_t model_first_fit(const model *m, uint64_t need) {
    uint64_t i = 0;
    while (i < m->units) {
        if (m->map[i]) {
            i += m->len[i]; /* a used run always starts with its allocation's length */
            continue;
        }
        const unsigned char *u = memchr(m->map + i, 1, m->units - i);
        uint64_t end = u ? (uint64_t)(u - m->map) : m->units;
        if (end - i >= need) return (int64_t)i;
        i = end;
    }
    return -1;
}

/* Expected result of freeing byte offset `off`. */
static int model_free_result(const model *m, uint64_t off) {
    if (off >= m->units * m->align) return ECT_ERANGE;
    uint64_t u = off / m->align;
    if (!m->map[u]) return ECT_ESTATE;
    if (off % m->align || m->len[u] == 0) return ECT_ENOTFOUND;
    return 0;
}

static uint64_t model_fragments(const model *m) {
    uint64_t n = 0;
    for (uint64_t i = 0; i < m->units; i++)
        if (!m->map[i] && (i == 0 || m->map[i - 1])) n++;
    return n;
}

static void model_take(model *m, uint64_t unit, uint64_t n) {
    assert_null(memchr(m->map + unit, 1, n)); /* no overlap */
    memset(m->map + unit, 1, n);
    m->len[unit] = n;
    m->live[m->nlive++] = unit;
    m->used_units += n;
}

static void model_drop(model *m, size_t idx) {
    uint64_t unit = m->live[idx];
    memset(m->map + unit, 0, m->len[unit]);
    m->used_units -= m->len[unit];
    m->len[unit] = 0;
    m->live[idx] = m->live[--m->nlive];
}

static void check_against_model(alloc *a, const model *m) {
    alloc_stats st;
    alloc_get_stats(a, &st);
    assert_int_equal(alloc_check(a), 0);
    assert_int_equal(st.used, m->used_units * m->align);
    assert_int_equal(st.allocations, m->nlive);
    assert_int_equal(st.fragments, model_fragments(m));
}

/* Runs `ops` random operations; sizes up to max_units units (occasionally 0
 * or far beyond the capacity), frees of live, stale and arbitrary offsets. */
static void run_model(uint64_t cap, uint64_t align, uint64_t max_units, long ops, uint64_t seed) {
    alloc *a;
    assert_int_equal(alloc_create(cap, align, &a), 0);
    model m;
    model_init(&m, cap, align);
    uint64_t rs = seed, succeeded = 0, failed = 0;
    for (long op = 0; op < ops; op++) {
        uint64_t r = test_rand(&rs);
        unsigned kind = (unsigned)(r % 100);
        if (kind < 48 || m.nlive == 0) {
            uint64_t nbytes, s = test_rand(&rs);
            if (kind == 0)
                nbytes = 0;
            else if (kind == 1)
                nbytes = m.units * align + 1 + (s >> 8) % (UINT64_MAX / 2);
            else if (s % 8 == 0) /* occasional large */
                nbytes = 1 + (s >> 3) % (max_units * align);
            else
                nbytes = 1 + (s >> 3) % (max_units * align / 16 + 1);
            uint64_t off = UINT64_MAX;
            int rc = alloc_alloc(a, nbytes, &off);
            if (nbytes == 0) {
                assert_int_equal(rc, ECT_EINVAL);
                continue;
            }
            uint64_t need = (nbytes + align - 1) / align;
            int64_t want = nbytes > m.units * align ? -1 : model_first_fit(&m, need);
            if (want < 0) {
                assert_int_equal(rc, ECT_EFULL);
                assert_int_equal(off, UINT64_MAX);
                failed++;
            } else {
                assert_int_equal(rc, 0);
                assert_int_equal(off, (uint64_t)want * align); /* same first fit */
                model_take(&m, (uint64_t)want, need);
                succeeded++;
            }
        } else if (kind < 96) {
            size_t idx = (size_t)(test_rand(&rs) % m.nlive);
            assert_int_equal(alloc_free(a, m.live[idx] * align), 0);
            model_drop(&m, idx);
        } else {
            /* A free the allocator must refuse or accept exactly as the model says. */
            uint64_t off;
            uint64_t s = test_rand(&rs);
            if (kind == 96)
                off = s % (m.units * align + 4 * align);
            else
                off = (s % (m.units + 2)) * align;
            int want = model_free_result(&m, off);
            int rc = alloc_free(a, off);
            assert_int_equal(rc, want);
            if (want == 0) {
                for (size_t i = 0; i < m.nlive; i++)
                    if (m.live[i] == off / align) {
                        model_drop(&m, i);
                        break;
                    }
            }
        }
        alloc_stats st;
        alloc_get_stats(a, &st);
        assert_int_equal(st.used, m.used_units * align);
        if (op % 50000 == 0) check_against_model(a, &m);
    }
    check_against_model(a, &m);
    /* Both outcomes happened a fair number of times, or the test proves little. */
    assert_true(succeeded > (uint64_t)ops / 10);
    assert_true(failed > (uint64_t)ops / 1000);
    while (m.nlive) {
        size_t idx = (size_t)(test_rand(&rs) % m.nlive);
        assert_int_equal(alloc_free(a, m.live[idx] * align), 0);
        model_drop(&m, idx);
    }
    alloc_stats st;
    alloc_get_stats(a, &st);
    assert_int_equal(alloc_check(a), 0);
    assert_int_equal(st.fragments, 1);
    assert_int_equal(st.largest_free, m.units * align);
    assert_int_equal(st.used, 0);
    model_fini(&m);
    alloc_destroy(a);
}

static void test_model_small_capacity_1m_ops(void **state) {
    (void)state;
    /* 1 MiB + 100 bytes, 256-byte alignment: 4096 units; requests up to 256 KiB. */
    run_model((1u << 20) + 100, 256, 1024, 1000000, 42);
}

static void test_model_large_capacity(void **state) {
    (void)state;
    /* 1 TiB with 16 MiB alignment: 65536 units; requests up to 64 GiB. */
    run_model(1ull << 40, 1ull << 24, 4096, 200000, 7);
}

static void test_model_byte_alignment(void **state) {
    (void)state;
    /* Alignment 1: every byte is a unit. */
    run_model(8192, 1, 512, 100000, 99);
}

/* `ect bench alloc`: runs, answers --help and bad flags, and at 100,000
 * fragments the tree beats the linear scan by far (the ratio is in the
 * hundreds on a quiet machine; 5 leaves room for a loaded or sanitized one). */
static int run_cmd(const char *cmd, char *out, size_t cap) {
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_bench_alloc_cli(void **state) {
    (void)state;
    const char *bin = getenv("ECT_BIN");
    if (!bin) skip();
    char cmd[4096], out[8192];
    snprintf(cmd, sizeof cmd, "'%s' bench alloc --help", bin);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "usage: ect bench alloc"));
    snprintf(cmd, sizeof cmd, "'%s' bench alloc --bogus 2>&1", bin);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "try 'ect bench alloc --help'"));
    snprintf(cmd, sizeof cmd, "'%s' bench alloc --ms 0 2>&1", bin);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "'%s' bench alloc --ms 30 --json", bin);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    const char *key = "{\"workload\":\"skip\",\"fragments\":100001,";
    const char *row = strstr(out, key);
    assert_non_null(row);
    double tree = 0, lin = 0;
    assert_int_equal(
        sscanf(row + strlen(key), "\"tree_ops_per_s\":%lf,\"linear_ops_per_s\":%lf", &tree, &lin),
        2);
    assert_true(tree > 0 && lin > 0);
    assert_true(tree > 5 * lin);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_rejects_bad_options),
        cmocka_unit_test(test_alloc_and_free_errors),
        cmocka_unit_test(test_first_fit_rounding_and_coalescing),
        cmocka_unit_test(test_huge_capacities),
        cmocka_unit_test(test_model_small_capacity_1m_ops),
        cmocka_unit_test(test_model_large_capacity),
        cmocka_unit_test(test_model_byte_alignment),
        cmocka_unit_test(test_bench_alloc_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
