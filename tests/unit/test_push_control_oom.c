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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handler_oom),
        cmocka_unit_test(test_handler_oom_empty_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
