/*
 * Tests for ect_push_consumer and ect_push_scheduler together, driven by a
 * small test-only producer built from the control client and the transport
 * (reserve on every shard, one batched write per shard, complete): TP = 1
 * and 2 over tcp and shm, zero-copy take, release to resident and the
 * `cached` answer, pool full, a producer that reserves and vanishes (the
 * reservation expires and its memory returns), an abandoned writer failing
 * the scheduler's entry, the shards' threads named (README "Threads"), and
 * the pools' used bytes back at zero after every scenario.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "testutil.h"
#include "push/control_client.h"
#include "ctl_req.h"
#include "util/util.h"

/* Opens tp consumers on consecutive control ports (retrying other bases if
 * one is taken). */
static void inst_open(test_inst *in, int tp, const char *transport, uint64_t pool,
                      uint64_t ttl_ms) {
    ect_push_consumer_opts o;
    ect_push_consumer_opts_init(&o);
    o.pool_size = pool;
    o.transport = transport;
    if (ttl_ms) {
        o.ttl_ms = ttl_ms;
        o.pending_grace_ms = ttl_ms;
        o.reap_interval_ms = 50;
    }
    test_inst_open(in, tp, &o);
}

/* ---- the test producer */
static void prod_open(test_prod *p, int base, const char *transport) {
    test_prod_open(p, base, transport, 5000);
}

static wire_ctl_request reserve_req(const char *tid, const char *hash, uint64_t rows) {
    return test_reserve_req(tid, hash, rows, 256, "torch.bfloat16");
}

/* Pushes one item to every shard: reserve, write (if asked), complete.
 * Returns how many shards answered `cached`. */
static int push_item(test_prod *p, const char *tid, const char *hash, uint64_t rows,
                     uint64_t seed) {
    uint64_t nbytes = rows * 256 * 2;
    uint8_t *src = malloc(nbytes);
    test_fill_pattern(src, nbytes, seed);
    int cached = 0;
    for (size_t i = 0; i < p->n; i++) {
        wire_ctl_request q = reserve_req(tid, hash, rows);
        wire_ctl_reply r;
        assert_int_equal(ctl_call_ok(p->cli, "127.0.0.1", p->ports[i], &q, &r), 0);
        if (r.u.reserve.cached) {
            cached++;
            assert_false(r.u.reserve.write);
        } else {
            assert_true(r.u.reserve.write);
            ect_write w = {src, r.u.reserve.dst_ptr, nbytes, r.u.reserve.dst_key};
            assert_int_equal(ect_xport_write_batch(p->xp, r.u.reserve.dst_session, &w, 1, NULL), 0);
            wire_ctl_request c = {.op = WIRE_OP_COMPLETE};
            snprintf(c.u.complete.transfer_id, sizeof c.u.complete.transfer_id, "%s", tid);
            snprintf(c.u.complete.reservation_id, sizeof c.u.complete.reservation_id, "%s",
                     r.u.reserve.reservation_id);
            wire_ctl_reply cr;
            assert_int_equal(ctl_call_ok(p->cli, "127.0.0.1", p->ports[i], &c, &cr), 0);
            assert_true(cr.u.complete.became_ready);
            wire_ctl_reply_clear(&cr);
        }
        wire_ctl_reply_clear(&r);
    }
    free(src);
    return cached;
}

static ect_push_scheduler *sched_open(int base, int tp, int accept_any, uint64_t push_wait_ms) {
    ect_push_scheduler_opts so;
    ect_push_scheduler_opts_init(&so);
    so.consumer_port = base;
    so.tp_size = tp;
    so.accept_any = accept_any;
    so.control_timeout_s = 2;
    if (push_wait_ms) so.push_wait_ms = push_wait_ms;
    ect_push_scheduler *s = NULL;
    assert_int_equal(ect_push_scheduler_open(&so, &s), 0);
    return s;
}

/* Polls until next() yields an item or ~5 s pass. */
static int wait_next(ect_push_scheduler *s, ect_push_sched_item *it) {
    for (int i = 0; i < 1000; i++) {
        ect_push_scheduler_poll(s);
        if (ect_push_scheduler_next(s, it) == 0) return 0;
        test_nap_ms(5);
    }
    return ECT_ETIMEDOUT;
}

static void wait_cancels(ect_push_scheduler *s, uint64_t want) {
    ect_push_scheduler_stat st;
    for (int i = 0; i < 1000; i++) {
        ect_push_scheduler_poll(s);
        ect_push_scheduler_stats(s, &st);
        if (st.cancels_sent >= want) return;
        test_nap_ms(5);
    }
    fail_msg("cancels not answered: %llu of %llu", (unsigned long long)st.cancels_sent,
             (unsigned long long)want);
}

static void run_roundtrip(int tp, const char *transport) {
    test_inst in;
    inst_open(&in, tp, transport, 16u << 20, 0);
    test_prod p;
    prod_open(&p, in.base, transport);
    assert_int_equal(p.n, (size_t)tp);
    ect_push_scheduler *s = sched_open(in.base, tp, 0, 0);
    assert_int_equal(ect_push_scheduler_expect(s, "t1", "h1"), 0);
    ect_push_sched_item it;
    assert_int_equal(ect_push_scheduler_state(s, "t1", &it), 0);
    assert_int_equal(it.state, ECT_PUSH_WAITING_EVENT);

    assert_int_equal(push_item(&p, "t1", "h1", 576, 42), 0);
    assert_int_equal(wait_next(s, &it), 0);
    assert_string_equal(it.transfer_id, "t1");
    assert_int_equal(it.state, ECT_PUSH_LOADING);
    assert_int_equal(it.reported, tp);
    assert_int_equal(it.nbytes, 576 * 256 * 2);
    for (int r = 0; r < tp; r++) {
        ect_push_view v;
        assert_int_equal(ect_push_consumer_take(in.c[r], "t1", &v), 0);
        assert_int_equal(v.nbytes, 576 * 256 * 2);
        assert_int_equal(v.ndim, 2);
        assert_int_equal(v.shape[0], 576);
        assert_string_equal(v.mm_hash, "h1");
        assert_true(test_check_pattern(v.data, v.nbytes, 42));
        assert_int_equal(ect_push_consumer_release(in.c[r], &v), 0);
        assert_err(ect_push_consumer_release(in.c[r], &v), ECT_ESTATE, NULL);
    }
    assert_int_equal(ect_push_scheduler_loaded(s, "t1"), 0);
    assert_int_equal(ect_push_scheduler_state(s, "t1", &it), 0);
    assert_int_equal(it.state, ECT_PUSH_RESIDENT);
    assert_int_equal(ect_push_scheduler_cancel(s, "t1"), 0); /* finished: shards forget it */
    wait_cancels(s, (uint64_t)tp);

    /* Same hash again: every shard answers cached, no bytes move. */
    assert_int_equal(ect_push_scheduler_expect(s, "t2", NULL), 0);
    assert_int_equal(push_item(&p, "t2", "h1", 576, 42), tp);
    assert_int_equal(wait_next(s, &it), 0);
    assert_string_equal(it.transfer_id, "t2");
    for (int r = 0; r < tp; r++) {
        ect_push_view v;
        assert_int_equal(ect_push_consumer_take(in.c[r], "t2", &v), 0);
        assert_true(test_check_pattern(v.data, v.nbytes, 42));
        assert_int_equal(ect_push_consumer_release(in.c[r], &v), 0);
    }
    assert_int_equal(ect_push_scheduler_loaded(s, "t2"), 0);
    assert_int_equal(ect_push_scheduler_cancel(s, "t2"), 0);
    wait_cancels(s, 2 * (uint64_t)tp);
    ect_push_scheduler_stat st;
    ect_push_scheduler_stats(s, &st);
    assert_int_equal(st.shards, tp);
    assert_int_equal(st.bad_frames, 0);
    /* the shards' threads carry their names (README "Threads"): the control
     * server, the data plane's accept loop and the target of the connection
     * that carried the bytes */
    char target[16];
    snprintf(target, sizeof target, "ect-%s-target", transport);
    assert_true(test_threads_named("ect-ctl-server") > 0);
    assert_true(test_threads_named("ect-xp-accept") > 0);
    assert_true(test_threads_named(target) > 0);
    ect_push_scheduler_close(s);
    test_prod_close(&p);
    test_inst_close_checked(&in);
}

static void test_tp1_tcp(void **state) {
    (void)state;
    run_roundtrip(1, "tcp");
}
static void test_tp2_tcp(void **state) {
    (void)state;
    run_roundtrip(2, "tcp");
}
static void test_tp2_shm(void **state) {
    (void)state;
    run_roundtrip(2, "shm");
}

/* accept_any: transfers nobody expected are accepted once every shard has
 * them; take of something not READY is refused. */
static void test_accept_any_and_refusals(void **state) {
    (void)state;
    test_inst in;
    inst_open(&in, 2, "tcp", 4u << 20, 0);
    test_prod p;
    prod_open(&p, in.base, "tcp");
    ect_push_scheduler *s = sched_open(in.base, 2, 1, 0);
    ect_push_view v;
    assert_err(ect_push_consumer_take(in.c[0], "nope", &v), ECT_ENOTFOUND, NULL);
    /* pool full: 8 MiB into a 4 MiB pool */
    wire_ctl_request q = reserve_req("big", "hbig", 16384);
    wire_ctl_reply r;
    assert_int_equal(ctl_call(p.cli, "127.0.0.1", p.ports[0], &q, &r), 0);
    assert_false(r.ok);
    assert_non_null(strstr(r.error, "EC consumer buffer pool is full"));
    wire_ctl_reply_clear(&r);
    /* reserved but not written: not takeable */
    q = reserve_req("w", "hw", 4);
    assert_int_equal(ctl_call_ok(p.cli, "127.0.0.1", p.ports[0], &q, &r), 0);
    wire_ctl_reply_clear(&r);
    assert_err(ect_push_consumer_take(in.c[0], "w", &v), ECT_ESTATE, NULL);
    /* The producer abandons it: the shard publishes an abandoned event. */
    wire_ctl_request k = {.op = WIRE_OP_CANCEL};
    snprintf(k.u.cancel.transfer_id, sizeof k.u.cancel.transfer_id, "w");
    k.u.cancel.abandon = true;
    assert_int_equal(ctl_call_ok(p.cli, "127.0.0.1", p.ports[0], &k, &r), 0);
    assert_true(r.u.cancelled);
    wire_ctl_reply_clear(&r);

    for (int i = 0; i < 3; i++) {
        char tid[16], h[16];
        snprintf(tid, sizeof tid, "any%d", i);
        snprintf(h, sizeof h, "ha%d", i);
        push_item(&p, tid, h, 8, (uint64_t)i);
    }
    int got = 0;
    ect_push_sched_item it;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(wait_next(s, &it), 0);
        for (int rr = 0; rr < 2; rr++) {
            assert_int_equal(ect_push_consumer_take(in.c[rr], it.transfer_id, &v), 0);
            assert_true(test_check_pattern(v.data, v.nbytes, (uint64_t)(it.transfer_id[3] - '0')));
            assert_int_equal(ect_push_consumer_release(in.c[rr], &v), 0);
        }
        assert_int_equal(ect_push_scheduler_loaded(s, it.transfer_id), 0);
        assert_int_equal(ect_push_scheduler_cancel(s, it.transfer_id), 0);
        got++;
    }
    assert_int_equal(got, 3);
    /* the abandoned one failed (accepted on arrival as an orphan) */
    for (int i = 0; i < 200; i++) {
        ect_push_scheduler_poll(s);
        if (ect_push_scheduler_state(s, "w", &it) == 0 && it.state == ECT_PUSH_FAILED) break;
        test_nap_ms(5);
    }
    assert_int_equal(ect_push_scheduler_state(s, "w", &it), 0);
    assert_int_equal(it.state, ECT_PUSH_FAILED);
    wait_cancels(s, 6);
    ect_push_scheduler_close(s);
    test_prod_close(&p);
    test_inst_close_checked(&in);
}

/* A producer that reserves and is killed: nothing ever completes or
 * abandons. With a short TTL the reaper moves the writer to EXPIRE_PENDING,
 * and after the grace, with no write landing, to EXPIRED: memory returns.
 * Times are taken before the reserve was sent, so a test thread off its CPU
 * for longer than TTL + grace sees the end state, never a wrong one. */
static void test_producer_killed_after_reserve(void **state) {
    (void)state;
    enum { TTL_MS = 300, GRACE_MS = 300 }; /* inst_open: pending_grace_ms = ttl_ms */
    test_inst in;
    inst_open(&in, 1, "tcp", 4u << 20, TTL_MS);
    test_prod p;
    prod_open(&p, in.base, "tcp");
    wire_ctl_request q = reserve_req("dead", "hd", 64);
    wire_ctl_reply r;
    uint64_t t0 = ect_now_ms(); /* the reservation's TTL starts after this */
    assert_int_equal(ctl_call_ok(p.cli, "127.0.0.1", p.ports[0], &q, &r), 0);
    assert_true(r.u.reserve.write);
    wire_ctl_reply_clear(&r);
    test_prod_close(&p); /* gone */
    ect_push_consumer_stat st;
    ect_push_consumer_stats(in.c[0], &st);
    assert_int_equal(st.peak_live, 1); /* it was held ... */
    assert_true(st.pool_used > 0 || ect_now_ms() - t0 >= TTL_MS + GRACE_MS); /* ... with memory */
    while (ect_now_ms() - t0 < 60000) { /* a generous deadline: only a leak reaches it */
        ect_push_consumer_stats(in.c[0], &st);
        if (st.pool_used == 0) break;
        test_nap_ms(20);
    }
    assert_int_equal(st.pool_used, 0);
    assert_int_equal(st.live, 0);
    assert_int_equal(st.expired, 1); /* by the reaper */
    assert_true(ect_now_ms() - t0 >= TTL_MS + GRACE_MS); /* not before TTL + grace */
    test_inst_close_checked(&in);
}

/* ect_push_consumer_finish ends a delivered transfer while its views keep
 * their leases: no later take, the room's bytes untouched under a pool
 * forced to reuse everything else, the lease-only releases (transfer_id
 * cleared) giving the bytes back one by one; a finish before any take;
 * the errors. */
static void test_finish_keeps_leases(void **state) {
    (void)state;
    test_inst in;
    inst_open(&in, 1, "tcp", 4u << 20, 0);
    test_prod p;
    prod_open(&p, in.base, "tcp");
    ect_push_consumer *c = in.c[0];
    assert_err(ect_push_consumer_finish(c, "nope"), ECT_ENOTFOUND, "nope");
    assert_err(ect_push_consumer_finish(c, ""), ECT_EINVAL, NULL);
    assert_err(ect_push_consumer_finish(NULL, "x"), ECT_EINVAL, NULL);
    push_item(&p, "f1", "hf1", 576, 7); /* 288 KiB */
    ect_push_view a, b;
    assert_int_equal(ect_push_consumer_take(c, "f1", &a), 0);
    assert_int_equal(ect_push_consumer_take(c, "f1", &b), 0);
    assert_int_equal(ect_push_consumer_finish(c, "f1"), 0);
    ect_push_consumer_stat st;
    ect_push_consumer_stats(c, &st);
    assert_int_equal(st.finished, 1);
    assert_int_equal(st.live, 0);
    assert_err(ect_push_consumer_take(c, "f1", &a), ECT_ENOTFOUND, NULL);
    assert_err(ect_push_consumer_finish(c, "f1"), ECT_ESTATE, "not READY");
    a = b; /* the refused take cleared a; both views describe the same bytes */
    assert_int_equal(ect_push_consumer_evict(c, SIZE_MAX), 0); /* leased twice */
    /* Fill the 4 MiB pool several times over: every other item is taken,
     * released and reclaimed; the leased bytes are never reused. */
    for (int i = 0; i < 40; i++) {
        char tid[16], h[16];
        snprintf(tid, sizeof tid, "o%d", i);
        snprintf(h, sizeof h, "ho%d", i);
        push_item(&p, tid, h, 576, 100 + (uint64_t)i);
        ect_push_view v;
        assert_int_equal(ect_push_consumer_take(c, tid, &v), 0);
        assert_true(test_check_pattern(v.data, v.nbytes, 100 + (uint64_t)i));
        assert_int_equal(ect_push_consumer_release(c, &v), 0);
    }
    assert_true(test_check_pattern(a.data, a.nbytes, 7));
    ect_push_consumer_evict(c, SIZE_MAX);
    ect_push_consumer_stats(c, &st);
    assert_int_equal(st.resident, 1); /* ours, leased */
    a.transfer_id[0] = '\0';          /* lease only */
    assert_int_equal(ect_push_consumer_release(c, &a), 0);
    assert_int_equal(ect_push_consumer_evict(c, SIZE_MAX), 0); /* b still leases it */
    assert_int_equal(ect_push_consumer_release(c, &b), 0);     /* f1 a tombstone: fine */
    assert_err(ect_push_consumer_release(c, &b), ECT_ESTATE, NULL);
    assert_int_equal(ect_push_consumer_evict(c, SIZE_MAX), 1);
    /* finish before any take: the bytes go resident, no lease */
    push_item(&p, "f2", "hf2", 8, 9);
    assert_int_equal(ect_push_consumer_finish(c, "f2"), 0);
    assert_err(ect_push_consumer_take(c, "f2", &a), ECT_ENOTFOUND, NULL);
    assert_int_equal(ect_push_consumer_evict(c, SIZE_MAX), 1);
    test_prod_close(&p);
    test_inst_close_checked(&in);
}

/* Bad options are refused by name; the control port in use is EEXIST. */
static void test_open_errors(void **state) {
    (void)state;
    ect_push_consumer_opts o;
    ect_push_consumer *c = (void *)1;
    ect_push_consumer_opts_init(&o);
    o.tp_rank = 1;
    assert_err(ect_push_consumer_open(&o, &c), ECT_EINVAL, "tp_rank");
    assert_null(c);
    ect_push_consumer_opts_init(&o);
    o.transport = "carrier-pigeon";
    o.ec_port = 0;
    assert_true(ect_push_consumer_open(&o, &c) < 0);
    ect_push_consumer_opts_init(&o);
    o.ec_port = 65535;
    o.tp_size = 2;
    assert_err(ect_push_consumer_open(&o, &c), ECT_EINVAL, "65535");
    test_inst in;
    inst_open(&in, 1, "tcp", 1u << 20, 0);
    ect_push_consumer_opts_init(&o);
    o.ec_port = in.base;
    o.pool_size = 1u << 20;
    assert_err(ect_push_consumer_open(&o, &c), ECT_EEXIST, "address in use");
    ect_push_scheduler_opts so;
    ect_push_scheduler_opts_init(&so);
    so.tp_size = 0;
    ect_push_scheduler *s = (void *)1;
    assert_err(ect_push_scheduler_open(&so, &s), ECT_EINVAL, "tp_size");
    assert_null(s);
    assert_string_equal(ect_push_state_name(ECT_PUSH_RESIDENT), "RESIDENT");
    test_inst_close_checked(&in);
}

/* ect_push_ping: n timed event_port exchanges to a shard; bad arguments and
 * a shard that is gone are refused by name. */
static void test_ping(void **state) {
    (void)state;
    test_inst in;
    inst_open(&in, 1, "tcp", 1u << 20, 0);
    uint64_t rtt[5] = {0};
    assert_int_equal(ect_push_ping("127.0.0.1", in.base, 30000, rtt, 5), 0);
    for (size_t i = 0; i < 5; i++) assert_true(rtt[i] > 0);
    assert_int_equal(ect_push_ping("127.0.0.1", in.base, 30000, NULL, 0), 0);
    assert_err(ect_push_ping("127.0.0.1", in.base, 30000, NULL, 3), ECT_EINVAL, "rtt_ns");
    assert_err(ect_push_ping("127.0.0.1", 0, 30000, rtt, 1), ECT_EINVAL, "port 0");
    assert_err(ect_push_ping("127.0.0.1", in.base, 0, rtt, 1), ECT_EINVAL, "timeout_ms");
    int port = in.base;
    test_inst_close_checked(&in);
    assert_err(ect_push_ping("127.0.0.1", port, 30000, rtt, 1), ECT_ECONNREFUSED,
               "no consumer answers");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ping),
        cmocka_unit_test(test_tp1_tcp),
        cmocka_unit_test(test_tp2_tcp),
        cmocka_unit_test(test_tp2_shm),
        cmocka_unit_test(test_accept_any_and_refusals),
        cmocka_unit_test(test_producer_killed_after_reserve),
        cmocka_unit_test(test_finish_keeps_leases),
        cmocka_unit_test(test_open_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
