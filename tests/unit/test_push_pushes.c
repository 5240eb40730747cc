/*
 * Tests for push/pushes: the producer's records. A scripted shell takes the
 * actions push_next_actions hands out and reports outcomes; the tests check
 * the order (reserve on every shard, write once staged, complete, release,
 * report), dedup, refresh of aged reservations, that a failed shard abandons
 * the others only once everything in flight settled, and that the source is
 * released exactly once. A random run checks the invariants throughout.
 */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "push/pushes.h"

#define S 1000ull
#define MAXACT 64

static const uint64_t SHAPE[2] = {576, 4096};

static push_table *open_default(void) {
    push_opts o;
    push_opts_init(&o);
    push_table *t;
    assert_int_equal(push_open(&o, &t), 0);
    return t;
}

static int add(push_table *t, const char *tid, size_t n, uint64_t now) {
    push_item it = {.transfer_id = tid,
                    .consumer = "127.0.0.1:14579",
                    .mm_hash = "hash",
                    .nbytes = 576 * 4096 * 2,
                    .shape = SHAPE,
                    .ndim = 2,
                    .dtype = "torch.bfloat16",
                    .n_shards = n};
    return push_add(t, &it, now, NULL);
}

/* The record of tid. */
static push_rec *R(push_table *t, const char *tid) {
    push_rec *r = push_find(t, tid);
    assert_non_null(r);
    return r;
}

/* The transfer_id an action is about. */
static const char *tid_of(const push_action *a) {
    return a->rec ? a->rec->transfer_id : a->fin.transfer_id;
}

typedef struct acts {
    push_action a[MAXACT];
    size_t n;
} acts;

static acts *next(push_table *t, uint64_t now) {
    static acts A;
    A.n = push_next_actions(t, now, A.a, MAXACT);
    assert_int_equal(push_check(t), 0);
    return &A;
}

/* Asserts the batch holds exactly `n` actions of `kind` (any others fail). */
static void expect_kind(const acts *A, push_action_kind kind, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < A->n; i++) c += A->a[i].kind == kind;
    assert_int_equal(c, n);
    assert_int_equal(A->n, n);
}

static void reserve_ok(push_table *t, const char *tid, size_t shard, bool write, uint64_t now) {
    char rid[ECT_ID_LEN + 1], sess[32];
    snprintf(rid, sizeof rid, "rid%zu", shard);
    snprintf(sess, sizeof sess, "10.0.0.%zu:9000", shard);
    push_reservation r = {.reservation_id = rid,
                          .dst_session = sess,
                          .dst_ptr = 4096 * (shard + 1),
                          .dst_key = "77",
                          .write = write,
                          .ready = !write,
                          .cached = !write};
    assert_int_equal(push_reserve_done(t, R(t, tid), shard, &r, NULL, now), 0);
    assert_int_equal(push_check(t), 0);
}

static push_state state_of(push_table *t, const char *tid) {
    push_info in;
    return push_get(t, tid, &in) ? 0 : in.state;
}

static void test_opts_and_add(void **state) {
    (void)state;
    push_opts o;
    push_opts_init(&o);
    assert_int_equal(o.refresh_after_ms, 150000);
    assert_int_equal(o.ttl_ms, 300000);
    push_table *t = (push_table *)1;
    o.refresh_after_ms = 0;
    assert_err(push_open(&o, &t), ECT_EINVAL, "refresh_after_ms");
    assert_null(t);
    push_close(NULL);
    t = open_default();
    push_item it = {.transfer_id = "t",
                    .consumer = "c:1",
                    .mm_hash = "h",
                    .nbytes = 10,
                    .shape = SHAPE,
                    .ndim = 2,
                    .dtype = "bfloat16",
                    .n_shards = 1};
    assert_err(push_add(t, &it, 0, NULL), ECT_EINVAL, "shape and dtype do not match nbytes");
    it.nbytes = 576 * 4096 * 2;
    it.dtype = "nope";
    assert_err(push_add(t, &it, 0, NULL), ECT_EINVAL, "Unsupported torch dtype string");
    it.dtype = "bfloat16";
    it.n_shards = 0;
    assert_err(push_add(t, &it, 0, NULL), ECT_EINVAL, "n_shards");
    it.n_shards = 65;
    assert_err(push_add(t, &it, 0, NULL), ECT_EINVAL, "n_shards");
    it.n_shards = 1;
    it.consumer = "";
    assert_err(push_add(t, &it, 0, NULL), ECT_EINVAL, "consumer");
    it.consumer = "c:1";
    it.transfer_id = NULL;
    assert_err(push_add(t, &it, 0, NULL), ECT_EINVAL, "transfer_id");
    it.transfer_id = "t";
    assert_int_equal(push_add(t, &it, 0, NULL), 0);
    assert_err(push_add(t, &it, 0, NULL), ECT_EEXIST, "already pushed"); /* dedup */
    assert_err(push_source_ready(t, "zz", NULL, 0), ECT_ENOTFOUND, "zz");
    assert_err(push_cancel(t, "zz", 0, NULL, NULL), ECT_ENOTFOUND, "zz");
    push_close(t);
}

static void test_happy_path(void **state) {
    (void)state;
    push_table *t = open_default();
    assert_int_equal(add(t, "t", 2, 0), 0);
    acts *A = next(t, 0);
    expect_kind(A, PUSH_ACT_RESERVE, 2);
    assert_int_equal(A->a[0].shard, 0);
    assert_int_equal(A->a[1].shard, 1);
    assert_string_equal(A->a[0].rec->mm_hash, "hash");
    assert_string_equal(A->a[0].rec->dtype, "bfloat16");
    assert_string_equal(A->a[0].rec->consumer, "127.0.0.1:14579");
    assert_int_equal(A->a[0].rec->shape[0], 576);
    expect_kind(next(t, 1), 0, 0); /* nothing handed out twice while in flight */
    reserve_ok(t, "t", 0, true, 2);
    assert_err(push_reserve_done(t, R(t, "t"), 0, NULL, "x", 2), ECT_ESTATE,
               "no reserve in flight");
    assert_err(push_write_done(t, R(t, "t"), 0, true), ECT_ESTATE, "no write in flight");
    assert_err(push_reserve_done(t, R(t, "t"), 5, NULL, "x", 2), ECT_ESTATE, "no shard 5");
    reserve_ok(t, "t", 1, true, 2);
    expect_kind(next(t, 3), 0, 0); /* no source yet */
    assert_int_equal(state_of(t, "t"), PUSH_WAITING_INPUTS);
    assert_int_equal(push_source_ready(t, "t", NULL, 4), 0);
    assert_err(push_source_ready(t, "t", NULL, 4), ECT_ESTATE, "staged");
    A = next(t, 5);
    expect_kind(A, PUSH_ACT_WRITE, 2);
    assert_string_equal(A->a[1].rec->sh[A->a[1].shard].session, "10.0.0.1:9000");
    assert_int_equal(A->a[1].rec->sh[A->a[1].shard].dst_ptr, 8192);
    assert_string_equal(A->a[1].rec->sh[1].dst_key, "77");
    assert_int_equal(A->a[1].rec->nbytes, 576 * 4096 * 2);
    assert_int_equal(state_of(t, "t"), PUSH_WRITING);
    assert_int_equal(push_write_done(t, R(t, "t"), 0, true), 0);
    expect_kind(next(t, 6), 0, 0); /* completes wait for every write */
    assert_int_equal(push_write_done(t, R(t, "t"), 1, true), 0);
    A = next(t, 7);
    expect_kind(A, PUSH_ACT_COMPLETE, 2);
    assert_string_equal(A->a[0].rec->sh[A->a[0].shard].rid, "rid0");
    assert_int_equal(state_of(t, "t"), PUSH_NOTIFYING);
    assert_int_equal(push_complete_done(t, R(t, "t"), 0, true, true), 0);
    assert_int_equal(push_complete_done(t, R(t, "t"), 1, true, true), 0);
    A = next(t, 8);
    assert_int_equal(A->n, 2);
    assert_int_equal(A->a[0].kind, PUSH_ACT_RELEASE_SOURCE);
    assert_int_equal(A->a[1].kind, PUSH_ACT_FINISHED);
    assert_int_equal(A->a[1].fin.state, PUSH_DONE);
    assert_string_equal(A->a[1].fin.error, "");
    assert_int_equal(state_of(t, "t"), PUSH_DONE);
    expect_kind(next(t, 9), 0, 0);
    assert_err(add(t, "t", 2, 10), ECT_EEXIST, "already pushed");
    assert_err(push_cancel(t, "t", 10, NULL, NULL), ECT_ESTATE, "DONE");
    /* remembered one TTL, then forgotten */
    next(t, 8 + 300 * S);
    assert_int_equal(state_of(t, "t"), 0);
    assert_int_equal(add(t, "t", 1, 9 + 300 * S), 0);
    push_stats st;
    push_get_stats(t, &st);
    assert_int_equal(st.done, 1);
    push_close(t);
}

static void test_cached_and_follower_shards_skip_writes(void **state) {
    (void)state;
    push_table *t = open_default();
    assert_int_equal(add(t, "t", 2, 0), 0);
    next(t, 0);
    reserve_ok(t, "t", 0, true, 0);
    reserve_ok(t, "t", 1, false, 0); /* cached or follower */
    assert_int_equal(push_source_ready(t, "t", NULL, 1), 0);
    acts *A = next(t, 1);
    expect_kind(A, PUSH_ACT_WRITE, 1);
    assert_int_equal(A->a[0].shard, 0);
    assert_int_equal(push_write_done(t, R(t, "t"), 0, true), 0);
    A = next(t, 2);
    expect_kind(A, PUSH_ACT_COMPLETE, 1);
    assert_int_equal(push_complete_done(t, R(t, "t"), 0, true, true), 0);
    A = next(t, 3);
    assert_int_equal(A->a[A->n - 1].fin.state, PUSH_DONE);
    /* nothing to write anywhere: straight to DONE */
    assert_int_equal(add(t, "u", 1, 4), 0);
    next(t, 4);
    reserve_ok(t, "u", 0, false, 4);
    assert_int_equal(push_source_ready(t, "u", NULL, 5), 0);
    A = next(t, 5);
    assert_int_equal(A->n, 2);
    assert_int_equal(A->a[0].kind, PUSH_ACT_RELEASE_SOURCE);
    assert_int_equal(A->a[1].fin.state, PUSH_DONE);
    push_close(t);
}

static void test_failed_shard_abandons_the_others(void **state) {
    (void)state;
    push_table *t = open_default();
    assert_int_equal(add(t, "t", 3, 0), 0);
    next(t, 0);
    reserve_ok(t, "t", 0, true, 1);
    assert_int_equal(push_reserve_done(t, R(t, "t"), 1, NULL, "conflicting in-flight tensor", 1),
                     0);
    /* shard 2 still answering: nothing is abandoned yet */
    expect_kind(next(t, 2), 0, 0);
    reserve_ok(t, "t", 2, true, 3);
    acts *A = next(t, 3);
    expect_kind(A, PUSH_ACT_ABANDON, 2);
    assert_int_equal(A->a[0].shard, 0);
    assert_string_equal(A->a[0].rec->sh[A->a[0].shard].rid, "rid0");
    assert_int_equal(A->a[1].shard, 2);
    /* the source arriving now is refused: the caller releases it */
    assert_err(push_source_ready(t, "t", NULL, 3), ECT_ESTATE, "ending");
    assert_int_equal(push_abandon_done(t, R(t, "t"), 0, true), 0);
    expect_kind(next(t, 4), 0, 0);
    assert_int_equal(push_abandon_done(t, R(t, "t"), 2, false), 0); /* its TTL ends it */
    A = next(t, 5);
    expect_kind(A, PUSH_ACT_FINISHED, 1); /* never staged: nothing to release */
    assert_int_equal(A->a[0].fin.state, PUSH_FAILED);
    assert_non_null(strstr(A->a[0].fin.error, "shard 1"));
    assert_non_null(strstr(A->a[0].fin.error, "conflicting in-flight tensor"));
    push_close(t);
}

static void add_to(push_table *t, const char *tid, const char *consumer, size_t n, uint64_t now) {
    push_item it = {.transfer_id = tid,
                    .consumer = consumer,
                    .mm_hash = "hash",
                    .nbytes = 576 * 4096 * 2,
                    .shape = SHAPE,
                    .ndim = 2,
                    .dtype = "bfloat16",
                    .n_shards = n};
    assert_int_equal(push_add(t, &it, now, NULL), 0);
}

static void full(push_table *t, const char *tid, size_t shard, uint64_t now) {
    assert_int_equal(push_reserve_full(t, R(t, tid), shard, "EC consumer buffer pool is full", now),
                     0);
    assert_int_equal(push_check(t), 0);
}

/* A full shard: the item keeps its source, gives back what the other shards
 * reserved (refresh cancels, which free at once), backs off and reserves
 * again on every shard; it ends DONE and counts its retries. */
static void test_full_shard_backs_off_and_retries(void **state) {
    (void)state;
    push_table *t = open_default();
    assert_int_equal(add(t, "t", 3, 0), 0);
    assert_int_equal(push_source_ready(t, "t", NULL, 0), 0);
    expect_kind(next(t, 0), PUSH_ACT_RESERVE, 3);
    reserve_ok(t, "t", 0, true, 1);
    full(t, "t", 1, 1);
    assert_err(push_reserve_full(t, R(t, "t"), 1, "x", 1), ECT_ESTATE, "no reserve in flight");
    expect_kind(next(t, 1), 0, 0);   /* shard 2 still answering */
    reserve_ok(t, "t", 2, false, 2); /* cached there */
    acts *A = next(t, 2);
    expect_kind(A, PUSH_ACT_GIVE_BACK, 2);
    assert_int_equal(A->a[0].shard, 0);
    assert_string_equal(A->a[0].rec->sh[A->a[0].shard].rid, "rid0");
    assert_int_equal(A->a[1].shard, 2);
    push_info in;
    assert_int_equal(push_get(t, "t", &in), 0);
    assert_true(in.waiting_room);
    assert_int_equal(in.state, PUSH_WAITING_INPUTS);
    assert_int_equal(push_refresh_done(t, R(t, "t"), 0, true), 0);
    expect_kind(next(t, 3), 0, 0);
    assert_int_equal(push_refresh_done(t, R(t, "t"), 2, true), 0);
    expect_kind(next(t, 3), 0, 0); /* backing off */
    assert_int_equal(push_next_wake(t), 3 + 2);
    expect_kind(next(t, 4), 0, 0);
    A = next(t, 5);
    expect_kind(A, PUSH_ACT_RESERVE, 3);
    /* refused again: the backoff doubles */
    reserve_ok(t, "t", 0, true, 6);
    full(t, "t", 1, 6);
    full(t, "t", 2, 6);
    expect_kind(next(t, 6), PUSH_ACT_GIVE_BACK, 1);
    assert_int_equal(push_refresh_done(t, R(t, "t"), 0, true), 0);
    expect_kind(next(t, 7), 0, 0);
    assert_int_equal(push_next_wake(t), 7 + 4);
    expect_kind(next(t, 11), PUSH_ACT_RESERVE, 3);
    for (size_t s = 0; s < 3; s++) reserve_ok(t, "t", s, true, 12);
    A = next(t, 12);
    expect_kind(A, PUSH_ACT_WRITE, 3);
    assert_int_equal(push_get(t, "t", &in), 0);
    assert_false(in.waiting_room);
    assert_int_equal(in.retries, 2);
    for (size_t s = 0; s < 3; s++) assert_int_equal(push_write_done(t, R(t, "t"), s, true), 0);
    expect_kind(next(t, 13), PUSH_ACT_COMPLETE, 3);
    for (size_t s = 0; s < 3; s++)
        assert_int_equal(push_complete_done(t, R(t, "t"), s, true, true), 0);
    A = next(t, 14);
    assert_int_equal(A->a[1].kind, PUSH_ACT_FINISHED);
    assert_int_equal(A->a[1].fin.state, PUSH_DONE);
    assert_int_equal(A->a[1].fin.retries, 2);
    push_stats st;
    push_get_stats(t, &st);
    assert_int_equal(st.full_refusals, 3);
    assert_int_equal(st.retries, 2);
    assert_int_equal(st.give_backs, 3);
    assert_int_equal(st.failed, 0);
    push_close(t);
}

/* The consumer stays full: the item fails at its push wait, saying so, and
 * holds nothing on the way out. A give-back that fails fails the item. */
static void test_full_until_the_push_wait(void **state) {
    (void)state;
    push_opts o;
    push_opts_init(&o);
    o.push_wait_ms = 100;
    o.retry_max_ms = 8;
    push_table *t;
    assert_int_equal(push_open(&o, &t), 0);
    assert_int_equal(add(t, "t", 1, 0), 0);
    assert_int_equal(push_source_ready(t, "t", NULL, 0), 0);
    uint64_t now = 0;
    unsigned rounds = 0;
    for (;;) {
        acts *A = next(t, now);
        if (A->n && A->a[A->n - 1].kind == PUSH_ACT_FINISHED) {
            assert_int_equal(A->a[0].kind, PUSH_ACT_RELEASE_SOURCE);
            assert_int_equal(A->a[1].fin.state, PUSH_FAILED);
            assert_non_null(strstr(A->a[1].fin.error, "stayed full"));
            assert_non_null(strstr(A->a[1].fin.error, "push_wait_ms"));
            assert_non_null(strstr(A->a[1].fin.error, "pool is full"));
            assert_int_equal(A->a[1].fin.retries, rounds);
            break;
        }
        if (A->n) {
            expect_kind(A, PUSH_ACT_RESERVE, 1);
            full(t, "t", 0, now);
            rounds++;
        }
        assert_true(now < 200); /* the table's own clock: it ends at 100 */
        now++;
    }
    assert_true(now >= 100);
    assert_true(rounds >= 5);
    /* a give-back that fails: the reservation may live on, so it is abandoned */
    assert_int_equal(add(t, "u", 2, now), 0);
    next(t, now);
    reserve_ok(t, "u", 0, true, now);
    full(t, "u", 1, now);
    expect_kind(next(t, now), PUSH_ACT_GIVE_BACK, 1);
    assert_int_equal(push_refresh_done(t, R(t, "u"), 0, false), 0);
    expect_kind(next(t, now), PUSH_ACT_ABANDON, 1);
    assert_int_equal(push_abandon_done(t, R(t, "u"), 0, true), 0);
    acts *A = next(t, now);
    expect_kind(A, PUSH_ACT_FINISHED, 1);
    assert_non_null(strstr(A->a[0].fin.error, "giving back"));
    push_close(t);
}

/* While a consumer has an item waiting for room, later items for it wait
 * behind (FIFO); items for another consumer go on. A later item that waits
 * past its push wait fails saying why. */
static void test_full_consumer_keeps_order(void **state) {
    (void)state;
    push_opts o;
    push_opts_init(&o);
    o.push_wait_ms = 1000;
    push_table *t;
    assert_int_equal(push_open(&o, &t), 0);
    add_to(t, "a", "c1:1", 1, 0);
    acts *A = next(t, 0);
    expect_kind(A, PUSH_ACT_RESERVE, 1);
    full(t, "a", 0, 1);
    add_to(t, "b", "c1:1", 1, 2);
    add_to(t, "x", "c2:1", 1, 2);
    A = next(t, 2); /* a backs off, b waits behind it, x goes */
    expect_kind(A, PUSH_ACT_RESERVE, 1);
    assert_string_equal(tid_of(&A->a[0]), "x");
    expect_kind(next(t, 3), 0, 0); /* a backs off 2 ms, b still waits */
    A = next(t, 4);                /* a retries alone */
    expect_kind(A, PUSH_ACT_RESERVE, 1);
    assert_string_equal(tid_of(&A->a[0]), "a");
    reserve_ok(t, "a", 0, true, 4);
    A = next(t, 4); /* room for a: b may start */
    expect_kind(A, PUSH_ACT_RESERVE, 1);
    assert_string_equal(tid_of(&A->a[0]), "b");
    /* b is refused, then its retry goes unanswered (a slow shard): c behind
     * it never starts and fails at its own push wait, saying why */
    full(t, "b", 0, 5);
    add_to(t, "c", "c1:1", 1, 5);
    expect_kind(next(t, 6), 0, 0); /* backoff from here: 2 ms */
    A = next(t, 8);
    expect_kind(A, PUSH_ACT_RESERVE, 1);
    assert_string_equal(tid_of(&A->a[0]), "b");
    for (uint64_t now = 9; now < 1005; now += 7) expect_kind(next(t, now), 0, 0);
    A = next(t, 1005);
    expect_kind(A, PUSH_ACT_FINISHED, 1);
    assert_string_equal(tid_of(&A->a[0]), "c");
    assert_int_equal(A->a[0].fin.state, PUSH_FAILED);
    assert_non_null(strstr(A->a[0].fin.error, "behind earlier items"));
    assert_non_null(strstr(A->a[0].fin.error, "stayed full"));
    /* b's answer comes: still full, and its own push wait is over */
    full(t, "b", 0, 1006);
    A = next(t, 1006);
    expect_kind(A, PUSH_ACT_FINISHED, 1);
    assert_non_null(strstr(A->a[0].fin.error, "stayed full for 1004 ms"));
    /* a consumer with nobody waiting any more takes new items at once */
    add_to(t, "d", "c1:1", 1, 1007);
    expect_kind(next(t, 1007), PUSH_ACT_RESERVE, 1);
    push_close(t);
}

static void test_consumer_cancelled_reply(void **state) {
    (void)state;
    push_table *t = open_default();
    assert_int_equal(add(t, "t", 2, 0), 0);
    next(t, 0);
    push_reservation c = {.reservation_id = "", .dst_session = "", .cancelled = true};
    assert_int_equal(push_reserve_done(t, R(t, "t"), 1, &c, NULL, 1), 0);
    assert_int_equal(state_of(t, "t"), PUSH_CANCEL_PENDING);
    reserve_ok(t, "t", 0, true, 1);
    acts *A = next(t, 2);
    expect_kind(A, PUSH_ACT_ABANDON, 1);
    assert_int_equal(A->a[0].shard, 0);
    assert_int_equal(push_abandon_done(t, R(t, "t"), 0, true), 0);
    A = next(t, 3);
    expect_kind(A, PUSH_ACT_FINISHED, 1);
    assert_int_equal(A->a[0].fin.state, PUSH_CANCELLED);
    push_close(t);
}

static void test_engine_cancel_while_writing(void **state) {
    (void)state;
    push_table *t = open_default();
    assert_int_equal(add(t, "t", 2, 0), 0);
    next(t, 0);
    reserve_ok(t, "t", 0, true, 0);
    reserve_ok(t, "t", 1, true, 0);
    assert_int_equal(push_source_ready(t, "t", NULL, 0), 0);
    expect_kind(next(t, 1), PUSH_ACT_WRITE, 2);
    assert_int_equal(push_cancel(t, "t", 2, NULL, NULL), 0);
    assert_int_equal(push_cancel(t, "t", 2, NULL, NULL), 0); /* idempotent */
    assert_int_equal(state_of(t, "t"), PUSH_CANCEL_PENDING);
    assert_int_equal(push_write_done(t, R(t, "t"), 0, true), 0);
    /* the source is not released while a write may still read it */
    expect_kind(next(t, 3), 0, 0);
    assert_int_equal(push_write_done(t, R(t, "t"), 1, true), 0);
    expect_kind(next(t, 4), PUSH_ACT_ABANDON, 2);
    assert_int_equal(push_abandon_done(t, R(t, "t"), 0, true), 0);
    assert_int_equal(push_abandon_done(t, R(t, "t"), 1, true), 0);
    acts *A = next(t, 5);
    assert_int_equal(A->n, 2);
    assert_int_equal(A->a[0].kind, PUSH_ACT_RELEASE_SOURCE);
    assert_int_equal(A->a[1].fin.state, PUSH_CANCELLED);
    assert_int_equal(push_cancel(t, "t", 6, NULL, NULL), 0);
    push_close(t);
}

static void test_refresh_before_write(void **state) {
    (void)state;
    push_table *t = open_default();
    assert_int_equal(add(t, "t", 2, 0), 0);
    next(t, 0);
    reserve_ok(t, "t", 0, true, 0);
    reserve_ok(t, "t", 1, false, 0); /* a cached shard holds nothing to refresh */
    assert_int_equal(push_source_ready(t, "t", NULL, 150 * S), 0);
    acts *A = next(t, 150 * S);
    expect_kind(A, PUSH_ACT_REFRESH, 1);
    assert_int_equal(A->a[0].shard, 0);
    assert_string_equal(A->a[0].rec->sh[A->a[0].shard].rid, "rid0");
    expect_kind(next(t, 150 * S), 0, 0);
    assert_int_equal(push_refresh_done(t, R(t, "t"), 0, true), 0);
    assert_err(push_refresh_done(t, R(t, "t"), 0, true), ECT_ESTATE, "no refresh in flight");
    expect_kind(next(t, 151 * S), PUSH_ACT_RESERVE, 1);
    reserve_ok(t, "t", 0, true, 151 * S);
    expect_kind(next(t, 152 * S), PUSH_ACT_WRITE, 1);
    push_stats st;
    push_get_stats(t, &st);
    assert_int_equal(st.refreshes, 1);
    /* a failed refresh fails the push and abandons what may remain */
    assert_int_equal(add(t, "u", 1, 0), 0);
    next(t, 152 * S);
    reserve_ok(t, "u", 0, true, 152 * S);
    assert_int_equal(push_source_ready(t, "u", NULL, 302 * S), 0);
    A = next(t, 302 * S);
    assert_int_equal(A->n, 1);
    assert_int_equal(A->a[0].kind, PUSH_ACT_REFRESH);
    assert_int_equal(push_refresh_done(t, R(t, "u"), 0, false), 0);
    expect_kind(next(t, 303 * S), PUSH_ACT_ABANDON, 1);
    assert_int_equal(push_abandon_done(t, R(t, "u"), 0, true), 0);
    A = next(t, 304 * S);
    assert_int_equal(A->a[1].fin.state, PUSH_FAILED);
    assert_non_null(strstr(A->a[1].fin.error, "refresh"));
    push_close(t);
}

/* Reserves shard `shard` of tid again with dst_key `key` (NULL: none). */
static void reserve_key(push_table *t, const char *tid, size_t shard, const char *key,
                        uint64_t now) {
    push_reservation r = {.reservation_id = "rid",
                          .dst_session = "10.0.0.1:9000",
                          .dst_ptr = 4096,
                          .dst_key = key,
                          .write = true};
    assert_int_equal(push_reserve_done(t, R(t, tid), shard, &r, NULL, now), 0);
    assert_int_equal(push_check(t), 0);
}

/* A record keeps its ids (kept in its own allocation) at their longest, and
 * a shard its dst_key, short (kept in the shard) or long (allocated), across
 * refreshes that replace one by the other; under ASan a wrong size or free
 * shows. */
static void test_record_keeps_ids_and_keys(void **state) {
    (void)state;
    push_table *t = open_default();
    char tid[PUSH_KEY_MAX + 1], hash[PUSH_KEY_MAX + 1], cons[PUSH_ADDR_MAX + 1];
    memset(tid, 't', PUSH_KEY_MAX);
    tid[PUSH_KEY_MAX] = '\0';
    memset(hash, 'h', PUSH_KEY_MAX);
    hash[PUSH_KEY_MAX] = '\0';
    memset(cons, 'c', PUSH_ADDR_MAX);
    cons[PUSH_ADDR_MAX] = '\0';
    push_item it = {.transfer_id = tid,
                    .consumer = cons,
                    .mm_hash = hash,
                    .nbytes = 576 * 4096 * 2,
                    .shape = SHAPE,
                    .ndim = 2,
                    .dtype = "bfloat16",
                    .n_shards = 1};
    push_rec *r;
    assert_int_equal(push_add(t, &it, 0, &r), 0);
    assert_string_equal(r->transfer_id, tid);
    assert_string_equal(r->consumer, cons);
    assert_string_equal(r->mm_hash, hash);
    assert_ptr_equal(push_find(t, tid), r);
    char shortk[PUSH_KEY_INLINE + 1], longk[PUSH_KEY_INLINE + 2];
    memset(shortk, 'a', PUSH_KEY_INLINE);
    shortk[PUSH_KEY_INLINE] = '\0';
    memset(longk, 'b', PUSH_KEY_INLINE + 1);
    longk[PUSH_KEY_INLINE + 1] = '\0';
    /* first key, then the key of the reserve after a refresh */
    const char *pairs[][2] = {
        {longk, shortk}, {shortk, NULL}, {NULL, longk}, {longk, longk}, {shortk, shortk}};
    uint64_t now = 0;
    for (size_t k = 0; k < sizeof pairs / sizeof *pairs; k++) {
        char id[16];
        snprintf(id, sizeof id, "k%zu", k);
        assert_int_equal(add(t, id, 1, now), 0);
        next(t, now);
        for (int i = 0; i < 2; i++) {
            reserve_key(t, id, 0, pairs[k][i], now);
            if (pairs[k][i])
                assert_string_equal(R(t, id)->sh[0].dst_key, pairs[k][i]);
            else
                assert_null(R(t, id)->sh[0].dst_key);
            if (i) break;
            now += 150 * S; /* the source comes late: refresh, then reserve again */
            assert_int_equal(push_source_ready(t, id, NULL, now), 0);
            acts *A = next(t, now);
            expect_kind(A, PUSH_ACT_REFRESH, 1);
            assert_int_equal(push_refresh_done(t, R(t, id), 0, true), 0);
            now += S;
            expect_kind(next(t, now), PUSH_ACT_RESERVE, 1);
        }
    }
    /* a three-shard record: each shard its own key */
    assert_int_equal(add(t, "three", 3, now), 0);
    next(t, now);
    reserve_key(t, "three", 0, longk, now);
    reserve_key(t, "three", 1, shortk, now);
    reserve_key(t, "three", 2, NULL, now);
    assert_string_equal(R(t, "three")->sh[0].dst_key, longk);
    assert_string_equal(R(t, "three")->sh[1].dst_key, shortk);
    assert_null(R(t, "three")->sh[2].dst_key);
    push_close(t); /* frees records with keys of both kinds */
}

/* Runs tid (one shard) to DONE. */
static void run_to_done(push_table *t, const char *tid, uint64_t now) {
    expect_kind(next(t, now), PUSH_ACT_RESERVE, 1);
    reserve_ok(t, tid, 0, true, now);
    assert_int_equal(push_source_ready(t, tid, NULL, now), 0);
    expect_kind(next(t, now), PUSH_ACT_WRITE, 1);
    assert_int_equal(push_write_done(t, R(t, tid), 0, true), 0);
    expect_kind(next(t, now), PUSH_ACT_COMPLETE, 1);
    assert_int_equal(push_complete_done(t, R(t, tid), 0, true, true), 0);
    acts *A = next(t, now);
    assert_int_equal(A->n, 2);
    assert_int_equal(A->a[1].fin.state, PUSH_DONE);
}

/* A finished record becomes a compact tombstone (its head, error and ids in
 * an allocation of their own) and the full record serves the next item: 20
 * items one after another allocate one full record. The tombstones keep
 * what push_get and dedup read (under ASan a read past the head shows). */
static void test_finished_records_are_compact_and_recycled(void **state) {
    (void)state;
    push_table *t = open_default();
    char id[16];
    for (int i = 0; i < 20; i++) {
        snprintf(id, sizeof id, "r%d", i);
        assert_int_equal(add(t, id, 1, 0), 0);
        run_to_done(t, id, 0);
        push_rec *r = R(t, id);
        assert_true(r->tomb);
        assert_string_equal(r->transfer_id, id);
        assert_string_equal(r->consumer, "127.0.0.1:14579");
        assert_string_equal(r->mm_hash, "hash");
        push_info in;
        assert_int_equal(push_get(t, id, &in), 0);
        assert_int_equal(in.state, PUSH_DONE);
        assert_int_equal(in.n_shards, 1);
        assert_int_equal(in.reserved + in.written + in.completed, 3);
        assert_true(in.source_staged);
        assert_string_equal(in.error, "");
        assert_err(add(t, id, 1, 0), ECT_EEXIST, "already pushed (DONE)");
    }
    push_stats st;
    push_get_stats(t, &st);
    assert_int_equal(st.records, 1);
    assert_int_equal(st.spares, 1);
    assert_int_equal(st.compact, 20);
    assert_int_equal(st.tombstones, 20);
    /* a failure keeps its text; ids too long for the record are not recycled */
    char longid[PUSH_KEY_MAX + 1];
    memset(longid, 'x', PUSH_KEY_MAX);
    longid[PUSH_KEY_MAX] = '\0';
    const char *ids[2] = {"f", longid};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(add(t, ids[i], 2, 0), 0);
        expect_kind(next(t, 0), PUSH_ACT_RESERVE, 2);
        assert_int_equal(push_reserve_done(t, R(t, ids[i]), 0, NULL, "no room at all", 0), 0);
        assert_int_equal(push_reserve_done(t, R(t, ids[i]), 1, NULL, "nor here", 0), 0);
        acts *A = next(t, 0);
        assert_int_equal(A->a[A->n - 1].fin.state, PUSH_FAILED);
        push_info in;
        assert_int_equal(push_get(t, ids[i], &in), 0);
        assert_int_equal(in.state, PUSH_FAILED);
        assert_int_equal(in.n_shards, 2);
        assert_int_equal(in.reserved, 0);
        assert_non_null(strstr(in.error, "no room at all"));
        assert_true(R(t, ids[i])->tomb);
        assert_string_equal(R(t, ids[i])->transfer_id, ids[i]);
    }
    push_get_stats(t, &st);
    assert_int_equal(st.records, 2); /* "f" took the spare; longid has a record of its own */
    assert_int_equal(st.spares, 1);  /* "f" back; longid freed */
    assert_int_equal(st.compact, 22);
    /* expiry and the table's close free compact tombstones and spares */
    next(t, 301 * S);
    push_get_stats(t, &st);
    assert_int_equal(st.tombstones, 0);
    assert_int_equal(st.compact, 0);
    assert_int_equal(push_check(t), 0);
    push_close(t);
}

static void test_write_and_complete_failures(void **state) {
    (void)state;
    push_table *t = open_default();
    assert_int_equal(add(t, "w", 2, 0), 0);
    next(t, 0);
    reserve_ok(t, "w", 0, true, 0);
    reserve_ok(t, "w", 1, true, 0);
    assert_int_equal(push_source_ready(t, "w", NULL, 0), 0);
    next(t, 1);
    assert_int_equal(push_write_done(t, R(t, "w"), 1, false), 0);
    expect_kind(next(t, 2), 0, 0); /* shard 0 still writing */
    assert_int_equal(push_write_done(t, R(t, "w"), 0, true), 0);
    expect_kind(next(t, 3), PUSH_ACT_ABANDON, 2); /* both, the written one too */
    assert_int_equal(push_abandon_done(t, R(t, "w"), 0, true), 0);
    assert_int_equal(push_abandon_done(t, R(t, "w"), 1, true), 0);
    acts *A = next(t, 4);
    assert_int_equal(A->a[0].kind, PUSH_ACT_RELEASE_SOURCE);
    assert_non_null(strstr(A->a[1].fin.error, "writing to 10.0.0.1:9000 (shard 1) failed"));
    /* a completion the shard refuses (expired meanwhile) fails the push */
    assert_int_equal(add(t, "c", 2, 5), 0);
    next(t, 5);
    reserve_ok(t, "c", 0, true, 5);
    reserve_ok(t, "c", 1, true, 5);
    assert_int_equal(push_source_ready(t, "c", NULL, 5), 0);
    next(t, 6);
    assert_int_equal(push_write_done(t, R(t, "c"), 0, true), 0);
    assert_int_equal(push_write_done(t, R(t, "c"), 1, true), 0);
    next(t, 7);
    assert_int_equal(push_complete_done(t, R(t, "c"), 0, true, true), 0);
    assert_int_equal(push_complete_done(t, R(t, "c"), 1, true, false), 0);
    expect_kind(next(t, 8), PUSH_ACT_ABANDON, 2);
    assert_int_equal(push_abandon_done(t, R(t, "c"), 0, true), 0);
    assert_int_equal(push_abandon_done(t, R(t, "c"), 1, true), 0);
    A = next(t, 9);
    assert_int_equal(A->a[1].fin.state, PUSH_FAILED);
    assert_non_null(strstr(A->a[1].fin.error, "did not accept the completion"));
    push_close(t);
}

static void test_input_wait_timeout(void **state) {
    (void)state;
    push_table *t = open_default();
    assert_int_equal(add(t, "t", 1, 0), 0);
    next(t, 0);
    reserve_ok(t, "t", 0, true, 0);
    expect_kind(next(t, 300 * S - 1), 0, 0);
    expect_kind(next(t, 300 * S), PUSH_ACT_ABANDON, 1);
    assert_int_equal(push_abandon_done(t, R(t, "t"), 0, true), 0);
    acts *A = next(t, 300 * S);
    expect_kind(A, PUSH_ACT_FINISHED, 1);
    assert_non_null(strstr(A->a[0].fin.error, "not saved within 300000 ms"));
    push_close(t);
}

static void test_small_action_buffers(void **state) {
    (void)state;
    push_table *t = open_default();
    assert_int_equal(add(t, "t", 3, 0), 0);
    push_action a[1];
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(push_next_actions(t, 0, a, 1), 1);
        assert_int_equal(a[0].kind, PUSH_ACT_RESERVE);
        assert_int_equal(a[0].shard, i);
    }
    assert_int_equal(push_next_actions(t, 0, a, 1), 0);
    for (size_t i = 0; i < 3; i++) reserve_ok(t, "t", i, false, 0);
    assert_int_equal(push_source_ready(t, "t", NULL, 0), 0);
    assert_int_equal(push_next_actions(t, 1, a, 1), 1);
    assert_int_equal(a[0].kind, PUSH_ACT_RELEASE_SOURCE);
    assert_int_equal(push_check(t), 0);
    assert_int_equal(push_next_actions(t, 1, a, 1), 1);
    assert_int_equal(a[0].kind, PUSH_ACT_FINISHED);
    assert_int_equal(push_next_actions(t, 1, a, 0), 0);
    assert_int_equal(state_of(t, "t"), PUSH_DONE);
    push_close(t);
}

static void test_tombstone_cap(void **state) {
    (void)state;
    push_opts o;
    push_opts_init(&o);
    o.max_tombstones = 2;
    push_table *t;
    assert_int_equal(push_open(&o, &t), 0);
    char id[8];
    for (int i = 0; i < 4; i++) {
        snprintf(id, sizeof id, "t%d", i);
        assert_int_equal(add(t, id, 1, 0), 0);
        assert_int_equal(push_cancel(t, id, 0, NULL, NULL), 0);
    }
    next(t, 1);
    push_stats st;
    push_get_stats(t, &st);
    assert_int_equal(st.tombstones, 2);
    assert_int_equal(st.tombstones_dropped, 2);
    assert_int_equal(st.cancelled, 4);
    assert_int_equal(state_of(t, "t0"), 0);
    assert_int_equal(state_of(t, "t3"), PUSH_CANCELLED);
    push_close(t);
}

/* Steps: a held record sends nothing until push_flush; a source staged
 * after the flush is used from the next one; a held record cancelled ends at
 * once with its release and report; closing aborts every live record
 * without abandoning anything. */
static void test_steps_cancel_and_abort(void **state) {
    (void)state;
    push_table *t = open_default();
    push_source src = {.data = "x"};
    push_item it = {.transfer_id = "h",
                    .consumer = "c:1",
                    .mm_hash = "hash",
                    .nbytes = 576 * 4096 * 2,
                    .shape = SHAPE,
                    .ndim = 2,
                    .dtype = "bfloat16",
                    .n_shards = 1,
                    .held = true};
    assert_int_equal(push_add(t, &it, 0, NULL), 0);
    expect_kind(next(t, 1), 0, 0); /* held */
    assert_int_equal(push_flush(t), 1);
    assert_int_equal(push_flush(t), 0);
    expect_kind(next(t, 2), PUSH_ACT_RESERVE, 1);
    reserve_ok(t, "h", 0, true, 2);
    assert_int_equal(push_stage_begin(t, "h", 1), ECT_EINVAL); /* nbytes differs */
    assert_int_equal(push_stage_begin(t, "h", it.nbytes), 0);
    assert_err(push_stage_begin(t, "h", it.nbytes), ECT_ESTATE, "already staged");
    assert_int_equal(push_stage_end(t, "h", &src, 3), 0);
    expect_kind(next(t, 3), 0, 0); /* staged after the flush: waits for the next */
    push_flush(t);
    expect_kind(next(t, 4), PUSH_ACT_WRITE, 1);
    /* a held record cancelled: over at once, its source given back */
    it.transfer_id = "g";
    it.src = &src;
    assert_int_equal(push_add(t, &it, 5, NULL), 0);
    push_action fin[2];
    size_t n = 0;
    assert_int_equal(push_cancel(t, "g", 5, fin, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(fin[0].kind, PUSH_ACT_RELEASE_SOURCE);
    assert_ptr_equal(fin[0].fin.src.data, src.data);
    assert_int_equal(fin[1].fin.status, ECT_ECANCELED);
    assert_string_equal(fin[1].fin.error, "cancelled before it was sent");
    assert_int_equal(state_of(t, "g"), PUSH_CANCELLED);
    assert_err(push_stage_begin(t, "g", it.nbytes), ECT_ESTATE, "finished");
    /* closing: the write in flight counts as failed, nothing is abandoned */
    push_abort_all(t, "closed");
    acts *A = next(t, 6);
    assert_int_equal(A->n, 2);
    assert_int_equal(A->a[0].kind, PUSH_ACT_RELEASE_SOURCE);
    assert_int_equal(A->a[1].fin.status, ECT_ECLOSED);
    assert_string_equal(A->a[1].fin.error, "closed");
    push_close(t);
}

/* A random shell: outcomes at random, checks after every call; every record
 * ends, every staged source is released exactly once, before the report. */
typedef struct shell {
    push_action pend[512];
    size_t np;
    unsigned staged[200], released[200], ends[PUSH_FAILED + 1];
} shell;

/* Takes new actions: release and report are done at once, in order, as the
 * producer shell does; the rest wait to be settled in random order. */
static void hand_out(push_table *t, shell *sh, uint64_t now) {
    push_action a[64];
    size_t n = push_next_actions(t, now, a, 64);
    assert_int_equal(push_check(t), 0);
    for (size_t i = 0; i < n; i++) {
        unsigned k = (unsigned)atoi(tid_of(&a[i]) + 1);
        if (a[i].kind == PUSH_ACT_RELEASE_SOURCE) {
            sh->released[k]++;
            assert_true(sh->released[k] <= sh->staged[k]);
        } else if (a[i].kind == PUSH_ACT_FINISHED) {
            sh->ends[a[i].fin.state]++;
            assert_int_equal(sh->released[k], sh->staged[k]);
        } else {
            assert_true(sh->np < 512);
            sh->pend[sh->np++] = a[i];
        }
    }
}

static void settle(push_table *t, shell *sh, uint64_t *seed, uint64_t now, bool all_fail) {
    size_t i = (size_t)(test_rand(seed) % sh->np);
    push_action a = sh->pend[i];
    sh->pend[i] = sh->pend[--sh->np];
    bool ok = !all_fail && test_rand(seed) % 10 != 0;
    push_rec *id = a.rec;
    switch (a.kind) {
    case PUSH_ACT_RESERVE:
        if (!all_fail && test_rand(seed) % 4 == 0) {
            assert_int_equal(
                push_reserve_full(t, id, a.shard, "EC consumer buffer pool is full", now), 0);
        } else if (!ok) {
            assert_int_equal(push_reserve_done(t, id, a.shard, NULL, "boom", now), 0);
        } else {
            bool w = test_rand(seed) % 3 != 0;
            push_reservation r = {.reservation_id = "rid",
                                  .dst_session = "s:1",
                                  .write = w,
                                  .ready = !w,
                                  .cancelled = test_rand(seed) % 20 == 0};
            assert_int_equal(push_reserve_done(t, id, a.shard, &r, NULL, now), 0);
        }
        break;
    case PUSH_ACT_REFRESH:
    case PUSH_ACT_GIVE_BACK: assert_int_equal(push_refresh_done(t, id, a.shard, ok), 0); break;
    case PUSH_ACT_WRITE: assert_int_equal(push_write_done(t, id, a.shard, ok), 0); break;
    case PUSH_ACT_COMPLETE:
        assert_int_equal(push_complete_done(t, id, a.shard, ok, test_rand(seed) % 10), 0);
        break;
    case PUSH_ACT_ABANDON: assert_int_equal(push_abandon_done(t, id, a.shard, ok), 0); break;
    default: fail();
    }
    assert_int_equal(push_check(t), 0);
}

static void test_random_shell(void **state) {
    (void)state;
    uint64_t seed = 4242;
    push_opts o;
    push_opts_init(&o);
    o.refresh_after_ms = 30;
    o.input_wait_ms = 80;
    o.ttl_ms = 50;
    o.max_tombstones = 16;
    o.push_wait_ms = 60;
    push_table *t;
    assert_int_equal(push_open(&o, &t), 0);
    shell *sh = calloc(1, sizeof *sh);
    uint64_t now = 0;
    for (int step = 0; step < 20000; step++) {
        now += test_rand(&seed) % 3;
        unsigned k = (unsigned)(test_rand(&seed) % 200);
        char id[8];
        snprintf(id, sizeof id, "p%u", k);
        switch (test_rand(&seed) % 6) {
        case 0: (void)add(t, id, 1 + (size_t)(test_rand(&seed) % 3), now); break;
        case 1:
            if (push_source_ready(t, id, NULL, now) == 0) sh->staged[k]++;
            break;
        case 2:
            if (test_rand(&seed) % 8 == 0) (void)push_cancel(t, id, now, NULL, NULL);
            break;
        case 3:
        case 4:
            if (sh->np < 400) hand_out(t, sh, now);
            break;
        case 5:
            if (sh->np) settle(t, sh, &seed, now, false);
            break;
        }
        assert_int_equal(push_check(t), 0);
    }
    /* drain: everything in flight fails, every record ends */
    push_stats st;
    for (int round = 0; round < 100000; round++) {
        now += 100;
        hand_out(t, sh, now);
        push_get_stats(t, &st);
        if (!sh->np && !st.live) break;
        while (sh->np) settle(t, sh, &seed, now, true);
    }
    push_get_stats(t, &st);
    assert_int_equal(st.live, 0);
    assert_int_equal(sh->np, 0);
    for (int k = 0; k < 200; k++) assert_int_equal(sh->released[k], sh->staged[k]);
    assert_true(sh->ends[PUSH_DONE] > 0 && sh->ends[PUSH_FAILED] > 0 &&
                sh->ends[PUSH_CANCELLED] > 0);
    assert_true(st.refreshes > 0);
    assert_true(st.full_refusals > 0 && st.retries > 0 && st.give_backs > 0);
    free(sh);
    push_close(t);
}

int main(void) {
    ect_log_set_level(ECT_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opts_and_add),
        cmocka_unit_test(test_happy_path),
        cmocka_unit_test(test_cached_and_follower_shards_skip_writes),
        cmocka_unit_test(test_failed_shard_abandons_the_others),
        cmocka_unit_test(test_full_shard_backs_off_and_retries),
        cmocka_unit_test(test_full_until_the_push_wait),
        cmocka_unit_test(test_full_consumer_keeps_order),
        cmocka_unit_test(test_consumer_cancelled_reply),
        cmocka_unit_test(test_engine_cancel_while_writing),
        cmocka_unit_test(test_refresh_before_write),
        cmocka_unit_test(test_record_keeps_ids_and_keys),
        cmocka_unit_test(test_finished_records_are_compact_and_recycled),
        cmocka_unit_test(test_write_and_complete_failures),
        cmocka_unit_test(test_input_wait_timeout),
        cmocka_unit_test(test_small_action_buffers),
        cmocka_unit_test(test_tombstone_cap),
        cmocka_unit_test(test_steps_cancel_and_abort),
        cmocka_unit_test(test_random_shell),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
