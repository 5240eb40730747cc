/*
 * Tests for push/transfers: the consumer scheduler's table — every state
 * and transition, the all-shards gate, push-wait and TTL timeouts, abandoned
 * and late events, orphans, bounded tombstones, remote cancels with one
 * retry to the failed shards only, and random operations against invariants.
 */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "push/transfers.h"

#define S 1000ull

static const uint64_t SHAPE[2] = {576, 4096};

static xfer_table *open_tp(size_t tp) {
    xfer_opts o;
    xfer_opts_init(&o);
    o.tp_size = tp;
    xfer_table *t;
    assert_int_equal(xfer_open(&o, &t), 0);
    return t;
}

static int ready(xfer_table *t, const char *tid, size_t shard, const char *rid, uint64_t now) {
    xfer_event ev = {tid, shard, true, rid, "h", 576 * 4096 * 2, SHAPE, 2, "bfloat16", NULL};
    int rc = xfer_on_event(t, &ev, now);
    assert_int_equal(xfer_check(t), 0);
    return rc;
}

static int abandoned(xfer_table *t, const char *tid, size_t shard, uint64_t now) {
    xfer_event ev = {.transfer_id = tid, .shard = shard, .ready = false, .error = "pool full"};
    int rc = xfer_on_event(t, &ev, now);
    assert_int_equal(xfer_check(t), 0);
    return rc;
}

static xfer_state state_of(xfer_table *t, const char *tid) {
    xfer_info in;
    return xfer_get(t, tid, &in) ? 0 : in.state;
}

static size_t take(xfer_table *t, xfer_cancel_job *jobs) { return xfer_take_cancels(t, jobs, 16); }

static void test_opts(void **state) {
    (void)state;
    xfer_opts o;
    xfer_opts_init(&o);
    assert_int_equal(o.push_wait_ms, 60000);
    assert_int_equal(o.ttl_ms, 300000);
    assert_int_equal(o.max_tombstones, 65536);
    assert_int_equal(o.cancel_attempts, 2);
    xfer_table *t = (xfer_table *)1;
    o.tp_size = 0;
    assert_err(xfer_open(&o, &t), ECT_EINVAL, "tp_size");
    assert_null(t);
    o.tp_size = 65;
    assert_err(xfer_open(&o, &t), ECT_EINVAL, "tp_size");
    o.tp_size = 64;
    o.push_wait_ms = 0;
    assert_err(xfer_open(&o, &t), ECT_EINVAL, "push_wait_ms");
    o.push_wait_ms = 1;
    o.cancel_attempts = 0;
    assert_err(xfer_open(&o, &t), ECT_EINVAL, "cancel_attempts");
    o.cancel_attempts = 1;
    assert_int_equal(xfer_open(&o, &t), 0); /* 64 shards: the full mask */
    for (size_t i = 0; i < 64; i++) ready(t, "x", i, "r", 0);
    assert_int_equal(state_of(t, "x"), XFER_AVAILABLE);
    xfer_close(t);
    xfer_close(NULL);
}

static void test_happy_path_all_shards(void **state) {
    (void)state;
    xfer_table *t = open_tp(2);
    assert_int_equal(xfer_expect(t, "t", "h", 0), 0);
    assert_err(xfer_expect(t, "t", "h", 0), ECT_EEXIST, "already expected");
    assert_int_equal(state_of(t, "t"), XFER_WAITING_EVENT);
    assert_err(xfer_start_load(t, "t"), ECT_ESTATE, "WAITING_EVENT");
    assert_int_equal(ready(t, "t", 0, "r0", 1), XFER_EV_APPLIED);
    assert_int_equal(ready(t, "t", 0, "r0", 1), XFER_EV_DUPLICATE);
    xfer_info in;
    assert_int_equal(xfer_get(t, "t", &in), 0);
    assert_int_equal(in.state, XFER_WAITING_EVENT); /* one shard is not enough */
    assert_int_equal(in.reported, 1);
    assert_int_equal(ready(t, "t", 1, "r1", 2), XFER_EV_APPLIED);
    assert_int_equal(xfer_get(t, "t", &in), 0);
    assert_int_equal(in.state, XFER_AVAILABLE);
    assert_int_equal(in.nbytes, 576 * 4096 * 2);
    assert_string_equal(in.dtype, "bfloat16");
    assert_int_equal(in.shape[1], 4096);
    assert_int_equal(ready(t, "t", 1, "r1", 2), XFER_EV_DUPLICATE);
    assert_err(xfer_loaded(t, "t"), ECT_ESTATE, "AVAILABLE");
    assert_err(xfer_resident(t, "t"), ECT_ESTATE, NULL);
    assert_int_equal(xfer_start_load(t, "t"), 0);
    assert_err(xfer_start_load(t, "t"), ECT_ESTATE, "LOADING");
    assert_err(xfer_resident(t, "t"), ECT_ESTATE, NULL);
    assert_int_equal(xfer_loaded(t, "t"), 0);
    assert_int_equal(abandoned(t, "t", 0, 3), XFER_EV_DUPLICATE); /* bytes already here */
    assert_int_equal(xfer_resident(t, "t"), 0);
    assert_int_equal(state_of(t, "t"), XFER_RESIDENT);
    xfer_cancel_job jobs[16];
    assert_int_equal(take(t, jobs), 0);
    /* finish: cancel on every shard, with each shard's reservation id */
    assert_int_equal(xfer_cancel(t, "t", 4), 0);
    assert_int_equal(state_of(t, "t"), XFER_CANCELLED);
    assert_int_equal(take(t, jobs), 2);
    assert_string_equal(jobs[0].transfer_id, "t");
    assert_string_equal(jobs[0].reservation_id, "r0");
    assert_int_equal(jobs[1].shard, 1);
    assert_string_equal(jobs[1].reservation_id, "r1");
    assert_int_equal(jobs[1].attempt, 1);
    assert_int_equal(xfer_cancel(t, "t", 5), 0); /* idempotent, nothing more sent */
    assert_int_equal(take(t, jobs), 0);
    assert_int_equal(ready(t, "t", 0, "r0", 6), XFER_EV_LATE);
    assert_err(xfer_expect(t, "t", "h", 6), ECT_EEXIST, NULL);
    assert_err(xfer_cancel(t, "zz", 6), ECT_ENOTFOUND, "zz");
    assert_err(xfer_start_load(t, "zz"), ECT_ENOTFOUND, "zz");
    xfer_close(t);
}

/* What the shell reports: every transfer that ended badly, once, oldest
 * first (not those the engine failed itself); a finished transfer leaves
 * without remote cancels; a shard reporting again (its reservation given
 * back and made anew) updates the id its cancel will carry. */
static void test_failures_finished_and_new_ids(void **state) {
    (void)state;
    xfer_table *t = open_tp(2);
    xfer_failure f[8];
    assert_int_equal(xfer_take_failures(t, f, 8), 0);
    assert_int_equal(xfer_expect(t, "a", NULL, 0), 0);
    assert_int_equal(abandoned(t, "a", 1, 1), XFER_EV_APPLIED);
    assert_int_equal(xfer_expect(t, "u", NULL, 0), 0);
    ready(t, "u", 0, "r0", 0);
    assert_int_equal(xfer_expect(t, "e", NULL, 0), 0);
    assert_int_equal(xfer_fail(t, "e", "the engine's own", 2), 0);
    abandoned(t, "orphan", 0, 3); /* never expected: still reported */
    xfer_reap(t, 61 * S);         /* u: not on every shard in time */
    assert_int_equal(xfer_take_failures(t, f, 1), 1);
    assert_string_equal(f[0].transfer_id, "a");
    assert_int_equal(f[0].state, XFER_FAILED);
    assert_non_null(strstr(f[0].error, "abandoned by shard 1"));
    assert_int_equal(xfer_take_failures(t, f, 8), 2);
    assert_string_equal(f[0].transfer_id, "orphan");
    assert_string_equal(f[1].transfer_id, "u");
    assert_int_equal(f[1].state, XFER_UNAVAILABLE);
    assert_int_equal(f[1].reported, 1);
    assert_int_equal(xfer_take_failures(t, f, 8), 0);
    /* a shard reports again with a new reservation: the newest is cancelled */
    assert_int_equal(xfer_expect(t, "n", NULL, 62 * S), 0);
    ready(t, "n", 0, "old", 62 * S);
    assert_int_equal(ready(t, "n", 0, "new", 62 * S), XFER_EV_DUPLICATE);
    ready(t, "n", 1, "r1", 62 * S);
    assert_int_equal(xfer_start_load(t, "n"), 0);
    assert_int_equal(xfer_loaded(t, "n"), 0);
    assert_err(xfer_finished(t, "n", 63 * S), ECT_ESTATE, "not RESIDENT");
    assert_int_equal(xfer_resident(t, "n"), 0);
    xfer_cancel_job jobs[16];
    while (take(t, jobs)) { /* the earlier failures' cancels */
    }
    assert_int_equal(xfer_cancel(t, "n", 63 * S), 0);
    assert_int_equal(take(t, jobs), 2);
    assert_string_equal(jobs[0].reservation_id, "new");
    /* finished: the shards ended it themselves, nothing is sent */
    assert_int_equal(xfer_expect(t, "d", NULL, 64 * S), 0);
    ready(t, "d", 0, "r0", 64 * S);
    ready(t, "d", 1, "r1", 64 * S);
    assert_int_equal(xfer_start_load(t, "d"), 0);
    assert_int_equal(xfer_loaded(t, "d"), 0);
    assert_int_equal(xfer_resident(t, "d"), 0);
    assert_int_equal(xfer_finished(t, "d", 65 * S), 0);
    assert_int_equal(state_of(t, "d"), XFER_CANCELLED);
    assert_int_equal(take(t, jobs), 0);
    assert_err(xfer_finished(t, "zz", 65 * S), ECT_ENOTFOUND, "zz");
    assert_int_equal(xfer_take_failures(t, f, 8), 0);
    assert_int_equal(xfer_check(t), 0);
    xfer_close(t);
}

static void test_push_wait_timeout(void **state) {
    (void)state;
    xfer_table *t = open_tp(2);
    assert_int_equal(xfer_expect(t, "t", NULL, 10 * S), 0);
    ready(t, "t", 1, "r1", 20 * S);
    xfer_reap(t, 70 * S - 1);
    assert_int_equal(state_of(t, "t"), XFER_WAITING_EVENT);
    xfer_reap(t, 70 * S);
    xfer_info in;
    assert_int_equal(xfer_get(t, "t", &in), 0);
    assert_int_equal(in.state, XFER_UNAVAILABLE);
    assert_true(in.retryable);
    assert_non_null(strstr(in.error, "1 of 2"));
    assert_non_null(strstr(in.error, "retryable"));
    xfer_cancel_job jobs[16];
    assert_int_equal(take(t, jobs), 2);
    assert_string_equal(jobs[0].reservation_id, ""); /* pre-cancel: refuses a late producer */
    assert_string_equal(jobs[1].reservation_id, "r1");
    /* a late event after unavailable is ignored */
    assert_int_equal(ready(t, "t", 0, "r0", 71 * S), XFER_EV_LATE);
    assert_int_equal(state_of(t, "t"), XFER_UNAVAILABLE);
    /* cancel on the tombstone keeps it, sends nothing more */
    assert_int_equal(xfer_cancel(t, "t", 72 * S), 0);
    assert_int_equal(state_of(t, "t"), XFER_CANCELLED);
    assert_int_equal(take(t, jobs), 0);
    xfer_stats st;
    xfer_get_stats(t, &st);
    assert_int_equal(st.late_events, 1);
    /* the tombstone lives one TTL */
    xfer_reap(t, 70 * S + 300 * S);
    assert_int_equal(state_of(t, "t"), 0);
    xfer_close(t);
}

static void test_available_expires(void **state) {
    (void)state;
    xfer_table *t = open_tp(1);
    assert_int_equal(xfer_expect(t, "t", "h", 0), 0);
    ready(t, "t", 0, "r", 5 * S);
    xfer_reap(t, 5 * S + 300 * S - 1);
    assert_int_equal(state_of(t, "t"), XFER_AVAILABLE);
    xfer_reap(t, 5 * S + 300 * S);
    xfer_info in;
    assert_int_equal(xfer_get(t, "t", &in), 0);
    assert_int_equal(in.state, XFER_EXPIRED);
    assert_true(in.retryable);
    xfer_cancel_job jobs[4];
    assert_int_equal(take(t, jobs), 1);
    assert_string_equal(jobs[0].reservation_id, "r");
    /* LOADING does not expire */
    assert_int_equal(xfer_expect(t, "u", "h", 400 * S), 0);
    ready(t, "u", 0, "r", 400 * S);
    assert_int_equal(xfer_start_load(t, "u"), 0);
    xfer_reap(t, 2000 * S);
    assert_int_equal(state_of(t, "u"), XFER_LOADING);
    assert_int_equal(xfer_fail(t, "u", "load failed: short read", 2000 * S), 0);
    assert_int_equal(xfer_get(t, "u", &in), 0);
    assert_int_equal(in.state, XFER_FAILED);
    assert_false(in.retryable);
    assert_string_equal(in.error, "load failed: short read");
    assert_err(xfer_fail(t, "u", "again", 2000 * S), ECT_ESTATE, "FAILED");
    assert_int_equal(take(t, jobs), 1);
    xfer_close(t);
}

static void test_abandoned_fails_early(void **state) {
    (void)state;
    xfer_table *t = open_tp(2);
    assert_int_equal(xfer_expect(t, "t", "h", 0), 0);
    ready(t, "t", 0, "r0", 1);
    assert_int_equal(abandoned(t, "t", 1, 2), XFER_EV_APPLIED);
    xfer_info in;
    assert_int_equal(xfer_get(t, "t", &in), 0);
    assert_int_equal(in.state, XFER_FAILED);
    assert_non_null(strstr(in.error, "abandoned by shard 1: pool full"));
    assert_int_equal(ready(t, "t", 1, "r1", 3), XFER_EV_LATE);
    /* AVAILABLE and LOADING fail too: a shard dropped its copy */
    assert_int_equal(xfer_expect(t, "a", "h", 0), 0);
    ready(t, "a", 0, "r0", 1);
    ready(t, "a", 1, "r1", 1);
    assert_int_equal(xfer_start_load(t, "a"), 0);
    assert_int_equal(abandoned(t, "a", 0, 2), XFER_EV_APPLIED);
    assert_int_equal(state_of(t, "a"), XFER_FAILED);
    xfer_close(t);
}

static void test_shards_must_agree(void **state) {
    (void)state;
    xfer_table *t = open_tp(2);
    assert_int_equal(xfer_expect(t, "t", "h", 0), 0);
    ready(t, "t", 0, "r0", 1);
    const uint64_t other[2] = {576, 2048};
    xfer_event ev = {"t", 1, true, "r1", "h", 576 * 2048 * 2, other, 2, "bfloat16", NULL};
    assert_int_equal(xfer_on_event(t, &ev, 2), XFER_EV_APPLIED);
    xfer_info in;
    assert_int_equal(xfer_get(t, "t", &in), 0);
    assert_int_equal(in.state, XFER_FAILED);
    assert_non_null(strstr(in.error, "shard 1"));
    /* the request names another hash than the shards */
    assert_int_equal(xfer_expect(t, "u", "other", 0), 0);
    ready(t, "u", 0, "r0", 1);
    assert_int_equal(state_of(t, "u"), XFER_FAILED);
    /* malformed events are refused with the cause */
    xfer_event bad = {"u", 2, true, "r", "h", 0, NULL, 0, "bfloat16", NULL};
    assert_err(xfer_on_event(t, &bad, 3), ECT_EINVAL, "shard 2 out of range");
    bad.shard = 0;
    bad.transfer_id = "";
    assert_err(xfer_on_event(t, &bad, 3), ECT_EINVAL, "transfer_id");
    bad.transfer_id = "v";
    bad.mm_hash = NULL;
    assert_err(xfer_on_event(t, &bad, 3), ECT_EINVAL, "mm_hash");
    bad.mm_hash = "h";
    bad.ndim = 9;
    assert_err(xfer_on_event(t, &bad, 3), ECT_EINVAL, "shape");
    assert_int_equal(state_of(t, "v"), 0);
    assert_err(xfer_expect(t, "", NULL, 0), ECT_EINVAL, "transfer_id");
    xfer_close(t);
}

static void test_orphans(void **state) {
    (void)state;
    xfer_opts o;
    xfer_opts_init(&o);
    o.tp_size = 2;
    o.max_orphans = 2;
    xfer_table *t;
    assert_int_equal(xfer_open(&o, &t), 0);
    /* events before expect are kept and adopted */
    assert_int_equal(ready(t, "a", 0, "r0", 0), XFER_EV_ORPHAN);
    assert_int_equal(ready(t, "a", 1, "r1", 0), XFER_EV_ORPHAN);
    xfer_info in;
    assert_int_equal(xfer_get(t, "a", &in), 0);
    assert_false(in.expected);
    assert_int_equal(in.state, XFER_AVAILABLE);
    assert_err(xfer_start_load(t, "a"), ECT_ENOTFOUND, NULL); /* not expected yet */
    assert_int_equal(xfer_expect(t, "a", "h", 1), 0);
    assert_int_equal(xfer_start_load(t, "a"), 0);
    /* the cap keeps the newest orphans */
    ready(t, "b", 0, "r", 2);
    ready(t, "c", 0, "r", 3);
    ready(t, "d", 0, "r", 4);
    xfer_stats st;
    xfer_get_stats(t, &st);
    assert_int_equal(st.orphans, 2);
    assert_int_equal(st.orphans_dropped, 1);
    assert_int_equal(state_of(t, "b"), 0);
    /* an orphan abandoned is adopted as FAILED */
    assert_int_equal(abandoned(t, "c", 1, 5), XFER_EV_ORPHAN);
    assert_int_equal(xfer_expect(t, "c", "h", 6), 0);
    assert_int_equal(state_of(t, "c"), XFER_FAILED);
    xfer_cancel_job jobs[8];
    assert_int_equal(take(t, jobs), 2);
    /* an orphan never expected goes after one TTL without cancels */
    xfer_reap(t, 4 + 300 * S);
    assert_int_equal(state_of(t, "d"), 0);
    assert_int_equal(take(t, jobs), 0);
    /* an expected orphan gets the push wait from its expect */
    ready(t, "e", 0, "r", 300 * S);
    assert_int_equal(xfer_expect(t, "e", NULL, 400 * S), 0);
    xfer_reap(t, 460 * S - 1);
    assert_int_equal(state_of(t, "e"), XFER_WAITING_EVENT);
    xfer_reap(t, 460 * S);
    assert_int_equal(state_of(t, "e"), XFER_UNAVAILABLE);
    assert_int_equal(xfer_check(t), 0);
    xfer_close(t);
}

/* Overdue items are handed out for `status` questions: only the shards that
 * have not reported, first recheck_ms after the entry was seen, then at
 * doubling intervals; an item that arrived is not asked for again. */
static void test_rechecks(void **state) {
    (void)state;
    xfer_table *t = open_tp(3); /* recheck_ms: the default, 1000 */
    xfer_recheck rc[8];
    assert_int_equal(xfer_expect(t, "a", "h", 0), 0);
    assert_int_equal(xfer_expect(t, "b", "h", 0), 0);
    assert_int_equal(ready(t, "a", 1, "r1", 10), XFER_EV_APPLIED);
    assert_int_equal(xfer_take_rechecks(t, 10, rc, 8), 0); /* first seen: not yet due */
    assert_int_equal(xfer_take_rechecks(t, 1009, rc, 8), 0);
    assert_int_equal(xfer_take_rechecks(t, 1010, rc, 8), 5); /* a: shards 0, 2; b: 0, 1, 2 */
    size_t a_asked = 0;
    for (size_t i = 0; i < 5; i++)
        if (strcmp(rc[i].transfer_id, "a") == 0) {
            assert_true(rc[i].shard != 1);
            a_asked++;
        }
    assert_int_equal(a_asked, 2);
    assert_int_equal(xfer_take_rechecks(t, 1500, rc, 8), 0); /* next round 2 s later */
    assert_int_equal(ready(t, "b", 0, "r0", 1600), XFER_EV_APPLIED);
    assert_int_equal(ready(t, "b", 1, "r1", 1600), XFER_EV_APPLIED);
    assert_int_equal(ready(t, "b", 2, "r2", 1600), XFER_EV_APPLIED); /* b arrived */
    assert_int_equal(xfer_take_rechecks(t, 3010, rc, 1), 0);         /* a needs 2 slots */
    assert_int_equal(xfer_take_rechecks(t, 3010, rc, 8), 2);
    assert_string_equal(rc[0].transfer_id, "a");
    assert_int_equal(xfer_take_rechecks(t, 7009, rc, 8), 0); /* then 4 s */
    assert_int_equal(xfer_take_rechecks(t, 7010, rc, 8), 2);
    xfer_stats st;
    xfer_get_stats(t, &st);
    assert_int_equal(st.rechecks, 9);
    assert_int_equal(xfer_check(t), 0);
    xfer_close(t);
}

static void test_cancel_retries_only_failed_shards(void **state) {
    (void)state;
    xfer_table *t = open_tp(4);
    assert_int_equal(xfer_expect(t, "t", "h", 0), 0);
    assert_int_equal(xfer_cancel(t, "t", 1), 0);
    xfer_cancel_job jobs[16];
    assert_int_equal(take(t, jobs), 4);
    xfer_cancel_done(t, &jobs[0], true);
    xfer_cancel_done(t, &jobs[1], false);
    xfer_cancel_done(t, &jobs[2], true);
    xfer_cancel_done(t, &jobs[3], false);
    xfer_cancel_job retry[16];
    assert_int_equal(take(t, retry), 2);
    assert_int_equal(retry[0].shard, 1);
    assert_int_equal(retry[1].shard, 3);
    assert_int_equal(retry[0].attempt, 2);
    xfer_cancel_done(t, &retry[0], true);
    xfer_cancel_done(t, &retry[1], false); /* second failure: given up */
    assert_int_equal(take(t, retry), 0);
    xfer_stats st;
    xfer_get_stats(t, &st);
    assert_int_equal(st.cancels_given_up, 1);
    assert_int_equal(xfer_check(t), 0);
    xfer_close(t);
}

static void test_tombstone_cap(void **state) {
    (void)state;
    xfer_opts o;
    xfer_opts_init(&o);
    o.max_tombstones = 3;
    xfer_table *t;
    assert_int_equal(xfer_open(&o, &t), 0);
    char id[8];
    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof id, "t%d", i);
        assert_int_equal(xfer_expect(t, id, "h", (uint64_t)i), 0);
        assert_int_equal(xfer_cancel(t, id, (uint64_t)i), 0);
    }
    xfer_stats st;
    xfer_get_stats(t, &st);
    assert_int_equal(st.tombstones, 3);
    assert_int_equal(st.tombstones_dropped, 2);
    assert_int_equal(state_of(t, "t0"), 0);
    assert_int_equal(state_of(t, "t2"), XFER_CANCELLED);
    /* a forgotten id may be expected again */
    assert_int_equal(xfer_expect(t, "t0", "h", 10), 0);
    assert_int_equal(xfer_check(t), 0);
    xfer_close(t);
}

/* Random events and steps: xfer_check after every call (AVAILABLE and later
 * only with every shard reported; counters and caps), and no transition
 * out of a tombstone except to CANCELLED. */
static void test_random_ops(void **state) {
    (void)state;
    uint64_t seed = 777;
    xfer_opts o;
    xfer_opts_init(&o);
    o.tp_size = 3;
    o.max_tombstones = 8;
    o.max_orphans = 4;
    o.push_wait_ms = 40;
    o.ttl_ms = 100;
    xfer_table *t;
    assert_int_equal(xfer_open(&o, &t), 0);
    uint64_t now = 0;
    unsigned seen[XFER_FAILED + 1] = {0};
    for (int i = 0; i < 20000; i++) {
        char id[8];
        snprintf(id, sizeof id, "t%u", (unsigned)(test_rand(&seed) % 10));
        now += test_rand(&seed) % 5;
        xfer_state before = state_of(t, id);
        size_t shard = (size_t)(test_rand(&seed) % 3);
        switch (test_rand(&seed) % 10) {
        case 0: (void)xfer_expect(t, id, NULL, now); break;
        case 1:
        case 2:
        case 3: ready(t, id, shard, "r", now); break;
        case 4:
            if (test_rand(&seed) % 4 == 0) abandoned(t, id, shard, now);
            break;
        case 5: (void)xfer_start_load(t, id); break;
        case 6: (void)xfer_loaded(t, id); break;
        case 7: (void)xfer_resident(t, id); break;
        case 8:
            if (test_rand(&seed) % 3 == 0) (void)xfer_cancel(t, id, now);
            break;
        case 9: {
            xfer_reap(t, now);
            xfer_cancel_job jobs[8];
            size_t n = xfer_take_cancels(t, jobs, 8);
            for (size_t k = 0; k < n; k++) xfer_cancel_done(t, &jobs[k], test_rand(&seed) % 2);
            xfer_recheck rc[8]; /* only waiting items' missing shards are asked for */
            n = xfer_take_rechecks(t, now, rc, 8);
            for (size_t k = 0; k < n; k++) {
                xfer_info in;
                assert_int_equal(xfer_get(t, rc[k].transfer_id, &in), 0);
                assert_int_equal(in.state, XFER_WAITING_EVENT);
                assert_true(rc[k].shard < 3);
            }
            break;
        }
        }
        assert_int_equal(xfer_check(t), 0);
        xfer_state after = state_of(t, id);
        if (before >= XFER_UNAVAILABLE && after && after != before)
            assert_int_equal(after, XFER_CANCELLED);
        seen[after]++;
    }
    for (int s = XFER_WAITING_EVENT; s <= XFER_FAILED; s++) assert_true(seen[s] > 0);
    xfer_close(t);
}

int main(void) {
    ect_log_set_level(ECT_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opts),
        cmocka_unit_test(test_happy_path_all_shards),
        cmocka_unit_test(test_failures_finished_and_new_ids),
        cmocka_unit_test(test_push_wait_timeout),
        cmocka_unit_test(test_available_expires),
        cmocka_unit_test(test_abandoned_fails_early),
        cmocka_unit_test(test_shards_must_agree),
        cmocka_unit_test(test_orphans),
        cmocka_unit_test(test_rechecks),
        cmocka_unit_test(test_cancel_retries_only_failed_shards),
        cmocka_unit_test(test_tombstone_cap),
        cmocka_unit_test(test_random_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
