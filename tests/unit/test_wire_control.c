/*
 * Tests for wire/control_msg: the push protocol's JSON requests, replies and
 * events. Golden strings pin the exact bytes (the same strings are the
 * examples in docs/PROTOCOL.md); random round trips cover every message type;
 * one test per bad-input class checks the error code and that the text names
 * the field; a mutation loop checks that no input crashes or leaks a decoder.
 */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "util/util.h"
#include "wire/control_msg.h"

/* Out-of-memory countdown over this program's malloc/calloc/realloc (jansson's
 * included), as in test_mem_oom.c. Interposing malloc conflicts with the
 * sanitizers' own, so the OOM test is skipped under ASan and TSan. */
#include "oom_inject.h"

/* ------------------------------------------------------------ helpers */

static void set_tensor(wire_tensor *t, const char *dtype, uint64_t nbytes, uint32_t ndim,
                       const uint64_t *shape) {
    memset(t, 0, sizeof *t);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    t->nbytes = nbytes;
    t->ndim = ndim;
    for (uint32_t i = 0; i < ndim; i++) t->shape[i] = shape[i];
}

static void assert_tensor_eq(const wire_tensor *a, const wire_tensor *b) {
    assert_int_equal(a->nbytes, b->nbytes);
    assert_int_equal(a->ndim, b->ndim);
    for (uint32_t i = 0; i < a->ndim; i++) assert_int_equal(a->shape[i], b->shape[i]);
    assert_string_equal(a->dtype, b->dtype);
}

static void assert_str_or_null_eq(const char *a, const char *b) {
    if (!a || !b)
        assert_true(a == b);
    else
        assert_string_equal(a, b);
}

static void assert_request_eq(const wire_ctl_request *a, const wire_ctl_request *b) {
    assert_int_equal(a->op, b->op);
    assert_true(a->shm_id == b->shm_id);
    assert_true(a->spare == b->spare);
    switch (a->op) {
    case WIRE_OP_RESERVE:
        assert_string_equal(a->u.reserve.transfer_id, b->u.reserve.transfer_id);
        assert_string_equal(a->u.reserve.mm_hash, b->u.reserve.mm_hash);
        assert_tensor_eq(&a->u.reserve.tensor, &b->u.reserve.tensor);
        break;
    case WIRE_OP_RESERVE_BATCH:
        assert_int_equal(a->u.reserve_batch.n, b->u.reserve_batch.n);
        for (size_t i = 0; i < a->u.reserve_batch.n; i++) {
            const wire_reserve_item *x = &a->u.reserve_batch.items[i];
            const wire_reserve_item *y = &b->u.reserve_batch.items[i];
            assert_int_equal(x->rc, y->rc);
            assert_string_equal(x->req.transfer_id, y->req.transfer_id);
            assert_string_equal(x->req.mm_hash, y->req.mm_hash);
            assert_tensor_eq(&x->req.tensor, &y->req.tensor);
        }
        break;
    case WIRE_OP_STATUS:
        assert_string_equal(a->u.status.transfer_id, b->u.status.transfer_id);
        break;
    case WIRE_OP_EVENT_PORT:
    case WIRE_OP_PEERS: break;
    case WIRE_OP_COMPLETE:
        assert_string_equal(a->u.complete.transfer_id, b->u.complete.transfer_id);
        assert_string_equal(a->u.complete.reservation_id, b->u.complete.reservation_id);
        break;
    case WIRE_OP_COMPLETE_BATCH:
        assert_int_equal(a->u.complete_batch.n, b->u.complete_batch.n);
        for (size_t i = 0; i < a->u.complete_batch.n; i++) {
            assert_string_equal(a->u.complete_batch.items[i].transfer_id,
                                b->u.complete_batch.items[i].transfer_id);
            assert_string_equal(a->u.complete_batch.items[i].reservation_id,
                                b->u.complete_batch.items[i].reservation_id);
        }
        break;
    case WIRE_OP_CANCEL:
        assert_string_equal(a->u.cancel.transfer_id, b->u.cancel.transfer_id);
        assert_string_equal(a->u.cancel.reservation_id, b->u.cancel.reservation_id);
        assert_int_equal(a->u.cancel.abandon, b->u.cancel.abandon);
        assert_int_equal(a->u.cancel.refresh, b->u.cancel.refresh);
        break;
    case WIRE_OP_ECT_STATUS: break; /* no fields */
    case WIRE_OP_ECT_PUT:
        assert_string_equal(a->u.put.item.transfer_id, b->u.put.item.transfer_id);
        assert_string_equal(a->u.put.item.mm_hash, b->u.put.item.mm_hash);
        assert_tensor_eq(&a->u.put.item.tensor, &b->u.put.item.tensor);
        assert_string_equal(a->u.put.spare_id, b->u.put.spare_id);
        break;
    case WIRE_OP_ECT_READY:
        assert_int_equal(a->u.ready.after, b->u.ready.after);
        assert_int_equal(a->u.ready.max, b->u.ready.max);
        assert_int_equal(a->u.ready.age_ms, b->u.ready.age_ms);
        break;
    }
}

static void assert_reserve_result_eq(const wire_reserve_result *a, const wire_reserve_result *b) {
    assert_int_equal(a->cancelled, b->cancelled);
    assert_string_equal(a->reservation_id, b->reservation_id);
    assert_string_equal(a->dst_session, b->dst_session);
    assert_int_equal(a->dst_ptr, b->dst_ptr);
    assert_int_equal(a->nbytes, b->nbytes);
    assert_int_equal(a->write, b->write);
    assert_int_equal(a->ready, b->ready);
    assert_int_equal(a->cached, b->cached);
    assert_string_equal(a->transport, b->transport);
    assert_str_or_null_eq(a->dst_key, b->dst_key);
    assert_string_equal(a->cancelled ? a->reason : "", b->cancelled ? b->reason : "");
}

static void assert_reply_eq(const wire_ctl_reply *a, const wire_ctl_reply *b) {
    assert_int_equal(a->op, b->op);
    assert_int_equal(a->ok, b->ok);
    if (!a->ok) {
        assert_string_equal(a->error, b->error);
        return;
    }
    assert_int_equal(a->has_spare, b->has_spare);
    if (a->has_spare) assert_reserve_result_eq(&a->spare, &b->spare);
    switch (a->op) {
    case WIRE_OP_RESERVE: assert_reserve_result_eq(&a->u.reserve, &b->u.reserve); break;
    case WIRE_OP_RESERVE_BATCH:
        assert_int_equal(a->u.reserve_batch.n, b->u.reserve_batch.n);
        for (size_t i = 0; i < a->u.reserve_batch.n; i++) {
            const wire_reserve_outcome *x = &a->u.reserve_batch.items[i];
            const wire_reserve_outcome *y = &b->u.reserve_batch.items[i];
            assert_int_equal(x->ok, y->ok);
            if (x->ok)
                assert_reserve_result_eq(&x->result, &y->result);
            else
                assert_string_equal(x->error, y->error);
        }
        break;
    case WIRE_OP_STATUS:
        assert_int_equal(a->u.status.found, b->u.status.found);
        if (!a->u.status.found) break;
        assert_string_equal(a->u.status.mm_hash, b->u.status.mm_hash);
        assert_int_equal(a->u.status.ready, b->u.status.ready);
        assert_string_equal(a->u.status.reservation_id, b->u.status.reservation_id);
        assert_tensor_eq(&a->u.status.tensor, &b->u.status.tensor);
        break;
    case WIRE_OP_EVENT_PORT: assert_int_equal(a->u.event_port, b->u.event_port); break;
    case WIRE_OP_PEERS:
        assert_int_equal(a->u.peers.n, b->u.peers.n);
        for (size_t i = 0; i < a->u.peers.n; i++)
            assert_int_equal(a->u.peers.ports[i], b->u.peers.ports[i]);
        assert_string_equal(a->u.peers.transport, b->u.peers.transport);
        break;
    case WIRE_OP_COMPLETE:
    case WIRE_OP_ECT_PUT:
        assert_int_equal(a->u.complete.completed, b->u.complete.completed);
        assert_int_equal(a->u.complete.became_ready, b->u.complete.became_ready);
        break;
    case WIRE_OP_COMPLETE_BATCH:
        assert_int_equal(a->u.complete_batch.n, b->u.complete_batch.n);
        for (size_t i = 0; i < a->u.complete_batch.n; i++) {
            assert_int_equal(a->u.complete_batch.items[i].completed,
                             b->u.complete_batch.items[i].completed);
            assert_int_equal(a->u.complete_batch.items[i].became_ready,
                             b->u.complete_batch.items[i].became_ready);
        }
        break;
    case WIRE_OP_CANCEL: assert_int_equal(a->u.cancelled, b->u.cancelled); break;
    case WIRE_OP_ECT_STATUS: assert_string_equal(a->u.ect_status, b->u.ect_status); break;
    case WIRE_OP_ECT_READY:
        assert_int_equal(a->u.ready.n, b->u.ready.n);
        assert_int_equal(a->u.ready.next, b->u.ready.next);
        assert_int_equal(a->u.ready.more, b->u.ready.more);
        for (size_t i = 0; i < a->u.ready.n; i++) {
            const wire_ready_item *x = &a->u.ready.items[i], *y = &b->u.ready.items[i];
            assert_int_equal(x->seq, y->seq);
            assert_string_equal(x->transfer_id, y->transfer_id);
            assert_string_equal(x->mm_hash, y->mm_hash);
            assert_string_equal(x->reservation_id, y->reservation_id);
            assert_tensor_eq(&x->tensor, &y->tensor);
        }
        break;
    }
}

static void assert_event_eq(const wire_event *a, const wire_event *b) {
    assert_string_equal(a->transfer_id, b->transfer_id);
    assert_string_equal(a->mm_hash, b->mm_hash);
    assert_int_equal(a->ready, b->ready);
    assert_string_equal(a->reservation_id, b->reservation_id);
    assert_tensor_eq(&a->tensor, &b->tensor);
    assert_int_equal(a->shard, b->shard);
    assert_str_or_null_eq(a->error, b->error);
}

/* Encodes req, checks the bytes against `golden` (when given), decodes them
 * back and checks the fields survived. */
/* The fast path (control_fast.c) and the jansson path write the same bytes
 * for req and decode them to the same struct. */
static void request_paths_agree(const wire_ctl_request *req, const char *s) {
    char *slow = NULL;
    wire_ctl_request a, b;
    wctl_fast_off = true;
    assert_int_equal(wire_ctl_encode_request(req, &slow), 0);
    assert_int_equal(wire_ctl_decode_request(s, strlen(s), &b), 0);
    wctl_fast_off = false;
    assert_string_equal(s, slow);
    assert_int_equal(wire_ctl_decode_request(s, strlen(s), &a), 0);
    assert_request_eq(&a, &b);
    wire_ctl_request_clear(&a);
    wire_ctl_request_clear(&b);
    free(slow);
}

static void reply_paths_agree(const wire_ctl_reply *rep, size_t expect, const char *s) {
    char *slow = NULL;
    wire_ctl_reply a, b;
    wctl_fast_off = true;
    assert_int_equal(wire_ctl_encode_reply(rep, &slow), 0);
    assert_int_equal(wire_ctl_decode_reply(rep->op, expect, s, strlen(s), &b), 0);
    wctl_fast_off = false;
    assert_string_equal(s, slow);
    assert_int_equal(wire_ctl_decode_reply(rep->op, expect, s, strlen(s), &a), 0);
    assert_reply_eq(&a, &b);
    wire_ctl_reply_clear(&a);
    wire_ctl_reply_clear(&b);
    free(slow);
}

static void request_round_trip(const wire_ctl_request *req, const char *golden) {
    char *s = NULL;
    assert_int_equal(wire_ctl_encode_request(req, &s), 0);
    if (golden) assert_string_equal(s, golden);
    request_paths_agree(req, s);
    wire_ctl_request back;
    int rc = wire_ctl_decode_request(s, strlen(s), &back);
    if (rc) fail_msg("decode of %s failed: %s", s, ect_last_error());
    assert_request_eq(req, &back);
    char *again = NULL;
    assert_int_equal(wire_ctl_encode_request(&back, &again), 0);
    assert_string_equal(s, again);
    free(again);
    wire_ctl_request_clear(&back);
    free(s);
}

static void reply_round_trip(const wire_ctl_reply *rep, size_t expect, const char *golden) {
    char *s = NULL;
    int erc = wire_ctl_encode_reply(rep, &s);
    if (erc) fail_msg("encode: %s", ect_last_error());
    if (golden) assert_string_equal(s, golden);
    reply_paths_agree(rep, expect, s);
    wire_ctl_reply back;
    int rc = wire_ctl_decode_reply(rep->op, expect, s, strlen(s), &back);
    if (rc) fail_msg("decode of %s failed: %s", s, ect_last_error());
    assert_reply_eq(rep, &back);
    char *again = NULL;
    assert_int_equal(wire_ctl_encode_reply(&back, &again), 0);
    assert_string_equal(s, again);
    free(again);
    wire_ctl_reply_clear(&back);
    free(s);
}

/* The fast event encoder (readiness events) writes jansson's bytes. */
static void event_paths_agree(const wire_event *ev, const char *s) {
    char *slow = NULL;
    wctl_fast_off = true;
    assert_int_equal(wire_ctl_encode_event(ev, &slow), 0);
    wctl_fast_off = false;
    assert_string_equal(s, slow);
    free(slow);
}

static void event_round_trip(const wire_event *ev, const char *golden) {
    char *s = NULL;
    assert_int_equal(wire_ctl_encode_event(ev, &s), 0);
    if (golden) assert_string_equal(s, golden);
    event_paths_agree(ev, s);
    wire_event back;
    int rc = wire_ctl_decode_event(s, strlen(s), &back);
    if (rc) fail_msg("decode of %s failed: %s", s, ect_last_error());
    assert_event_eq(ev, &back);
    wire_event_clear(&back);
    free(s);
}

/* ------------------------------------------------------------ goldens */

/* These strings are the examples in docs/PROTOCOL.md (push section). */
#define G_RESERVE                                                                                  \
    "{\"op\":\"reserve\",\"transfer_id\":\"req-7-img0\",\"mm_hash\":\"9f86d081884c7d65\","         \
    "\"nbytes\":4718592,\"shape\":[576,4096],\"dtype\":\"bfloat16\"}"
#define G_RESERVE_BATCH                                                                            \
    "{\"op\":\"reserve_batch\",\"items\":[{\"transfer_id\":\"t1\",\"mm_hash\":\"h1\","             \
    "\"nbytes\":8,\"shape\":[2,2],\"dtype\":\"torch.float16\"},{\"transfer_id\":\"t2\","           \
    "\"mm_hash\":\"h2\",\"nbytes\":3,\"shape\":[3],\"dtype\":\"float8_e4m3fn\"}]}"
/* A spare range granted ahead (docs/PROTOCOL.md, extension) */
#define G_RESERVE_BATCH_SPARE                                                                      \
    "{\"op\":\"reserve_batch\",\"items\":[{\"transfer_id\":\"t1\",\"mm_hash\":\"h1\",\"nbytes\":"  \
    "65536,"                                                                                       \
    "\"shape\":[32768],\"dtype\":\"bfloat16\"}],\"ect_shm_id\":\"00c0ffee12345678\",\"ect_"        \
    "spare\":65536}"
#define G_R_RESERVE_BATCH_SPARE                                                                    \
    "{\"ok\":true,\"result\":{\"items\":[{\"ok\":true,\"result\":{\"reservation_id\":\"r1\","      \
    "\"dst_session\":\"10.0.0.2:15001\",\"dst_ptr\":140737488355328,\"nbytes\":65536,\"write\":"   \
    "true,"                                                                                        \
    "\"ready\":false,\"cached\":false,\"transport\":\"shm\",\"dst_key\":\"5f3c9a1b2d4e6f70\"}}]}," \
    "\"ect_spare\":{\"reservation_id\":\"s1\",\"dst_session\":\"10.0.0.2:15001\","                 \
    "\"dst_ptr\":140737488420864,\"nbytes\":65536,\"transport\":\"shm\",\"dst_key\":"              \
    "\"0a1b2c3d4e5f6071\"}}"
#define G_PUT                                                                                      \
    "{\"op\":\"ect_put\",\"transfer_id\":\"t2\",\"mm_hash\":\"h2\",\"nbytes\":65536,\"shape\":["   \
    "32768],"                                                                                      \
    "\"dtype\":\"bfloat16\",\"reservation_id\":\"s1\",\"ect_shm_id\":\"00c0ffee12345678\","        \
    "\"ect_spare\":65536}"
#define G_R_PUT                                                                                    \
    "{\"ok\":true,\"result\":{\"completed\":true,\"became_ready\":true},\"ect_spare\":{"           \
    "\"reservation_id\":\"s2\",\"dst_session\":\"10.0.0.2:15001\",\"dst_ptr\":140737488355328,"    \
    "\"nbytes\":65536,\"transport\":\"shm\",\"dst_key\":\"1b2c3d4e5f607182\"}}"
#define G_R_PUT_NO_SPARE "{\"ok\":true,\"result\":{\"completed\":true,\"became_ready\":true}}"
#define G_R_PUT_REFUSED                                                                            \
    "{\"ok\":false,\"error\":\"ect_put: no spare 's1' (expired, freed or never granted)\"}"
#define G_STATUS "{\"op\":\"status\",\"transfer_id\":\"t1\"}"
#define G_EVENT_PORT "{\"op\":\"event_port\"}"
#define G_PEERS "{\"op\":\"peers\"}"
#define G_COMPLETE "{\"op\":\"complete\",\"transfer_id\":\"t1\",\"reservation_id\":\"r1\"}"
#define G_COMPLETE_BATCH                                                                           \
    "{\"op\":\"complete_batch\",\"items\":[{\"transfer_id\":\"t1\",\"reservation_id\":\"r1\"},"    \
    "{\"transfer_id\":\"t2\",\"reservation_id\":\"r2\"}]}"
#define G_CANCEL                                                                                   \
    "{\"op\":\"cancel\",\"transfer_id\":\"t1\",\"reservation_id\":\"r1\",\"abandon\":true,"        \
    "\"refresh\":false}"

#define G_R_RESERVE                                                                                \
    "{\"ok\":true,\"result\":{\"reservation_id\":\"r1\",\"dst_session\":\"10.0.0.2:15001\","       \
    "\"dst_ptr\":140737488355328,\"nbytes\":4718592,\"write\":true,\"ready\":false,"               \
    "\"cached\":false,\"transport\":\"tcp\",\"dst_key\":\"5f3c9a1b2d4e6f70\"}}"
#define G_R_RESERVE_CANCELLED                                                                      \
    "{\"ok\":true,\"result\":{\"reservation_id\":\"\",\"dst_session\":\"\",\"dst_ptr\":0,"         \
    "\"write\":false,\"ready\":false,\"cancelled\":true}}"
#define G_R_RESERVE_REFUSED                                                                        \
    "{\"ok\":true,\"result\":{\"reservation_id\":\"\",\"dst_session\":\"\",\"dst_ptr\":0,"         \
    "\"write\":false,\"ready\":false,\"cancelled\":true,\"reason\":\"transfer_id 'req-7-img0' "    \
    "was already delivered (the engine took and released it) 12000 ms ago; ids are kept "          \
    "300000 ms (TTL): use a new one\"}}"
#define G_R_RESERVE_BATCH                                                                          \
    "{\"ok\":true,\"result\":{\"items\":[{\"ok\":true,\"result\":{\"reservation_id\":\"r1\","      \
    "\"dst_session\":\"10.0.0.2:15001\",\"dst_ptr\":4096,\"nbytes\":8,\"write\":false,"            \
    "\"ready\":true,\"cached\":true}},{\"ok\":false,\"error\":\"EC consumer buffer pool is "       \
    "full\"}]}}"
#define G_R_STATUS                                                                                 \
    "{\"ok\":true,\"result\":{\"mm_hash\":\"h1\",\"ready\":true,\"reservation_id\":\"r1\","        \
    "\"nbytes\":8,\"shape\":[2,2],\"dtype\":\"float16\"}}"
#define G_R_STATUS_NULL "{\"ok\":true,\"result\":null}"
#define G_R_EVENT_PORT "{\"ok\":true,\"result\":40123}"
#define G_R_EVENT_PORT_SECRET                                                                      \
    "{\"ok\":true,\"result\":40123,\"event_secret\":\"0f1e2d3c4b5a69788796a5b4c3d2e1f0\"}"
#define G_R_PEERS "{\"ok\":true,\"result\":{\"ports\":[14579,14580]}}"
#define G_R_PEERS_TRANSPORT                                                                        \
    "{\"ok\":true,\"result\":{\"ports\":[14579,14580],\"transport\":\"shm\"}}"
#define G_R_COMPLETE "{\"ok\":true,\"result\":{\"completed\":true,\"became_ready\":true}}"
#define G_R_COMPLETE_BATCH                                                                         \
    "{\"ok\":true,\"result\":{\"items\":[{\"completed\":true,\"became_ready\":true},"              \
    "{\"completed\":false,\"became_ready\":false}]}}"
#define G_R_CANCEL "{\"ok\":true,\"result\":{\"cancelled\":true}}"
#define G_R_ERROR "{\"ok\":false,\"error\":\"conflicting reservation for transfer_id\"}"
#define G_R_MALFORMED "{\"ok\":false,\"error\":\"malformed control request\"}"
#define G_R_UNKNOWN_OP "{\"ok\":false,\"error\":\"unknown control op: 'x'\"}"

#define G_EV_READY                                                                                 \
    "{\"transfer_id\":\"t1\",\"mm_hash\":\"h1\",\"ready\":true,\"reservation_id\":\"r1\","         \
    "\"nbytes\":8,\"shape\":[2,2],\"dtype\":\"float16\",\"shard\":14579}"
#define G_EV_ABANDONED                                                                             \
    "{\"transfer_id\":\"t1\",\"mm_hash\":\"h1\",\"ready\":false,\"reservation_id\":\"r1\","        \
    "\"nbytes\":8,\"shape\":[2,2],\"dtype\":\"float16\",\"shard\":14579,\"abandoned\":true,"       \
    "\"error\":\"reservation abandoned by the producer\"}"

static const uint64_t shape_llava[] = {576, 4096};
static const uint64_t shape_2x2[] = {2, 2};
static const uint64_t shape_3[] = {3};

static void test_golden_requests(void **state) {
    (void)state;
    wire_ctl_request r;
    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_RESERVE;
    strcpy(r.u.reserve.transfer_id, "req-7-img0");
    strcpy(r.u.reserve.mm_hash, "9f86d081884c7d65");
    set_tensor(&r.u.reserve.tensor, "bfloat16", 4718592, 2, shape_llava);
    request_round_trip(&r, G_RESERVE);

    wire_reserve_item items[2];
    memset(items, 0, sizeof items);
    strcpy(items[0].req.transfer_id, "t1");
    strcpy(items[0].req.mm_hash, "h1");
    set_tensor(&items[0].req.tensor, "torch.float16", 8, 2, shape_2x2);
    strcpy(items[1].req.transfer_id, "t2");
    strcpy(items[1].req.mm_hash, "h2");
    set_tensor(&items[1].req.tensor, "float8_e4m3fn", 3, 1, shape_3);
    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_RESERVE_BATCH;
    r.u.reserve_batch.n = 2;
    r.u.reserve_batch.items = items;
    request_round_trip(&r, G_RESERVE_BATCH);

    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_STATUS;
    strcpy(r.u.status.transfer_id, "t1");
    request_round_trip(&r, G_STATUS);

    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_EVENT_PORT;
    request_round_trip(&r, G_EVENT_PORT);
    r.op = WIRE_OP_PEERS;
    request_round_trip(&r, G_PEERS);

    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_COMPLETE;
    strcpy(r.u.complete.transfer_id, "t1");
    strcpy(r.u.complete.reservation_id, "r1");
    request_round_trip(&r, G_COMPLETE);

    wire_complete_req citems[2] = {{"t1", "r1"}, {"t2", "r2"}};
    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_COMPLETE_BATCH;
    r.u.complete_batch.n = 2;
    r.u.complete_batch.items = citems;
    request_round_trip(&r, G_COMPLETE_BATCH);

    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_CANCEL;
    strcpy(r.u.cancel.transfer_id, "t1");
    strcpy(r.u.cancel.reservation_id, "r1");
    r.u.cancel.abandon = true;
    request_round_trip(&r, G_CANCEL);
}

static void test_golden_replies(void **state) {
    (void)state;
    wire_ctl_reply r;
    char key[] = "5f3c9a1b2d4e6f70";

    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_RESERVE;
    r.ok = true;
    strcpy(r.u.reserve.reservation_id, "r1");
    strcpy(r.u.reserve.dst_session, "10.0.0.2:15001");
    r.u.reserve.dst_ptr = 140737488355328ull;
    r.u.reserve.nbytes = 4718592;
    r.u.reserve.write = true;
    strcpy(r.u.reserve.transport, "tcp");
    r.u.reserve.dst_key = key;
    reply_round_trip(&r, SIZE_MAX, G_R_RESERVE);

    /* The cancelled form ignores every other field. */
    r.u.reserve.cancelled = true;
    char *s;
    assert_int_equal(wire_ctl_encode_reply(&r, &s), 0);
    assert_string_equal(s, G_R_RESERVE_CANCELLED);
    free(s);
    memset(&r.u.reserve, 0, sizeof r.u.reserve);
    r.u.reserve.cancelled = true;
    reply_round_trip(&r, SIZE_MAX, G_R_RESERVE_CANCELLED);
    snprintf(r.u.reserve.reason, sizeof r.u.reserve.reason,
             "transfer_id 'req-7-img0' was already delivered (the engine took and released it) "
             "12000 ms ago; ids are kept 300000 ms (TTL): use a new one");
    reply_round_trip(&r, SIZE_MAX, G_R_RESERVE_REFUSED);
    /* an upstream producer reads the cancelled form and ignores the reason;
     * a long reason is cut, never refused */
    wire_ctl_reply d;
    char big[600];
    snprintf(big, sizeof big,
             "{\"ok\":true,\"result\":{\"reservation_id\":\"\",\"dst_session\":"
             "\"\",\"dst_ptr\":0,\"write\":false,\"ready\":false,\"cancelled\":true,"
             "\"reason\":\"%0400d\"}}",
             7);
    assert_int_equal(wire_ctl_decode_reply(WIRE_OP_RESERVE, SIZE_MAX, big, strlen(big), &d), 0);
    assert_true(d.u.reserve.cancelled);
    assert_int_equal(strlen(d.u.reserve.reason), WIRE_REASON_MAX);
    wire_ctl_reply_clear(&d);

    wire_reserve_outcome outs[2];
    memset(outs, 0, sizeof outs);
    outs[0].ok = true;
    strcpy(outs[0].result.reservation_id, "r1");
    strcpy(outs[0].result.dst_session, "10.0.0.2:15001");
    outs[0].result.dst_ptr = 4096;
    outs[0].result.nbytes = 8;
    outs[0].result.ready = true;
    outs[0].result.cached = true;
    char full[] = "EC consumer buffer pool is full";
    outs[1].error = full;
    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_RESERVE_BATCH;
    r.ok = true;
    r.u.reserve_batch.n = 2;
    r.u.reserve_batch.items = outs;
    reply_round_trip(&r, 2, G_R_RESERVE_BATCH);

    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_STATUS;
    r.ok = true;
    r.u.status.found = true;
    strcpy(r.u.status.mm_hash, "h1");
    r.u.status.ready = true;
    strcpy(r.u.status.reservation_id, "r1");
    set_tensor(&r.u.status.tensor, "float16", 8, 2, shape_2x2);
    reply_round_trip(&r, SIZE_MAX, G_R_STATUS);
    memset(&r.u.status, 0, sizeof r.u.status);
    reply_round_trip(&r, SIZE_MAX, G_R_STATUS_NULL);

    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_EVENT_PORT;
    r.ok = true;
    r.u.event_port = 40123;
    reply_round_trip(&r, SIZE_MAX, G_R_EVENT_PORT);
    /* the event_secret extension (docs/PROTOCOL.md "Event-port secret") */
    strcpy(r.event_secret, "0f1e2d3c4b5a69788796a5b4c3d2e1f0");
    reply_round_trip(&r, SIZE_MAX, G_R_EVENT_PORT_SECRET);
    {
        wire_ctl_reply b;
        assert_int_equal(wire_ctl_decode_reply(WIRE_OP_EVENT_PORT, SIZE_MAX, G_R_EVENT_PORT_SECRET,
                                               strlen(G_R_EVENT_PORT_SECRET), &b),
                         0);
        assert_string_equal(b.event_secret, "0f1e2d3c4b5a69788796a5b4c3d2e1f0");
        wire_ctl_reply_clear(&b);
        assert_int_equal(wire_ctl_decode_reply(WIRE_OP_EVENT_PORT, SIZE_MAX, G_R_EVENT_PORT,
                                               strlen(G_R_EVENT_PORT), &b),
                         0);
        assert_string_equal(b.event_secret, ""); /* upstream's reply: no secret */
        wire_ctl_reply_clear(&b);
        const char *bad = "{\"ok\":true,\"result\":40123,\"event_secret\":7}";
        assert_err(wire_ctl_decode_reply(WIRE_OP_EVENT_PORT, SIZE_MAX, bad, strlen(bad), &b),
                   ECT_EINVAL, "event_secret");
        char longer[200];
        snprintf(longer, sizeof longer, "{\"ok\":true,\"result\":1,\"event_secret\":\"%065d\"}", 0);
        assert_err(wire_ctl_decode_reply(WIRE_OP_EVENT_PORT, SIZE_MAX, longer, strlen(longer), &b),
                   ECT_EINVAL, "event_secret");
        /* only event_port's reply carries it: another op's encoder leaves it out */
        wire_ctl_reply c = {.op = WIRE_OP_CANCEL, .ok = true};
        strcpy(c.event_secret, "x");
        char *txt = NULL;
        assert_int_equal(wire_ctl_encode_reply(&c, &txt), 0);
        assert_null(strstr(txt, "event_secret"));
        free(txt);
    }
    memset(r.event_secret, 0, sizeof r.event_secret);

    uint16_t ports[] = {14579, 14580};
    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_PEERS;
    r.ok = true;
    r.u.peers.n = 2;
    r.u.peers.ports = ports;
    reply_round_trip(&r, SIZE_MAX, G_R_PEERS);
    strcpy(r.u.peers.transport, "shm");
    reply_round_trip(&r, SIZE_MAX, G_R_PEERS_TRANSPORT);

    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_COMPLETE;
    r.ok = true;
    r.u.complete.completed = true;
    r.u.complete.became_ready = true;
    reply_round_trip(&r, SIZE_MAX, G_R_COMPLETE);

    wire_complete_result cres[2] = {{true, true}, {false, false}};
    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_COMPLETE_BATCH;
    r.ok = true;
    r.u.complete_batch.n = 2;
    r.u.complete_batch.items = cres;
    reply_round_trip(&r, 2, G_R_COMPLETE_BATCH);

    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_CANCEL;
    r.ok = true;
    r.u.cancelled = true;
    reply_round_trip(&r, SIZE_MAX, G_R_CANCEL);

    /* The error reply is the same for every op. */
    char conflict[] = "conflicting reservation for transfer_id";
    for (int op = WIRE_OP_RESERVE; op <= WIRE_OP_CANCEL; op++) {
        memset(&r, 0, sizeof r);
        r.op = (wire_ctl_op)op;
        r.error = conflict;
        reply_round_trip(&r, 3, G_R_ERROR);
    }
    assert_int_equal(wire_ctl_encode_error(conflict, &s), 0);
    assert_string_equal(s, G_R_ERROR);
    free(s);
}

static void test_golden_events(void **state) {
    (void)state;
    wire_event ev;
    memset(&ev, 0, sizeof ev);
    strcpy(ev.transfer_id, "t1");
    strcpy(ev.mm_hash, "h1");
    ev.ready = true;
    strcpy(ev.reservation_id, "r1");
    set_tensor(&ev.tensor, "float16", 8, 2, shape_2x2);
    ev.shard = 14579;
    event_round_trip(&ev, G_EV_READY);
    char why[] = "reservation abandoned by the producer";
    ev.ready = false;
    ev.error = why;
    event_round_trip(&ev, G_EV_ABANDONED);

    /* Upstream's form of an abandoned event: ready false, no extension keys. */
    const char *up = "{\"transfer_id\":\"t1\",\"mm_hash\":\"h1\",\"ready\":false,"
                     "\"reservation_id\":\"r1\",\"nbytes\":8,\"shape\":[2,2],"
                     "\"dtype\":\"float16\",\"shard\":14579}";
    wire_event back;
    assert_int_equal(wire_ctl_decode_event(up, strlen(up), &back), 0);
    assert_false(back.ready);
    assert_null(back.error);
    wire_event_clear(&back);
}

/* The readiness event as the encoder writes it decodes on the fast path, to
 * what jansson decodes; every other form (abandoned, another order, spacing
 * with other keys, a shard or tensor the decoder refuses) is left to jansson,
 * whose result and error text stay as they were. */
static void test_fast_event_decoder(void **state) {
    (void)state;
    wire_event f, s;
    const char *fast[] = {G_EV_READY,
                          " { \"transfer_id\" : \"t1\", \"mm_hash\":\"h1\",\"ready\":true,"
                          "\"reservation_id\":\"\",\"nbytes\":8,\"shape\":[ 2 , 2 ],"
                          "\"dtype\":\"float16\",\"shard\":65535 } "};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(wctl_fast_decode_event(fast[i], strlen(fast[i]), &f), 0);
        wctl_fast_off = true;
        assert_int_equal(wire_ctl_decode_event(fast[i], strlen(fast[i]), &s), 0);
        wctl_fast_off = false;
        assert_event_eq(&f, &s);
        wire_event_clear(&f);
        wire_event_clear(&s);
    }
    const char *slow[] = {
        G_EV_ABANDONED,
        /* upstream's order: shard first */
        "{\"shard\":14579,\"transfer_id\":\"t1\",\"mm_hash\":\"h1\",\"ready\":true,"
        "\"reservation_id\":\"r1\",\"nbytes\":8,\"shape\":[2,2],\"dtype\":\"float16\"}",
        /* an extra key after shard */
        "{\"transfer_id\":\"t1\",\"mm_hash\":\"h1\",\"ready\":true,\"reservation_id\":\"r1\","
        "\"nbytes\":8,\"shape\":[2,2],\"dtype\":\"float16\",\"shard\":1,\"abandoned\":false}",
        /* refused by jansson's path, with its words */
        "{\"transfer_id\":\"t1\",\"mm_hash\":\"h1\",\"ready\":true,\"reservation_id\":\"r1\","
        "\"nbytes\":8,\"shape\":[2,2],\"dtype\":\"float16\",\"shard\":65536}",
        "{\"transfer_id\":\"t1\",\"mm_hash\":\"h1\",\"ready\":true,\"reservation_id\":\"r1\","
        "\"nbytes\":9,\"shape\":[2,2],\"dtype\":\"float16\",\"shard\":1}",
        "{\"transfer_id\":\"\",\"mm_hash\":\"h1\",\"ready\":true,\"reservation_id\":\"r1\","
        "\"nbytes\":8,\"shape\":[2,2],\"dtype\":\"float16\",\"shard\":1}",
        "{\"transfer_id\":\"t\\u0031\",\"mm_hash\":\"h1\",\"ready\":true,\"reservation_id\":"
        "\"r1\",\"nbytes\":8,\"shape\":[2,2],\"dtype\":\"float16\",\"shard\":1}",
    };
    const char *errs[] = {NULL, NULL, NULL, "outside 1..65535", "nbytes", "transfer_id", NULL};
    for (size_t i = 0; i < sizeof slow / sizeof *slow; i++) {
        assert_int_equal(wctl_fast_decode_event(slow[i], strlen(slow[i]), &f), WCTL_FALLBACK);
        int rf = wire_ctl_decode_event(slow[i], strlen(slow[i]), &f);
        if (errs[i]) {
            assert_err(rf, ECT_EINVAL, errs[i]);
            continue;
        }
        assert_int_equal(rf, 0);
        wctl_fast_off = true;
        assert_int_equal(wire_ctl_decode_event(slow[i], strlen(slow[i]), &s), 0);
        wctl_fast_off = false;
        assert_event_eq(&f, &s);
        wire_event_clear(&f);
        wire_event_clear(&s);
    }
}

/* An event_port reply f (decoded already) equals jansson's decode of txt;
 * clears f. */
static void event_port_as_jansson(const char *txt, wire_ctl_reply *f) {
    wire_ctl_reply s;
    wctl_fast_off = true;
    assert_int_equal(wire_ctl_decode_reply(WIRE_OP_EVENT_PORT, SIZE_MAX, txt, strlen(txt), &s), 0);
    wctl_fast_off = false;
    assert_reply_eq(f, &s);
    assert_string_equal(f->event_secret, s.event_secret);
    wire_ctl_reply_clear(f);
    wire_ctl_reply_clear(&s);
}

/* event_port (the exchange ect_push_ping times): the request and the reply
 * as the encoders write them, with any spacing, decode on the fast path to
 * what jansson decodes; every other form (a bad port, an escaped or long
 * secret, another key, a refusal) is left to jansson, whose result and error
 * text stay as they were. */
static void test_fast_event_port(void **state) {
    (void)state;
    wire_ctl_request q;
    const char *reqs[] = {G_EVENT_PORT, " { \"op\" : \"event_port\" } "};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(wctl_fast_decode_request(reqs[i], strlen(reqs[i]), &q), 0);
        assert_int_equal(q.op, WIRE_OP_EVENT_PORT);
    }
    const char *slow_reqs[] = {"{\"op\":\"event_port\",\"x\":1}", "{\"op\":\"event_\\u0070ort\"}"};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(wctl_fast_decode_request(slow_reqs[i], strlen(slow_reqs[i]), &q),
                         WCTL_FALLBACK);
        assert_int_equal(wire_ctl_decode_request(slow_reqs[i], strlen(slow_reqs[i]), &q), 0);
        assert_int_equal(q.op, WIRE_OP_EVENT_PORT);
    }
    wire_ctl_reply f;
    const char *fast[] = {G_R_EVENT_PORT, G_R_EVENT_PORT_SECRET,
                          " {\"ok\" : true , \"result\" : 1 , \"event_secret\" : \"\" } ",
                          "{\"ok\":true,\"result\":65535}"};
    for (size_t i = 0; i < sizeof fast / sizeof *fast; i++) {
        assert_int_equal(
            wctl_fast_decode_reply(WIRE_OP_EVENT_PORT, SIZE_MAX, fast[i], strlen(fast[i]), &f), 0);
        event_port_as_jansson(fast[i], &f);
    }
    const char *slow[] = {
        "{\"ok\":true,\"result\":0}",
        "{\"ok\":true,\"result\":65536}",
        "{\"ok\":true,\"result\":40123,\"event_secret\":\"a\\u0062\"}",
        "{\"ok\":true,\"result\":40123,\"event_secret\":"
        "\"0123456789012345678901234567890123456789012345678901234567890123456789\"}",
        "{\"ok\":true,\"result\":40123,\"other\":1}",
        "{\"result\":40123,\"ok\":true}",
        "{\"ok\":false,\"error\":\"no\"}",
    };
    const char *errs[] = {
        "outside 1..65535", "outside 1..65535", NULL, "event_secret", NULL, NULL, NULL};
    for (size_t i = 0; i < sizeof slow / sizeof *slow; i++) {
        assert_int_equal(
            wctl_fast_decode_reply(WIRE_OP_EVENT_PORT, SIZE_MAX, slow[i], strlen(slow[i]), &f),
            WCTL_FALLBACK);
        int rf = wire_ctl_decode_reply(WIRE_OP_EVENT_PORT, SIZE_MAX, slow[i], strlen(slow[i]), &f);
        if (errs[i]) {
            assert_err(rf, ECT_EINVAL, errs[i]);
            continue;
        }
        assert_int_equal(rf, 0);
        event_port_as_jansson(slow[i], &f);
    }
}

/* The canned replies of a server whose request did not decode. */
static void test_decode_failure_replies(void **state) {
    (void)state;
    wire_ctl_request req;
    char *s;
    const char *bad = "{\"op\":";
    int rc = wire_ctl_decode_request(bad, strlen(bad), &req);
    assert_err(rc, ECT_EPROTO, "not JSON");
    assert_int_equal(wire_ctl_encode_decode_failure(rc, &s), 0);
    assert_string_equal(s, G_R_MALFORMED);
    free(s);

    const char *x = "{\"op\":\"x\"}";
    rc = wire_ctl_decode_request(x, strlen(x), &req);
    assert_int_equal(rc, ECT_ENOTSUP);
    assert_string_equal(ect_last_error(), "unknown control op: 'x'");
    assert_int_equal(wire_ctl_encode_decode_failure(rc, &s), 0);
    assert_string_equal(s, G_R_UNKNOWN_OP);
    free(s);

    /* Found by fuzz_control_msg: a path naming a key with invalid UTF-8 in the
     * error text. The reply must still be valid JSON, the bad bytes as '?'. */
    const char bad_key[] = "{\"op\":\"peers\",\"k\xff\xc3\":[99999999999999999999]}";
    rc = wire_ctl_decode_request(bad_key, sizeof bad_key - 1, &req);
    assert_err(rc, ECT_EINVAL, "integer out of range");
    assert_int_equal(wire_ctl_encode_decode_failure(rc, &s), 0);
    assert_string_equal(s, "{\"ok\":false,\"error\":\"k??[0]: integer out of range (beyond "
                           "64-bit signed)\"}");
    free(s);

    const char *field = "{\"op\":\"status\",\"transfer_id\":7}";
    rc = wire_ctl_decode_request(field, strlen(field), &req);
    assert_err(rc, ECT_EINVAL, "transfer_id: expected a string, got integer");
    assert_int_equal(wire_ctl_encode_decode_failure(rc, &s), 0);
    assert_string_equal(s, "{\"ok\":false,\"error\":\"transfer_id: expected a string, got "
                           "integer\"}");
    free(s);
}

/* docs/PROTOCOL.md shows these exact strings as its push examples. */
static void test_goldens_are_the_documented_examples(void **state) {
    (void)state;
    static const char *const goldens[] = {
        G_RESERVE,
        G_RESERVE_BATCH,
        G_STATUS,
        G_EVENT_PORT,
        G_PEERS,
        G_COMPLETE,
        G_COMPLETE_BATCH,
        G_CANCEL,
        G_R_RESERVE,
        G_R_RESERVE_CANCELLED,
        G_R_RESERVE_REFUSED,
        G_R_RESERVE_BATCH,
        G_R_STATUS,
        G_R_STATUS_NULL,
        G_R_EVENT_PORT,
        G_R_EVENT_PORT_SECRET,
        G_R_PEERS,
        G_R_PEERS_TRANSPORT,
        G_R_COMPLETE,
        G_R_COMPLETE_BATCH,
        G_R_CANCEL,
        G_R_ERROR,
        G_R_MALFORMED,
        G_R_UNKNOWN_OP,
        G_EV_READY,
        G_EV_ABANDONED,
        G_RESERVE_BATCH_SPARE,
        G_R_RESERVE_BATCH_SPARE,
        G_PUT,
        G_R_PUT,
        G_R_PUT_REFUSED,
    };
    const char *doc = test_protocol_md();
    /* Each example is a line of its own in a code block. */
    for (size_t i = 0; i < ECT_ARRAY_LEN(goldens); i++) {
        char line[1024];
        snprintf(line, sizeof line, "\n%s\n", goldens[i]);
        if (!strstr(doc, line)) fail_msg("docs/PROTOCOL.md lacks the example %s", goldens[i]);
    }
}

/* The spare extension's documented frames: the fast path takes each (no
 * jansson on a lone step's one exchange), both paths decode them alike, and
 * encoding what they decode gives the same bytes back. */
static void test_spare_frames(void **state) {
    (void)state;
    static const char *const reqs[] = {G_RESERVE_BATCH_SPARE, G_PUT};
    for (size_t i = 0; i < ECT_ARRAY_LEN(reqs); i++) {
        wire_ctl_request q;
        if (wctl_fast_decode_request(reqs[i], strlen(reqs[i]), &q) != 0)
            fail_msg("fast path refused %s", reqs[i]);
        assert_true(q.spare == 65536 && q.shm_id == 0x00c0ffee12345678u);
        request_round_trip(&q, reqs[i]);
        wire_ctl_request_clear(&q);
    }
    static const struct {
        wire_ctl_op op;
        const char *s;
        bool spare;
    } reps[] = {{WIRE_OP_RESERVE_BATCH, G_R_RESERVE_BATCH_SPARE, true},
                {WIRE_OP_ECT_PUT, G_R_PUT, true},
                {WIRE_OP_ECT_PUT, G_R_PUT_NO_SPARE, false}};
    for (size_t i = 0; i < ECT_ARRAY_LEN(reps); i++) {
        wire_ctl_reply r;
        if (wctl_fast_decode_reply(reps[i].op, 1, reps[i].s, strlen(reps[i].s), &r) != 0)
            fail_msg("fast path refused %s", reps[i].s);
        assert_int_equal(r.has_spare, reps[i].spare);
        if (r.has_spare) assert_int_equal(r.spare.nbytes, 65536);
        reply_round_trip(&r, 1, reps[i].s);
        wire_ctl_reply_clear(&r);
    }
    wire_ctl_reply r;
    assert_int_equal(
        wire_ctl_decode_reply(WIRE_OP_ECT_PUT, 1, G_R_PUT_REFUSED, strlen(G_R_PUT_REFUSED), &r), 0);
    assert_false(r.ok);
    wire_ctl_reply_clear(&r);
    /* a spare object missing a key, or of the wrong type: a bad reply */
    static const char *const bad[] = {
        "{\"ok\":true,\"result\":{\"completed\":true,\"became_ready\":true},\"ect_spare\":5}",
        "{\"ok\":true,\"result\":{\"completed\":true,\"became_ready\":true},\"ect_spare\":{"
        "\"reservation_id\":\"s\",\"dst_session\":\"h:1\",\"dst_ptr\":1}}",
        "{\"ok\":true,\"result\":{\"completed\":true,\"became_ready\":true},\"ect_spare\":{"
        "\"reservation_id\":\"\",\"dst_session\":\"h:1\",\"dst_ptr\":1,\"nbytes\":2}}",
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(bad); i++)
        assert_int_equal(wire_ctl_decode_reply(WIRE_OP_ECT_PUT, 1, bad[i], strlen(bad[i]), &r),
                         ECT_EINVAL);
    /* an ect_put without the spare's id fails the frame, naming it */
    const char *noid = "{\"op\":\"ect_put\",\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":2,"
                       "\"shape\":[1],\"dtype\":\"bfloat16\"}";
    wire_ctl_request q;
    assert_int_equal(wire_ctl_decode_request(noid, strlen(noid), &q), ECT_EINVAL);
    assert_non_null(strstr(ect_last_error(), "reservation_id"));
}

/* ---------------------------------------------------- random round trips */

static void rand_str(uint64_t *st, char *dst, size_t max, bool nonempty) {
    static const char *const pieces[] = {"a",
                                         "Z",
                                         "0",
                                         "-",
                                         "_",
                                         ":",
                                         "/",
                                         " ",
                                         "\"",
                                         "\\",
                                         "\n",
                                         "\t",
                                         "\x01",
                                         "\x7f",
                                         "'",
                                         "\xc3\xa9",
                                         "\xe2\x82\xac",
                                         "\xf0\x9f\x98\x80"};
    size_t want = (size_t)(test_rand(st) % (max + 1));
    if (test_rand(st) % 4 == 0) want = max; /* hit the bound often */
    size_t n = 0;
    while (n < want) {
        const char *p = pieces[test_rand(st) % ECT_ARRAY_LEN(pieces)];
        size_t k = strlen(p);
        if (n + k > want) break;
        memcpy(dst + n, p, k);
        n += k;
    }
    if (nonempty && n == 0) dst[n++] = 'x';
    dst[n] = '\0';
}

static void rand_tensor(uint64_t *st, wire_tensor *t) {
    static const char *const dtypes[] = {"bfloat16",      "torch.bfloat16", "float16",
                                         "torch.float32", "float8_e5m2",    "torch.float8_e4m3fn",
                                         "int64",         "bool",           "complex128"};
    memset(t, 0, sizeof *t);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtypes[test_rand(st) % ECT_ARRAY_LEN(dtypes)]);
    t->ndim = (uint32_t)(test_rand(st) % (WIRE_MAX_NDIM + 1));
    for (uint32_t i = 0; i < t->ndim; i++) t->shape[i] = test_rand(st) % 17;
    if (t->ndim && test_rand(st) % 3 == 0) t->shape[0] = test_rand(st) % (1ull << 24);
    uint64_t n = 0;
    assert_int_equal(wire_shape_nbytes(t->dtype, t->shape, t->ndim, &n, "t"), 0);
    t->nbytes = n;
}

static void rand_reserve_result(uint64_t *st, wire_reserve_result *r, char *keybuf) {
    memset(r, 0, sizeof *r);
    if (test_rand(st) % 5 == 0) {
        r->cancelled = true;
        if (test_rand(st) & 1) rand_str(st, r->reason, WIRE_REASON_MAX, true);
        return;
    }
    rand_str(st, r->reservation_id, WIRE_ID_MAX, false);
    rand_str(st, r->dst_session, WIRE_SESSION_MAX, false);
    r->dst_ptr = test_rand(st) >> 1;
    r->nbytes = test_rand(st) >> 1;
    r->write = test_rand(st) & 1;
    r->ready = test_rand(st) & 1;
    r->cached = test_rand(st) & 1;
    if (test_rand(st) & 1) rand_str(st, r->transport, WIRE_TRANSPORT_MAX, true);
    if (test_rand(st) & 1) {
        rand_str(st, keybuf, 64, false);
        r->dst_key = keybuf;
    }
}

#define RT_BATCH 9

static void test_random_round_trips(void **state) {
    (void)state;
    uint64_t st = 42;
    static wire_reserve_item ritems[RT_BATCH];
    static wire_complete_req citems[RT_BATCH];
    static wire_reserve_outcome outs[RT_BATCH];
    static wire_complete_result cres[RT_BATCH];
    static wire_ready_item readys[RT_BATCH];
    static char keys[RT_BATCH][80], errs[RT_BATCH][80];
    uint16_t ports[RT_BATCH];
    for (int iter = 0; iter < 400; iter++) {
        wire_ctl_op op = (wire_ctl_op)(WIRE_OP_RESERVE + iter % WIRE_OP_LAST);
        size_t n = (size_t)(test_rand(&st) % RT_BATCH);
        wire_ctl_request q;
        memset(&q, 0, sizeof q);
        q.op = op;
        switch (op) {
        case WIRE_OP_RESERVE:
            rand_str(&st, q.u.reserve.transfer_id, WIRE_ID_MAX, true);
            rand_str(&st, q.u.reserve.mm_hash, WIRE_ID_MAX, true);
            rand_tensor(&st, &q.u.reserve.tensor);
            break;
        case WIRE_OP_RESERVE_BATCH:
            memset(ritems, 0, sizeof ritems);
            for (size_t i = 0; i < n; i++) {
                rand_str(&st, ritems[i].req.transfer_id, WIRE_ID_MAX, true);
                rand_str(&st, ritems[i].req.mm_hash, WIRE_ID_MAX, true);
                rand_tensor(&st, &ritems[i].req.tensor);
            }
            q.u.reserve_batch.n = n;
            q.u.reserve_batch.items = ritems;
            break;
        case WIRE_OP_STATUS: rand_str(&st, q.u.status.transfer_id, WIRE_ID_MAX, true); break;
        case WIRE_OP_COMPLETE:
            rand_str(&st, q.u.complete.transfer_id, WIRE_ID_MAX, true);
            rand_str(&st, q.u.complete.reservation_id, WIRE_ID_MAX, false);
            break;
        case WIRE_OP_COMPLETE_BATCH:
            for (size_t i = 0; i < n; i++) {
                rand_str(&st, citems[i].transfer_id, WIRE_ID_MAX, true);
                rand_str(&st, citems[i].reservation_id, WIRE_ID_MAX, false);
            }
            q.u.complete_batch.n = n;
            q.u.complete_batch.items = citems;
            break;
        case WIRE_OP_CANCEL:
            rand_str(&st, q.u.cancel.transfer_id, WIRE_ID_MAX, true);
            rand_str(&st, q.u.cancel.reservation_id, WIRE_ID_MAX, false);
            q.u.cancel.abandon = test_rand(&st) & 1;
            q.u.cancel.refresh = test_rand(&st) & 1;
            break;
        case WIRE_OP_ECT_PUT:
            rand_str(&st, q.u.put.item.transfer_id, WIRE_ID_MAX, true);
            rand_str(&st, q.u.put.item.mm_hash, WIRE_ID_MAX, true);
            rand_tensor(&st, &q.u.put.item.tensor);
            rand_str(&st, q.u.put.spare_id, WIRE_ID_MAX, true);
            break;
        case WIRE_OP_ECT_READY:
            q.u.ready.after = test_rand(&st) >> 1;
            q.u.ready.max = (uint32_t)(1 + test_rand(&st) % WIRE_BATCH_MAX);
            if (test_rand(&st) & 1) q.u.ready.age_ms = test_rand(&st) >> 1;
            break;
        default: break;
        }
        if (op == WIRE_OP_RESERVE || op == WIRE_OP_RESERVE_BATCH || op == WIRE_OP_ECT_PUT) {
            if (test_rand(&st) & 1) q.shm_id = 1 + test_rand(&st) % 1000000;
            if (test_rand(&st) & 1) q.spare = test_rand(&st) % 100000000;
        }
        request_round_trip(&q, NULL);

        wire_ctl_reply r;
        memset(&r, 0, sizeof r);
        r.op = op;
        r.ok = test_rand(&st) % 8 != 0;
        if (!r.ok) {
            rand_str(&st, errs[0], 70, false);
            r.error = errs[0];
        }
        switch (op) {
        case WIRE_OP_RESERVE: rand_reserve_result(&st, &r.u.reserve, keys[0]); break;
        case WIRE_OP_RESERVE_BATCH:
            for (size_t i = 0; i < n; i++) {
                memset(&outs[i], 0, sizeof outs[i]);
                outs[i].ok = test_rand(&st) & 1;
                if (outs[i].ok) {
                    rand_reserve_result(&st, &outs[i].result, keys[i]);
                } else {
                    rand_str(&st, errs[i], 70, false);
                    outs[i].error = errs[i];
                }
            }
            r.u.reserve_batch.n = n;
            r.u.reserve_batch.items = outs;
            break;
        case WIRE_OP_STATUS:
            r.u.status.found = test_rand(&st) & 1;
            if (r.u.status.found) {
                rand_str(&st, r.u.status.mm_hash, WIRE_ID_MAX, true);
                r.u.status.ready = test_rand(&st) & 1;
                rand_str(&st, r.u.status.reservation_id, WIRE_ID_MAX, false);
                rand_tensor(&st, &r.u.status.tensor);
            }
            break;
        case WIRE_OP_EVENT_PORT: r.u.event_port = (uint16_t)(1 + test_rand(&st) % 65535); break;
        case WIRE_OP_PEERS:
            for (size_t i = 0; i < n + 1; i++) ports[i] = (uint16_t)(1 + test_rand(&st) % 65535);
            r.u.peers.n = n + 1;
            r.u.peers.ports = ports;
            if (test_rand(&st) & 1) rand_str(&st, r.u.peers.transport, WIRE_TRANSPORT_MAX, true);
            break;
        case WIRE_OP_COMPLETE:
        case WIRE_OP_ECT_PUT:
            r.u.complete.completed = test_rand(&st) & 1;
            r.u.complete.became_ready = test_rand(&st) & 1;
            break;
        case WIRE_OP_COMPLETE_BATCH:
            for (size_t i = 0; i < n; i++) {
                cres[i].completed = test_rand(&st) & 1;
                cres[i].became_ready = test_rand(&st) & 1;
            }
            r.u.complete_batch.n = n;
            r.u.complete_batch.items = cres;
            break;
        case WIRE_OP_CANCEL: r.u.cancelled = test_rand(&st) & 1; break;
        case WIRE_OP_ECT_STATUS:
            r.u.ect_status = (char *)"{\"shard\":0,\"pool\":{\"capacity\":5},\"errors\":[]}";
            break;
        case WIRE_OP_ECT_READY: {
            uint64_t seq = 0;
            for (size_t i = 0; i < n; i++) {
                memset(&readys[i], 0, sizeof readys[i]);
                readys[i].seq = seq += 1 + test_rand(&st) % 1000;
                rand_str(&st, readys[i].transfer_id, WIRE_ID_MAX, true);
                rand_str(&st, readys[i].mm_hash, WIRE_ID_MAX, true);
                rand_str(&st, readys[i].reservation_id, WIRE_ID_MAX, false);
                rand_tensor(&st, &readys[i].tensor);
            }
            r.u.ready.n = n;
            r.u.ready.items = readys;
            r.u.ready.next = seq + test_rand(&st) % 3;
            r.u.ready.more = test_rand(&st) & 1;
            break;
        }
        }
        if ((op == WIRE_OP_RESERVE || op == WIRE_OP_RESERVE_BATCH || op == WIRE_OP_ECT_PUT) &&
            (test_rand(&st) & 1)) {
            r.has_spare = true;
            rand_str(&st, r.spare.reservation_id, WIRE_ID_MAX, true);
            rand_str(&st, r.spare.dst_session, WIRE_SESSION_MAX, false);
            r.spare.dst_ptr = test_rand(&st) >> 1;
            r.spare.nbytes = test_rand(&st) % 100000;
            r.spare.write = true;
            if (test_rand(&st) & 1) rand_str(&st, r.spare.transport, WIRE_TRANSPORT_MAX, true);
            if (test_rand(&st) & 1) {
                rand_str(&st, keys[RT_BATCH - 1], 70, false);
                r.spare.dst_key = keys[RT_BATCH - 1];
            }
        }
        reply_round_trip(&r, n, NULL);

        wire_event ev;
        memset(&ev, 0, sizeof ev);
        rand_str(&st, ev.transfer_id, WIRE_ID_MAX, true);
        rand_str(&st, ev.mm_hash, WIRE_ID_MAX, true);
        ev.ready = test_rand(&st) & 1;
        rand_str(&st, ev.reservation_id, WIRE_ID_MAX, false);
        rand_tensor(&st, &ev.tensor);
        ev.shard = (uint16_t)(1 + test_rand(&st) % 65535);
        if (!ev.ready && (test_rand(&st) & 1)) {
            rand_str(&st, errs[0], 70, false);
            ev.error = errs[0];
        }
        event_round_trip(&ev, NULL);
    }
}

/* The fast path takes the frames the push path sends (ours compact, an
 * upstream peer's with Python's ", " / ": " spacing) and hands anything else
 * to the jansson path, which still decodes it. */
static void test_fast_path_takes_the_hot_frames(void **state) {
    (void)state;
    static const char *const reqs[] = {
        G_RESERVE_BATCH,
        G_COMPLETE_BATCH,
        "{\"op\": \"reserve_batch\", \"items\": [{\"transfer_id\": \"t\xc3\xa9\", \"mm_hash\": "
        "\"h\", \"nbytes\": 6, \"shape\": [1, 3], \"dtype\": \"torch.bfloat16\"}]}",
        "{\"op\":\"complete_batch\",\"items\":[]}",
        "{\"op\": \"complete_batch\", \"items\": [{\"transfer_id\": \"t\", \"reservation_id\": "
        "\"\"}]}\n",
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(reqs); i++) {
        wire_ctl_request q;
        if (wctl_fast_decode_request(reqs[i], strlen(reqs[i]), &q) != 0)
            fail_msg("fast path refused %s", reqs[i]);
        wire_ctl_request_clear(&q);
    }
    static const char *const reps[] = {
        G_R_RESERVE_BATCH,
        G_R_COMPLETE_BATCH,
        "{\"ok\": true, \"result\": {\"items\": [{\"ok\": true, \"result\": {\"reservation_id\": "
        "\"r1\", \"dst_session\": \"h:1\", \"dst_ptr\": 0, \"nbytes\": 4, \"write\": true, "
        "\"ready\": false, \"cached\": false, \"transport\": \"tcp\", \"dst_key\": \"k\"}}, "
        "{\"ok\": true, \"result\": {\"reservation_id\": \"r2\", \"dst_session\": \"h:1\", "
        "\"dst_ptr\": 4, \"nbytes\": 4, \"write\": true, \"ready\": false, \"cached\": false, "
        "\"dst_key\": \"k2\"}}]}}",
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(reps); i++) {
        wire_ctl_op op =
            strstr(reps[i], "completed") ? WIRE_OP_COMPLETE_BATCH : WIRE_OP_RESERVE_BATCH;
        wire_ctl_reply r;
        if (wctl_fast_decode_reply(op, SIZE_MAX, reps[i], strlen(reps[i]), &r) != 0)
            fail_msg("fast path refused %s", reps[i]);
        wire_ctl_reply_clear(&r);
    }
    /* A readiness event is written by the fast path, an abandoned one by jansson. */
    {
        wire_event ev;
        memset(&ev, 0, sizeof ev);
        strcpy(ev.transfer_id, "t\xc3\xa9\"q");
        strcpy(ev.mm_hash, "h");
        strcpy(ev.reservation_id, "r");
        ev.ready = true;
        ev.tensor.nbytes = 6;
        ev.tensor.ndim = 2;
        ev.tensor.shape[0] = 1;
        ev.tensor.shape[1] = 3;
        strcpy(ev.tensor.dtype, "bfloat16");
        ev.shard = 15001;
        char *s = NULL;
        assert_int_equal(wctl_fast_encode_event(&ev, &s), 0);
        event_round_trip(&ev, s);
        free(s);
        ev.ready = false;
        assert_int_equal(wctl_fast_encode_event(&ev, &s), WCTL_FALLBACK);
        assert_null(s);
        ev.ready = true;
        ev.transfer_id[0] = '\x01'; /* a control character: jansson escapes it */
        assert_int_equal(wctl_fast_encode_event(&ev, &s), WCTL_FALLBACK);
        event_round_trip(&ev, NULL);
    }
    /* Handed on (an escape, another key order, an unknown key, a bad item, a
     * frame jansson refuses), and the public decoder answers as before. */
    static const struct {
        const char *s;
        int rc;
    } back[] = {
        {"{\"op\":\"complete_batch\",\"items\":[{\"transfer_id\":\"t\\u00e9\",\"reservation_id\":"
         "\"r\"}]}",
         0},
        {"{\"items\":[],\"op\":\"complete_batch\"}", 0},
        {"{\"op\":\"complete_batch\",\"items\":[],\"x\":1}", 0},
        {"{\"op\":\"reserve_batch\",\"items\":[{\"transfer_id\":\"t\",\"mm_hash\":\"h\","
         "\"nbytes\":7,\"shape\":[2,2],\"dtype\":\"float16\"}]}",
         0},
        {"{\"op\":\"complete_batch\",\"items\":[{\"transfer_id\":\"\",\"reservation_id\":\"r\"}]}",
         ECT_EINVAL},
        {"{\"op\":\"complete_batch\",\"items\":[{\"transfer_id\":\"t\",\"reservation_id\":\"r\"}]"
         "} x",
         ECT_EPROTO},
        {"{\"op\":\"complete_batch\",\"items\":[{\"transfer_id\":\"t\",\"reservation_id\":\"r\","
         "\"transfer_id\":\"u\"}]}",
         ECT_EPROTO},
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(back); i++) {
        wire_ctl_request q;
        assert_int_equal(wctl_fast_decode_request(back[i].s, strlen(back[i].s), &q), WCTL_FALLBACK);
        int rc = wire_ctl_decode_request(back[i].s, strlen(back[i].s), &q);
        if (rc != back[i].rc) fail_msg("%s: rc %d (%s)", back[i].s, rc, ect_last_error());
        wire_ctl_request_clear(&q);
    }
}

/* ------------------------------------------------------------ rejections */

static int dec_req(const char *s) {
    wire_ctl_request r;
    int rc = wire_ctl_decode_request(s, strlen(s), &r);
    wire_ctl_request_clear(&r);
    return rc;
}

static int dec_reply(wire_ctl_op op, size_t expect, const char *s) {
    wire_ctl_reply r;
    int rc = wire_ctl_decode_reply(op, expect, s, strlen(s), &r);
    wire_ctl_reply_clear(&r);
    return rc;
}

static int dec_event(const char *s) {
    wire_event e;
    int rc = wire_ctl_decode_event(s, strlen(s), &e);
    wire_event_clear(&e);
    return rc;
}

#define RSV(fields) "{\"op\":\"reserve\"," fields "}"
#define RSV_OK_TAIL "\"nbytes\":8,\"shape\":[2,2],\"dtype\":\"float16\""

static void test_reject_wrong_type(void **state) {
    (void)state;
    assert_err(dec_req(RSV("\"transfer_id\":1,\"mm_hash\":\"h\"," RSV_OK_TAIL)), ECT_EINVAL,
               "transfer_id: expected a string, got integer");
    assert_err(dec_req(RSV("\"transfer_id\":\"t\",\"mm_hash\":null," RSV_OK_TAIL)), ECT_EINVAL,
               "mm_hash: expected a string, got null");
    assert_err(dec_req(RSV("\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":\"8\","
                           "\"shape\":[2,2],\"dtype\":\"float16\"")),
               ECT_EINVAL, "nbytes: expected a non-negative integer, got string");
    assert_err(dec_req(RSV("\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":8,"
                           "\"shape\":{\"0\":2},\"dtype\":\"float16\"")),
               ECT_EINVAL, "shape: expected an array, got object");
    assert_err(dec_req(RSV("\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":8,"
                           "\"shape\":[2,2],\"dtype\":2")),
               ECT_EINVAL, "dtype: expected a string, got integer");
    assert_err(dec_req("{\"op\":\"cancel\",\"transfer_id\":\"t\",\"abandon\":1}"), ECT_EINVAL,
               "abandon: expected a boolean, got integer");
    assert_err(dec_req("{\"op\":\"complete_batch\",\"items\":{}}"), ECT_EINVAL,
               "items: expected an array, got object");
    assert_err(dec_req("{\"op\":\"complete_batch\",\"items\":[{\"transfer_id\":\"t\","
                       "\"reservation_id\":\"r\"},5]}"),
               ECT_EINVAL, "items[1]: expected an object, got integer");
    assert_err(dec_reply(WIRE_OP_CANCEL, SIZE_MAX, "{\"ok\":1,\"result\":{\"cancelled\":true}}"),
               ECT_EINVAL, "ok: expected a boolean, got integer");
    assert_err(dec_reply(WIRE_OP_CANCEL, SIZE_MAX, "{\"ok\":true,\"result\":[]}"), ECT_EINVAL,
               "result: expected an object, got array");
    assert_err(dec_reply(WIRE_OP_EVENT_PORT, SIZE_MAX, "{\"ok\":true,\"result\":\"4000\"}"),
               ECT_EINVAL, "result: expected a port number, got string");
    assert_err(dec_reply(WIRE_OP_RESERVE, SIZE_MAX,
                         "{\"ok\":true,\"result\":{\"reservation_id\":\"r\",\"dst_session\":"
                         "\"s\",\"dst_ptr\":0,\"nbytes\":0,\"write\":\"yes\",\"ready\":false,"
                         "\"cached\":false}}"),
               ECT_EINVAL, "result.write: expected a boolean, got string");
    assert_err(dec_event("{\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"ready\":true,"
                         "\"reservation_id\":\"r\"," RSV_OK_TAIL ",\"shard\":\"1\"}"),
               ECT_EINVAL, "shard: expected a port number, got string");
}

static void test_reject_missing_field(void **state) {
    (void)state;
    assert_err(dec_req(RSV("\"transfer_id\":\"t\"," RSV_OK_TAIL)), ECT_EINVAL, "mm_hash: missing");
    assert_err(dec_req(RSV("\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"shape\":[2,2],"
                           "\"dtype\":\"float16\"")),
               ECT_EINVAL, "nbytes: missing");
    assert_err(dec_req("{\"op\":\"status\"}"), ECT_EINVAL, "transfer_id: missing");
    assert_err(dec_req("{\"op\":\"complete\",\"transfer_id\":\"t\"}"), ECT_EINVAL,
               "reservation_id: missing");
    assert_err(dec_req("{\"op\":\"reserve_batch\"}"), ECT_EINVAL, "items: missing");
    assert_err(dec_reply(WIRE_OP_CANCEL, SIZE_MAX, "{\"result\":{\"cancelled\":true}}"), ECT_EINVAL,
               "ok: missing");
    assert_err(dec_reply(WIRE_OP_CANCEL, SIZE_MAX, "{\"ok\":false}"), ECT_EINVAL, "error: missing");
    assert_err(dec_reply(WIRE_OP_STATUS, SIZE_MAX, "{\"ok\":true}"), ECT_EINVAL, "result: missing");
    assert_err(dec_reply(WIRE_OP_RESERVE, SIZE_MAX,
                         "{\"ok\":true,\"result\":{\"reservation_id\":\"r\",\"dst_session\":"
                         "\"s\",\"dst_ptr\":0,\"write\":true,\"ready\":false,\"cached\":false}}"),
               ECT_EINVAL, "result.nbytes: missing");
    assert_err(dec_reply(WIRE_OP_RESERVE_BATCH, SIZE_MAX,
                         "{\"ok\":true,\"result\":{\"items\":[{\"ok\":true}]}}"),
               ECT_EINVAL, "result.items[0].result: missing");
    assert_err(dec_event("{\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"ready\":true,"
                         "\"reservation_id\":\"r\"," RSV_OK_TAIL "}"),
               ECT_EINVAL, "shard: missing");
    /* Optional fields of cancel default to "" / false. */
    wire_ctl_request r;
    const char *c = "{\"op\":\"cancel\",\"transfer_id\":\"t\"}";
    assert_int_equal(wire_ctl_decode_request(c, strlen(c), &r), 0);
    assert_string_equal(r.u.cancel.reservation_id, "");
    assert_false(r.u.cancel.abandon);
    assert_false(r.u.cancel.refresh);
    wire_ctl_request_clear(&r);
}

static void test_reject_bad_integers(void **state) {
    (void)state;
    assert_err(dec_req(RSV("\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":-8,"
                           "\"shape\":[2,2],\"dtype\":\"float16\"")),
               ECT_EINVAL, "nbytes: expected a non-negative integer, got -8");
    assert_err(dec_req(RSV("\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":8.0,"
                           "\"shape\":[2,2],\"dtype\":\"float16\"")),
               ECT_EINVAL, "nbytes: expected a non-negative integer, got real");
    assert_err(dec_req(RSV("\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":8,"
                           "\"shape\":[2,2e0],\"dtype\":\"float16\"")),
               ECT_EINVAL, "shape[1]: expected a non-negative integer, got real");
    assert_err(dec_req(RSV("\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":true,"
                           "\"shape\":[2,2],\"dtype\":\"float16\"")),
               ECT_EINVAL, "nbytes: expected a non-negative integer, got boolean");
    assert_err(dec_req(RSV("\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":8,"
                           "\"shape\":[2,-2],\"dtype\":\"float16\"")),
               ECT_EINVAL, "shape[1]: expected a non-negative integer, got -2");
    /* Beyond int64: jansson cannot hold it, the pre-scan names the path. */
    assert_err(dec_req(RSV("\"transfer_id\":\"t\",\"mm_hash\":\"h\","
                           "\"nbytes\":9223372036854775808,\"shape\":[2,2],\"dtype\":\"f\"")),
               ECT_EINVAL, "nbytes: integer out of range");
    assert_err(dec_req("{\"op\":\"reserve_batch\",\"items\":[{},{\"shape\":[1,"
                       "-99999999999999999999]}]}"),
               ECT_EINVAL, "items[1].shape[1]: integer out of range");
    assert_err(dec_reply(WIRE_OP_RESERVE_BATCH, SIZE_MAX,
                         "{\"ok\":true,\"result\":{\"items\":[{\"ok\":true,\"result\":"
                         "{\"dst_ptr\":18446744073709551616}}]}}"),
               ECT_EINVAL, "result.items[0].result.dst_ptr: integer out of range");
    /* The extremes that do fit. */
    assert_int_equal(dec_reply(WIRE_OP_RESERVE, SIZE_MAX,
                               "{\"ok\":true,\"result\":{\"reservation_id\":\"r\","
                               "\"dst_session\":\"s\",\"dst_ptr\":9223372036854775807,"
                               "\"nbytes\":0,\"write\":true,\"ready\":false,\"cached\":false}}"),
                     0);
    assert_int_equal(dec_req("{\"op\":\"peers\",\"x\":-9223372036854775808}"), 0);
    /* Ports. */
    assert_err(dec_reply(WIRE_OP_EVENT_PORT, SIZE_MAX, "{\"ok\":true,\"result\":0}"), ECT_EINVAL,
               "result: port 0 outside 1..65535");
    assert_err(dec_reply(WIRE_OP_PEERS, SIZE_MAX, "{\"ok\":true,\"result\":{\"ports\":[1,65536]}}"),
               ECT_EINVAL, "result.ports[1]: port 65536");
    /* Encoders refuse what JSON integers cannot carry. */
    wire_ctl_reply r;
    memset(&r, 0, sizeof r);
    r.op = WIRE_OP_RESERVE;
    r.ok = true;
    r.u.reserve.dst_ptr = (uint64_t)INT64_MAX + 1;
    char *s = (char *)1;
    assert_err(wire_ctl_encode_reply(&r, &s), ECT_ERANGE, "dst_ptr");
    assert_null(s);
}

static void test_reject_truncated(void **state) {
    (void)state;
    const char *goldens[] = {G_RESERVE, G_RESERVE_BATCH, G_COMPLETE_BATCH, G_CANCEL};
    for (size_t g = 0; g < ECT_ARRAY_LEN(goldens); g++) {
        size_t n = strlen(goldens[g]);
        for (size_t cut = 0; cut < n; cut++) {
            wire_ctl_request r;
            int rc = wire_ctl_decode_request(goldens[g], cut, &r);
            if (rc != ECT_EPROTO) fail_msg("prefix %zu of %s: rc %d", cut, goldens[g], rc);
        }
    }
    for (size_t cut = 0; cut < strlen(G_R_RESERVE_BATCH); cut++) {
        wire_ctl_reply r;
        assert_int_equal(
            wire_ctl_decode_reply(WIRE_OP_RESERVE_BATCH, 2, G_R_RESERVE_BATCH, cut, &r),
            ECT_EPROTO);
    }
    for (size_t cut = 0; cut < strlen(G_EV_ABANDONED); cut++) {
        wire_event e;
        assert_int_equal(wire_ctl_decode_event(G_EV_ABANDONED, cut, &e), ECT_EPROTO);
    }
}

static void test_reject_trailing_and_nul(void **state) {
    (void)state;
    assert_err(dec_req(G_PEERS " x"), ECT_EPROTO, "end of file expected");
    assert_err(dec_req(G_PEERS G_PEERS), ECT_EPROTO, NULL);
    assert_int_equal(dec_req(" " G_PEERS "\r\n\t "), 0); /* whitespace is not garbage */
    wire_ctl_request r;
    const char nul_after[] = G_PEERS "\0";
    assert_err(wire_ctl_decode_request(nul_after, sizeof nul_after, &r), ECT_EPROTO, "NUL byte");
    const char nul_in[] = "{\"op\":\"status\",\"transfer_id\":\"a\0b\"}";
    assert_err(wire_ctl_decode_request(nul_in, sizeof nul_in - 1, &r), ECT_EPROTO,
               "NUL byte at offset 31");
    /* An escaped NUL cannot become a C string either. */
    assert_err(dec_req("{\"op\":\"status\",\"transfer_id\":\"a\\u0000b\"}"), ECT_EPROTO, "u0000");
    assert_err(dec_req("{\"op\":\"status\",\"transfer_id\":\"\xff\"}"), ECT_EPROTO, "0xff");
    assert_err(dec_req("[{\"op\":\"peers\"}]"), ECT_EPROTO, "not a JSON object");
    assert_err(dec_req("\"peers\""), ECT_EPROTO, NULL);
    assert_err(dec_req(""), ECT_EPROTO, NULL);
    assert_err(dec_req("{\"op\":\"peers\",\"op\":\"peers\"}"), ECT_EPROTO, "duplicate");
    assert_err(wire_ctl_decode_request(NULL, 5, &r), ECT_EINVAL, NULL);
}

static void test_reject_nesting_and_size(void **state) {
    (void)state;
    char deep[256];
    size_t n = 0;
    n += (size_t)snprintf(deep, sizeof deep, "{\"op\":\"peers\",\"x\":");
    for (int i = 0; i < WIRE_CTL_MAX_DEPTH; i++) deep[n++] = '[';
    for (int i = 0; i < WIRE_CTL_MAX_DEPTH; i++) deep[n++] = ']';
    deep[n++] = '}';
    deep[n] = '\0';
    assert_err(dec_req(deep), ECT_EPROTO, "nesting deeper than 32");
    /* One level less fits (the outer object is a level too). */
    n = 0;
    n += (size_t)snprintf(deep, sizeof deep, "{\"op\":\"peers\",\"x\":");
    for (int i = 0; i < WIRE_CTL_MAX_DEPTH - 1; i++) deep[n++] = '[';
    for (int i = 0; i < WIRE_CTL_MAX_DEPTH - 1; i++) deep[n++] = ']';
    deep[n++] = '}';
    deep[n] = '\0';
    assert_int_equal(dec_req(deep), 0);
    /* Brackets inside strings do not count. */
    assert_int_equal(dec_req("{\"op\":\"peers\",\"x\":\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"}"),
                     0);

    size_t big = (size_t)WIRE_CTL_MAX_FRAME + 1;
    char *buf = malloc(big);
    assert_non_null(buf);
    memset(buf, ' ', big);
    memcpy(buf, G_PEERS, strlen(G_PEERS));
    wire_ctl_request r;
    assert_err(wire_ctl_decode_request(buf, big, &r), ECT_EPROTO, "exceeds");
    assert_int_equal(wire_ctl_decode_request(buf, big - 1, &r), 0);
    free(buf);
}

/* A reserve_batch of `n` copies of `item`. */
static char *batch_of(const char *op, const char *item, size_t n) {
    size_t k = strlen(item), cap = 64 + n * (k + 1);
    char *s = malloc(cap);
    assert_non_null(s);
    size_t o = (size_t)snprintf(s, cap, "{\"op\":\"%s\",\"items\":[", op);
    for (size_t i = 0; i < n; i++) {
        if (i) s[o++] = ',';
        memcpy(s + o, item, k);
        o += k;
    }
    memcpy(s + o, "]}", 3);
    return s;
}

static void test_reject_over_bounds(void **state) {
    (void)state;
    char id[WIRE_ID_MAX + 2];
    memset(id, 'i', sizeof id - 1);
    id[sizeof id - 1] = '\0';
    char msg[600];
    snprintf(msg, sizeof msg, "{\"op\":\"status\",\"transfer_id\":\"%s\"}", id);
    assert_err(dec_req(msg), ECT_EINVAL, "transfer_id: 257 bytes, longer than the 256 allowed");
    id[WIRE_ID_MAX] = '\0';
    snprintf(msg, sizeof msg, "{\"op\":\"status\",\"transfer_id\":\"%s\"}", id);
    assert_int_equal(dec_req(msg), 0);
    /* Bounds count bytes after unescaping: 129 x "\u00e9" is 258 bytes of UTF-8. */
    char esc[1024];
    size_t o = (size_t)snprintf(esc, sizeof esc, "{\"op\":\"status\",\"transfer_id\":\"");
    for (int i = 0; i < 129; i++) o += (size_t)snprintf(esc + o, sizeof esc - o, "\\u00e9");
    snprintf(esc + o, sizeof esc - o, "\"}");
    assert_err(dec_req(esc), ECT_EINVAL, "transfer_id: 258 bytes");

    char dt[WIRE_DTYPE_MAX + 2];
    memset(dt, 'd', sizeof dt - 1);
    dt[sizeof dt - 1] = '\0';
    snprintf(msg, sizeof msg,
             RSV("\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":8,\"shape\":[2,2],"
                 "\"dtype\":\"%s\""),
             dt);
    assert_err(dec_req(msg), ECT_EINVAL, "dtype: 65 bytes");
    assert_err(dec_req(RSV("\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":1,"
                           "\"shape\":[1,1,1,1,1,1,1,1,1],\"dtype\":\"int8\"")),
               ECT_EINVAL, "shape: 9 dimensions, at most 8");
    assert_int_equal(dec_req(RSV("\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":1,"
                                 "\"shape\":[1,1,1,1,1,1,1,1],\"dtype\":\"int8\"")),
                     0);
    assert_err(dec_req(RSV("\"transfer_id\":\"\",\"mm_hash\":\"h\"," RSV_OK_TAIL)), ECT_EINVAL,
               "transfer_id: must not be empty");

    const char *citem = "{\"transfer_id\":\"t\",\"reservation_id\":\"r\"}";
    char *s = batch_of("complete_batch", citem, WIRE_BATCH_MAX);
    wire_ctl_request r;
    assert_int_equal(wire_ctl_decode_request(s, strlen(s), &r), 0);
    assert_int_equal(r.u.complete_batch.n, WIRE_BATCH_MAX);
    wire_ctl_request_clear(&r);
    free(s);
    s = batch_of("complete_batch", citem, WIRE_BATCH_MAX + 1);
    assert_err(dec_req(s), ECT_EINVAL, "items: 4097 items, at most 4096");
    free(s);
    s = batch_of("reserve_batch", "{}", WIRE_BATCH_MAX + 1);
    assert_err(dec_req(s), ECT_EINVAL, "items: 4097 items");
    free(s);

    assert_err(dec_reply(WIRE_OP_PEERS, SIZE_MAX, "{\"ok\":true,\"result\":{\"ports\":[]}}"),
               ECT_EINVAL, "result.ports: empty peer list");
    wire_ctl_reply rep;
    memset(&rep, 0, sizeof rep);
    rep.op = WIRE_OP_COMPLETE_BATCH;
    rep.ok = true;
    rep.u.complete_batch.n = WIRE_BATCH_MAX + 1;
    rep.u.complete_batch.items = (wire_complete_result *)msg; /* never read */
    assert_err(wire_ctl_encode_reply(&rep, &s), ECT_EINVAL, "items");
}

static void test_reject_mismatched_lengths(void **state) {
    (void)state;
    assert_err(dec_reply(WIRE_OP_COMPLETE_BATCH, 3, G_R_COMPLETE_BATCH), ECT_EINVAL,
               "result.items: 2 results for 3 requested items");
    assert_err(dec_reply(WIRE_OP_RESERVE_BATCH, 1, G_R_RESERVE_BATCH), ECT_EINVAL,
               "result.items: 2 results for 1");
    assert_int_equal(dec_reply(WIRE_OP_RESERVE_BATCH, SIZE_MAX, G_R_RESERVE_BATCH), 0);
    /* nbytes against shape x dtype, wherever a tensor is described. */
    assert_err(dec_req(RSV("\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":9,"
                           "\"shape\":[2,2],\"dtype\":\"float16\"")),
               ECT_EINVAL, "nbytes: shape and dtype do not match nbytes");
    assert_err(dec_reply(WIRE_OP_STATUS, SIZE_MAX,
                         "{\"ok\":true,\"result\":{\"mm_hash\":\"h\",\"ready\":true,"
                         "\"reservation_id\":\"r\",\"nbytes\":4,\"shape\":[2,2],"
                         "\"dtype\":\"float16\"}}"),
               ECT_EINVAL, "result.nbytes: shape and dtype do not match nbytes");
    assert_err(dec_event("{\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"ready\":true,"
                         "\"reservation_id\":\"r\",\"nbytes\":8,\"shape\":[2,2],"
                         "\"dtype\":\"bfloat17\",\"shard\":1}"),
               ECT_EINVAL, "dtype: Unsupported torch dtype string 'bfloat17'");
    assert_err(dec_req(RSV("\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"nbytes\":0,"
                           "\"shape\":[4294967296,4294967296],\"dtype\":\"int8\"")),
               ECT_EOVERFLOW, "overflows");
    assert_err(dec_event("{\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"ready\":true,"
                         "\"reservation_id\":\"r\"," RSV_OK_TAIL ",\"shard\":1,"
                         "\"abandoned\":true}"),
               ECT_EINVAL, "abandoned: true contradicts ready: true");
}

static void test_unknown_ops(void **state) {
    (void)state;
    static const struct {
        const char *frame, *text;
    } cases[] = {
        {"{\"op\":\"x\"}", "unknown control op: 'x'"},
        {"{}", "unknown control op: None"},
        {"{\"op\":null}", "unknown control op: None"},
        {"{\"op\":5}", "unknown control op: 5"},
        {"{\"op\":true}", "unknown control op: True"},
        {"{\"op\":\"it's\"}", "unknown control op: \"it's\""},
        {"{\"op\":\"a'b\\\"c\"}", "unknown control op: 'a\\'b\"c'"},
        {"{\"op\":\"a\\nb\\\\\"}", "unknown control op: 'a\\nb\\\\'"},
        {"{\"op\":\"RESERVE\"}", "unknown control op: 'RESERVE'"},
        {"{\"op\":\"reserve\\u0000\"}", NULL}, /* escaped NUL: malformed instead */
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(cases); i++) {
        int rc = dec_req(cases[i].frame);
        if (!cases[i].text) {
            assert_int_equal(rc, ECT_EPROTO);
            continue;
        }
        assert_int_equal(rc, ECT_ENOTSUP);
        assert_string_equal(ect_last_error(), cases[i].text);
    }
    /* A long op is quoted up to 64 bytes. */
    char msg[300];
    snprintf(msg, sizeof msg, "{\"op\":\"%0200d\"}", 0);
    assert_int_equal(dec_req(msg), ECT_ENOTSUP);
    assert_true(strlen(ect_last_error()) < 100);
    assert_non_null(strstr(ect_last_error(), "...'"));
}

static void test_extra_keys_ignored_and_batch_items_judged_alone(void **state) {
    (void)state;
    const char *s = "{\"future\":{\"a\":[1,2,{\"b\":null}]},\"op\":\"reserve_batch\",\"items\":["
                    "{\"transfer_id\":\"t0\",\"mm_hash\":\"h0\",\"nbytes\":4,\"shape\":[2],"
                    "\"dtype\":\"torch.bfloat16\",\"op\":\"ignored\",\"extra\":1.5},"
                    "{\"transfer_id\":\"t1\",\"mm_hash\":\"h1\",\"nbytes\":4,\"shape\":[2,0.5],"
                    "\"dtype\":\"bfloat16\"},"
                    "[],"
                    "{\"transfer_id\":\"t3\",\"mm_hash\":\"h3\",\"nbytes\":5,\"shape\":[2],"
                    "\"dtype\":\"bfloat16\"},"
                    "{\"transfer_id\":\"t4\",\"mm_hash\":\"h4\",\"nbytes\":2,\"shape\":[2],"
                    "\"dtype\":\"uint8\"}]}";
    wire_ctl_request r;
    assert_int_equal(wire_ctl_decode_request(s, strlen(s), &r), 0);
    assert_int_equal(r.op, WIRE_OP_RESERVE_BATCH);
    assert_int_equal(r.u.reserve_batch.n, 5);
    wire_reserve_item *it = r.u.reserve_batch.items;
    assert_int_equal(it[0].rc, 0);
    assert_string_equal(it[0].req.transfer_id, "t0");
    assert_string_equal(it[0].req.tensor.dtype, "torch.bfloat16");
    assert_int_equal(it[1].rc, ECT_EINVAL);
    assert_string_equal(it[1].error,
                        "items[1].shape[1]: expected a non-negative integer, got real");
    assert_int_equal(it[2].rc, ECT_EINVAL);
    assert_string_equal(it[2].error, "items[2]: expected an object, got array");
    assert_int_equal(it[3].rc, ECT_EINVAL);
    assert_non_null(strstr(it[3].error, "items[3].nbytes: shape and dtype do not match nbytes"));
    assert_int_equal(it[4].rc, 0);
    assert_string_equal(it[4].req.mm_hash, "h4");
    wire_ctl_request_clear(&r);
    wire_ctl_request_clear(&r); /* clearing twice is harmless */
}

static void test_encoders_refuse_what_decoders_refuse(void **state) {
    (void)state;
    char *s = (char *)1;
    wire_ctl_request q;
    memset(&q, 0, sizeof q);
    q.op = WIRE_OP_RESERVE;
    strcpy(q.u.reserve.mm_hash, "h");
    set_tensor(&q.u.reserve.tensor, "float16", 8, 2, shape_2x2);
    assert_err(wire_ctl_encode_request(&q, &s), ECT_EINVAL, "transfer_id: must not be empty");
    assert_null(s);
    strcpy(q.u.reserve.transfer_id, "t");
    q.u.reserve.tensor.nbytes = 9;
    assert_err(wire_ctl_encode_request(&q, &s), ECT_EINVAL, "shape and dtype do not match");
    set_tensor(&q.u.reserve.tensor, "float17", 8, 2, shape_2x2);
    assert_err(wire_ctl_encode_request(&q, &s), ECT_EINVAL, "Unsupported torch dtype string");
    q.op = (wire_ctl_op)99;
    assert_err(wire_ctl_encode_request(&q, &s), ECT_EINVAL, "op");

    wire_ctl_reply r;
    memset(&r, 0, sizeof r);
    r.ok = true;
    r.op = WIRE_OP_EVENT_PORT;
    assert_err(wire_ctl_encode_reply(&r, &s), ECT_EINVAL, "port 0");
    r.op = WIRE_OP_PEERS;
    assert_err(wire_ctl_encode_reply(&r, &s), ECT_EINVAL, "empty");
    r.op = WIRE_OP_RESERVE;
    static char key[WIRE_KEY_MAX + 2];
    memset(key, 'k', WIRE_KEY_MAX + 1);
    key[WIRE_KEY_MAX + 1] = '\0';
    r.u.reserve.dst_key = key;
    assert_err(wire_ctl_encode_reply(&r, &s), ECT_EINVAL, "dst_key: longer than the 4096");
    key[WIRE_KEY_MAX] = '\0';
    assert_int_equal(wire_ctl_encode_reply(&r, &s), 0);
    free(s);
    char bad[] = "r\xff";
    strcpy(r.u.reserve.reservation_id, bad);
    assert_err(wire_ctl_encode_reply(&r, &s), ECT_EINVAL, "reservation_id: not valid UTF-8");

    /* Error texts are never refused: cut to WIRE_ERROR_MAX, bad bytes as '?'. */
    static char long_text[WIRE_ERROR_MAX + 100];
    memset(long_text, 'e', WIRE_ERROR_MAX + 99);
    memcpy(long_text + WIRE_ERROR_MAX - 1, "\xe2\x82\xac", 3); /* a euro sign across the cut */
    long_text[WIRE_ERROR_MAX + 99] = '\0';
    long_text[0] = (char)0xff;
    assert_int_equal(wire_ctl_encode_error(long_text, &s), 0);
    wire_ctl_reply back;
    assert_int_equal(wire_ctl_decode_reply(WIRE_OP_CANCEL, SIZE_MAX, s, strlen(s), &back), 0);
    assert_int_equal(strlen(back.error), WIRE_ERROR_MAX - 1);
    assert_int_equal(back.error[0], '?');
    wire_ctl_reply_clear(&back);
    free(s);

    wire_event ev;
    memset(&ev, 0, sizeof ev);
    strcpy(ev.transfer_id, "t");
    strcpy(ev.mm_hash, "h");
    set_tensor(&ev.tensor, "float16", 8, 2, shape_2x2);
    assert_err(wire_ctl_encode_event(&ev, &s), ECT_EINVAL, "shard");
}

/* What one OOM step runs: decode `frame` as `kind`, or (encode kinds) encode
 * the struct decoded from it beforehand. Cleans up after itself. */
typedef struct {
    enum { DEC_REQ, ENC_REQ, DEC_REP, ENC_REP, DEC_EV, ENC_EV, ENC_FAIL } kind;
    wire_ctl_op op;
    const char *frame;
    wire_ctl_request q;
    wire_ctl_reply r;
    wire_event e;
} oom_case;

static int oom_step(oom_case *c) {
    size_t len = strlen(c->frame);
    char *out = NULL;
    int rc = 0;
    switch (c->kind) {
    case DEC_REQ: {
        wire_ctl_request q;
        if (!(rc = wire_ctl_decode_request(c->frame, len, &q))) wire_ctl_request_clear(&q);
        break;
    }
    case DEC_REP: {
        wire_ctl_reply r;
        if (!(rc = wire_ctl_decode_reply(c->op, SIZE_MAX, c->frame, len, &r)))
            wire_ctl_reply_clear(&r);
        break;
    }
    case DEC_EV: {
        wire_event e;
        if (!(rc = wire_ctl_decode_event(c->frame, len, &e))) wire_event_clear(&e);
        break;
    }
    case ENC_REQ: rc = wire_ctl_encode_request(&c->q, &out); break;
    case ENC_REP: rc = wire_ctl_encode_reply(&c->r, &out); break;
    case ENC_EV: rc = wire_ctl_encode_event(&c->e, &out); break;
    case ENC_FAIL:
        rc = wire_ctl_decode_request(c->frame, len, &c->q);
        assert_true(rc != 0);
        rc = wire_ctl_encode_decode_failure(rc, &out);
        break;
    }
    if (rc == 0) assert_non_null(out = out ? out : (char *)c->frame);
    if (out != c->frame) free(out);
    return rc;
}

static void test_out_of_memory_fails_cleanly(void **state) {
    (void)state;
#ifdef OOM_SKIP
    skip();
#endif
    static const struct {
        wire_ctl_op op;
        const char *frame;
    } frames[] = {
        {WIRE_OP_RESERVE, G_RESERVE},
        {WIRE_OP_RESERVE_BATCH, G_RESERVE_BATCH},
        {WIRE_OP_COMPLETE_BATCH, G_COMPLETE_BATCH},
        {WIRE_OP_CANCEL, G_CANCEL},
        {WIRE_OP_RESERVE, G_R_RESERVE},
        {WIRE_OP_RESERVE, G_R_RESERVE_CANCELLED},
        {WIRE_OP_RESERVE_BATCH, G_R_RESERVE_BATCH},
        {WIRE_OP_STATUS, G_R_STATUS},
        {WIRE_OP_PEERS, G_R_PEERS},
        {WIRE_OP_COMPLETE_BATCH, G_R_COMPLETE_BATCH},
        {WIRE_OP_CANCEL, G_R_ERROR},
        {0, G_EV_ABANDONED},
        {0, "{\"op\":\"nope\"}"},
        {0, "{\"op\":"},
    };
    int steps = 0;
    for (size_t f = 0; f < ECT_ARRAY_LEN(frames); f++) {
        const char *fr = frames[f].frame;
        size_t len = strlen(fr);
        oom_case c;
        memset(&c, 0, sizeof c);
        c.op = frames[f].op;
        c.frame = fr;
        /* Which decoder takes this frame decides the kinds to run. */
        int kinds[2], nk = 0;
        if (fr == (const char *)G_EV_ABANDONED) {
            assert_int_equal(wire_ctl_decode_event(fr, len, &c.e), 0);
            kinds[nk++] = DEC_EV, kinds[nk++] = ENC_EV;
        } else if (c.op == 0) {
            kinds[nk++] = ENC_FAIL;
        } else if (strncmp(fr, "{\"op\"", 5) == 0) {
            assert_int_equal(wire_ctl_decode_request(fr, len, &c.q), 0);
            kinds[nk++] = DEC_REQ, kinds[nk++] = ENC_REQ;
        } else {
            assert_int_equal(wire_ctl_decode_reply(c.op, SIZE_MAX, fr, len, &c.r), 0);
            kinds[nk++] = DEC_REP, kinds[nk++] = ENC_REP;
        }
        for (int i = 0; i < nk; i++) {
            c.kind = kinds[i];
            int k = 0;
            for (;; k++) {
                long before = live;
                countdown = k;
                int rc = oom_step(&c);
                countdown = -1;
                if (live != before)
                    fail_msg("%s kind %d: leak after %d allocations", fr, c.kind, k);
                if (rc == 0) break;
                /* jansson reports some of its allocation failures as syntax errors,
                 * so a decoder may say ECT_EPROTO; an encoder always says ENOMEM. */
                bool dec = c.kind == DEC_REQ || c.kind == DEC_REP || c.kind == DEC_EV;
                if (rc != ECT_ENOMEM && !(dec && rc == ECT_EPROTO))
                    fail_msg("%s kind %d, allocation %d failed: rc %d (%s)", fr, c.kind, k, rc,
                             ect_last_error());
            }
            assert_true(k >= 1); /* every call allocates, so the loop did fail some */
            steps += k;
        }
        wire_ctl_request_clear(&c.q);
        wire_ctl_reply_clear(&c.r);
        wire_event_clear(&c.e);
    }
    print_message("%d allocation failures injected\n", steps);
}

/* -------------------------------------------------------- mutation loop */

/* Whether a decoded request holds a reserve_batch item that did not decode
 * (the encoder refuses to send such an item). */
static bool has_failed_item(const wire_ctl_request *q) {
    if (q->op != WIRE_OP_RESERVE_BATCH) return false;
    for (size_t i = 0; i < q->u.reserve_batch.n; i++)
        if (q->u.reserve_batch.items[i].rc) return true;
    return false;
}

static void decode_everything(const unsigned char *buf, size_t len) {
    wire_ctl_request q;
    int qrc = wire_ctl_decode_request(buf, len, &q);
    if (qrc) {
        char *s = NULL;
        assert_int_equal(wire_ctl_encode_decode_failure(qrc, &s), 0);
        free(s);
    } else if (has_failed_item(&q)) {
        char *s = NULL;
        assert_err(wire_ctl_encode_request(&q, &s), ECT_EINVAL, "did not decode");
        wire_ctl_request_clear(&q);
    } else {
        char *s = NULL;
        assert_int_equal(wire_ctl_encode_request(&q, &s), 0);
        wire_ctl_request_clear(&q);
        assert_int_equal(wire_ctl_decode_request(s, strlen(s), &q), 0);
        wire_ctl_request_clear(&q);
        free(s);
    }
    for (int op = WIRE_OP_RESERVE; op <= WIRE_OP_CANCEL; op++) {
        wire_ctl_reply r;
        if (wire_ctl_decode_reply((wire_ctl_op)op, SIZE_MAX, buf, len, &r) == 0) {
            char *s = NULL;
            assert_int_equal(wire_ctl_encode_reply(&r, &s), 0);
            wire_ctl_reply_clear(&r);
            free(s);
        }
    }
    wire_event e;
    if (wire_ctl_decode_event(buf, len, &e) == 0) wire_event_clear(&e);
}

static void test_mutations_never_crash(void **state) {
    (void)state;
    const char *seeds[] = {G_RESERVE,         G_RESERVE_BATCH, G_CANCEL,     G_R_RESERVE,
                           G_R_RESERVE_BATCH, G_R_STATUS,      G_R_PEERS,    G_R_COMPLETE_BATCH,
                           G_EV_READY,        G_EV_ABANDONED,  G_R_MALFORMED};
    uint64_t st = 7;
    unsigned char buf[512];
    int accepted = 0;
    for (int iter = 0; iter < 6000; iter++) {
        const char *seed = seeds[test_rand(&st) % ECT_ARRAY_LEN(seeds)];
        size_t len = strlen(seed);
        memcpy(buf, seed, len);
        int edits = 1 + (int)(test_rand(&st) % 3);
        for (int e = 0; e < edits; e++) {
            size_t at = (size_t)(test_rand(&st) % len);
            switch (test_rand(&st) % 4) {
            case 0: buf[at] = (unsigned char)test_rand(&st); break;
            case 1: buf[at] = "{}[],:\"0-9e.\\ "[test_rand(&st) % 15]; break;
            case 2: len = at + 1; break; /* truncate */
            default:
                if (len + 1 < sizeof buf) { /* duplicate a byte */
                    memmove(buf + at + 1, buf + at, len - at);
                    len++;
                }
            }
        }
        wire_ctl_request q;
        if (wire_ctl_decode_request(buf, len, &q) == 0) accepted++;
        wire_ctl_request_clear(&q);
        decode_everything(buf, len);
    }
    assert_true(accepted > 0); /* some mutations stay valid: the loop exercises success too */
}

/* "ect_shm_id" (extension, docs/PROTOCOL.md "shm", "Offers"): written last in
 * reserve and reserve_batch when set, byte-exact on both paths, decoded back;
 * absent is 0; a value that is not 16 lowercase hex digits of a non-zero
 * number fails the frame with a text naming it. */
static void test_shm_id(void **st) {
    (void)st;
    wire_reserve_item it = {0};
    snprintf(it.req.transfer_id, sizeof it.req.transfer_id, "t1");
    snprintf(it.req.mm_hash, sizeof it.req.mm_hash, "h1");
    it.req.tensor.nbytes = 8;
    it.req.tensor.ndim = 1;
    it.req.tensor.shape[0] = 4;
    snprintf(it.req.tensor.dtype, sizeof it.req.tensor.dtype, "bfloat16");
    wire_ctl_request q = {.op = WIRE_OP_RESERVE_BATCH, .shm_id = 0x00c0ffee12345678ull};
    q.u.reserve_batch.n = 1;
    q.u.reserve_batch.items = &it;
    const char *batch = "{\"op\":\"reserve_batch\",\"items\":[{\"transfer_id\":\"t1\",\"mm_hash\":"
                        "\"h1\",\"nbytes\":8,\"shape\":[4],\"dtype\":\"bfloat16\"}],"
                        "\"ect_shm_id\":\"00c0ffee12345678\"}";
    char *out = NULL;
    assert_int_equal(wire_ctl_encode_request(&q, &out), 0);
    assert_string_equal(out, batch);
    free(out);
    request_paths_agree(&q, batch);
    char line[512];
    snprintf(line, sizeof line, "\n%s\n", batch); /* docs/PROTOCOL.md's example */
    assert_non_null(strstr(test_protocol_md(), line));
    wire_ctl_request d;
    assert_int_equal(wire_ctl_decode_request(batch, strlen(batch), &d), 0);
    assert_true(d.shm_id == 0x00c0ffee12345678ull);
    wire_ctl_request_clear(&d);
    wire_ctl_request r1 = {.op = WIRE_OP_RESERVE, .shm_id = 1};
    r1.u.reserve = it.req;
    const char *one = "{\"op\":\"reserve\",\"transfer_id\":\"t1\",\"mm_hash\":\"h1\",\"nbytes\":8,"
                      "\"shape\":[4],\"dtype\":\"bfloat16\",\"ect_shm_id\":\"0000000000000001\"}";
    request_paths_agree(&r1, one);
    /* Absent: 0 (an upstream producer). */
    q.shm_id = 0;
    request_paths_agree(&q,
                        "{\"op\":\"reserve_batch\",\"items\":[{\"transfer_id\":\"t1\","
                        "\"mm_hash\":\"h1\",\"nbytes\":8,\"shape\":[4],\"dtype\":\"bfloat16\"}]}");
    static const char *const bad[] = {"\"00C0FFEE12345678\"",
                                      "\"0000000000000000\"",
                                      "\"123\"",
                                      "\"00c0ffee123456789\"",
                                      "12",
                                      "null"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char f[256];
        snprintf(f, sizeof f, "{\"op\":\"reserve_batch\",\"items\":[],\"ect_shm_id\":%s}", bad[i]);
        assert_err(wire_ctl_decode_request(f, strlen(f), &d), ECT_EINVAL, "ect_shm_id");
    }
}

/* ect_ready (extension, docs/PROTOCOL.md "the scheduler lists what is
 * ready"): the documented request and reply round-trip byte for byte, an
 * absent max is the default, and every bad field is refused naming it. */
#define G_READY "{\"op\":\"ect_ready\",\"after\":0,\"max\":2}"
#define G_READY_AGED "{\"op\":\"ect_ready\",\"after\":41,\"max\":256,\"age_ms\":1000}"
#define G_R_READY                                                                                  \
    "{\"ok\":true,\"result\":{\"items\":[{\"seq\":1,\"transfer_id\":\"t1\",\"mm_hash\":\"h1\","    \
    "\"reservation_id\":\"r1\",\"nbytes\":8,\"shape\":[2,2],\"dtype\":\"float16\"},{\"seq\":3,"    \
    "\"transfer_id\":\"t3\",\"mm_hash\":\"h3\",\"reservation_id\":\"r3\",\"nbytes\":8,\"shape\":"  \
    "[4],\"dtype\":\"bfloat16\"}],\"next\":3,\"more\":true}}"
#define G_R_READY_UPSTREAM "{\"ok\":false,\"error\":\"unknown control op: 'ect_ready'\"}"

static void test_ect_ready_frames(void **state) {
    (void)state;
    wire_ctl_request q = {.op = WIRE_OP_ECT_READY, .u.ready = {.after = 0, .max = 2}};
    request_round_trip(&q, G_READY);
    wire_ctl_request aged = {.op = WIRE_OP_ECT_READY,
                             .u.ready = {.after = 41, .max = 256, .age_ms = 1000}};
    request_round_trip(&aged, G_READY_AGED);
    wire_ready_item it[2] = {
        {.seq = 1,
         .transfer_id = "t1",
         .mm_hash = "h1",
         .reservation_id = "r1",
         .tensor = {.nbytes = 8, .ndim = 2, .shape = {2, 2}, .dtype = "float16"}},
        {.seq = 3,
         .transfer_id = "t3",
         .mm_hash = "h3",
         .reservation_id = "r3",
         .tensor = {.nbytes = 8, .ndim = 1, .shape = {4}, .dtype = "bfloat16"}}};
    wire_ctl_reply r = {.op = WIRE_OP_ECT_READY, .ok = true};
    r.u.ready.n = 2;
    r.u.ready.items = it;
    r.u.ready.next = 3;
    r.u.ready.more = true;
    reply_round_trip(&r, 2, G_R_READY);
    const char *doc = test_protocol_md();
    static const char *const documented[] = {G_READY, G_READY_AGED, G_R_READY, G_R_READY_UPSTREAM};
    for (size_t i = 0; i < ECT_ARRAY_LEN(documented); i++) {
        char line[1024];
        snprintf(line, sizeof line, "\n%s\n", documented[i]);
        if (!strstr(doc, line)) fail_msg("docs/PROTOCOL.md lacks the example %s", documented[i]);
    }
    /* an upstream shard's answer decodes as a refusal with its text */
    wire_ctl_reply up;
    assert_int_equal(wire_ctl_decode_reply(WIRE_OP_ECT_READY, 8, G_R_READY_UPSTREAM,
                                           strlen(G_R_READY_UPSTREAM), &up),
                     0);
    assert_false(up.ok);
    assert_string_equal(up.error, "unknown control op: 'ect_ready'");
    wire_ctl_reply_clear(&up);
    /* "max" absent: the default; the encoder leaves out max 0 */
    const char *bare = "{\"op\":\"ect_ready\",\"after\":7}";
    assert_int_equal(wire_ctl_decode_request(bare, strlen(bare), &q), 0);
    assert_int_equal(q.u.ready.after, 7);
    assert_int_equal(q.u.ready.max, WIRE_READY_DEFAULT);
    q.u.ready.max = 0;
    char *enc = NULL;
    assert_int_equal(wire_ctl_encode_request(&q, &enc), 0);
    assert_string_equal(enc, bare);
    free(enc);
    q.u.ready.max = WIRE_BATCH_MAX + 1;
    assert_err(wire_ctl_encode_request(&q, &enc), ECT_EINVAL, "max: 4097 outside 1..4096");
    wire_ctl_request_clear(&q);
    /* bad requests */
    assert_err(dec_req("{\"op\":\"ect_ready\"}"), ECT_EINVAL, "after: missing");
    assert_err(dec_req("{\"op\":\"ect_ready\",\"after\":-1}"), ECT_EINVAL,
               "after: expected a non-negative integer, got -1");
    assert_err(dec_req("{\"op\":\"ect_ready\",\"after\":1.5}"), ECT_EINVAL,
               "after: expected a non-negative integer, got real");
    assert_err(dec_req("{\"op\":\"ect_ready\",\"after\":\"3\"}"), ECT_EINVAL,
               "after: expected a non-negative integer, got string");
    assert_err(dec_req("{\"op\":\"ect_ready\",\"after\":99999999999999999999}"), ECT_EINVAL,
               "after");
    assert_err(dec_req("{\"op\":\"ect_ready\",\"after\":0,\"max\":0}"), ECT_EINVAL,
               "max: 0 outside 1..4096");
    assert_err(dec_req("{\"op\":\"ect_ready\",\"after\":0,\"max\":4097}"), ECT_EINVAL,
               "max: 4097 outside 1..4096");
    assert_err(dec_req("{\"op\":\"ect_ready\",\"after\":0,\"max\":2.0}"), ECT_EINVAL,
               "max: expected a non-negative integer, got real");
    assert_err(dec_req("{\"op\":\"ect_ready\",\"after\":0,\"max\":null}"), ECT_EINVAL,
               "max: expected a non-negative integer, got null");
    assert_err(dec_req("{\"op\":\"ect_ready\",\"after\":0,\"age_ms\":-1}"), ECT_EINVAL,
               "age_ms: expected a non-negative integer, got -1");
    assert_err(dec_req("{\"op\":\"ect_ready\",\"after\":0,\"age_ms\":\"1s\"}"), ECT_EINVAL,
               "age_ms: expected a non-negative integer, got string");
    /* bad replies */
#define ITEM(seq)                                                                                  \
    "{\"seq\":" #seq ",\"transfer_id\":\"t\",\"mm_hash\":\"h\",\"reservation_id\":"                \
    "\"r\",\"nbytes\":4,\"shape\":[2],\"dtype\":\"float16\"}"
#define READY_REP(items, tail) "{\"ok\":true,\"result\":{\"items\":[" items "]" tail "}}"
    assert_int_equal(dec_reply(WIRE_OP_ECT_READY, 2,
                               READY_REP(ITEM(1) "," ITEM(2), ",\"next\":2,\"more\":false")),
                     0);
    assert_err(dec_reply(WIRE_OP_ECT_READY, 1,
                         READY_REP(ITEM(1) "," ITEM(2), ",\"next\":2,\"more\":false")),
               ECT_EINVAL, "result.items: 2 items, asked for at most 1");
    assert_err(dec_reply(WIRE_OP_ECT_READY, 8,
                         READY_REP(ITEM(3) "," ITEM(2), ",\"next\":3,\"more\":false")),
               ECT_EINVAL, "result.items[1].seq: 2 is not above 3");
    assert_err(dec_reply(WIRE_OP_ECT_READY, 8, READY_REP(ITEM(0), ",\"next\":3,\"more\":false")),
               ECT_EINVAL, "result.items[0].seq: 0 is not above 0");
    assert_err(dec_reply(WIRE_OP_ECT_READY, 8, READY_REP(ITEM(5), ",\"next\":4,\"more\":false")),
               ECT_EINVAL, "result.next: 4 is below the last item's seq");
    assert_err(dec_reply(WIRE_OP_ECT_READY, 8, READY_REP(ITEM(5), ",\"next\":5")), ECT_EINVAL,
               "result.more: missing");
    assert_err(dec_reply(WIRE_OP_ECT_READY, 8, READY_REP(ITEM(5), ",\"more\":false")), ECT_EINVAL,
               "result.next: missing");
    assert_err(dec_reply(WIRE_OP_ECT_READY, 8, READY_REP(ITEM(5), ",\"next\":-5,\"more\":false")),
               ECT_EINVAL, "result.next: expected a non-negative integer, got -5");
    assert_err(dec_reply(WIRE_OP_ECT_READY, 8,
                         READY_REP("{\"seq\":1,\"transfer_id\":\"\",\"mm_hash\":\"h\","
                                   "\"reservation_id\":\"r\",\"nbytes\":4,\"shape\":[2],"
                                   "\"dtype\":\"float16\"}",
                                   ",\"next\":1,\"more\":false")),
               ECT_EINVAL, "result.items[0].transfer_id");
    assert_err(dec_reply(WIRE_OP_ECT_READY, 8,
                         READY_REP("{\"seq\":1,\"transfer_id\":\"t\",\"mm_hash\":\"h\","
                                   "\"reservation_id\":\"r\",\"nbytes\":5,\"shape\":[2],"
                                   "\"dtype\":\"float16\"}",
                                   ",\"next\":1,\"more\":false")),
               ECT_EINVAL, "result.items[0].");
    assert_err(dec_reply(WIRE_OP_ECT_READY, 8,
                         "{\"ok\":true,\"result\":{\"items\":[7],"
                         "\"next\":1,\"more\":false}}"),
               ECT_EINVAL, "result.items[0]: expected an object, got integer");
    assert_err(dec_reply(WIRE_OP_ECT_READY, 8, "{\"ok\":true,\"result\":null}"), ECT_EINVAL,
               "result: expected an object, got null");
#undef ITEM
#undef READY_REP
    /* the encoder refuses what the decoder refuses */
    it[1].seq = 1;
    assert_err(wire_ctl_encode_reply(&r, &enc), ECT_EINVAL, "items[1].seq");
    it[1].seq = 3;
    r.u.ready.next = 2;
    assert_err(wire_ctl_encode_reply(&r, &enc), ECT_EINVAL, "items[1].seq");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_requests),
        cmocka_unit_test(test_golden_replies),
        cmocka_unit_test(test_golden_events),
        cmocka_unit_test(test_fast_event_decoder),
        cmocka_unit_test(test_fast_event_port),
        cmocka_unit_test(test_decode_failure_replies),
        cmocka_unit_test(test_goldens_are_the_documented_examples),
        cmocka_unit_test(test_random_round_trips),
        cmocka_unit_test(test_spare_frames),
        cmocka_unit_test(test_fast_path_takes_the_hot_frames),
        cmocka_unit_test(test_reject_wrong_type),
        cmocka_unit_test(test_reject_missing_field),
        cmocka_unit_test(test_reject_bad_integers),
        cmocka_unit_test(test_reject_truncated),
        cmocka_unit_test(test_reject_trailing_and_nul),
        cmocka_unit_test(test_reject_nesting_and_size),
        cmocka_unit_test(test_reject_over_bounds),
        cmocka_unit_test(test_reject_mismatched_lengths),
        cmocka_unit_test(test_unknown_ops),
        cmocka_unit_test(test_extra_keys_ignored_and_batch_items_judged_alone),
        cmocka_unit_test(test_encoders_refuse_what_decoders_refuse),
        cmocka_unit_test(test_out_of_memory_fails_cleanly),
        cmocka_unit_test(test_mutations_never_crash),
        cmocka_unit_test(test_shm_id),
        cmocka_unit_test(test_ect_ready_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
