/* Tests for mem/resident through the pool: put/acquire/lookup/release/remove and
 * their errors, least-recently-used reclaim, leases blocking reclaim, the reclaim
 * callback, and pool full -> reclaim -> retry -> ECT_EFULL. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "mem/pool.h"
#include "mem/resident.h"
#include "util/util.h"

#define MiB (UINT64_C(1) << 20)

/* What the reclaim callback heard, in order. */
typedef struct heard {
    ect_pool *pool;
    int n;
    char hashes[32][ECT_MM_HASH_MAX + 1];
    uint64_t offsets[32], nbytes[32];
    int lookup_rc[32]; /* ect_pool_lookup of the hash from inside the callback */
} heard;

static void on_reclaim(void *user, const char *mm_hash, uint64_t offset, uint64_t nbytes) {
    heard *h = user;
    if (h->n >= 32) return;
    snprintf(h->hashes[h->n], sizeof h->hashes[0], "%s", mm_hash);
    h->offsets[h->n] = offset;
    h->nbytes[h->n] = nbytes;
    /* The pool's mutex is not held here: calling back in must not deadlock. */
    h->lookup_rc[h->n] = ect_pool_lookup(h->pool, mm_hash, NULL);
    h->n++;
}

static ect_pool *open_pool(uint64_t cap, heard *h) {
    ect_pool_opts o;
    ect_pool_opts_init(&o);
    o.capacity = cap;
    o.on_reclaim = h ? on_reclaim : NULL;
    o.reclaim_user = h;
    ect_pool *p = NULL;
    assert_int_equal(ect_pool_open(&o, &p), 0);
    if (h) {
        memset(h, 0, sizeof *h);
        h->pool = p;
    }
    return p;
}

/* Allocates nbytes and makes them resident as a float32 vector. */
static uint64_t put_item(ect_pool *p, const char *hash, uint64_t nbytes, int lease) {
    uint64_t off, shape[1] = {nbytes / 4};
    assert_int_equal(ect_pool_alloc(p, nbytes, &off), 0);
    int rc = ect_pool_put(p, hash, off, nbytes, shape, 1, "float32", lease);
    if (rc) print_error("put %s: %s\n", hash, ect_last_error());
    assert_int_equal(rc, 0);
    return off;
}

static void test_put_errors(void **state) {
    (void)state;
    ect_pool *p = open_pool(4 * MiB, NULL);
    uint64_t off, off2;
    assert_int_equal(ect_pool_alloc(p, 4096, &off), 0);
    uint64_t shape[3] = {2, 4, 128}; /* 1024 bfloat16 = 2048 bytes */
    char longhash[ECT_MM_HASH_MAX + 2];
    memset(longhash, 'h', sizeof longhash - 1);
    longhash[sizeof longhash - 1] = '\0';
    assert_err(ect_pool_put(p, "", off, 2048, shape, 3, "bfloat16", 0), ECT_EINVAL, "mm_hash");
    assert_err(ect_pool_put(p, NULL, off, 2048, shape, 3, "bfloat16", 0), ECT_EINVAL, "mm_hash");
    assert_err(ect_pool_put(p, longhash, off, 2048, shape, 3, "bfloat16", 0), ECT_EINVAL,
               "longer than 255");
    assert_err(ect_pool_put(p, "a", off, 2048, shape, 3, NULL, 0), ECT_EINVAL, "dtype");
    assert_err(ect_pool_put(p, "a", off, 2048, shape, 3, "bogus16", 0), ECT_EINVAL, "dtype");
    assert_err(
        ect_pool_put(p, "a", off, 2048, shape, 3, "a_very_long_dtype_name_that_is_not_real", 0),
        ECT_EINVAL, "dtype");
    assert_err(ect_pool_put(p, "a", off, 2050, shape, 3, "bfloat16", 0), ECT_EINVAL, NULL);
    assert_err(ect_pool_put(p, "a", off, 2048, NULL, 3, "bfloat16", 0), ECT_EINVAL, "shape");
    assert_err(ect_pool_put(p, "a", off, 0, shape, 0, "bfloat16", 0), ECT_EINVAL, "nbytes");
    uint64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 2};
    assert_err(ect_pool_put(p, "a", off, 4, nine, 9, "bfloat16", 0), ECT_EINVAL, "dimensions");
    uint64_t big[1] = {4096}; /* 8192 bytes in a 4096-byte allocation */
    assert_err(ect_pool_put(p, "a", off, 8192, big, 1, "bfloat16", 0), ECT_EINVAL,
               "exceeds the allocation");
    assert_err(ect_pool_put(p, "a", off + 256, 2048, shape, 3, "bfloat16", 0), ECT_ENOTFOUND,
               "not the start of an allocation");
    assert_err(ect_pool_put(p, "a", 3 * MiB, 2048, shape, 3, "bfloat16", 0), ECT_ENOTFOUND, NULL);
    assert_err(ect_pool_put(NULL, "a", off, 2048, shape, 3, "bfloat16", 0), ECT_EINVAL, NULL);
    /* A failed put leaves the caller owning the allocation: it can free it. */
    assert_int_equal(ect_pool_alloc(p, 4096, &off2), 0);
    assert_int_equal(ect_pool_free(p, off2), 0);

    assert_int_equal(ect_pool_put(p, "a", off, 2048, shape, 3, "torch.bfloat16", 0), 0);
    assert_int_equal(ect_pool_alloc(p, 4096, &off2), 0);
    assert_err(ect_pool_put(p, "a", off2, 2048, shape, 3, "bfloat16", 0), ECT_EEXIST,
               "already resident");
    assert_err(ect_pool_put(p, "b", off, 2048, shape, 3, "bfloat16", 0), ECT_EEXIST,
               "already belongs to 'a'");
    /* The resident owns its memory now: a plain free is refused. */
    assert_err(ect_pool_free(p, off), ECT_EBUSY, "ect_pool_remove");
    assert_int_equal(ect_pool_free(p, off2), 0);

    ect_resident_info info;
    assert_int_equal(ect_pool_lookup(p, "a", &info), 0);
    assert_int_equal(info.offset, off);
    assert_int_equal(info.nbytes, 2048);
    assert_int_equal(info.ndim, 3);
    assert_int_equal(info.shape[0], 2);
    assert_int_equal(info.shape[2], 128);
    assert_int_equal(info.shape[3], 0);
    assert_string_equal(info.dtype, "torch.bfloat16");
    assert_int_equal(info.leases, 0);
    ect_pool_close(p); /* frees the resident too (leak-checked under ASan) */
}

static void test_lease_release_remove_errors(void **state) {
    (void)state;
    ect_pool *p = open_pool(4 * MiB, NULL);
    ect_resident_info info;
    assert_err(ect_pool_lookup(p, "x", &info), ECT_ENOTFOUND, "'x' is not resident");
    assert_err(ect_pool_acquire(p, "x", &info), ECT_ENOTFOUND, "not resident");
    assert_err(ect_pool_release(p, "x"), ECT_ENOTFOUND, "not resident");
    assert_err(ect_pool_remove(p, "x"), ECT_ENOTFOUND, "not resident");
    assert_err(ect_pool_lookup(p, "", NULL), ECT_EINVAL, "mm_hash");
    assert_err(ect_pool_release(p, NULL), ECT_EINVAL, "mm_hash");
    assert_err(ect_pool_acquire(NULL, "x", NULL), ECT_EINVAL, NULL);

    uint64_t off = put_item(p, "x", 1000, 1); /* put with one lease */
    assert_int_equal(ect_pool_acquire(p, "x", &info), 0);
    assert_int_equal(info.leases, 2);
    ect_pool_stat st;
    ect_pool_stats(p, &st);
    assert_int_equal(st.residents, 1);
    assert_int_equal(st.leased, 1);
    assert_int_equal(st.resident_bytes, 1024);
    assert_err(ect_pool_remove(p, "x"), ECT_EBUSY, "leased");
    assert_int_equal(ect_pool_release(p, "x"), 0);
    assert_err(ect_pool_remove(p, "x"), ECT_EBUSY, "1 leases");
    assert_int_equal(ect_pool_release(p, "x"), 0);
    assert_err(ect_pool_release(p, "x"), ECT_ESTATE, "no lease");
    ect_pool_stats(p, &st);
    assert_int_equal(st.leased, 0);
    assert_int_equal(ect_pool_remove(p, "x"), 0);
    assert_err(ect_pool_lookup(p, "x", NULL), ECT_ENOTFOUND, NULL);
    /* Remove freed the memory: the offset is free space again. */
    assert_err(ect_pool_free(p, off), ECT_ESTATE, "not allocated");
    ect_pool_stats(p, &st);
    assert_int_equal(st.residents, 0);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.fragments, 1);
    ect_pool_close(p);
}

static void test_lru_order_and_callback(void **state) {
    (void)state;
    heard h;
    ect_pool *p = open_pool(4 * MiB, &h);
    uint64_t oa = put_item(p, "A", MiB, 0);
    uint64_t ob = put_item(p, "B", MiB, 0);
    uint64_t oc = put_item(p, "C", MiB, 0);
    uint64_t od = put_item(p, "D", MiB, 0);
    (void)oa;
    /* Using A makes B the least recently used. */
    assert_int_equal(ect_pool_lookup(p, "A", NULL), 0);
    uint64_t x;
    assert_int_equal(ect_pool_alloc(p, MiB, &x), 0);
    assert_int_equal(x, ob);
    assert_int_equal(h.n, 1);
    assert_string_equal(h.hashes[0], "B");
    assert_int_equal(h.offsets[0], ob);
    assert_int_equal(h.nbytes[0], MiB);
    assert_int_equal(h.lookup_rc[0], ECT_ENOTFOUND); /* already gone when told */
    /* 2 MiB: C alone is not enough, C then D are (adjacent), A stays. */
    uint64_t y;
    assert_int_equal(ect_pool_alloc(p, 2 * MiB, &y), 0);
    assert_int_equal(y, oc);
    assert_int_equal(h.n, 3);
    assert_string_equal(h.hashes[1], "C");
    assert_string_equal(h.hashes[2], "D");
    assert_int_equal(h.offsets[2], od);
    assert_int_equal(ect_pool_lookup(p, "A", NULL), 0);
    ect_pool_stat st;
    ect_pool_stats(p, &st);
    assert_int_equal(st.reclaimed, 3);
    assert_int_equal(st.residents, 1);
    assert_int_equal(st.free, 0);
    ect_pool_close(p);
}

static void test_release_counts_as_use(void **state) {
    (void)state;
    heard h;
    ect_pool *p = open_pool(2 * MiB, &h);
    put_item(p, "old", MiB, 1);
    put_item(p, "new", MiB, 0);
    /* "old" was put first but released last: "new" is now least recently used. */
    assert_int_equal(ect_pool_release(p, "old"), 0);
    assert_int_equal(ect_pool_reclaim(p, MiB), 0);
    assert_int_equal(h.n, 1);
    assert_string_equal(h.hashes[0], "new");
    ect_pool_close(p);
}

static void test_leases_block_reclaim_then_full(void **state) {
    (void)state;
    heard h;
    ect_pool *p = open_pool(4 * MiB, &h);
    put_item(p, "L1", MiB, 1); /* leased from the put */
    put_item(p, "U1", MiB, 0);
    put_item(p, "L2", MiB, 0);
    put_item(p, "U2", MiB, 0);
    assert_int_equal(ect_pool_acquire(p, "L2", NULL), 0);
    /* Oldest first, skipping the leased: U1 goes, not L1. */
    uint64_t x;
    assert_int_equal(ect_pool_alloc(p, MiB, &x), 0);
    assert_int_equal(h.n, 1);
    assert_string_equal(h.hashes[0], "U1");
    /* 2 MiB cannot fit even if U2, the only unleased item (1 MiB), went: so
     * nothing may be reclaimed in vain. */
    uint64_t y = 12345;
    assert_err(ect_pool_alloc(p, 2 * MiB, &y), ECT_EFULL, "pool is full");
    assert_true(strstr(ect_last_error(), "of them leased") != NULL);
    assert_int_equal(y, 12345);
    assert_int_equal(h.n, 1);
    assert_int_equal(ect_pool_lookup(p, "U2", NULL), 0);
    /* Leased items survive any pressure; U2 goes for a 1 MiB request. */
    assert_int_equal(ect_pool_free(p, x), 0);
    assert_int_equal(ect_pool_alloc(p, MiB, &x), 0); /* fits without reclaim */
    assert_int_equal(h.n, 1);
    assert_int_equal(ect_pool_alloc(p, MiB, &y), 0);
    assert_int_equal(h.n, 2);
    assert_string_equal(h.hashes[1], "U2");
    assert_err(ect_pool_alloc(p, 1, &y), ECT_EFULL, "pool is full");
    assert_int_equal(ect_pool_lookup(p, "L1", NULL), 0);
    assert_int_equal(ect_pool_lookup(p, "L2", NULL), 0);
    /* Once released they can go. */
    assert_int_equal(ect_pool_release(p, "L1"), 0);
    assert_int_equal(ect_pool_alloc(p, 1, &y), 0);
    assert_int_equal(h.n, 3);
    assert_string_equal(h.hashes[2], "L1");
    ect_pool_close(p);
}

/* Reclaim frees every unleased item yet the request still does not fit (the
 * freed blocks are separated by leased ones): ECT_EFULL, and the owner still
 * hears of every item that was reclaimed; the error detail survives the
 * callbacks (which themselves call into the pool). */
static void test_fragmented_reclaim_still_full(void **state) {
    (void)state;
    heard h;
    ect_pool *p = open_pool(4 * MiB, &h);
    put_item(p, "u0", MiB, 0);
    put_item(p, "l1", MiB, 1);
    put_item(p, "u2", MiB, 0);
    put_item(p, "l3", MiB, 1);
    uint64_t y;
    /* 2 MiB of unleased items could make room in principle, but they are not adjacent. */
    assert_err(ect_pool_alloc(p, 2 * MiB, &y), ECT_EFULL, "pool is full");
    assert_true(strstr(ect_last_error(), "2097152 bytes requested") != NULL);
    assert_int_equal(h.n, 2);
    assert_string_equal(h.hashes[0], "u0");
    assert_string_equal(h.hashes[1], "u2");
    ect_pool_stat st;
    ect_pool_stats(p, &st);
    assert_int_equal(st.fragments, 2);
    assert_int_equal(st.largest_free, MiB);
    assert_int_equal(st.residents, 2);
    assert_int_equal(st.leased, 2);
    ect_pool_close(p);
}

/* The internal cache directly: victims are reported and the owner lookup works. */
static void test_resident_internal(void **state) {
    (void)state;
    alloc *a;
    resident_cache *c;
    assert_int_equal(alloc_create(4096, 256, &a), 0);
    assert_int_equal(resident_create(a, &c), 0);
    uint64_t o1, o2, shape[1] = {256};
    assert_int_equal(alloc_alloc(a, 2048, &o1), 0);
    assert_int_equal(alloc_alloc(a, 2048, &o2), 0);
    assert_int_equal(resident_put(c, "one", o1, 1024, shape, 1, "float32", false), 0);
    assert_int_equal(resident_put(c, "two", o2, 1024, shape, 1, "float32", false), 0);
    assert_string_equal(resident_owner(c, o2), "two");
    assert_null(resident_owner(c, o2 + 256));
    resident_victim *v = NULL;
    size_t nv = 0;
    assert_err(resident_reclaim(c, 0, &v, &nv), ECT_EINVAL, "nbytes");
    assert_err(resident_reclaim(c, 8192, &v, &nv), ECT_EFULL, NULL);
    assert_int_equal(nv, 0);
    assert_int_equal(resident_reclaim(c, 4096, &v, &nv), 0);
    assert_int_equal(nv, 2);
    assert_string_equal(v[0].mm_hash, "one");
    assert_int_equal(v[1].offset, o2);
    assert_int_equal(v[1].nbytes, 1024);
    free(v);
    resident_stats rs;
    resident_get_stats(c, &rs);
    assert_int_equal(rs.count, 0);
    assert_int_equal(rs.reclaimed, 2);
    assert_int_equal(alloc_check(a), 0);
    resident_destroy(c);
    resident_destroy(NULL);
    alloc_destroy(a);
}

/* A writer still active vetoes reclaiming its range: the next victim is
 * taken instead, and the vetoed one goes once the writer is done. */
static uint64_t busy_offset = UINT64_MAX;
static bool busy_at(void *ctx, uint64_t offset, uint64_t nbytes) {
    (void)ctx;
    return busy_offset >= offset && busy_offset < offset + nbytes;
}

static void test_writer_veto(void **state) {
    (void)state;
    alloc *a;
    resident_cache *c;
    assert_int_equal(alloc_create(4096, 256, &a), 0);
    assert_int_equal(resident_create(a, &c), 0);
    resident_set_veto(c, busy_at, NULL);
    uint64_t o[2], shape[1] = {256};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(alloc_alloc(a, 2048, &o[i]), 0);
        char h[8];
        snprintf(h, sizeof h, "h%d", i);
        assert_int_equal(resident_put(c, h, o[i], 1024, shape, 1, "float32", false), 0);
    }
    busy_offset = o[0] + 100; /* the oldest is being written into */
    resident_victim *v = NULL;
    size_t nv = 0;
    assert_int_equal(resident_reclaim(c, 2048, &v, &nv), 0);
    assert_int_equal(nv, 1);
    assert_string_equal(v[0].mm_hash, "h1"); /* passed over h0 */
    free(v);
    v = NULL;
    nv = 0;
    assert_int_equal(resident_reclaim(c, 4096, &v, &nv), ECT_EFULL);
    resident_victim one;
    assert_err(resident_reclaim_one(c, &one, NULL), ECT_ENOTFOUND, NULL);
    busy_offset = UINT64_MAX; /* done writing */
    assert_int_equal(resident_reclaim_one(c, &one, NULL), 0);
    assert_string_equal(one.mm_hash, "h0");
    assert_int_equal(alloc_check(a), 0);
    free(v);
    resident_destroy(c);
    alloc_destroy(a);
}

/* Without an alloc the owner keeps the memory: the cache orders, leases,
 * carries the owner's pointer and picks victims one at a time; peek and each
 * read without counting as a use. */
static int each_n;
static void count_each(void *ctx, const char *mm_hash, const ect_resident_info *info) {
    (void)ctx;
    char want[8];
    snprintf(want, sizeof want, "k%d", each_n);
    assert_string_equal(mm_hash, want);
    assert_int_equal(info->offset, (uint64_t)each_n * 100);
    each_n++;
}

static void test_owner_keeps_memory(void **state) {
    (void)state;
    resident_cache *c;
    assert_int_equal(resident_create(NULL, &c), 0);
    int owners[3];
    for (int i = 0; i < 3; i++) {
        char h[8];
        snprintf(h, sizeof h, "k%d", i);
        /* no alloc: any offset, any size, no tensor check */
        assert_int_equal(resident_put(c, h, (uint64_t)i * 100, 7, NULL, 0, "x", i == 1), 0);
        assert_int_equal(resident_bind(c, h, &owners[i]), 0);
    }
    assert_err(resident_bind(c, "nope", NULL), ECT_ENOTFOUND, "nope");
    assert_ptr_equal(resident_user(c, "k2"), &owners[2]);
    assert_null(resident_user(c, "nope"));
    each_n = 0;
    resident_each(c, count_each, NULL);
    assert_int_equal(each_n, 3);
    ect_resident_info info;
    assert_int_equal(resident_peek(c, "k0", &info), 0); /* not a use: k0 stays oldest */
    assert_int_equal(info.nbytes, 7);
    resident_victim v;
    void *user = NULL;
    assert_int_equal(resident_reclaim_one(c, &v, &user), 0);
    assert_string_equal(v.mm_hash, "k0");
    assert_ptr_equal(user, &owners[0]);
    assert_int_equal(resident_get(c, "k2", false, NULL), 0); /* a use: k2 newest */
    assert_int_equal(resident_release(c, "k1"), 0);          /* k1 released: newest */
    assert_int_equal(resident_reclaim_one(c, &v, &user), 0);
    assert_string_equal(v.mm_hash, "k2");
    assert_int_equal(resident_remove(c, "k1"), 0);
    assert_err(resident_reclaim_one(c, &v, &user), ECT_ENOTFOUND, NULL);
    resident_victim *vs = NULL;
    size_t nv = 0;
    assert_err(resident_reclaim(c, 1, &vs, &nv), ECT_EINVAL, "alloc");
    resident_destroy(c);
}

/* Entries are reused: rounds of 256 items put and removed (a shard with 8
 * steps of 32 items resident) allocate 256 entries in all, and each round's
 * items read back as put. */
#define REUSE_ITEMS 256
static void test_entries_reused(void **state) {
    (void)state;
    resident_cache *c;
    assert_int_equal(resident_create(NULL, &c), 0);
    for (int round = 0; round < 3; round++) {
        char h[32];
        for (int i = 0; i < REUSE_ITEMS; i++) {
            snprintf(h, sizeof h, "r%d-%d", round, i);
            uint64_t shape[1] = {(uint64_t)i + 1};
            assert_int_equal(
                resident_put(c, h, (uint64_t)i * 100, (uint64_t)i + 1, shape, 1, "uint8", false),
                0);
        }
        for (int i = 0; i < REUSE_ITEMS; i++) {
            snprintf(h, sizeof h, "r%d-%d", round, i);
            ect_resident_info info;
            assert_int_equal(resident_peek(c, h, &info), 0);
            assert_int_equal(info.offset, (uint64_t)i * 100);
            assert_int_equal(info.nbytes, (uint64_t)i + 1);
            assert_int_equal(info.leases, 0);
            assert_string_equal(info.dtype, "uint8");
            assert_int_equal(resident_remove(c, h), 0);
        }
        resident_stats st;
        resident_get_stats(c, &st);
        assert_int_equal(st.count, 0);
        assert_int_equal(st.allocated, REUSE_ITEMS);
    }
    resident_destroy(c);
}

/* A producer thread keeps writing items into a small pool (so reclaim runs
 * all the time) while a reader thread leases recent items and checks their
 * bytes: a lease must keep an item's memory from being reclaimed and reused. */
typedef struct shared {
    ect_pool *p;
    atomic_int produced;
    atomic_int reclaimed;
    atomic_int done;
    int errors, verified;
} shared;

static void count_reclaim(void *user, const char *mm_hash, uint64_t offset, uint64_t nbytes) {
    (void)mm_hash, (void)offset, (void)nbytes;
    atomic_fetch_add(&((shared *)user)->reclaimed, 1);
}

#define ITEM (UINT64_C(16) << 10)

static void *producer_main(void *arg) {
    shared *sh = arg;
    unsigned char *base = ect_pool_base(sh->p);
    for (int i = 0; i < 3000; i++) {
        char hash[32];
        snprintf(hash, sizeof hash, "h%d", i);
        uint64_t off, shape[1] = {ITEM};
        if (ect_pool_alloc(sh->p, ITEM, &off)) {
            sh->errors++;
            break;
        }
        test_fill_pattern(base + off, ITEM, (uint64_t)i);
        if (ect_pool_put(sh->p, hash, off, ITEM, shape, 1, "uint8", 0)) sh->errors++;
        atomic_store(&sh->produced, i + 1);
    }
    atomic_store(&sh->done, 1);
    return NULL;
}

static void *reader_main(void *arg) {
    shared *sh = arg;
    unsigned char *base = ect_pool_base(sh->p);
    uint64_t rs = 3;
    while (!atomic_load(&sh->done)) {
        int n = atomic_load(&sh->produced);
        if (n == 0) continue;
        int j = n - 1 - (int)(test_rand(&rs) % 8);
        if (j < 0) continue;
        char hash[32];
        snprintf(hash, sizeof hash, "h%d", j);
        ect_resident_info info;
        int rc = ect_pool_acquire(sh->p, hash, &info);
        if (rc == ECT_ENOTFOUND) continue;
        if (rc) {
            sh->errors++;
            break;
        }
        if (!test_check_pattern(base + info.offset, ITEM, (uint64_t)j)) sh->errors++;
        sh->verified++;
        if (ect_pool_release(sh->p, hash)) sh->errors++;
    }
    return NULL;
}

static void test_threads_lease_protects_from_reclaim(void **state) {
    (void)state;
    shared sh = {0};
    ect_pool_opts o;
    ect_pool_opts_init(&o);
    o.capacity = 16 * ITEM;
    o.on_reclaim = count_reclaim;
    o.reclaim_user = &sh;
    assert_int_equal(ect_pool_open(&o, &sh.p), 0);
    pthread_t t[2];
    assert_int_equal(pthread_create(&t[0], NULL, producer_main, &sh), 0);
    assert_int_equal(pthread_create(&t[1], NULL, reader_main, &sh), 0);
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    assert_int_equal(sh.errors, 0);
    assert_true(sh.verified > 0);
    assert_int_equal(atomic_load(&sh.produced), 3000);
    assert_true(atomic_load(&sh.reclaimed) >= 3000 - 16);
    ect_pool_stat st;
    ect_pool_stats(sh.p, &st);
    assert_int_equal(st.reclaimed, (uint64_t)atomic_load(&sh.reclaimed));
    assert_int_equal(st.leased, 0);
    ect_pool_close(sh.p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_errors),
        cmocka_unit_test(test_lease_release_remove_errors),
        cmocka_unit_test(test_lru_order_and_callback),
        cmocka_unit_test(test_release_counts_as_use),
        cmocka_unit_test(test_leases_block_reclaim_then_full),
        cmocka_unit_test(test_fragmented_reclaim_still_full),
        cmocka_unit_test(test_resident_internal),
        cmocka_unit_test(test_writer_veto),
        cmocka_unit_test(test_owner_keeps_memory),
        cmocka_unit_test(test_entries_reused),
        cmocka_unit_test(test_threads_lease_protects_from_reclaim),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
