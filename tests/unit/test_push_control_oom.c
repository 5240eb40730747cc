/*
 * Out-of-memory tests for the control server's request handler: for each op
 * (after a setup that gives it something to act on), every heap allocation
 * the call makes is failed in turn (a countdown over this program's
 * malloc/calloc/realloc). The call must return 0 with a reply that is a JSON
 * object, or ECT_ENOMEM; the table's invariants must hold; and once the
 * shard is closed, nothing is leaked and every pool byte is back.
 *
 * Interposing malloc conflicts with the sanitizers' own, so under ASan or
 * TSan these tests are skipped.
 */
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "testutil.h"
#include "push/control_server.h"
#include "wire/control_msg.h"

#include "oom_inject.h"

/* ---- fake pool: distinct slots, counts bytes */
#define SLOTS 32
static struct {
    bool live[SLOTS];
    uint64_t size[SLOTS], used;
} P;

static int p_alloc(void *ctx, uint64_t n, uint64_t *off) {
    (void)ctx;
    for (int i = 0; i < SLOTS; i++)
        if (!P.live[i]) {
            P.live[i] = true;
            P.size[i] = n;
            P.used += n;
            *off = (uint64_t)i << 20;
            return 0;
        }
    return ECT_EFULL;
}

static void p_free(void *ctx, uint64_t off, uint64_t n) {
    (void)ctx;
    int i = (int)(off >> 20);
    assert_true(i < SLOTS && P.live[i] && P.size[i] == n);
    P.live[i] = false;
    P.used -= n;
}

static const rsv_mem_ops ops = {p_alloc, p_free, NULL};

static ctl_server *open_shard(void) {
    ctl_server_opts o;
    ctl_server_opts_init(&o);
    o.detached = true;
    o.port = 14579;
    o.rsv.mem = &ops;
    o.dst_session = "127.0.0.1:1";
    o.transport = "tcp";
    o.dst_key = "00000000000000aa";
    ctl_server *s = NULL;
    assert_int_equal(ctl_server_open(NULL, &o, &s), 0);
    return s;
}

static void handle_ok(ctl_server *s, const char *frame) {
    char *rep = NULL;
    assert_int_equal(ctl_server_handle(s, frame, strlen(frame), 1000, &rep), 0);
    free(rep);
}

#define R1                                                                                         \
    "{\"op\":\"reserve\",\"transfer_id\":\"t1\",\"mm_hash\":\"h1\",\"nbytes\":8,\"shape\":[4],"    \
    "\"dtype\":\"bfloat16\"}"

static const char *const setup[] = {R1, NULL};
static const char *const frames[] = {
    R1,
    "{\"op\":\"reserve\",\"transfer_id\":\"t2\",\"mm_hash\":\"h2\",\"nbytes\":8,\"shape\":[4],"
    "\"dtype\":\"bfloat16\"}",
    "{\"op\":\"reserve_batch\",\"items\":[{\"transfer_id\":\"a\",\"mm_hash\":\"h1\",\"nbytes\":8,"
    "\"shape\":[4],\"dtype\":\"bfloat16\"},{\"transfer_id\":\"b\",\"mm_hash\":\"hb\",\"nbytes\":2,"
    "\"shape\":[1],\"dtype\":\"float16\"},{\"transfer_id\":\"c\"}]}",
    "{\"op\":\"status\",\"transfer_id\":\"t1\"}",
    "{\"op\":\"complete\",\"transfer_id\":\"t1\",\"reservation_id\":\"nope\"}",
    "{\"op\":\"complete_batch\",\"items\":[{\"transfer_id\":\"t1\",\"reservation_id\":\"x\"}]}",
    "{\"op\":\"cancel\",\"transfer_id\":\"t1\",\"abandon\":true}",
    "{\"op\":\"cancel\",\"transfer_id\":\"new\"}",
    "{\"op\":\"peers\"}",
    "{\"op\":\"what\"}",
    "{broken",
};

/* Runs every frame after `setup_n` setup frames (0: an empty table, where
 * the first insert also allocates the hash tables). */
static void run_frames(size_t setup_n) {
    for (size_t f = 0; f < sizeof frames / sizeof frames[0]; f++) {
        int k;
        for (k = 0; k < 10000; k++) {
            memset(&P, 0, sizeof P);
            long before = live;
            ctl_server *s = open_shard();
            for (size_t i = 0; i < setup_n && setup[i]; i++) handle_ok(s, setup[i]);
            char *rep = NULL;
            countdown = k;
            int rc = ctl_server_handle(s, frames[f], strlen(frames[f]), 2000, &rep);
            bool exhausted = countdown > 0;
            countdown = -1;
            if (rc == 0) {
                assert_non_null(rep);
                json_error_t err;
                json_t *v = json_loads(rep, 0, &err);
                assert_non_null(v);
                assert_true(json_is_boolean(json_object_get(v, "ok")));
                json_decref(v);
            } else {
                assert_int_equal(rc, ECT_ENOMEM);
                assert_null(rep);
            }
            free(rep);
            assert_int_equal(ctl_server_check(s), 0);
            ctl_server_close(s);
            assert_int_equal(P.used, 0);
            assert_int_equal(live, before);
            if (exhausted) break; /* the call made fewer than k allocations */
        }
        assert_true(k > 0);
    }
}

static void test_handler_oom(void **state) {
    (void)state;
    SKIP_UNDER_SANITIZER();
    run_frames(1);
}

static void test_handler_oom_empty_table(void **state) {
    (void)state;
    SKIP_UNDER_SANITIZER();
    run_frames(0);
}

/* The shard's kept batch memory (wire_ctl_keep): once a reserve_batch or
 * complete_batch of 32 items was decoded into it, the next decodes into it
 * allocate nothing at all (every allocation fails, the decode still
 * succeeds and reads back), where a plain decode fails; a reply's items in
 * kept memory lose their strings at clear, not the array. */
#define KEPT_N 32
static void batch_frame(char *out, size_t cap, bool reserve) {
    size_t at = (size_t)snprintf(out, cap, "{\"op\":\"%s\",\"items\":[",
                                 reserve ? "reserve_batch" : "complete_batch");
    for (int i = 0; i < KEPT_N; i++)
        at += (size_t)snprintf(out + at, cap - at,
                               reserve ? "%s{\"transfer_id\":\"t%d\",\"mm_hash\":\"h%d\","
                                         "\"nbytes\":8,\"shape\":[4],\"dtype\":\"bfloat16\"}"
                                       : "%s{\"transfer_id\":\"t%d\",\"reservation_id\":\"r%d\"}",
                               i ? "," : "", i, i);
    snprintf(out + at, cap - at, "]}");
}

static void test_kept_decode_allocates_nothing(void **state) {
    (void)state;
    SKIP_UNDER_SANITIZER();
    static char frame[8192];
    wire_ctl_keep keep = {0};
    for (int reserve = 1; reserve >= 0; reserve--) {
        batch_frame(frame, sizeof frame, reserve);
        wire_ctl_request q;
        assert_int_equal(wire_ctl_decode_request_kept(frame, strlen(frame), &q, &keep), 0);
        wire_ctl_request_clear_kept(&q, &keep);
        for (int round = 0; round < 2; round++) {
            countdown = 0; /* every allocation fails */
            int rc = wire_ctl_decode_request_kept(frame, strlen(frame), &q, &keep);
            countdown = -1;
            assert_int_equal(rc, 0);
            char want[16];
            for (int i = 0; i < KEPT_N; i++) {
                snprintf(want, sizeof want, "t%d", i);
                if (reserve) {
                    assert_int_equal(q.u.reserve_batch.n, KEPT_N);
                    assert_int_equal(q.u.reserve_batch.items[i].rc, 0);
                    assert_string_equal(q.u.reserve_batch.items[i].req.transfer_id, want);
                    assert_int_equal(q.u.reserve_batch.items[i].req.tensor.nbytes, 8);
                    assert_int_equal(q.u.reserve_batch.items[i].req.tensor.ndim, 1);
                } else {
                    assert_int_equal(q.u.complete_batch.n, KEPT_N);
                    assert_string_equal(q.u.complete_batch.items[i].transfer_id, want);
                }
            }
            long before = live;
            wire_ctl_request_clear_kept(&q, &keep);
            assert_int_equal(live, before); /* the kept array stays */
        }
        countdown = 0;
        wire_ctl_request plain;
        int rc = wire_ctl_decode_request(frame, strlen(frame), &plain);
        countdown = -1;
        assert_int_equal(rc, ECT_ENOMEM);
    }
    wire_ctl_reply rep = {.op = WIRE_OP_RESERVE_BATCH, .ok = true};
    assert_true(wire_ctl_keep_reserve(&keep, 2 * sizeof(wire_reserve_outcome)));
    rep.u.reserve_batch.items = keep.mem;
    rep.u.reserve_batch.n = 2;
    memset(keep.mem, 0, 2 * sizeof(wire_reserve_outcome));
    long before = live;
    rep.u.reserve_batch.items[0].error = strdup("no");
    rep.u.reserve_batch.items[1].result.dst_key = strdup("k");
    wire_ctl_reply_clear_kept(&rep, &keep);
    assert_int_equal(live, before); /* both strings freed, the array not */
    assert_null(((wire_reserve_outcome *)keep.mem)[0].error);
    wire_ctl_keep_free(&keep);
    assert_int_equal(live, before - 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handler_oom),
        cmocka_unit_test(test_handler_oom_empty_table),
        cmocka_unit_test(test_kept_decode_allocates_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
