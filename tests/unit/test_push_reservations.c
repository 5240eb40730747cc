/*
 * Tests for push/reservations: every op and transition of the consumer
 * shard's state machine, the spec's fault cases at the pure level, and a
 * random-operation run against invariants. A fake pool checks every free
 * (no double free, never a range a writer may still write) and each
 * scenario ends with the pool's used bytes back at zero.
 */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "push/reservations.h"

#define S 1000ull /* ms per second */
#define TTL (300 * S)
#define MAXA 512

/* ---- fake pool: first fit over slots of `unit` bytes */
typedef struct fake_pool {
    uint64_t capacity, used;
    uint64_t off[MAXA], size[MAXA];
    bool live[MAXA], writing[MAXA]; /* writing: a remote writer may write there */
    size_t n;
    int fail_next; /* ECT_E* to return from the next alloc, 0 none */
    bool quiet;    /* write_active answers false */
    unsigned frees, allocs;
} fake_pool;

static int find_slot(fake_pool *p, uint64_t off) {
    for (size_t i = 0; i < p->n; i++)
        if (p->live[i] && p->off[i] == off) return (int)i;
    return -1;
}

static int fake_alloc(void *ctx, uint64_t nbytes, uint64_t *offset) {
    fake_pool *p = ctx;
    if (p->fail_next) {
        int rc = p->fail_next;
        p->fail_next = 0;
        return rc;
    }
    /* first fit over [0, capacity) */
    uint64_t at = 0;
    for (;;) {
        bool moved = false;
        for (size_t i = 0; i < p->n; i++)
            if (p->live[i] && at < p->off[i] + p->size[i] && p->off[i] < at + nbytes) {
                at = p->off[i] + p->size[i];
                moved = true;
            }
        if (!moved) break;
    }
    if (at + nbytes > p->capacity) return ECT_EFULL;
    size_t i = 0;
    while (i < p->n && p->live[i]) i++;
    assert_true(i < MAXA);
    if (i == p->n) p->n++;
    p->off[i] = at;
    p->size[i] = nbytes;
    p->live[i] = true;
    p->writing[i] = false;
    p->used += nbytes;
    p->allocs++;
    *offset = at;
    return 0;
}

static void fake_free(void *ctx, uint64_t offset, uint64_t nbytes) {
    fake_pool *p = ctx;
    int i = find_slot(p, offset);
    assert_true(i >= 0);                        /* no double free, no unknown range */
    assert_int_equal(p->size[i], nbytes);       /* freed as allocated */
    if (!p->quiet) assert_false(p->writing[i]); /* never under a writer */
    p->live[i] = false;
    p->used -= nbytes;
    p->frees++;
}

static bool fake_write_active(void *ctx, uint64_t offset, uint64_t nbytes) {
    (void)offset;
    (void)nbytes;
    return !((fake_pool *)ctx)->quiet;
}

static const rsv_mem_ops fake_ops = {fake_alloc, fake_free, NULL};
static const rsv_mem_ops fake_ops_quiet = {fake_alloc, fake_free, fake_write_active};

/* marks / unmarks the range a writer was given as "may be written" */
static void writing(fake_pool *p, uint64_t off, bool on) {
    int i = find_slot(p, off);
    assert_true(i >= 0);
    p->writing[i] = on;
}

typedef struct fx {
    fake_pool pool;
    rsv_opts o;
    rsv_table *t;
} fx;

static fx *fx_new(uint64_t capacity, const rsv_mem_ops *ops) {
    fx *f = calloc(1, sizeof *f);
    f->pool.capacity = capacity;
    rsv_opts_init(&f->o);
    f->o.mem = ops;
    f->o.mem_ctx = &f->pool;
    return f;
}

static void fx_open(fx *f) { assert_int_equal(rsv_open(&f->o, &f->t), 0); }

/* Ends a scenario: nothing may be held once everything due is reaped and
 * the residents reclaimed. */
static void fx_finish(fx *f, uint64_t now) {
    assert_int_equal(rsv_check(f->t), 0);
    rsv_reap(f->t, now + 4 * TTL);
    rsv_evict_resident(f->t, SIZE_MAX);
    assert_int_equal(rsv_check(f->t), 0);
    rsv_stats st;
    rsv_get_stats(f->t, &st);
    assert_int_equal(st.bytes_held, 0);
    assert_int_equal(st.buffers, 0);
    assert_int_equal(f->pool.used, 0);
    rsv_close(f->t);
    assert_int_equal(f->pool.used, 0);
    free(f);
}

static const uint64_t SHAPE[2] = {4, 8}; /* bfloat16: 64 bytes */

static int reserve(fx *f, const char *tid, const char *hash, uint64_t now, rsv_reply *r) {
    rsv_request q = {tid, hash, 64, SHAPE, 2, "bfloat16", NULL};
    int rc = rsv_reserve(f->t, &q, now, r);
    assert_int_equal(rsv_check(f->t), 0);
    return rc;
}

static void complete(fx *f, const char *tid, const char *rid, uint64_t now, bool want_c,
                     bool want_r) {
    bool c, r;
    rsv_complete(f->t, tid, rid, now, &c, &r);
    assert_int_equal(c, want_c);
    assert_int_equal(r, want_r);
    assert_int_equal(rsv_check(f->t), 0);
}

static bool cancel(fx *f, const char *tid, const char *rid, bool abandon, bool refresh,
                   uint64_t now) {
    bool c;
    assert_int_equal(rsv_cancel(f->t, tid, rid, abandon, refresh, now, &c), 0);
    assert_int_equal(rsv_check(f->t), 0);
    return c;
}

static rsv_state state_of(fx *f, const char *tid) {
    rsv_status st;
    if (rsv_status_get(f->t, tid, &st)) return 0;
    return st.state;
}

/* pops one event and checks it */
static void expect_event(fx *f, rsv_event_kind kind, const char *tid) {
    const rsv_event *ev = rsv_event_peek(f->t);
    assert_non_null(ev);
    assert_int_equal(ev->kind, kind);
    assert_string_equal(ev->transfer_id, tid);
    rsv_event_pop(f->t);
}

static size_t n_events(fx *f) {
    rsv_stats st;
    rsv_get_stats(f->t, &st);
    return st.events;
}

/* binds spare `sp` to a 64-byte item of owner's */
static int bind(fx *f, const char *sp, const char *tid, const char *hash, const char *owner,
                uint64_t now, rsv_reply *r) {
    rsv_request q = {tid, hash, 64, SHAPE, 2, "bfloat16", "peer"};
    int rc = rsv_spare_bind(f->t, sp, owner, &q, now, r);
    assert_int_equal(rsv_check(f->t), 0);
    return rc;
}

static size_t n_spares(fx *f) {
    rsv_stats st;
    rsv_get_stats(f->t, &st);
    return st.spares;
}

/* ------------------------------------------------------------------ tests */

/* Spare ranges (docs/PROTOCOL.md "a spare range granted ahead"): granted
 * without reclaiming, one per owner, bound only in the plain case and only
 * by their owner, freed by a reserve that would otherwise find the pool
 * full, and by the reaper after one TTL. */
static void test_spares(void **state) {
    (void)state;
    fx *f = fx_new(256, &fake_ops); /* four 64-byte items */
    fx_open(f);
    rsv_reply s1, s2, r, sb;
    assert_err(rsv_spare_grant(f->t, "A", 0, 0, &s1), ECT_EINVAL, "0 bytes");
    assert_err(rsv_spare_grant(f->t, "A", 512, 0, &s1), ECT_EFULL, "no free range");
    assert_int_equal(rsv_spare_grant(f->t, "A", 64, 0, &s1), 0);
    assert_true(s1.write && s1.nbytes == 64 && strlen(s1.reservation_id) == 32);
    assert_int_equal(f->pool.used, 64);
    /* one per owner: a new grant frees the old one */
    assert_int_equal(rsv_spare_grant(f->t, "A", 64, 0, &s2), 0);
    assert_false(rsv_spare_held(f->t, s1.reservation_id));
    assert_true(rsv_spare_held(f->t, s2.reservation_id));
    assert_int_equal(f->pool.used, 64);
    assert_int_equal(rsv_check(f->t), 0);
    /* unknown or another owner's: refused, the spare stays */
    assert_err(bind(f, s1.reservation_id, "t1", "h1", "A", 1, &r), ECT_ENOTFOUND, "no spare");
    assert_err(bind(f, s2.reservation_id, "t1", "h1", "B", 1, &r), ECT_EACCES, "another peer");
    /* not the plain case: a known transfer_id, a hash in flight or cached */
    rsv_reply r0;
    assert_int_equal(reserve(f, "t0", "h0", 1, &r0), 0);
    assert_err(bind(f, s2.reservation_id, "t0", "hx", "A", 1, &r), ECT_EEXIST, "is known");
    assert_err(bind(f, s2.reservation_id, "tx", "h0", "A", 1, &r), ECT_EEXIST, "in flight");
    complete(f, "t0", r0.reservation_id, 1, true, true);
    assert_err(bind(f, s2.reservation_id, "ty", "h0", "A", 1, &r), ECT_EEXIST, "cached");
    const uint64_t big_shape[2] = {8, 8};
    rsv_request big = {"tb", "hb", 128, big_shape, 2, "bfloat16", "A"};
    assert_err(rsv_spare_bind(f->t, s2.reservation_id, "A", &big, 1, &r), ECT_EINVAL, "do not fit");
    assert_true(rsv_spare_held(f->t, s2.reservation_id));
    assert_int_equal(n_events(f), 1);
    /* bound: the WRITING writer over the spare's range, with the spare's id */
    assert_int_equal(bind(f, s2.reservation_id, "t2", "h2", "A", 2, &r), 0);
    assert_true(r.write && !r.ready);
    assert_int_equal(r.offset, s2.offset);
    assert_string_equal(r.reservation_id, s2.reservation_id);
    rsv_status stt;
    assert_int_equal(rsv_status_get(f->t, "t2", &stt), 0);
    assert_string_equal(stt.owner, "peer"); /* the request's, for complete / cancel guards */
    assert_false(rsv_spare_held(f->t, s2.reservation_id));
    assert_int_equal(state_of(f, "t2"), RSV_WRITING);
    complete(f, "t2", s2.reservation_id, 3, true, true);
    expect_event(f, RSV_EV_READY, "t0");
    expect_event(f, RSV_EV_READY, "t2");
    /* pool pressure: t0, t2 READY (held) and two spares fill the pool; a
     * reserve frees a spare instead of being refused as full */
    assert_int_equal(rsv_spare_grant(f->t, "A", 64, 4, &s1), 0);
    assert_int_equal(rsv_spare_grant(f->t, "B", 64, 4, &sb), 0);
    assert_err(rsv_spare_grant(f->t, "C", 64, 4, &r), ECT_EFULL, "no free range"); /* no reclaim */
    assert_int_equal(n_spares(f), 2);
    assert_int_equal(f->pool.used, 256);
    rsv_reply r3;
    assert_int_equal(reserve(f, "t3", "h3", 5, &r3), 0);
    assert_int_equal(n_spares(f), 1);
    assert_int_equal(f->pool.used, 256);
    /* the reaper frees a spare after one TTL */
    rsv_reap(f->t, 4 + TTL);
    assert_int_equal(n_spares(f), 0);
    assert_int_equal(rsv_check(f->t), 0);
    /* close frees what is held */
    assert_int_equal(rsv_spare_grant(f->t, "A", 32, 4 + TTL, &s1), 0);
    rsv_stats st;
    rsv_get_stats(f->t, &st);
    assert_int_equal(st.spares_granted, 5);
    assert_int_equal(st.spares_bound, 1);
    assert_int_equal(st.spare_bytes, 32);
    rsv_close(f->t);
    assert_int_equal(f->pool.used, 0);
    free(f);
}

static void test_opts_validated(void **state) {
    (void)state;
    rsv_opts o;
    rsv_table *t = (rsv_table *)1;
    rsv_opts_init(&o);
    assert_int_equal(o.ttl_ms, 300000);
    assert_int_equal(o.max_tombstones, 65536);
    assert_int_equal(o.max_events, 4096);
    assert_err(rsv_open(&o, &t), ECT_EINVAL, "mem");
    assert_null(t);
    o.mem = &fake_ops;
    o.ttl_ms = 0;
    assert_err(rsv_open(&o, &t), ECT_EINVAL, "ttl_ms");
    o.ttl_ms = 1;
    o.max_tombstones = 0;
    assert_err(rsv_open(&o, &t), ECT_EINVAL, "max_tombstones");
    o.max_tombstones = 1;
    o.max_events = 0;
    assert_err(rsv_open(&o, &t), ECT_EINVAL, "max_events");
    rsv_close(NULL);
}

static void test_reserve_complete_take_release(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply r;
    assert_int_equal(reserve(f, "t1", "h1", 0, &r), 0);
    assert_true(r.write && !r.ready && !r.cached && !r.cancelled);
    assert_int_equal(strlen(r.reservation_id), 32);
    assert_int_equal(r.nbytes, 64);
    assert_int_equal(f->pool.used, 64);
    assert_int_equal(state_of(f, "t1"), RSV_WRITING);
    rsv_status st;
    assert_err(rsv_take(f->t, "t1", 1, &st), ECT_ESTATE, "not READY");
    writing(&f->pool, r.offset, true);
    complete(f, "t1", "wrong", 1, false, false);
    complete(f, "nope", r.reservation_id, 1, false, false);
    complete(f, "t1", "", 1, false, false);
    assert_int_equal(n_events(f), 0);
    writing(&f->pool, r.offset, false);
    complete(f, "t1", r.reservation_id, 2, true, true);
    complete(f, "t1", r.reservation_id, 3, true, false); /* idempotent */
    const rsv_event *ev = rsv_event_peek(f->t);
    assert_non_null(ev);
    assert_string_equal(ev->st.mm_hash, "h1");
    assert_string_equal(ev->st.reservation_id, r.reservation_id);
    assert_string_equal(ev->st.dtype, "bfloat16");
    assert_int_equal(ev->st.ndim, 2);
    assert_int_equal(ev->st.shape[1], 8);
    expect_event(f, RSV_EV_READY, "t1");
    assert_null(rsv_event_peek(f->t));
    /* reserve of a READY transfer repeats the reply */
    rsv_reply again;
    assert_int_equal(reserve(f, "t1", "h1", 4, &again), 0);
    assert_true(again.ready && !again.write);
    assert_string_equal(again.reservation_id, r.reservation_id);
    /* take / release */
    assert_int_equal(rsv_take(f->t, "t1", 5, &st), 0);
    assert_int_equal(st.offset, r.offset);
    assert_true(st.ready && st.writer);
    assert_err(rsv_release(f->t, "nope", 6), ECT_ENOTFOUND, "nope");
    assert_int_equal(rsv_release(f->t, "h1", 6), 0);
    assert_err(rsv_release(f->t, "h1", 6), ECT_ESTATE, "not taken");
    assert_err(rsv_take(f->t, "zz", 6, &st), ECT_ENOTFOUND, "zz");
    assert_err(rsv_status_get(f->t, "zz", &st), ECT_ENOTFOUND, "zz");
    fx_finish(f, 10);
}

static void test_reserve_validates_fields(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply r;
    rsv_request q = {"t", "h", 64, SHAPE, 2, "bogus", NULL};
    assert_err(rsv_reserve(f->t, &q, 0, &r), ECT_EINVAL, "Unsupported torch dtype string");
    q.dtype = "torch.bfloat16";
    q.nbytes = 65;
    assert_err(rsv_reserve(f->t, &q, 0, &r), ECT_EINVAL, "shape and dtype do not match nbytes");
    q.nbytes = 64;
    q.transfer_id = "";
    assert_err(rsv_reserve(f->t, &q, 0, &r), ECT_EINVAL, "transfer_id");
    char longid[RSV_KEY_MAX + 2];
    memset(longid, 'a', sizeof longid - 1);
    longid[sizeof longid - 1] = 0;
    q.transfer_id = "t";
    q.mm_hash = longid;
    assert_err(rsv_reserve(f->t, &q, 0, &r), ECT_EINVAL, "mm_hash");
    q.mm_hash = NULL;
    assert_err(rsv_reserve(f->t, &q, 0, &r), ECT_EINVAL, "mm_hash");
    q.mm_hash = "h";
    q.shape = NULL;
    assert_err(rsv_reserve(f->t, &q, 0, &r), ECT_EINVAL, "shape");
    q.shape = SHAPE;
    assert_int_equal(f->pool.used, 0);
    /* "torch." prefix accepted, canonical form kept; a zero-size tensor works */
    assert_int_equal(rsv_reserve(f->t, &q, 0, &r), 0);
    rsv_status st;
    assert_int_equal(rsv_status_get(f->t, "t", &st), 0);
    assert_string_equal(st.dtype, "bfloat16");
    const uint64_t zero[1] = {0};
    rsv_request z = {"z", "hz", 0, zero, 1, "float32", NULL};
    assert_int_equal(rsv_reserve(f->t, &z, 0, &r), 0);
    assert_true(r.write);
    assert_int_equal(r.nbytes, 0);
    assert_true(cancel(f, "t", NULL, true, false, 1));
    assert_true(cancel(f, "z", NULL, true, false, 1));
    fx_finish(f, 2);
}

static void test_conflicts(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply r, r2;
    assert_int_equal(reserve(f, "t1", "h1", 0, &r), 0);
    /* same transfer_id, other hash or other tensor */
    assert_err(reserve(f, "t1", "h2", 0, &r2), ECT_EEXIST,
               "conflicting reservation for transfer_id");
    rsv_request q = {"t1", "h1", 128, (const uint64_t[]){8, 8}, 2, "bfloat16", NULL};
    assert_err(rsv_reserve(f->t, &q, 0, &r2), ECT_EEXIST,
               "conflicting reservation for transfer_id");
    /* another transfer, same hash, other tensor, while in flight */
    q.transfer_id = "t2";
    assert_err(rsv_reserve(f->t, &q, 0, &r2), ECT_EEXIST,
               "conflicting in-flight tensor for mm_hash");
    complete(f, "t1", r.reservation_id, 1, true, true);
    assert_err(rsv_reserve(f->t, &q, 1, &r2), ECT_EEXIST, "conflicting cached tensor for mm_hash");
    rsv_stats st;
    rsv_get_stats(f->t, &st);
    assert_int_equal(st.live, 1);
    assert_int_equal(f->pool.used, 64);
    assert_true(cancel(f, "t1", r.reservation_id, false, false, 2));
    assert_int_equal(state_of(f, "t1"), RSV_CANCELLED);
    fx_finish(f, 3);
}

static void test_follower_published_with_writer(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply w, fl;
    assert_int_equal(reserve(f, "tw", "h", 0, &w), 0);
    writing(&f->pool, w.offset, true);
    assert_int_equal(reserve(f, "tf", "h", 1, &fl), 0);
    assert_false(fl.write);
    assert_false(fl.ready);
    assert_int_equal(fl.offset, w.offset);
    assert_string_not_equal(fl.reservation_id, w.reservation_id);
    assert_int_equal(f->pool.allocs, 1);
    /* follower completion is an idempotent no-op */
    complete(f, "tf", fl.reservation_id, 2, true, false);
    complete(f, "tf", fl.reservation_id, 2, true, false);
    assert_int_equal(state_of(f, "tf"), RSV_WRITING);
    assert_int_equal(n_events(f), 0);
    writing(&f->pool, w.offset, false);
    complete(f, "tw", w.reservation_id, 3, true, true);
    assert_int_equal(state_of(f, "tf"), RSV_READY);
    expect_event(f, RSV_EV_READY, "tw");
    expect_event(f, RSV_EV_READY, "tf");
    complete(f, "tf", fl.reservation_id, 4, true, false);
    /* the buffer stays while either holds it */
    assert_true(cancel(f, "tw", NULL, false, false, 5));
    assert_int_equal(f->pool.used, 64);
    assert_true(cancel(f, "tf", fl.reservation_id, false, false, 5));
    assert_int_equal(f->pool.used, 0);
    fx_finish(f, 6);
}

static void test_writing_reserve_extends_ttl(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply r, r2;
    assert_int_equal(reserve(f, "t", "h", 0, &r), 0);
    assert_int_equal(reserve(f, "t", "h", 200 * S, &r2), 0);
    assert_false(r2.write);
    assert_string_equal(r2.reservation_id, r.reservation_id);
    rsv_reap(f->t, TTL + 1);
    assert_int_equal(state_of(f, "t"), RSV_WRITING);
    rsv_reap(f->t, 200 * S + TTL);
    assert_int_equal(state_of(f, "t"), RSV_EXPIRE_PENDING);
    complete(f, "t", r.reservation_id, 200 * S + TTL + 1, false, false);
    assert_int_equal(state_of(f, "t"), RSV_EXPIRED);
    fx_finish(f, 600 * S);
}

static void test_cached_from_resident(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply r, c;
    rsv_status st;
    assert_int_equal(reserve(f, "t1", "h", 0, &r), 0);
    complete(f, "t1", r.reservation_id, 1, true, true);
    assert_int_equal(rsv_take(f->t, "t1", 2, &st), 0);
    assert_int_equal(rsv_release(f->t, "h", 3), 0);
    /* the READY reservation expires, the tensor stays resident */
    rsv_reap(f->t, 1 + TTL);
    assert_int_equal(state_of(f, "t1"), RSV_EXPIRED);
    assert_int_equal(f->pool.used, 64);
    expect_event(f, RSV_EV_READY, "t1");
    assert_int_equal(reserve(f, "t2", "h", TTL + 5, &c), 0);
    assert_true(c.cached && c.ready && !c.write);
    assert_int_equal(c.offset, r.offset);
    assert_int_equal(f->pool.allocs, 1);
    expect_event(f, RSV_EV_READY, "t2");
    complete(f, "t2", c.reservation_id, TTL + 6, true, false);
    assert_int_equal(rsv_take(f->t, "t2", TTL + 7, &st), 0);
    assert_false(st.writer);
    /* a leased buffer is not reclaimed even when every reservation is gone */
    assert_true(cancel(f, "t2", NULL, false, false, TTL + 8));
    assert_int_equal(rsv_evict_resident(f->t, 10), 0);
    assert_int_equal(f->pool.used, 64);
    assert_int_equal(rsv_release(f->t, "h", TTL + 9), 0);
    assert_int_equal(rsv_evict_resident(f->t, 10), 1);
    assert_int_equal(f->pool.used, 0);
    fx_finish(f, TTL + 10);
}

static void test_ready_expires_and_memory_returns(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply r;
    assert_int_equal(reserve(f, "t", "h", 0, &r), 0);
    complete(f, "t", r.reservation_id, 100 * S, true, true);
    rsv_reap(f->t, 100 * S + TTL - 1);
    assert_int_equal(state_of(f, "t"), RSV_READY);
    rsv_reap(f->t, 100 * S + TTL);
    assert_int_equal(state_of(f, "t"), RSV_EXPIRED);
    assert_int_equal(f->pool.used, 0);
    /* the tombstone lives one TTL; an EXPIRED id reserved again is new */
    rsv_reply r2;
    assert_int_equal(reserve(f, "t", "h", 100 * S + TTL + 1, &r2), 0);
    assert_true(r2.write);
    assert_string_not_equal(r2.reservation_id, r.reservation_id);
    assert_true(cancel(f, "t", r2.reservation_id, true, false, 100 * S + TTL + 2));
    rsv_reap(f->t, 100 * S + 3 * TTL);
    rsv_stats st;
    rsv_get_stats(f->t, &st);
    assert_int_equal(st.tombstones, 0);
    fx_finish(f, 100 * S + 3 * TTL);
}

static void test_cancel_before_reserve(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    assert_true(cancel(f, "t", NULL, false, false, 0));
    assert_int_equal(state_of(f, "t"), RSV_CANCELLED);
    assert_true(cancel(f, "t", NULL, false, false, 0)); /* idempotent */
    rsv_reply r;
    assert_int_equal(reserve(f, "t", "h", 1, &r), 0);
    assert_true(r.cancelled);
    assert_false(r.write || r.ready);
    assert_string_equal(r.reservation_id, "");
    assert_int_equal(r.offset, 0);
    assert_int_equal(f->pool.allocs, 0);
    complete(f, "t", "", 2, false, false);
    /* after one TTL the tombstone is gone */
    rsv_reap(f->t, TTL);
    assert_int_equal(state_of(f, "t"), 0);
    fx_finish(f, TTL);
}

static void test_cancel_while_writing(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply w, fl;
    assert_int_equal(reserve(f, "t", "h", 0, &w), 0);
    writing(&f->pool, w.offset, true);
    assert_int_equal(reserve(f, "tf", "h", 0, &fl), 0);
    assert_false(cancel(f, "t", "other-id", false, false, 1));
    assert_int_equal(state_of(f, "t"), RSV_WRITING);
    assert_true(cancel(f, "t", w.reservation_id, false, false, 1));
    assert_int_equal(state_of(f, "t"), RSV_CANCEL_PENDING);
    /* the follower can never become ready: reported at once */
    assert_int_equal(state_of(f, "tf"), RSV_CANCELLED);
    expect_event(f, RSV_EV_ABANDONED, "tf");
    assert_int_equal(n_events(f), 0);
    rsv_reply r;
    assert_int_equal(reserve(f, "t", "h", 2, &r), 0);
    assert_true(r.cancelled);
    /* a new transfer of the hash does not follow the cancelled writer */
    rsv_reply n;
    assert_int_equal(reserve(f, "t3", "h", 2, &n), 0);
    assert_true(n.write);
    assert_int_not_equal(n.offset, w.offset);
    assert_true(cancel(f, "t3", NULL, true, false, 2));
    expect_event(f, RSV_EV_ABANDONED, "t3");
    /* memory stays through every reap while the writer may write */
    rsv_reap(f->t, 10 * TTL);
    assert_int_equal(state_of(f, "t"), RSV_CANCEL_PENDING);
    assert_int_equal(f->pool.used, 64);
    writing(&f->pool, w.offset, false); /* the write landed, then complete */
    complete(f, "t", w.reservation_id, 10 * TTL, false, false);
    assert_int_equal(state_of(f, "t"), RSV_CANCELLED);
    assert_int_equal(f->pool.used, 0);
    fx_finish(f, 10 * TTL);
}

static void test_cancel_pending_abandon_frees(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply w;
    assert_int_equal(reserve(f, "t", "h", 0, &w), 0);
    assert_true(cancel(f, "t", NULL, false, false, 1));
    assert_true(cancel(f, "t", NULL, false, false, 1)); /* stays pending */
    assert_int_equal(state_of(f, "t"), RSV_CANCEL_PENDING);
    assert_int_equal(f->pool.used, 64);
    assert_true(cancel(f, "t", w.reservation_id, true, false, 2));
    assert_int_equal(state_of(f, "t"), RSV_CANCELLED);
    assert_int_equal(f->pool.used, 0);
    fx_finish(f, 3);
}

static void test_abandoned_writer_reports_followers(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply w, a, b;
    assert_int_equal(reserve(f, "tw", "h", 0, &w), 0);
    assert_int_equal(reserve(f, "ta", "h", 0, &a), 0);
    assert_int_equal(reserve(f, "tb", "h", 0, &b), 0);
    /* a follower cancelled on its own holds nothing of its own */
    assert_true(cancel(f, "tb", b.reservation_id, false, false, 1));
    assert_int_equal(state_of(f, "tb"), RSV_CANCELLED);
    assert_int_equal(n_events(f), 0);
    assert_true(cancel(f, "tw", w.reservation_id, true, false, 2));
    assert_int_equal(state_of(f, "tw"), RSV_CANCELLED);
    assert_int_equal(state_of(f, "ta"), RSV_CANCELLED);
    expect_event(f, RSV_EV_ABANDONED, "ta");
    expect_event(f, RSV_EV_ABANDONED, "tw");
    assert_int_equal(f->pool.used, 0);
    complete(f, "tw", w.reservation_id, 3, false, false);
    fx_finish(f, 3);
}

static void test_expired_writer_must_refresh(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply w, fl, r;
    assert_int_equal(reserve(f, "t", "h", 0, &w), 0);
    writing(&f->pool, w.offset, true);
    assert_int_equal(reserve(f, "tf", "h", 0, &fl), 0);
    rsv_reap(f->t, TTL);
    assert_int_equal(state_of(f, "t"), RSV_EXPIRE_PENDING);
    assert_int_equal(state_of(f, "tf"), RSV_CANCELLED);
    expect_event(f, RSV_EV_ABANDONED, "tf");
    assert_int_equal(n_events(f), 0); /* the writer may still refresh */
    assert_int_equal(f->pool.used, 64);
    assert_err(reserve(f, "t", "h", TTL + 1, &r), ECT_EBUSY, "still has an active writer");
    bool c;
    assert_err(rsv_cancel(f->t, "t", w.reservation_id, false, true, TTL + 1, &c), ECT_EINVAL,
               "refresh needs abandon");
    assert_int_equal(state_of(f, "t"), RSV_EXPIRE_PENDING);
    writing(&f->pool, w.offset, false); /* the producer stopped, then refreshes */
    assert_true(cancel(f, "t", w.reservation_id, true, true, TTL + 2));
    assert_int_equal(state_of(f, "t"), RSV_EXPIRED);
    assert_int_equal(f->pool.used, 0);
    assert_int_equal(n_events(f), 0); /* a refresh is no abandonment */
    assert_int_equal(reserve(f, "t", "h", TTL + 3, &r), 0);
    assert_true(r.write);
    assert_string_not_equal(r.reservation_id, w.reservation_id);
    /* a late completion of the old reservation cannot complete the new one */
    complete(f, "t", w.reservation_id, TTL + 4, false, false);
    assert_int_equal(state_of(f, "t"), RSV_WRITING);
    complete(f, "t", r.reservation_id, TTL + 5, true, true);
    expect_event(f, RSV_EV_READY, "t");
    fx_finish(f, TTL + 6);
}

static void test_refresh_writing_and_ready(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply w, r2;
    assert_int_equal(reserve(f, "t", "h", 0, &w), 0);
    /* a producer refreshes a reservation older than 150 s before writing */
    assert_true(cancel(f, "t", w.reservation_id, true, true, 150 * S));
    assert_int_equal(state_of(f, "t"), RSV_EXPIRED);
    assert_int_equal(f->pool.used, 0);
    assert_int_equal(reserve(f, "t", "h", 150 * S, &r2), 0);
    assert_true(r2.write);
    complete(f, "t", r2.reservation_id, 151 * S, true, true);
    expect_event(f, RSV_EV_READY, "t");
    assert_true(cancel(f, "t", NULL, true, true, 152 * S));
    assert_int_equal(state_of(f, "t"), RSV_EXPIRED);
    assert_true(cancel(f, "t", NULL, true, true, 152 * S)); /* stays EXPIRED */
    assert_int_equal(state_of(f, "t"), RSV_EXPIRED);
    assert_true(cancel(f, "t", NULL, false, false, 153 * S)); /* EXPIRED -> CANCELLED */
    assert_int_equal(state_of(f, "t"), RSV_CANCELLED);
    assert_int_equal(n_events(f), 0);
    fx_finish(f, 153 * S);
}

static void test_expire_pending_cancel_then_complete(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply w;
    assert_int_equal(reserve(f, "t", "h", 0, &w), 0);
    rsv_reap(f->t, TTL);
    assert_int_equal(n_events(f), 0);
    assert_true(cancel(f, "t", NULL, false, false, TTL));
    assert_int_equal(state_of(f, "t"), RSV_EXPIRE_PENDING);
    assert_int_equal(f->pool.used, 64);
    complete(f, "t", w.reservation_id, TTL + 1, false, false);
    assert_int_equal(state_of(f, "t"), RSV_CANCELLED);
    assert_int_equal(f->pool.used, 0);
    /* and the plain EXPIRE_PENDING -> CANCELLED by abandon */
    assert_int_equal(reserve(f, "u", "h", TTL + 2, &w), 0);
    rsv_reap(f->t, 2 * TTL + 2);
    assert_int_equal(state_of(f, "u"), RSV_EXPIRE_PENDING);
    assert_true(cancel(f, "u", w.reservation_id, true, false, 2 * TTL + 3));
    assert_int_equal(state_of(f, "u"), RSV_CANCELLED);
    expect_event(f, RSV_EV_ABANDONED, "u");
    fx_finish(f, 2 * TTL + 3);
}

static void test_reaper_cancels_stale_follower(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply w, fl, again;
    assert_int_equal(reserve(f, "tw", "h", 0, &w), 0);
    assert_int_equal(reserve(f, "tf", "h", 100 * S, &fl), 0);
    assert_int_equal(reserve(f, "tw", "h", 250 * S, &again), 0); /* writer extended */
    rsv_reap(f->t, 100 * S + TTL);
    assert_int_equal(state_of(f, "tf"), RSV_CANCELLED);
    assert_int_equal(state_of(f, "tw"), RSV_WRITING);
    expect_event(f, RSV_EV_ABANDONED, "tf");
    complete(f, "tw", w.reservation_id, 100 * S + TTL + 1, true, true);
    expect_event(f, RSV_EV_READY, "tw");
    assert_int_equal(n_events(f), 0);
    fx_finish(f, 100 * S + TTL + 2);
}

static void test_producer_vanishes_after_reserve(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops_quiet);
    fx_open(f);
    rsv_reply w;
    assert_int_equal(reserve(f, "t", "h", 0, &w), 0);
    rsv_reap(f->t, TTL);
    assert_int_equal(state_of(f, "t"), RSV_EXPIRE_PENDING);
    /* the transport still sees a write in flight: keep the memory */
    rsv_reap(f->t, 3 * TTL);
    assert_int_equal(f->pool.used, 64);
    f->pool.quiet = true;
    rsv_reap(f->t, 2 * TTL - 1 + 0 * S);
    assert_int_equal(state_of(f, "t"), RSV_EXPIRED); /* clamped now: 3 TTL */
    assert_int_equal(f->pool.used, 0);
    complete(f, "t", w.reservation_id, 3 * TTL, false, false);
    /* a CANCEL_PENDING writer that vanished ends CANCELLED */
    assert_int_equal(reserve(f, "u", "h", 3 * TTL, &w), 0);
    assert_true(cancel(f, "u", NULL, false, false, 3 * TTL));
    rsv_reap(f->t, 3 * TTL + TTL - 1);
    assert_int_equal(state_of(f, "u"), RSV_CANCEL_PENDING);
    rsv_reap(f->t, 4 * TTL);
    assert_int_equal(state_of(f, "u"), RSV_CANCELLED);
    fx_finish(f, 4 * TTL);
}

/* A refresh (the producer gives a reservation back and reserves anew, e.g.
 * while another shard of the item is full) keeps the writer's followers:
 * the next reserve of the hash writes for them. */
static void test_refresh_keeps_followers(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply w, a, w2, n;
    assert_int_equal(reserve(f, "tw", "h", 0, &w), 0);
    assert_int_equal(reserve(f, "ta", "h", 0, &a), 0);
    assert_true(w.write && !a.write);
    assert_true(cancel(f, "tw", w.reservation_id, true, true, 1));
    assert_int_equal(state_of(f, "tw"), RSV_EXPIRED);
    assert_int_equal(state_of(f, "ta"), RSV_WRITING); /* still waiting, no event */
    assert_int_equal(n_events(f), 0);
    assert_int_equal(f->pool.used, 64);
    /* another hash with the same tensor is not the orphan's */
    assert_int_equal(reserve(f, "tx", "hx", 2, &n), 0);
    assert_true(n.write && n.offset != w.offset);
    /* a different tensor for the hash conflicts, as with a writer */
    rsv_request q = {"tz", "h", 8, (const uint64_t[]){4}, 1, "bfloat16", NULL};
    assert_err(rsv_reserve(f->t, &q, 2, &n), ECT_EEXIST, "conflicting in-flight tensor");
    /* the producer reserves again: it writes into the same buffer */
    assert_int_equal(reserve(f, "tw", "h", 3, &w2), 0);
    assert_true(w2.write);
    assert_int_equal(w2.offset, w.offset);
    assert_int_equal(f->pool.used, 2 * 64);
    rsv_stats s;
    rsv_get_stats(f->t, &s);
    assert_int_equal(s.adopted, 1);
    complete(f, "tw", w2.reservation_id, 4, true, true);
    assert_int_equal(state_of(f, "ta"), RSV_READY);
    expect_event(f, RSV_EV_READY, "tw");
    expect_event(f, RSV_EV_READY, "ta");
    assert_true(cancel(f, "tx", NULL, true, false, 5));
    expect_event(f, RSV_EV_ABANDONED, "tx");
    /* nobody comes back: the waiting followers end at their TTL */
    rsv_reply v, b;
    assert_int_equal(reserve(f, "tv", "hv", 10, &v), 0);
    assert_int_equal(reserve(f, "tb", "hv", 10, &b), 0);
    assert_true(cancel(f, "tv", v.reservation_id, true, true, 11));
    rsv_reap(f->t, 10 + TTL);
    assert_int_equal(state_of(f, "tb"), RSV_CANCELLED);
    expect_event(f, RSV_EV_ABANDONED, "tb");
    /* a later reserve of the hash allocates afresh */
    assert_int_equal(reserve(f, "tc", "hv", 11 + TTL, &b), 0);
    assert_true(b.write);
    assert_true(cancel(f, "tc", NULL, true, false, 12 + TTL));
    expect_event(f, RSV_EV_ABANDONED, "tc");
    /* a plain abandon still ends the followers at once */
    assert_int_equal(reserve(f, "tp", "hp", 13 + TTL, &v), 0);
    assert_int_equal(reserve(f, "tq", "hp", 13 + TTL, &b), 0);
    assert_true(cancel(f, "tp", v.reservation_id, true, false, 14 + TTL));
    assert_int_equal(state_of(f, "tq"), RSV_CANCELLED);
    fx_finish(f, 20 + TTL);
}

/* The engine's release ends a delivered reservation at once: its buffer is
 * resident (reclaimable, dedup) and a reuse of the transfer_id says why. */
static void test_finish_on_release(void **state) {
    (void)state;
    fx *f = fx_new(2 * 64, &fake_ops);
    fx_open(f);
    rsv_reply r, c;
    rsv_status st;
    assert_int_equal(reserve(f, "t1", "h1", 0, &r), 0);
    assert_err(rsv_finish(f->t, "t1", 1), ECT_ESTATE, "not READY");
    assert_err(rsv_finish(f->t, "nope", 1), ECT_ENOTFOUND, "nope");
    complete(f, "t1", r.reservation_id, 1, true, true);
    assert_int_equal(rsv_take(f->t, "t1", 2, &st), 0);
    assert_int_equal(rsv_release(f->t, "h1", 3), 0);
    assert_int_equal(rsv_finish(f->t, "t1", 3), 0);
    assert_int_equal(state_of(f, "t1"), RSV_CANCELLED);
    assert_err(rsv_finish(f->t, "t1", 3), ECT_ESTATE, "CANCELLED");
    rsv_stats s;
    rsv_get_stats(f->t, &s);
    assert_int_equal(s.finished, 1);
    assert_int_equal(s.live, 0);
    assert_int_equal(s.resident, 1);
    /* the scheduler's late cancel is harmless */
    assert_true(cancel(f, "t1", r.reservation_id, false, false, 4));
    /* a reuse of the id is refused, saying why and since when */
    assert_int_equal(reserve(f, "t1", "h1", 1003, &c), 0);
    assert_true(c.cancelled);
    assert_int_equal(c.why, RSV_END_FINISHED);
    assert_int_equal(c.ended_ms_ago, 1000);
    assert_non_null(strstr(rsv_end_text(c.why), "delivered"));
    /* a new id of the same content is answered from the resident copy */
    assert_int_equal(reserve(f, "t2", "h1", 1004, &c), 0);
    assert_true(c.cached && c.ready);
    /* finished buffers are reclaimed for new writes: two fit after all */
    assert_int_equal(rsv_take(f->t, "t2", 1005, &st), 0);
    assert_int_equal(rsv_release(f->t, "h1", 1005), 0);
    assert_int_equal(rsv_finish(f->t, "t2", 1005), 0);
    assert_int_equal(reserve(f, "a", "ha", 1006, &r), 0);
    assert_int_equal(reserve(f, "b", "hb", 1006, &c), 0);
    rsv_get_stats(f->t, &s);
    assert_int_equal(s.evictions, 1);
    assert_int_equal(s.peak_live, 2);
    assert_int_equal(s.peak_bytes, 2 * 64);
    /* why other refusals happen */
    assert_true(cancel(f, "pre", NULL, false, false, 1007));
    assert_int_equal(reserve(f, "pre", "hz", 1007, &c), 0);
    assert_true(c.cancelled && c.why == RSV_END_PRECANCEL);
    assert_true(cancel(f, "a", NULL, true, false, 1008));
    assert_int_equal(reserve(f, "a", "ha", 1009, &c), 0);
    assert_true(c.cancelled && c.why == RSV_END_ABANDONED);
    rsv_get_stats(f->t, &s);
    assert_int_equal(s.abandoned, 1);
    assert_true(cancel(f, "b", NULL, true, false, 1010));
    fx_finish(f, 1010);
}

static void test_pool_full_lru_reclaim(void **state) {
    (void)state;
    fx *f = fx_new(3 * 64, &fake_ops);
    fx_open(f);
    const char *h[3] = {"h0", "h1", "h2"}, *tid[3] = {"t0", "t1", "t2"};
    rsv_reply r;
    rsv_status st;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(reserve(f, tid[i], h[i], (uint64_t)i, &r), 0);
        complete(f, tid[i], r.reservation_id, (uint64_t)i, true, true);
        assert_int_equal(rsv_take(f->t, tid[i], (uint64_t)i, &st), 0);
        assert_int_equal(rsv_release(f->t, h[i], (uint64_t)i), 0);
        assert_true(cancel(f, tid[i], NULL, false, false, (uint64_t)i));
    }
    /* touch h0 through a cached reserve: h1 is now least recently used */
    rsv_reply c;
    assert_int_equal(reserve(f, "c0", "h0", 10, &c), 0);
    assert_true(c.cached);
    assert_int_equal(reserve(f, "n1", "hn", 11, &r), 0);
    assert_true(r.write);
    rsv_stats s;
    rsv_get_stats(f->t, &s);
    assert_int_equal(s.evictions, 1);
    rsv_reply probe;
    assert_int_equal(reserve(f, "p1", "h1", 12, &probe), 0); /* h1 is gone: a new write */
    assert_true(probe.write);
    rsv_get_stats(f->t, &s);
    assert_int_equal(s.evictions, 2); /* h2 made room for it */
    /* everything held (c0 READY on h0, two writers): the pool is full */
    rsv_reply x;
    assert_err(reserve(f, "x", "hx", 13, &x), ECT_EFULL, "EC consumer buffer pool is full");
    assert_int_equal(state_of(f, "x"), 0);
    assert_int_equal(f->pool.used, 3 * 64);
    /* READY reservations past their lease are expired before allocating */
    complete(f, "n1", r.reservation_id, 14, true, true);
    assert_int_equal(reserve(f, "x", "hx", 14 + TTL, &x), 0);
    assert_true(x.write);
    /* other allocation errors pass through unchanged */
    f->pool.fail_next = ECT_ENOMEM;
    assert_err(reserve(f, "y", "hy", 15 + TTL, &x), ECT_ENOMEM, NULL);
    assert_true(cancel(f, "p1", NULL, true, false, 16 + TTL));
    assert_true(cancel(f, "x", NULL, true, false, 16 + TTL));
    fx_finish(f, 16 + TTL);
}

static void test_tombstone_cap(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    f->o.max_tombstones = 4;
    fx_open(f);
    char id[16];
    for (int i = 0; i < 6; i++) {
        snprintf(id, sizeof id, "t%d", i);
        assert_true(cancel(f, id, NULL, false, false, (uint64_t)i));
    }
    rsv_stats st;
    rsv_get_stats(f->t, &st);
    assert_int_equal(st.tombstones, 4);
    assert_int_equal(st.tombstones_dropped, 2);
    assert_int_equal(state_of(f, "t0"), 0); /* the oldest went first */
    assert_int_equal(state_of(f, "t1"), 0);
    assert_int_equal(state_of(f, "t2"), RSV_CANCELLED);
    /* a reservation turning into a tombstone also respects the cap */
    rsv_reply r;
    assert_int_equal(reserve(f, "w", "h", 10, &r), 0);
    assert_true(cancel(f, "w", NULL, true, false, 11));
    rsv_get_stats(f->t, &st);
    assert_int_equal(st.tombstones, 4);
    assert_int_equal(state_of(f, "t2"), 0);
    assert_int_equal(state_of(f, "w"), RSV_CANCELLED);
    fx_finish(f, 12);
}

/* The table remembers the entry its latest lookup found (an op right after
 * its guard's lookup of the same id): that memory follows the table when
 * the entry leaves it, by the tombstone cap or when an EXPIRED id is
 * reserved anew (with ASan a stale one reads freed memory). */
static void test_lookup_memory_follows_the_table(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    f->o.max_tombstones = 1;
    fx_open(f);
    rsv_brief b;
    assert_true(cancel(f, "a", NULL, false, false, 1));
    assert_int_equal(rsv_brief_get(f->t, "a", &b), 0);
    assert_int_equal(b.state, RSV_CANCELLED);
    assert_true(cancel(f, "b", NULL, false, false, 2)); /* the cap drops a's tombstone */
    assert_int_equal(rsv_brief_get(f->t, "a", &b), ECT_ENOTFOUND);
    assert_int_equal(rsv_brief_get(f->t, "b", &b), 0);

    rsv_reply r, r2;
    assert_int_equal(reserve(f, "t", "h", 10, &r), 0);
    complete(f, "t", r.reservation_id, 10, true, true);
    rsv_reap(f->t, 10 + TTL);
    assert_int_equal(rsv_brief_get(f->t, "t", &b), 0);
    assert_int_equal(b.state, RSV_EXPIRED);
    assert_int_equal(reserve(f, "t", "h", 11 + TTL, &r2), 0); /* the tombstone is freed */
    assert_int_equal(rsv_brief_get(f->t, "t", &b), 0);
    assert_int_equal(b.state, RSV_WRITING);
    assert_string_equal(b.reservation_id, r2.reservation_id);
    assert_true(cancel(f, "t", r2.reservation_id, true, false, 12 + TTL));
    fx_finish(f, 12 + TTL);
}

/* 320 items (10 steps of 32 in flight, or a consumer that lags: more than
 * 256 events queued and buffers held at once) reserved, completed, their
 * events popped, taken, released and finished, with a tombstone cap of 64:
 * from the third round on nothing is allocated (entries come back from the
 * tombstones the cap pushed out, buffer records and event nodes from the
 * round before; the second round still allocates the 64 entries the cap
 * keeps as tombstones), and every event reads back as its item was
 * reserved. */
#define REUSE_STEP 320
static void test_records_reused_across_steps(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    f->o.max_tombstones = 64;
    fx_open(f);
    char rid[REUSE_STEP][ECT_ID_LEN + 1];
    uint64_t allocs[4];
    for (int round = 0; round < 4; round++) {
        char id[32], h[32];
        for (int i = 0; i < REUSE_STEP; i++) {
            rsv_reply r;
            snprintf(id, sizeof id, "t%d-%d", round, i);
            snprintf(h, sizeof h, "h%d-%d", round, i);
            assert_int_equal(reserve(f, id, h, 1, &r), 0);
            assert_true(r.write);
            snprintf(rid[i], sizeof rid[i], "%s", r.reservation_id);
        }
        for (int i = 0; i < REUSE_STEP; i++) {
            snprintf(id, sizeof id, "t%d-%d", round, i);
            complete(f, id, rid[i], 2, true, true);
        }
        for (int i = 0; i < REUSE_STEP; i++) {
            const rsv_event *ev = rsv_event_peek(f->t);
            assert_non_null(ev);
            snprintf(id, sizeof id, "t%d-%d", round, i);
            snprintf(h, sizeof h, "h%d-%d", round, i);
            assert_int_equal(ev->kind, RSV_EV_READY);
            assert_string_equal(ev->transfer_id, id);
            assert_string_equal(ev->st.mm_hash, h);
            assert_string_equal(ev->st.reservation_id, rid[i]);
            assert_int_equal(ev->st.nbytes, 64);
            rsv_event_pop(f->t);
        }
        assert_null(rsv_event_peek(f->t));
        for (int i = 0; i < REUSE_STEP; i++) {
            rsv_status st;
            snprintf(id, sizeof id, "t%d-%d", round, i);
            snprintf(h, sizeof h, "h%d-%d", round, i);
            assert_int_equal(rsv_take(f->t, id, 3, &st), 0);
            assert_int_equal(rsv_release(f->t, h, 3), 0);
            assert_int_equal(rsv_finish(f->t, id, 3), 0);
        }
        rsv_evict_resident(f->t, SIZE_MAX);
        assert_int_equal(rsv_check(f->t), 0);
        rsv_stats st;
        rsv_get_stats(f->t, &st);
        assert_int_equal(st.buffers, 0);
        allocs[round] = st.allocs;
    }
    assert_int_equal(allocs[0], 3 * REUSE_STEP); /* an entry, a record and an event each */
    assert_int_equal(allocs[1], allocs[0] + 64); /* the entries the cap kept as tombstones */
    assert_int_equal(allocs[2], allocs[1]);
    assert_int_equal(allocs[3], allocs[2]);
    fx_finish(f, 4);
}

static void test_event_backlog(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    f->o.max_events = 3;
    fx_open(f);
    char id[16], h[16];
    rsv_reply r;
    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof id, "t%d", i);
        snprintf(h, sizeof h, "h%d", i);
        assert_int_equal(reserve(f, id, h, 0, &r), 0);
        complete(f, id, r.reservation_id, 0, true, true);
    }
    rsv_stats st;
    rsv_get_stats(f->t, &st);
    assert_int_equal(st.events, 3);
    assert_int_equal(st.events_dropped, 2);
    expect_event(f, RSV_EV_READY, "t2"); /* oldest dropped */
    /* an unsent event stays queued: peek does not pop */
    assert_string_equal(rsv_event_peek(f->t)->transfer_id, "t3");
    assert_string_equal(rsv_event_peek(f->t)->transfer_id, "t3");
    expect_event(f, RSV_EV_READY, "t3");
    expect_event(f, RSV_EV_READY, "t4");
    rsv_event_pop(f->t); /* popping an empty queue is harmless */
    assert_null(rsv_event_peek(f->t));
    fx_finish(f, 1);
}

/* The same table over the real buffer pool: reclaim, then "pool is full",
 * and the pool's used bytes back at zero. */
static void test_real_pool(void **state) {
    (void)state;
    ect_pool_opts po;
    ect_pool_opts_init(&po);
    po.capacity = 4 * 4096;
    ect_pool *pool;
    assert_int_equal(ect_pool_open(&po, &pool), 0);
    rsv_opts o;
    rsv_opts_init(&o);
    o.mem = &rsv_pool_ops;
    o.mem_ctx = pool;
    rsv_table *t;
    assert_int_equal(rsv_open(&o, &t), 0);
    const uint64_t shape[1] = {1000}; /* float32: 4000 bytes, one 4 KiB slot after rounding */
    char id[8], h[8];
    rsv_reply r;
    rsv_status st;
    bool c, b;
    for (int i = 0; i < 6; i++) {
        snprintf(id, sizeof id, "t%d", i);
        snprintf(h, sizeof h, "h%d", i);
        rsv_request q = {id, h, 4000, shape, 1, "float32", NULL};
        assert_int_equal(rsv_reserve(t, &q, (uint64_t)i, &r), 0);
        assert_true(r.write);
        memset((char *)ect_pool_base(pool) + r.offset, i, 4000);
        rsv_complete(t, id, r.reservation_id, (uint64_t)i, &c, &b);
        assert_true(c && b);
        assert_int_equal(rsv_take(t, id, (uint64_t)i, &st), 0);
        assert_int_equal(((unsigned char *)ect_pool_base(pool))[st.offset + 3999], i);
        assert_int_equal(rsv_release(t, h, (uint64_t)i), 0);
        assert_int_equal(rsv_cancel(t, id, NULL, false, false, (uint64_t)i, &c), 0);
        assert_int_equal(rsv_check(t), 0);
    }
    rsv_stats s;
    rsv_get_stats(t, &s);
    assert_int_equal(s.evictions, 2); /* h0 and h1 made room */
    for (int i = 0; i < 4; i++) {     /* lease every resident: nothing can be reclaimed */
        snprintf(id, sizeof id, "c%d", i);
        snprintf(h, sizeof h, "h%d", i + 2);
        rsv_request q = {id, h, 4000, shape, 1, "float32", NULL};
        assert_int_equal(rsv_reserve(t, &q, 10, &r), 0);
        assert_true(r.cached);
        assert_int_equal(rsv_take(t, id, 10, &st), 0);
    }
    rsv_request q = {"x", "hx", 4000, shape, 1, "float32", NULL};
    assert_err(rsv_reserve(t, &q, 11, &r), ECT_EFULL, "EC consumer buffer pool is full");
    for (int i = 0; i < 4; i++) {
        snprintf(h, sizeof h, "h%d", i + 2);
        assert_int_equal(rsv_release(t, h, 12), 0);
    }
    rsv_reap(t, 12 + 2 * TTL);
    rsv_evict_resident(t, SIZE_MAX);
    ect_pool_stat ps;
    ect_pool_stats(pool, &ps);
    assert_int_equal(ps.used, 0);
    rsv_close(t);
    ect_pool_close(pool);
}

/* The transitions SPEC.md allows (0: unknown). Beyond its list: WRITING ->
 * EXPIRED is the producer's refresh (cancel with refresh and abandon), and an
 * EXPIRED tombstone counts as forgotten: a reserve starts anew, a cancel
 * pre-cancels. */
static bool legal(rsv_state from, rsv_state to) {
    if (from == to) return true;
    if (from == 0) return to == RSV_WRITING || to == RSV_READY || to == RSV_CANCELLED;
    switch (from) {
    case RSV_WRITING:
        return to == RSV_READY || to == RSV_CANCEL_PENDING || to == RSV_EXPIRE_PENDING ||
               to == RSV_CANCELLED || to == RSV_EXPIRED;
    case RSV_READY: return to == RSV_CANCELLED || to == RSV_EXPIRED;
    case RSV_CANCEL_PENDING: return to == RSV_CANCELLED;
    case RSV_EXPIRE_PENDING: return to == RSV_CANCELLED || to == RSV_EXPIRED;
    case RSV_CANCELLED: return to == 0;
    case RSV_EXPIRED: return to == 0 || to == RSV_WRITING || to == RSV_READY || to == RSV_CANCELLED;
    }
    return false;
}

/* Random operations against the invariants: no free under a writer (the
 * fake asserts), used bytes == bytes held, no double free, rsv_check, and
 * every state change of the operated transfer is a legal transition. */
static void test_random_ops(void **state) {
    (void)state;
    uint64_t seed = 12345;
    /* write, follow, cached, cancelled, ready, pending, evict, full, adopted, finished */
    unsigned seen[10] = {0};
    for (int round = 0; round < 20; round++) {
        fx *f = fx_new(4 * 64, &fake_ops);
        f->o.max_tombstones = 16;
        f->o.max_events = 8;
        f->o.ttl_ms = 50;
        fx_open(f);
        char rid[8][ECT_ID_LEN + 1] = {{0}};
        uint64_t woff[8];
        bool wr[8] = {0};
        uint64_t now = 0;
        for (int step = 0; step < 3000; step++) {
            unsigned k = (unsigned)(test_rand(&seed) % 8), op = (unsigned)(test_rand(&seed) % 9);
            char tid[8], h[8];
            snprintf(tid, sizeof tid, "t%u", k);
            snprintf(h, sizeof h, "h%u", (unsigned)(test_rand(&seed) % 5));
            now += test_rand(&seed) % 7;
            rsv_reap(f->t, now); /* so the op below makes one transition at most */
            rsv_state before = state_of(f, tid);
            rsv_reply r;
            rsv_status st;
            bool c, b;
            switch (op) {
            case 0:
            case 1:
                int rc = reserve(f, tid, h, now, &r);
                seen[7] += rc == ECT_EFULL;
                if (rc == 0) {
                    seen[0] += r.write;
                    seen[1] += !r.write && !r.ready && !r.cancelled;
                    seen[2] += r.cached;
                    seen[3] += r.cancelled;
                }
                if (rc == 0 && r.write) {
                    memcpy(rid[k], r.reservation_id, sizeof rid[k]);
                    woff[k] = r.offset;
                    wr[k] = true;
                    writing(&f->pool, r.offset, true);
                } else if (rsv_status_get(f->t, tid, &st) == 0) {
                    memcpy(rid[k], st.reservation_id, sizeof rid[k]);
                }
                break;
            case 2:
            case 3:
                /* the producer completes only once its write landed */
                if (wr[k]) writing(&f->pool, woff[k], false), wr[k] = false;
                rsv_complete(f->t, tid, rid[k], now, &c, &b);
                seen[4] += b;
                break;
            case 4: /* abandon or refresh: the writer stops first */
                if (wr[k]) writing(&f->pool, woff[k], false), wr[k] = false;
                (void)rsv_cancel(f->t, tid, test_rand(&seed) % 4 ? rid[k] : NULL, true,
                                 test_rand(&seed) % 2, now, &c);
                break;
            case 5: (void)rsv_cancel(f->t, tid, NULL, false, false, now, &c); break;
            case 6:
                if (rsv_take(f->t, tid, now, &st) == 0 && test_rand(&seed) % 3) {
                    assert_int_equal(rsv_release(f->t, st.mm_hash, now), 0);
                    if (test_rand(&seed) % 2) assert_int_equal(rsv_finish(f->t, tid, now), 0);
                }
                break;
            case 7: rsv_reap(f->t, now); break;
            case 8:
                while (rsv_event_peek(f->t) && test_rand(&seed) % 4) rsv_event_pop(f->t);
                break;
            }
            assert_int_equal(rsv_check(f->t), 0);
            rsv_stats s;
            rsv_get_stats(f->t, &s);
            assert_int_equal(s.bytes_held, f->pool.used);
            rsv_state after = state_of(f, tid);
            if (!legal(before, after)) {
                print_error("illegal transition %s -> %s (op %u)\n", rsv_state_name(before),
                            rsv_state_name(after), op);
                fail();
            }
            if (rsv_status_get(f->t, tid, &st) == 0)
                seen[5] += st.state == RSV_CANCEL_PENDING || st.state == RSV_EXPIRE_PENDING;
            seen[6] = (unsigned)s.evictions > seen[6] ? (unsigned)s.evictions : seen[6];
            seen[8] = (unsigned)s.adopted > seen[8] ? (unsigned)s.adopted : seen[8];
            seen[9] = (unsigned)s.finished > seen[9] ? (unsigned)s.finished : seen[9];
        }
        /* settle: every writer completes or abandons, leases are dropped */
        for (unsigned k = 0; k < 8; k++) {
            char tid[8];
            snprintf(tid, sizeof tid, "t%u", k);
            if (wr[k]) writing(&f->pool, woff[k], false);
            bool c;
            (void)rsv_cancel(f->t, tid, NULL, true, false, now, &c);
        }
        for (int i = 0; i < 16; i++) {
            char h[8];
            snprintf(h, sizeof h, "h%d", i % 5);
            (void)rsv_release(f->t, h, now);
        }
        for (int i = 0; i < 100; i++) {
            char h[8];
            snprintf(h, sizeof h, "h%d", i % 5);
            (void)rsv_release(f->t, h, now);
        }
        fx_finish(f, now);
    }
    /* the run reached every kind of outcome it is meant to check */
    for (int i = 0; i < 10; i++) {
        print_message("outcome %d seen %u times\n", i, seen[i]);
        assert_true(seen[i] > 0);
    }
}

/* ---- rsv_ready_list (ect_ready, docs/PROTOCOL.md "the scheduler lists what
 * is ready"): seqs in readiness order, the cursor, max, age, taken items. */

typedef struct listed {
    char ids[256];
    uint64_t seqs[16];
    size_t n;
} listed;

static void on_listed(void *ctx, const char *tid, uint64_t seq, const rsv_status *st) {
    listed *l = ctx;
    assert_true(st->ready && st->nbytes == 64 && strcmp(st->dtype, "bfloat16") == 0);
    assert_true(l->n < 16);
    l->seqs[l->n++] = seq;
    strcat(l->ids, tid);
    strcat(l->ids, ",");
}

/* Lists and checks the ids, the cursor and `more`. */
static void expect_list(fx *f, uint64_t after, uint64_t age, size_t max, uint64_t now,
                        const char *ids, uint64_t want_next, bool want_more) {
    listed l = {0};
    uint64_t next = 12345;
    bool more = !want_more;
    size_t n = rsv_ready_list(f->t, after, age, max, now, on_listed, &l, &next, &more);
    assert_string_equal(l.ids, ids);
    assert_int_equal(n, l.n);
    if (next != want_next || more != want_more)
        fail_msg("after %llu age %llu max %zu at %llu: next %llu more %d, want %llu %d",
                 (unsigned long long)after, (unsigned long long)age, max, (unsigned long long)now,
                 (unsigned long long)next, more, (unsigned long long)want_next, want_more);
    for (size_t i = 1; i < l.n; i++) assert_true(l.seqs[i] > l.seqs[i - 1]);
    assert_int_equal(rsv_check(f->t), 0);
}

static void test_ready_list(void **state) {
    (void)state;
    fx *f = fx_new(1 << 20, &fake_ops);
    fx_open(f);
    rsv_reply r1, r2, r2b, r3, r4;
    expect_list(f, 0, 0, 8, 0, "", 0, false); /* empty table */
    assert_int_equal(reserve(f, "t1", "h1", 0, &r1), 0);
    expect_list(f, 0, 0, 8, 0, "", 0, false);             /* WRITING: not listed */
    complete(f, "t1", r1.reservation_id, 10, true, true); /* seq 1 at 10 */
    assert_int_equal(reserve(f, "t2", "h2", 10, &r2), 0);
    assert_int_equal(reserve(f, "t2b", "h2", 10, &r2b), 0); /* a follower */
    assert_int_equal(reserve(f, "t4", "h4", 10, &r4), 0);   /* stays WRITING */
    complete(f, "t2", r2.reservation_id, 20, true, true);   /* seqs 2, 3 at 20 */
    assert_int_equal(reserve(f, "t3", "h1", 30, &r3), 0);   /* cached: seq 4 at 30 */
    assert_true(r3.cached);
    /* everything, oldest first; then nothing new */
    expect_list(f, 0, 0, 8, 30, "t1,t2,t2b,t3,", 4, false);
    expect_list(f, 4, 0, 8, 30, "", 4, false);
    /* max splits the list: listed once each, the cursor advances */
    expect_list(f, 0, 0, 2, 30, "t1,t2,", 2, true);
    expect_list(f, 2, 0, 2, 30, "t2b,t3,", 4, false);
    expect_list(f, 0, 0, 4, 30, "t1,t2,t2b,t3,", 4, false); /* max reached at the end: no more */
    /* age: only items ready that long; the cursor stops before the young */
    expect_list(f, 0, 15, 8, 30, "t1,", 1, false);
    expect_list(f, 1, 15, 8, 40, "t2,t2b,", 3, false);
    expect_list(f, 3, 15, 8, 40, "", 3, false);
    expect_list(f, 3, 15, 8, 45, "t3,", 4, false);
    /* a cursor from before a restart (above every seq) reads as 0 */
    expect_list(f, 99, 0, 8, 45, "t1,t2,t2b,t3,", 4, false);
    /* taken: skipped (and passed by the cursor); finished and cancelled: gone */
    rsv_status st;
    assert_int_equal(rsv_take(f->t, "t2", 45, &st), 0);
    expect_list(f, 0, 0, 8, 45, "t1,t2b,t3,", 4, false);
    expect_list(f, 0, 0, 1, 45, "t1,", 2, true); /* passed the taken t2 */
    expect_list(f, 2, 0, 1, 45, "t2b,", 3, true);
    assert_int_equal(rsv_release(f->t, "h2", 46), 0);
    assert_int_equal(rsv_finish(f->t, "t2", 46), 0);
    assert_int_equal(rsv_take(f->t, "t1", 46, &st), 0);
    assert_int_equal(rsv_release(f->t, "h1", 46), 0);
    assert_int_equal(rsv_finish(f->t, "t1", 46), 0);
    cancel(f, "t3", "", false, false, 46);
    expect_list(f, 0, 0, 8, 46, "t2b,", 4, false);
    /* a new readiness gets the next seq; the reaper ends the rest */
    complete(f, "t4", r4.reservation_id, 50, true, true);
    expect_list(f, 4, 0, 8, 50, "t4,", 5, false);
    rsv_reap(f->t, 50 + TTL + 1);
    expect_list(f, 0, 0, 8, 50 + TTL + 1, "", 5, false);
    fx_finish(f, 50 + TTL + 2);
}

int main(void) {
    ect_log_set_level(ECT_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opts_validated),
        cmocka_unit_test(test_spares),
        cmocka_unit_test(test_reserve_complete_take_release),
        cmocka_unit_test(test_reserve_validates_fields),
        cmocka_unit_test(test_conflicts),
        cmocka_unit_test(test_follower_published_with_writer),
        cmocka_unit_test(test_writing_reserve_extends_ttl),
        cmocka_unit_test(test_cached_from_resident),
        cmocka_unit_test(test_ready_expires_and_memory_returns),
        cmocka_unit_test(test_cancel_before_reserve),
        cmocka_unit_test(test_cancel_while_writing),
        cmocka_unit_test(test_cancel_pending_abandon_frees),
        cmocka_unit_test(test_abandoned_writer_reports_followers),
        cmocka_unit_test(test_expired_writer_must_refresh),
        cmocka_unit_test(test_refresh_writing_and_ready),
        cmocka_unit_test(test_expire_pending_cancel_then_complete),
        cmocka_unit_test(test_reaper_cancels_stale_follower),
        cmocka_unit_test(test_producer_vanishes_after_reserve),
        cmocka_unit_test(test_refresh_keeps_followers),
        cmocka_unit_test(test_finish_on_release),
        cmocka_unit_test(test_pool_full_lru_reclaim),
        cmocka_unit_test(test_tombstone_cap),
        cmocka_unit_test(test_lookup_memory_follows_the_table),
        cmocka_unit_test(test_records_reused_across_steps),
        cmocka_unit_test(test_event_backlog),
        cmocka_unit_test(test_real_pool),
        cmocka_unit_test(test_random_ops),
        cmocka_unit_test(test_ready_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
