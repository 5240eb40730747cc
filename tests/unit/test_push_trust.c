/*
 * Tests for two protections of the push consumer that need no keys
 * (issue 15; docs/PROTOCOL.md "Lost events" and "Reservations belong to
 * their peer"):
 *  - a stray PULL socket connected to the shards' event ports steals
 *    readiness events (PUSH round-robins), yet every item the producer
 *    completed becomes AVAILABLE at the scheduler, which asks the shards with
 *    `status` for items whose events are overdue;
 *  - an outside client (source address 127.0.0.2) cannot complete, cancel,
 *    re-reserve or learn the reservation id of a reservation the producer
 *    (127.0.0.1) made; the legitimate pushes all succeed and the refusals are
 *    counted in ect_status.
 * Readiness is by polling state with generous deadlines; nothing is timed.
 */
#include <stdio.h>
#include <stdlib.h>

#include <zmq.h>

#include "testutil.h"
#include "push/control_client.h"
#include "push/control_server.h"
#include "ctl_req.h"
#include "util/util.h"

#define ROWS 64
#define COLS 256
#define NITEMS 20

/* The stray-PULL case needs the opt-out (event_auth none, as an upstream
 * scheduler needs): with the default event secret a stray PULL cannot
 * connect at all (test_zauth shows that). */
static void inst_open(test_inst *in, int tp, size_t max_events) {
    ect_push_consumer_opts o;
    ect_push_consumer_opts_init(&o);
    o.pool_size = 16u << 20;
    o.transport = "tcp";
    if (max_events) o.max_events = max_events;
    o.event_auth_off = 1;
    test_inst_open(in, tp, &o);
}

/* ---- the legitimate producer (from 127.0.0.1) */
static void prod_open(test_prod *p, int base) { test_prod_open(p, base, "tcp", 30000); }

/* Reserves tid on shard i; returns the reply (the caller clears it). */
static wire_ctl_reply reserve(test_prod *p, size_t i, const char *tid, const char *hash) {
    wire_ctl_request q = test_reserve_req(tid, hash, ROWS, COLS, "bfloat16");
    wire_ctl_reply r;
    assert_int_equal(ctl_call_ok(p->cli, "127.0.0.1", p->ports[i], &q, &r), 0);
    assert_true(r.u.reserve.write);
    return r;
}

/* Writes the pattern of seed into the reservation and completes it. */
static void write_complete(test_prod *p, size_t i, const char *tid, const wire_ctl_reply *r,
                           uint64_t seed) {
    uint64_t nbytes = ROWS * COLS * 2;
    uint8_t *src = malloc(nbytes);
    test_fill_pattern(src, nbytes, seed);
    ect_write w = {src, r->u.reserve.dst_ptr, nbytes, r->u.reserve.dst_key};
    assert_int_equal(ect_xport_write_batch(p->xp, r->u.reserve.dst_session, &w, 1, NULL), 0);
    free(src);
    wire_ctl_request c = {.op = WIRE_OP_COMPLETE};
    snprintf(c.u.complete.transfer_id, sizeof c.u.complete.transfer_id, "%s", tid);
    snprintf(c.u.complete.reservation_id, sizeof c.u.complete.reservation_id, "%s",
             r->u.reserve.reservation_id);
    wire_ctl_reply cr;
    assert_int_equal(ctl_call_ok(p->cli, "127.0.0.1", p->ports[i], &c, &cr), 0);
    assert_true(cr.u.complete.completed);
    assert_true(cr.u.complete.became_ready);
    wire_ctl_reply_clear(&cr);
}

static void push_item(test_prod *p, const char *tid, const char *hash, uint64_t seed) {
    for (size_t i = 0; i < p->n; i++) {
        wire_ctl_reply r = reserve(p, i, tid, hash);
        write_complete(p, i, tid, &r, seed);
        wire_ctl_reply_clear(&r);
    }
}

/* Takes tid on every shard, checks its bytes and releases it. */
static void take_release(test_inst *in, const char *tid, uint64_t seed) {
    for (int r = 0; r < in->tp; r++) {
        ect_push_view v;
        assert_int_equal(ect_push_consumer_take(in->c[r], tid, &v), 0);
        assert_true(test_check_pattern(v.data, v.nbytes, seed));
        assert_int_equal(ect_push_consumer_release(in->c[r], &v), 0);
    }
}

/* ---- a raw REQ client with a chosen source address */
typedef struct raw {
    void *zctx, *req;
} raw;

static void raw_open(raw *c, const char *src, int port) {
    c->zctx = zmq_ctx_new();
    c->req = zmq_socket(c->zctx, ZMQ_REQ);
    int t = 30000, zero = 0;
    zmq_setsockopt(c->req, ZMQ_RCVTIMEO, &t, sizeof t);
    zmq_setsockopt(c->req, ZMQ_SNDTIMEO, &t, sizeof t);
    zmq_setsockopt(c->req, ZMQ_LINGER, &zero, sizeof zero);
    char ep[128];
    snprintf(ep, sizeof ep, "tcp://%s:0;127.0.0.1:%d", src, port); /* source address */
    assert_int_equal(zmq_connect(c->req, ep), 0);
}

static void raw_close(raw *c) {
    zmq_close(c->req);
    zmq_ctx_term(c->zctx);
}

/* Sends one request; returns the reply text (static storage). */
static const char *raw_call(raw *c, const char *fmt, ...) {
    static char buf[1 << 16];
    char req[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(req, sizeof req, fmt, ap);
    va_end(ap);
    assert_true(zmq_send(c->req, req, strlen(req), 0) >= 0);
    int n = zmq_recv(c->req, buf, sizeof buf - 1, 0);
    if (n < 0) fail_msg("no reply to %s: %s", req, zmq_strerror(errno));
    buf[n < (int)sizeof buf - 1 ? n : (int)sizeof buf - 1] = 0;
    return buf;
}

/* One shard, a producer on it, and two raw clients of its control port:
 * an outsider (127.0.0.2) and this host (127.0.0.1, trusted). */
typedef struct rig {
    test_inst in;
    test_prod p;
    raw out, local;
} rig;

static void rig_open(rig *r) {
    inst_open(&r->in, 1, 0);
    prod_open(&r->p, r->in.base);
    raw_open(&r->out, "127.0.0.2", r->in.base);
    raw_open(&r->local, "127.0.0.1", r->in.base);
}

static void rig_close(rig *r) {
    raw_close(&r->out);
    raw_close(&r->local);
    test_prod_close(&r->p);
    test_inst_close_checked(&r->in);
}

/* The count under "peer_refused" -> key in the shard's ect_status. */
static long peer_refused(raw *c, const char *key) {
    const char *s = raw_call(c, "{\"op\":\"ect_status\"}");
    const char *o = strstr(s, "\"peer_refused\":{");
    assert_non_null(o);
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *k = strstr(o, pat);
    assert_non_null(k);
    return strtol(k + strlen(pat), NULL, 10);
}

/* ---- lost events */

/* A stray PULL connected to every shard's event port (in its own context,
 * *sctx). A probe item, pushed before any scheduler exists: its events (one
 * per shard) reach the stray, which proves it is connected to every shard. */
static void *stray_open(test_inst *in, test_prod *p, void **sctx) {
    *sctx = zmq_ctx_new();
    void *stray = zmq_socket(*sctx, ZMQ_PULL);
    int t = 30000, zero = 0;
    zmq_setsockopt(stray, ZMQ_RCVTIMEO, &t, sizeof t);
    zmq_setsockopt(stray, ZMQ_LINGER, &zero, sizeof zero);
    for (size_t i = 0; i < p->n; i++) {
        int ev;
        assert_int_equal(ctl_event_port(p->cli, "127.0.0.1", p->ports[i], &ev), 0);
        char ep[64];
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", ev);
        assert_int_equal(zmq_connect(stray, ep), 0);
    }
    push_item(p, "probe", "hprobe", 7);
    char buf[4096];
    for (size_t k = 0; k < p->n; k++) assert_true(zmq_recv(stray, buf, sizeof buf, 0) > 0);
    take_release(in, "probe", 7);
    zmq_setsockopt(stray, ZMQ_RCVTIMEO, &zero, sizeof zero);
    return stray;
}

static void test_stray_pull_loses_no_item(void **state) {
    (void)state;
    test_inst in;
    inst_open(&in, 2, 0);
    test_prod p;
    prod_open(&p, in.base);
    assert_int_equal(p.n, 2);
    void *sctx, *stray = stray_open(&in, &p, &sctx);
    char buf[4096];

    /* The scheduler connects too; the stray keeps reading (as a thief would). */
    ect_push_scheduler_opts so;
    ect_push_scheduler_opts_init(&so);
    so.consumer_port = in.base;
    so.tp_size = 2;
    so.control_timeout_s = 30;
    so.push_wait_ms = 600000; /* no UNAVAILABLE under a slow machine */
    ect_push_scheduler *s = NULL;
    assert_int_equal(ect_push_scheduler_open(&so, &s), 0);
    char tid[NITEMS][32], hash[NITEMS][32];
    for (int i = 0; i < NITEMS; i++) {
        snprintf(tid[i], sizeof tid[i], "t%d", i);
        snprintf(hash[i], sizeof hash[i], "h%d", i);
        assert_int_equal(ect_push_scheduler_expect(s, tid[i], hash[i]), 0);
    }
    ect_push_scheduler_stat st;
    for (int i = 0; i < 6000; i++) { /* discovery done: its PULL is connecting too */
        ect_push_scheduler_poll(s);
        ect_push_scheduler_stats(s, &st);
        if (st.shards == 2) break;
        test_nap_ms(5);
    }
    assert_int_equal(st.shards, 2);
    for (int i = 0; i < NITEMS; i++) push_item(&p, tid[i], hash[i], 100 + (uint64_t)i);

    /* Every item arrives; the stray's catch is read meanwhile. */
    int stolen = 0, arrived = 0;
    for (int round = 0; round < 24000 && arrived < NITEMS; round++) { /* ~120 s at most */
        while (zmq_recv(stray, buf, sizeof buf, ZMQ_DONTWAIT) > 0) stolen++;
        ect_push_scheduler_poll(s);
        ect_push_sched_item it;
        while (ect_push_scheduler_next(s, &it) == 0) {
            assert_int_equal(it.reported, 2);
            arrived++;
        }
        if (arrived < NITEMS) test_nap_ms(5);
    }
    while (zmq_recv(stray, buf, sizeof buf, ZMQ_DONTWAIT) > 0) stolen++;
    assert_int_equal(arrived, NITEMS);
    ect_push_scheduler_stats(s, &st);
    print_message("stray PULL took %d of %d events; %llu shard reports recovered by status\n",
                  stolen, 2 * NITEMS, (unsigned long long)st.recovered);
    assert_true(stolen > 0);       /* the thief did steal ... */
    assert_true(st.recovered > 0); /* ... and status made up for it */
    assert_true(st.rechecks >= st.recovered);
    for (int i = 0; i < NITEMS; i++) {
        take_release(&in, tid[i], 100 + (uint64_t)i);
        assert_int_equal(ect_push_scheduler_loaded(s, tid[i]), 0);
        assert_int_equal(ect_push_scheduler_finished(s, tid[i]), 0);
    }
    ect_push_scheduler_close(s);
    zmq_close(stray);
    zmq_ctx_term(sctx);
    test_prod_close(&p);
    test_inst_close_checked(&in);
}

/* accept_any (ect push-consumer, the bench server): the scheduler expects
 * nothing, and one shard's stray PULL takes every other event, so some items
 * have lost every event they had. Every item still arrives (once), learnt
 * from the shard's ect_ready listing, and is then taken and finished as
 * usual. Without the listing the stolen items would never arrive. */
static void test_stray_pull_accept_any_loses_no_item(void **state) {
    (void)state;
    test_inst in;
    inst_open(&in, 1, 0);
    test_prod p;
    prod_open(&p, in.base);
    void *sctx, *stray = stray_open(&in, &p, &sctx);
    ect_push_scheduler_opts so;
    ect_push_scheduler_opts_init(&so);
    so.consumer_port = in.base;
    so.tp_size = 1;
    so.control_timeout_s = 30;
    so.push_wait_ms = 600000;
    so.accept_any = 1;
    so.recheck_ms = 200;
    ect_push_scheduler *s = NULL;
    assert_int_equal(ect_push_scheduler_open(&so, &s), 0);
    ect_push_scheduler_stat st;
    for (int i = 0; i < 6000; i++) {
        ect_push_scheduler_poll(s);
        ect_push_scheduler_stats(s, &st);
        if (st.shards == 1) break;
        test_nap_ms(5);
    }
    assert_int_equal(st.shards, 1);
    for (int i = 0; i < NITEMS; i++) {
        char tid[32], hash[32];
        snprintf(tid, sizeof tid, "a%d", i);
        snprintf(hash, sizeof hash, "ha%d", i);
        push_item(&p, tid, hash, 300 + (uint64_t)i);
    }
    int stolen = 0, arrived = 0;
    bool seen[NITEMS] = {false};
    char buf[4096];
    for (int round = 0; round < 24000 && arrived < NITEMS; round++) { /* ~120 s at most */
        while (zmq_recv(stray, buf, sizeof buf, ZMQ_DONTWAIT) > 0) stolen++;
        ect_push_scheduler_poll(s);
        ect_push_sched_item it;
        while (ect_push_scheduler_next(s, &it) == 0) {
            int i = atoi(it.transfer_id + 1);
            assert_true(it.transfer_id[0] == 'a' && i >= 0 && i < NITEMS && !seen[i]);
            seen[i] = true;
            arrived++;
            take_release(&in, it.transfer_id, 300 + (uint64_t)i);
            assert_int_equal(ect_push_scheduler_loaded(s, it.transfer_id), 0);
            assert_int_equal(ect_push_scheduler_finished(s, it.transfer_id), 0);
        }
        if (arrived < NITEMS) test_nap_ms(5);
    }
    while (zmq_recv(stray, buf, sizeof buf, ZMQ_DONTWAIT) > 0) stolen++;
    ect_push_scheduler_stats(s, &st);
    print_message("stray PULL took %d of %d events; %llu items learnt from ect_ready\n", stolen,
                  NITEMS, (unsigned long long)st.listed);
    assert_int_equal(arrived, NITEMS);
    assert_true(stolen > 0);                    /* the thief did steal whole items ... */
    assert_true(st.listed >= (uint64_t)stolen); /* ... and each came back by the listing */
    assert_true(st.listed <= NITEMS);
    ect_push_scheduler_close(s);
    zmq_close(stray);
    zmq_ctx_term(sctx);
    test_prod_close(&p);
    test_inst_close_checked(&in);
}

/* Events the shard's full queue dropped (fault injection: a backlog of 2,
 * and no scheduler connected while ten items complete) are recovered too. */
static void test_dropped_events_lose_no_item(void **state) {
    (void)state;
    test_inst in;
    inst_open(&in, 1, 2);
    test_prod p;
    prod_open(&p, in.base);
    char tid[10][32], hash[10][32];
    for (int i = 0; i < 10; i++) {
        snprintf(tid[i], sizeof tid[i], "d%d", i);
        snprintf(hash[i], sizeof hash[i], "hd%d", i);
        push_item(&p, tid[i], hash[i], 900 + (uint64_t)i);
    }
    ect_push_consumer_stat cst;
    ect_push_consumer_stats(in.c[0], &cst);
    assert_int_equal(cst.events_dropped, 8); /* only the newest two wait */

    ect_push_scheduler_opts so;
    ect_push_scheduler_opts_init(&so);
    so.consumer_port = in.base;
    so.control_timeout_s = 30;
    so.push_wait_ms = 600000;
    ect_push_scheduler *s = NULL;
    assert_int_equal(ect_push_scheduler_open(&so, &s), 0);
    for (int i = 0; i < 10; i++) assert_int_equal(ect_push_scheduler_expect(s, tid[i], hash[i]), 0);
    int arrived = 0;
    for (int round = 0; round < 24000 && arrived < 10; round++) { /* ~120 s at most */
        ect_push_scheduler_poll(s);
        ect_push_sched_item it;
        while (ect_push_scheduler_next(s, &it) == 0) arrived++;
        if (arrived < 10) test_nap_ms(5);
    }
    assert_int_equal(arrived, 10);
    ect_push_scheduler_stat st;
    ect_push_scheduler_stats(s, &st);
    assert_true(st.recovered >= 8); /* the dropped ones at least */
    for (int i = 0; i < 10; i++) {
        take_release(&in, tid[i], 900 + (uint64_t)i);
        assert_int_equal(ect_push_scheduler_loaded(s, tid[i]), 0);
        assert_int_equal(ect_push_scheduler_finished(s, tid[i]), 0);
    }
    ect_push_scheduler_close(s);
    test_prod_close(&p);
    test_inst_close_checked(&in);
}

/* ---- reservations belong to their peer */

static void test_outsider_cannot_touch_reservations(void **state) {
    (void)state;
    rig t;
    rig_open(&t);
    for (int i = 0; i < NITEMS; i++) {
        char tid[32], hash[32];
        snprintf(tid, sizeof tid, "x%d", i);
        snprintf(hash, sizeof hash, "hx%d", i);
        wire_ctl_reply r = reserve(&t.p, 0, tid, hash);
        const char *rid = r.u.reserve.reservation_id;

        /* status: the outsider sees the item but not its reservation id. */
        const char *s = raw_call(&t.out, "{\"op\":\"status\",\"transfer_id\":\"%s\"}", tid);
        assert_non_null(strstr(s, "\"ok\":true"));
        assert_non_null(strstr(s, "\"reservation_id\":\"\""));
        assert_null(strstr(s, rid));
        if (r.u.reserve.dst_key) assert_null(strstr(s, r.u.reserve.dst_key));
        /* The reserver's host sees the id, never the write key. */
        s = raw_call(&t.local, "{\"op\":\"status\",\"transfer_id\":\"%s\"}", tid);
        assert_non_null(strstr(s, rid));
        if (r.u.reserve.dst_key) assert_null(strstr(s, r.u.reserve.dst_key));

        /* Even knowing the id, the outsider can neither cancel nor complete. */
        s = raw_call(&t.out,
                     "{\"op\":\"cancel\",\"transfer_id\":\"%s\",\"reservation_id\":\"%s\","
                     "\"abandon\":true}",
                     tid, rid);
        assert_non_null(strstr(s, "\"ok\":false"));
        assert_non_null(strstr(s, "belongs to another peer"));
        s = raw_call(&t.out, "{\"op\":\"cancel\",\"transfer_id\":\"%s\"}", tid);
        assert_non_null(strstr(s, "belongs to another peer"));
        s = raw_call(&t.out,
                     "{\"op\":\"complete\",\"transfer_id\":\"%s\",\"reservation_id\":\"%s\"}", tid,
                     rid);
        assert_non_null(strstr(s, "\"ok\":false"));
        assert_non_null(strstr(s, "belongs to another peer"));
        s = raw_call(&t.out,
                     "{\"op\":\"complete_batch\",\"items\":[{\"transfer_id\":\"%s\","
                     "\"reservation_id\":\"%s\"}]}",
                     tid, rid);
        assert_non_null(strstr(s, "\"completed\":false"));
        s = raw_call(&t.out,
                     "{\"op\":\"reserve\",\"transfer_id\":\"%s\",\"mm_hash\":\"%s\",\"nbytes\":%d,"
                     "\"shape\":[%d,%d],\"dtype\":\"bfloat16\"}",
                     tid, hash, ROWS * COLS * 2, ROWS, COLS);
        assert_non_null(strstr(s, "\"ok\":false"));
        assert_non_null(strstr(s, "conflicting reservation for transfer_id"));

        /* The legitimate push goes through untouched. */
        write_complete(&t.p, 0, tid, &r, 500 + (uint64_t)i);
        wire_ctl_reply_clear(&r);
        /* READY now: the outsider still cannot cancel it. */
        s = raw_call(&t.out, "{\"op\":\"cancel\",\"transfer_id\":\"%s\"}", tid);
        assert_non_null(strstr(s, "belongs to another peer"));
        take_release(&t.in, tid, 500 + (uint64_t)i);
    }
    assert_int_equal(peer_refused(&t.out, "complete"), 2 * NITEMS);
    assert_int_equal(peer_refused(&t.out, "cancel"), 3 * NITEMS);
    assert_int_equal(peer_refused(&t.out, "status"), NITEMS);
    assert_int_equal(peer_refused(&t.out, "reserve"), NITEMS);

    /* This host's scheduler (a trusted address) may still cancel another
     * peer's live reservation, as upstream's scheduler does. */
    wire_ctl_reply r = reserve(&t.p, 0, "y", "hy");
    const char *s = raw_call(&t.local,
                             "{\"op\":\"cancel\",\"transfer_id\":\"y\",\"reservation_id\":\"%s\","
                             "\"abandon\":true}",
                             r.u.reserve.reservation_id);
    assert_non_null(strstr(s, "\"cancelled\":true"));
    wire_ctl_reply_clear(&r);

    rig_close(&t);
}

/* ect_ready lists every ready item with its reservation id: refused to an
 * outsider (counted), answered to this host; max splits the list and the
 * cursor moves on; a taken item is not listed; bad requests are refused with
 * texts naming the field. */
static void test_ect_ready_trusted_only(void **state) {
    (void)state;
    rig t;
    rig_open(&t);
    push_item(&t.p, "r0", "hr0", 40);
    push_item(&t.p, "r1", "hr1", 41);
    push_item(&t.p, "r2", "hr2", 42);
    const char *refused = "{\"ok\":false,\"error\":\"" CTL_READY_REFUSED "\"}";
    assert_string_equal(raw_call(&t.out, "{\"op\":\"ect_ready\",\"after\":0}"), refused);
    char doc[512];
    snprintf(doc, sizeof doc, "\n%s\n", refused);
    if (!strstr(test_protocol_md(), doc)) fail_msg("docs/PROTOCOL.md lacks %s", refused);
    assert_int_equal(peer_refused(&t.out, "ready"), 1);
    /* this host: two, then the third, then nothing new */
    wire_ctl_reply r;
    const char *s = raw_call(&t.local, "{\"op\":\"ect_ready\",\"after\":0,\"max\":2}");
    assert_int_equal(wire_ctl_decode_reply(WIRE_OP_ECT_READY, 2, s, strlen(s), &r), 0);
    assert_true(r.ok && r.u.ready.n == 2 && r.u.ready.more);
    assert_string_equal(r.u.ready.items[0].transfer_id, "r0");
    assert_string_equal(r.u.ready.items[1].transfer_id, "r1");
    assert_string_equal(r.u.ready.items[0].mm_hash, "hr0");
    assert_int_equal(r.u.ready.items[0].tensor.nbytes, ROWS * COLS * 2);
    assert_string_equal(r.u.ready.items[0].tensor.dtype, "bfloat16");
    assert_int_equal(r.u.ready.next, r.u.ready.items[1].seq);
    char rid0[WIRE_ID_MAX + 1];
    snprintf(rid0, sizeof rid0, "%s", r.u.ready.items[0].reservation_id);
    assert_non_null(strstr(raw_call(&t.local, "{\"op\":\"status\",\"transfer_id\":\"r0\"}"), rid0));
    uint64_t next = r.u.ready.next;
    wire_ctl_reply_clear(&r);
    s = raw_call(&t.local, "{\"op\":\"ect_ready\",\"after\":%llu,\"max\":2}",
                 (unsigned long long)next);
    assert_int_equal(wire_ctl_decode_reply(WIRE_OP_ECT_READY, 2, s, strlen(s), &r), 0);
    assert_true(r.ok && r.u.ready.n == 1 && !r.u.ready.more);
    assert_string_equal(r.u.ready.items[0].transfer_id, "r2");
    next = r.u.ready.next;
    wire_ctl_reply_clear(&r);
    s = raw_call(&t.local, "{\"op\":\"ect_ready\",\"after\":%llu}", (unsigned long long)next);
    assert_int_equal(wire_ctl_decode_reply(WIRE_OP_ECT_READY, SIZE_MAX, s, strlen(s), &r), 0);
    assert_true(r.ok && r.u.ready.n == 0 && !r.u.ready.more && r.u.ready.next == next);
    wire_ctl_reply_clear(&r);
    /* taken by the engine: no longer listed; finished: neither */
    ect_push_view v;
    assert_int_equal(ect_push_consumer_take(t.in.c[0], "r1", &v), 0);
    s = raw_call(&t.local, "{\"op\":\"ect_ready\",\"after\":0}");
    assert_int_equal(wire_ctl_decode_reply(WIRE_OP_ECT_READY, SIZE_MAX, s, strlen(s), &r), 0);
    assert_true(r.ok && r.u.ready.n == 2);
    assert_string_equal(r.u.ready.items[0].transfer_id, "r0");
    assert_string_equal(r.u.ready.items[1].transfer_id, "r2");
    wire_ctl_reply_clear(&r);
    assert_int_equal(ect_push_consumer_release(t.in.c[0], &v), 0);
    take_release(&t.in, "r0", 40);
    take_release(&t.in, "r2", 42);
    s = raw_call(&t.local, "{\"op\":\"ect_ready\",\"after\":0}");
    assert_non_null(strstr(s, "\"items\":[]"));
    /* bad requests: refused, the field named */
    static const char *const bad[][2] = {
        {"{\"op\":\"ect_ready\"}", "after: missing"},
        {"{\"op\":\"ect_ready\",\"after\":-1}", "after: expected a non-negative integer, got -1"},
        {"{\"op\":\"ect_ready\",\"after\":1.5}",
         "after: expected a non-negative integer, got real"},
        {"{\"op\":\"ect_ready\",\"after\":\"0\"}",
         "after: expected a non-negative integer, got string"},
        {"{\"op\":\"ect_ready\",\"after\":0,\"max\":0}", "max: 0 outside 1..4096"},
        {"{\"op\":\"ect_ready\",\"after\":0,\"max\":4097}", "max: 4097 outside 1..4096"},
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(bad); i++) {
        char want[256];
        snprintf(want, sizeof want, "{\"ok\":false,\"error\":\"%s\"}", bad[i][1]);
        assert_string_equal(raw_call(&t.local, "%s", bad[i][0]), want);
    }
    rig_close(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stray_pull_loses_no_item),
        cmocka_unit_test(test_dropped_events_lose_no_item),
        cmocka_unit_test(test_outsider_cannot_touch_reservations),
        cmocka_unit_test(test_stray_pull_accept_any_loses_no_item),
        cmocka_unit_test(test_ect_ready_trusted_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
