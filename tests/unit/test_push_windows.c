/*
 * Tests for the control server's write windows (docs/PROTOCOL.md "Write
 * windows"): a window lives exactly while its reservation is the WRITING
 * writer it was opened for. A detached shard with a fake transport that
 * records which windows are open; after each request the open set is
 * checked: a complete or cancel closes the named item's window and no
 * other, a complete with a stale reservation id closes nothing, and a
 * writer the table expires by itself (a reserve's own reap, not the
 * shard's reaper) loses its window with that very request.
 */
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "testutil.h"
#include "push/control_server.h"

#define SLOTS 80 /* more than the shard keeps spare window entries for (64) */
#define TTL_MS 100

/* ---- fake pool: distinct slots */
static bool live[SLOTS];

static int p_alloc(void *ctx, uint64_t n, uint64_t *off) {
    (void)ctx, (void)n;
    for (int i = 0; i < SLOTS; i++)
        if (!live[i]) {
            live[i] = true;
            *off = (uint64_t)i << 20;
            return 0;
        }
    return ECT_EFULL;
}

static void p_free(void *ctx, uint64_t off, uint64_t n) {
    (void)ctx, (void)n;
    assert_true(live[off >> 20]);
    live[off >> 20] = false;
}

static const rsv_mem_ops ops = {p_alloc, p_free, NULL};

/* ---- fake transport: the open windows, by key (each key new) */
#define MAX_OPEN 96
static char open_keys[MAX_OPEN][32];
static int n_opened;

static int w_open(void *ctx, uint64_t off, uint64_t nbytes, char key[ECT_XPORT_KEY_MAX]) {
    (void)ctx, (void)nbytes;
    for (int i = 0; i < MAX_OPEN; i++)
        if (!open_keys[i][0]) {
            snprintf(key, ECT_XPORT_KEY_MAX, "w%d-%llu", n_opened++,
                     (unsigned long long)(off >> 20));
            snprintf(open_keys[i], sizeof open_keys[0], "%s", key);
            return 0;
        }
    fail_msg("more than %d windows open", MAX_OPEN);
    return ECT_EFULL;
}

static void w_close(void *ctx, const char *key) {
    (void)ctx;
    for (int i = 0; i < MAX_OPEN; i++)
        if (strcmp(open_keys[i], key) == 0) {
            open_keys[i][0] = '\0';
            return;
        }
    fail_msg("closed a window that is not open: %s", key);
}

/* The shard's batched close (ctl_server_opts.win_close_many): when
 * batch_closes is set, open_shard hands it and the calls are counted. */
static bool batch_closes;
static int n_close_calls;
static size_t last_close_n;

static void w_close_many(void *ctx, const char *const *keys, size_t n) {
    n_close_calls++;
    last_close_n = n;
    for (size_t i = 0; i < n; i++) w_close(ctx, keys[i]);
}

static bool is_open(const char *key) {
    for (int i = 0; i < MAX_OPEN; i++)
        if (strcmp(open_keys[i], key) == 0) return true;
    return false;
}

static int n_open(void) {
    int n = 0;
    for (int i = 0; i < MAX_OPEN; i++) n += open_keys[i][0] != '\0';
    return n;
}

static ctl_server *open_shard(void) {
    memset(live, 0, sizeof live);
    memset(open_keys, 0, sizeof open_keys);
    ctl_server_opts o;
    ctl_server_opts_init(&o);
    o.detached = true;
    o.port = 14581;
    o.rsv.mem = &ops;
    o.rsv.ttl_ms = TTL_MS;
    o.dst_session = "127.0.0.1:1";
    o.transport = "shm";
    o.win_open = w_open;
    o.win_close = w_close;
    o.win_close_many = batch_closes ? w_close_many : NULL;
    n_close_calls = 0;
    ctl_server *s = NULL;
    assert_int_equal(ctl_server_open(NULL, &o, &s), 0);
    return s;
}

/* The reply to frame at now, parsed; asserts it is ok. */
static json_t *call(ctl_server *s, const char *frame, uint64_t now) {
    char *rep = NULL;
    assert_int_equal(ctl_server_handle(s, frame, strlen(frame), now, &rep), 0);
    json_error_t err;
    json_t *v = json_loads(rep, 0, &err);
    assert_non_null(v);
    if (!json_is_true(json_object_get(v, "ok"))) fail_msg("refused: %s", rep);
    free(rep);
    return v;
}

typedef struct held {
    char rid[64], key[32];
} held;

static void held_from(const json_t *res, held *h) {
    const char *rid = json_string_value(json_object_get(res, "reservation_id"));
    const char *key = json_string_value(json_object_get(res, "dst_key"));
    assert_non_null(rid);
    assert_non_null(key);
    assert_true(json_is_true(json_object_get(res, "write")));
    snprintf(h->rid, sizeof h->rid, "%s", rid);
    snprintf(h->key, sizeof h->key, "%s", key);
}

static void reserve(ctl_server *s, const char *tid, uint64_t now, held *h) {
    char f[3072]; /* room for any tid the compiler can see (a row of a 2-D array) */
    snprintf(f, sizeof f,
             "{\"op\":\"reserve\",\"transfer_id\":\"%s\",\"mm_hash\":\"h-%s\",\"nbytes\":8,"
             "\"shape\":[4],\"dtype\":\"bfloat16\"}",
             tid, tid);
    json_t *v = call(s, f, now);
    held_from(json_object_get(v, "result"), h);
    json_decref(v);
}

static void complete(ctl_server *s, const char *tid, const char *rid, uint64_t now) {
    char f[256];
    snprintf(f, sizeof f, "{\"op\":\"complete\",\"transfer_id\":\"%s\",\"reservation_id\":\"%s\"}",
             tid, rid);
    json_decref(call(s, f, now));
}

/* The items (and bytes) the shard counted as received. */
static void assert_received(ctl_server *s, uint64_t items) {
    ctl_counters c;
    ctl_server_counters(s, &c);
    assert_int_equal(c.items_in, items);
    assert_int_equal(c.bytes_in, items * 8);
}

/* Complete, complete_batch and cancel each close the named item's window
 * and no other; a stale reservation id closes nothing; each item that
 * became READY is counted once, with its bytes. */
static void test_ops_close_their_window(void **state) {
    (void)state;
    ctl_server *s = open_shard();
    held a, b, c, d;
    json_t *v = call(s,
                     "{\"op\":\"reserve_batch\",\"items\":["
                     "{\"transfer_id\":\"a\",\"mm_hash\":\"ha\",\"nbytes\":8,\"shape\":[4],"
                     "\"dtype\":\"bfloat16\"},"
                     "{\"transfer_id\":\"b\",\"mm_hash\":\"hb\",\"nbytes\":8,\"shape\":[4],"
                     "\"dtype\":\"bfloat16\"}]}",
                     10);
    json_t *items = json_object_get(json_object_get(v, "result"), "items");
    assert_int_equal(json_array_size(items), 2);
    held_from(json_object_get(json_array_get(items, 0), "result"), &a);
    held_from(json_object_get(json_array_get(items, 1), "result"), &b);
    json_decref(v);
    reserve(s, "c", 10, &c);
    reserve(s, "d", 10, &d);
    assert_int_equal(n_open(), 4);

    complete(s, "a", a.rid, 20);
    assert_false(is_open(a.key));
    assert_int_equal(n_open(), 3);
    assert_received(s, 1);
    complete(s, "a", a.rid, 21); /* again: READY already, not counted twice */
    assert_received(s, 1);

    complete(s, "b", "stale-id", 20); /* not b's writer: nothing changes */
    assert_true(is_open(b.key));
    assert_int_equal(n_open(), 3);

    char f[512];
    snprintf(f, sizeof f,
             "{\"op\":\"complete_batch\",\"items\":[{\"transfer_id\":\"b\",\"reservation_id\":"
             "\"%s\"},{\"transfer_id\":\"c\",\"reservation_id\":\"stale\"}]}",
             b.rid);
    json_decref(call(s, f, 30));
    assert_false(is_open(b.key));
    assert_true(is_open(c.key));
    assert_true(is_open(d.key));
    assert_received(s, 2);

    snprintf(f, sizeof f,
             "{\"op\":\"cancel\",\"transfer_id\":\"c\",\"reservation_id\":\"%s\",\"abandon\":true}",
             c.rid);
    json_decref(call(s, f, 40));
    assert_false(is_open(c.key));
    assert_true(is_open(d.key));
    assert_int_equal(n_open(), 1);
    assert_received(s, 2);

    /* A status op changes nothing. */
    json_decref(call(s, "{\"op\":\"status\",\"transfer_id\":\"d\"}", 40));
    assert_true(is_open(d.key));
    assert_int_equal(ctl_server_check(s), 0);
    ctl_server_close(s); /* closes d's */
    assert_int_equal(n_open(), 0);
}

/* A writer the table expires inside a reserve (its own reap), not by the
 * shard's reaper: its window closes with that request; the new writer's
 * stays until the shard's reaper expires it in turn. */
static void test_expiry_inside_reserve_closes_window(void **state) {
    (void)state;
    ctl_server *s = open_shard();
    held x, y, z;
    reserve(s, "x", 1000, &x);
    reserve(s, "y", 1000, &y);
    assert_int_equal(n_open(), 2);
    reserve(s, "z", 1000 + TTL_MS + 1, &z); /* x and y are past their TTL */
    assert_false(is_open(x.key));
    assert_false(is_open(y.key));
    assert_true(is_open(z.key));
    assert_int_equal(n_open(), 1);
    /* The expired writer's late complete changes nothing and closes nothing. */
    complete(s, "x", x.rid, 1000 + TTL_MS + 2);
    assert_true(is_open(z.key));

    ctl_server_reap(s, 1000 + 3 * TTL_MS);
    assert_false(is_open(z.key));
    assert_int_equal(n_open(), 0);
    assert_int_equal(ctl_server_check(s), 0);
    ctl_server_close(s);
}

/* Many items through the shard, more than it keeps spare window entries
 * for at first: each closes exactly its own window (w_close refuses a key
 * that is not open, so an entry reused with a stale key fails here), and
 * after the first round every entry comes from the spares (they grew to
 * the SLOTS windows open at once). */
static void test_windows_reused_across_items(void **state) {
    (void)state;
    ctl_server *s = open_shard();
    for (int round = 0; round < 40; round++) {
        held h[SLOTS];
        char tid[SLOTS][16];
        for (int i = 0; i < SLOTS; i++) {
            snprintf(tid[i], sizeof tid[i], "r%d-%d", round, i);
            reserve(s, tid[i], 10 + (uint64_t)round, &h[i]);
        }
        assert_int_equal(n_open(), SLOTS);
        for (int i = SLOTS - 1; i >= 0; i--) {
            complete(s, tid[i], h[i].rid, 10 + (uint64_t)round);
            assert_false(is_open(h[i].key));
            assert_int_equal(n_open(), i);
        }
        for (int i = 0; i < SLOTS; i++) assert_int_equal(ctl_server_finish(s, tid[i]), 0);
        ctl_counters c;
        ctl_server_counters(s, &c);
        assert_int_equal(c.window_entries, SLOTS); /* the first round's, reused since */
    }
    assert_int_equal(ctl_server_check(s), 0);
    ctl_server_close(s);
}

/* With win_close_many, every window one request ended is closed by one
 * call, before the reply: a complete_batch of 10 closes its 10 keys at
 * once; a request that ends none calls nothing. */
static void test_batch_closes_once_per_request(void **state) {
    (void)state;
    ctl_server *s = open_shard();
    enum { N = 10 };
    char f[4096];
    int k = snprintf(f, sizeof f, "{\"op\":\"reserve_batch\",\"items\":[");
    for (int i = 0; i < N; i++)
        k += snprintf(f + k, sizeof f - (size_t)k,
                      "%s{\"transfer_id\":\"t%d\",\"mm_hash\":\"h%d\",\"nbytes\":8,"
                      "\"shape\":[4],\"dtype\":\"bfloat16\"}",
                      i ? "," : "", i, i);
    snprintf(f + k, sizeof f - (size_t)k, "]}");
    json_t *v = call(s, f, 10);
    json_t *items = json_object_get(json_object_get(v, "result"), "items");
    held h[N];
    for (int i = 0; i < N; i++)
        held_from(json_object_get(json_array_get(items, (size_t)i), "result"), &h[i]);
    json_decref(v);
    assert_int_equal(n_open(), N);
    assert_int_equal(n_close_calls, 0);
    k = snprintf(f, sizeof f, "{\"op\":\"complete_batch\",\"items\":[");
    for (int i = 0; i < N; i++)
        k += snprintf(f + k, sizeof f - (size_t)k,
                      "%s{\"transfer_id\":\"t%d\",\"reservation_id\":\"%s\"}", i ? "," : "", i,
                      h[i].rid);
    snprintf(f + k, sizeof f - (size_t)k, "]}");
    json_decref(call(s, f, 20));
    assert_int_equal(n_open(), 0);
    assert_int_equal(n_close_calls, 1);
    assert_int_equal(last_close_n, N);
    assert_received(s, N);
    json_decref(call(s, "{\"op\":\"status\",\"transfer_id\":\"t0\"}", 20));
    assert_int_equal(n_close_calls, 1);
    assert_int_equal(ctl_server_check(s), 0);
    ctl_server_close(s);
}

/* The tests above again, the shard closing through win_close_many. */
static int with_batch_closes(void **state) {
    (void)state;
    batch_closes = true;
    return 0;
}

static int without_batch_closes(void **state) {
    (void)state;
    batch_closes = false;
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_close_their_window),
        cmocka_unit_test(test_expiry_inside_reserve_closes_window),
        cmocka_unit_test(test_windows_reused_across_items),
        cmocka_unit_test_setup_teardown(test_ops_close_their_window, with_batch_closes,
                                        without_batch_closes),
        cmocka_unit_test_setup_teardown(test_expiry_inside_reserve_closes_window, with_batch_closes,
                                        without_batch_closes),
        cmocka_unit_test_setup_teardown(test_windows_reused_across_items, with_batch_closes,
                                        without_batch_closes),
        cmocka_unit_test_setup_teardown(test_batch_closes_once_per_request, with_batch_closes,
                                        without_batch_closes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
