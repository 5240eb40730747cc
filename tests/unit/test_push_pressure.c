/*
 * Back-pressure end to end, in one process: a real consumer instance (TP 1
 * or 4 ect_push_consumer shards over tcp or shm, each pool holding exactly 8
 * items of 4.5 MiB) with its scheduler and an "engine" thread that takes
 * every arrived item on every rank, checks its XXH64 against the producer's,
 * and releases it; a real ect_push_producer pushing 200 such items in steps
 * of 8 through a staging pool that holds 16. Both pools are far too small
 * for the workload, so every run goes through full refusals, give-backs,
 * retries and staging waits; the tests assert outcomes only (every item
 * arrives checksum-equal, nothing fails, pools drain), never how long
 * anything took. Variants: a slowed engine (it sleeps before each take), and
 * an engine that never releases, where every further item must fail at its
 * push wait saying the consumer stayed full, and both pools must return to
 * zero used bytes once the held items are let go. And with many steps of
 * small items in flight at once (no pressure), the consumer hands items out
 * in exactly the order they were pushed.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include <xxhash.h>

#include "testutil.h"
#include "util/util.h"

#define MAXTP 4
#define ITEM_ROWS 576
#define ITEM_COLS 4096
#define ITEM_BYTES ((uint64_t)ITEM_ROWS * ITEM_COLS * 2) /* 4.5 MiB bfloat16 */
#define POOL_ITEMS 8
#define STAGING_ITEMS 16
#define MAX_ITEMS 256
#define DEADLINE_MS 600000 /* generous: only a hang reaches it */

static void inst_open(test_inst *in, int tp, const char *transport) {
    ect_push_consumer_opts o;
    ect_push_consumer_opts_init(&o);
    o.pool_size = POOL_ITEMS * ITEM_BYTES; /* exactly 8 items (256-aligned) */
    o.transport = transport;
    test_inst_open(in, tp, &o);
}

/* Every rank: nothing live once its items were released, and after dropping
 * the resident copies nothing in use. */
static void inst_close_drained(test_inst *in) {
    for (int r = 0; r < in->tp; r++) {
        ect_push_consumer_stat st;
        ect_push_consumer_stats(in->c[r], &st);
        assert_int_equal(st.live, 0);
        assert_true(st.peak_live <= POOL_ITEMS + MAX_ITEMS);
        ect_push_consumer_evict(in->c[r], SIZE_MAX);
        ect_push_consumer_stats(in->c[r], &st);
        assert_int_equal(st.pool_used, 0);
        ect_push_consumer_close(in->c[r]);
    }
}

/* ---- the consumer's engine: its own thread owns the scheduler */
typedef struct engine {
    test_inst *in;
    int slow_ms;              /* sleep before each take */
    bool hold;                /* never release what it took */
    uint64_t want[MAX_ITEMS]; /* the producer's checksums, by item index */
    atomic_bool want_set[MAX_ITEMS];
    atomic_int verified, mismatched, failed;
    atomic_bool stop;
    ect_push_view held[MAX_ITEMS][MAXTP];
    int n_held;
    pthread_t th;
} engine;

static int index_of(const char *tid) {
    const char *dash = strrchr(tid, '-');
    return dash ? atoi(dash + 1) : -1;
}

static void *engine_main(void *arg) {
    engine *e = arg;
    ect_push_scheduler_opts so;
    ect_push_scheduler_opts_init(&so);
    so.consumer_port = e->in->base;
    so.tp_size = e->in->tp;
    so.accept_any = 1;
    ect_push_scheduler *s = NULL;
    assert_int_equal(ect_push_scheduler_open(&so, &s), 0);
    while (!atomic_load(&e->stop)) {
        ect_push_scheduler_poll(s);
        ect_push_sched_item it;
        bool any = false;
        while (ect_push_scheduler_next(s, &it) == 0) {
            any = true;
            if (e->slow_ms) test_nap_ms(e->slow_ms);
            int k = index_of(it.transfer_id);
            assert_true(k >= 0 && k < MAX_ITEMS);
            ect_push_view v[MAXTP];
            bool ok = true;
            for (int r = 0; r < e->in->tp; r++) {
                assert_int_equal(ect_push_consumer_take(e->in->c[r], it.transfer_id, &v[r]), 0);
                uint64_t got = XXH64(v[r].data, v[r].nbytes, 0);
                while (!atomic_load(&e->want_set[k])) test_nap_ms(1); /* set before reserve */
                ok &= got == e->want[k] && v[r].nbytes == ITEM_BYTES;
                assert_string_equal(v[r].dtype, "bfloat16"); /* reserved as torch.bfloat16 */
            }
            atomic_fetch_add(ok ? &e->verified : &e->mismatched, 1);
            if (e->hold) {
                memcpy(e->held[e->n_held++], v, sizeof v);
                continue;
            }
            for (int r = 0; r < e->in->tp; r++)
                assert_int_equal(ect_push_consumer_release(e->in->c[r], &v[r]), 0);
            assert_int_equal(ect_push_scheduler_loaded(s, it.transfer_id), 0);
            assert_int_equal(ect_push_scheduler_cancel(s, it.transfer_id), 0);
        }
        while (ect_push_scheduler_next_failed(s, &it) == 0) atomic_fetch_add(&e->failed, 1);
        if (!any) test_nap_ms(1);
    }
    ect_push_scheduler_close(s);
    return NULL;
}

static void engine_start(engine *e, test_inst *in, int slow_ms, bool hold) {
    memset(e, 0, sizeof *e);
    e->in = in;
    e->slow_ms = slow_ms;
    e->hold = hold;
    assert_int_equal(pthread_create(&e->th, NULL, engine_main, e), 0);
}

static void engine_stop(engine *e) {
    atomic_store(&e->stop, true);
    pthread_join(e->th, NULL);
}

/* Lets go of what a holding engine took (the test's thread, after stop). */
static void engine_release_held(engine *e) {
    for (int i = 0; i < e->n_held; i++)
        for (int r = 0; r < e->in->tp; r++)
            assert_int_equal(ect_push_consumer_release(e->in->c[r], &e->held[i][r]), 0);
    e->n_held = 0;
}

/* ---- the producer side */
static ect_push_producer *producer_open(uint64_t push_wait_ms) {
    ect_push_producer_opts o;
    ect_push_producer_opts_init(&o);
    o.staging_size = STAGING_ITEMS * ITEM_BYTES;
    if (push_wait_ms) o.push_wait_ms = push_wait_ms;
    ect_push_producer *p = NULL;
    assert_int_equal(ect_push_producer_open(&o, &p), 0);
    return p;
}

/* Pushes items [first, first + n) in steps of 8, copying each from one
 * scratch buffer (the staging pool keeps the copy); records each checksum for
 * the engine. With `prime`, the first flush comes only after 16 items: the
 * 17th reserve then finds the staging pool full of unflushed items, which it
 * must hand over and wait for, and the 16 go out in one reserve_batch to a
 * pool that holds 8 — so both kinds of back-pressure happen on any machine,
 * however fast or slow. Returns when every item has a result; fills *done /
 * *failed and the largest retry count. */
static void push_items(ect_push_producer *p, engine *e, const char *prefix, int first, int n,
                       const char *consumer, int *done, int *failed, uint32_t *max_retries,
                       const char *want_error, bool prime) {
    uint64_t *buf = malloc(ITEM_BYTES);
    assert_non_null(buf);
    const uint64_t shape[2] = {ITEM_ROWS, ITEM_COLS};
    for (int i = first; i < first + n; i++) {
        for (size_t w = 0; w < ITEM_BYTES / 8; w++)
            buf[w] = (uint64_t)i * 0x9e3779b97f4a7c15ull + w;
        e->want[i] = XXH64(buf, ITEM_BYTES, 0);
        atomic_store(&e->want_set[i], true);
        char tid[64], hash[64];
        snprintf(tid, sizeof tid, "%s-%d", prefix, i);
        snprintf(hash, sizeof hash, "h-%s-%d", prefix, i);
        ect_push_item it = {.transfer_id = tid,
                            .consumer = consumer,
                            .mm_hash = hash,
                            .shape = shape,
                            .ndim = 2,
                            .dtype = "torch.bfloat16",
                            .nbytes = ITEM_BYTES,
                            .data = buf};
        /* the staging pool holds 16: this waits for room as pushes finish */
        assert_int_equal(ect_push_producer_reserve(p, &it), 0);
        if ((i - first) % 8 == 7 && (!prime || i - first >= STAGING_ITEMS))
            ect_push_producer_flush(p);
    }
    ect_push_producer_flush(p);
    free(buf);
    *done = *failed = 0;
    *max_retries = 0;
    uint64_t end = ect_now_ms() + DEADLINE_MS;
    ect_push_result r[16];
    while (*done + *failed < n) {
        assert_true(ect_now_ms() < end);
        size_t got = ect_push_producer_poll(p, r, 16, 1000);
        for (size_t i = 0; i < got; i++) {
            if (r[i].status == 0) {
                (*done)++;
            } else {
                (*failed)++;
                if (want_error) {
                    if (!strstr(r[i].error, want_error))
                        fail_msg("%s failed: %s", r[i].transfer_id, r[i].error);
                } else {
                    fail_msg("%s failed: %s", r[i].transfer_id, r[i].error);
                }
            }
            if (r[i].retries > *max_retries) *max_retries = r[i].retries;
        }
    }
}

static void wait_verified(engine *e, int n) {
    uint64_t end = ect_now_ms() + DEADLINE_MS;
    while (atomic_load(&e->verified) + atomic_load(&e->mismatched) < n) {
        assert_true(ect_now_ms() < end);
        test_nap_ms(5);
    }
}

static void run_pressure(int tp, const char *transport, int slow_ms) {
    test_inst in;
    inst_open(&in, tp, transport);
    engine e;
    engine_start(&e, &in, slow_ms, false);
    ect_push_producer *p = producer_open(0);
    char consumer[64];
    snprintf(consumer, sizeof consumer, "127.0.0.1:%d", in.base);
    enum { N = 200 };
    int done, failed;
    uint32_t max_retries;
    push_items(p, &e, "pr", 0, N, consumer, &done, &failed, &max_retries, NULL, true);
    assert_int_equal(done, N);
    assert_int_equal(failed, 0);
    wait_verified(&e, N);
    assert_int_equal(atomic_load(&e.verified), N);
    assert_int_equal(atomic_load(&e.mismatched), 0);
    assert_int_equal(atomic_load(&e.failed), 0);
    ect_push_producer_stat ps;
    ect_push_producer_stats(p, &ps);
    /* the pressure was real (by construction, see push_items): the consumer
     * refused, the producer waited */
    assert_true(ps.full_refusals > 0 && ps.retries > 0 && max_retries > 0);
    assert_true(ps.staging_waits > 0);
    assert_int_equal(ps.done, N);
    assert_int_equal(ps.failed, 0);
    assert_int_equal(ps.staged_bytes_in_use, 0);
    print_message("tp %d %s slow %d ms: %" PRIu64 " full refusals, %" PRIu64
                  " retry rounds (at most %u for one item), %" PRIu64 " give-backs, %" PRIu64
                  " staging waits\n",
                  tp, transport, slow_ms, ps.full_refusals, ps.retries, max_retries, ps.give_backs,
                  ps.staging_waits);
    engine_stop(&e);
    ect_push_producer_close(p);
    for (int r = 0; r < tp; r++) {
        ect_push_consumer_stat cs;
        ect_push_consumer_stats(in.c[r], &cs);
        assert_true(cs.refused_full > 0);
        assert_int_equal(cs.finished, N);
        assert_int_equal(cs.expired, 0);
        assert_true(cs.peak_held <= POOL_ITEMS * ITEM_BYTES);
    }
    inst_close_drained(&in);
}

static void test_tcp_tp1(void **st) {
    (void)st;
    run_pressure(1, "tcp", 0);
}
static void test_tcp_tp4(void **st) {
    (void)st;
    run_pressure(4, "tcp", 0);
}
static void test_shm_tp1(void **st) {
    (void)st;
    run_pressure(1, "shm", 0);
}
static void test_shm_tp4(void **st) {
    (void)st;
    run_pressure(4, "shm", 0);
}
static void test_slow_engine_tcp_tp4(void **st) {
    (void)st;
    run_pressure(4, "tcp", 3);
}
static void test_slow_engine_shm_tp1(void **st) {
    (void)st;
    run_pressure(1, "shm", 3);
}

/* An engine that takes but never releases: the pools fill with the first 8
 * items; every later item waits, then fails at its push wait with the cause,
 * and neither pool keeps anything of the failed items. */
static void test_never_released(void **st) {
    (void)st;
    test_inst in;
    inst_open(&in, 2, "tcp");
    engine e;
    engine_start(&e, &in, 0, true);
    ect_push_producer *p = producer_open(1500);
    char consumer[64];
    snprintf(consumer, sizeof consumer, "127.0.0.1:%d", in.base);
    int done, failed;
    uint32_t max_retries;
    push_items(p, &e, "hold", 0, POOL_ITEMS, consumer, &done, &failed, &max_retries, NULL, false);
    assert_int_equal(done, POOL_ITEMS);
    wait_verified(&e, POOL_ITEMS);
    enum { LATER = 24 };
    push_items(p, &e, "late", POOL_ITEMS, LATER, consumer, &done, &failed, &max_retries,
               "stayed full", false);
    assert_int_equal(done, 0);
    assert_int_equal(failed, LATER);
    ect_push_producer_stat ps;
    ect_push_producer_stats(p, &ps);
    assert_int_equal(ps.staged_bytes_in_use, 0);
    assert_int_equal(ps.failed, LATER);
    /* the consumer holds exactly the 8 taken items, nothing of the failed ones */
    for (int r = 0; r < in.tp; r++) {
        ect_push_consumer_stat cs;
        ect_push_consumer_stats(in.c[r], &cs);
        assert_int_equal(cs.live, POOL_ITEMS);
        assert_int_equal(cs.pool_used, POOL_ITEMS * ITEM_BYTES);
        assert_true(cs.refused_full > 0);
    }
    engine_stop(&e);
    assert_int_equal(atomic_load(&e.verified), POOL_ITEMS);
    engine_release_held(&e);
    ect_push_producer_close(p);
    inst_close_drained(&in);
}

/* ---- steps in flight keep per-consumer FIFO order */

#define FIFO_N 240
#define FIFO_STEP 8
#define FIFO_BYTES (64u << 10)

typedef struct orderly {
    test_inst *in;
    int seen[FIFO_N]; /* item indexes in the order the scheduler handed them out */
    atomic_int n_seen;
    atomic_bool stop;
    pthread_t th;
} orderly;

/* The scheduler's thread: records the order items arrive in, takes and
 * releases each on every rank (checking its bytes). */
static void *orderly_main(void *arg) {
    orderly *o = arg;
    ect_push_scheduler_opts so;
    ect_push_scheduler_opts_init(&so);
    so.consumer_port = o->in->base;
    so.tp_size = o->in->tp;
    so.accept_any = 1;
    ect_push_scheduler *s = NULL;
    assert_int_equal(ect_push_scheduler_open(&so, &s), 0);
    while (!atomic_load(&o->stop)) {
        ect_push_scheduler_poll(s);
        ect_push_sched_item it;
        bool any = false;
        while (ect_push_scheduler_next(s, &it) == 0) {
            any = true;
            int k = index_of(it.transfer_id), n = atomic_load(&o->n_seen);
            assert_true(k >= 0 && k < FIFO_N && n < FIFO_N);
            o->seen[n] = k;
            for (int r = 0; r < o->in->tp; r++) {
                ect_push_view v;
                assert_int_equal(ect_push_consumer_take(o->in->c[r], it.transfer_id, &v), 0);
                assert_int_equal(v.nbytes, FIFO_BYTES);
                assert_int_equal(((const uint8_t *)v.data)[0], (uint8_t)k);
                assert_int_equal(((const uint8_t *)v.data)[FIFO_BYTES - 1], (uint8_t)(k * 7));
                assert_int_equal(ect_push_consumer_release(o->in->c[r], &v), 0);
            }
            assert_int_equal(ect_push_scheduler_loaded(s, it.transfer_id), 0);
            assert_int_equal(ect_push_scheduler_cancel(s, it.transfer_id), 0);
            atomic_store(&o->n_seen, n + 1);
        }
        if (!any) test_nap_ms(1);
    }
    ect_push_scheduler_close(s);
    return NULL;
}

/* 240 items of 64 KiB in 30 steps of 8, every step flushed at once without
 * waiting for the previous ones (many steps in flight; the pool holds them
 * all, so no refusal reorders anything): every item lands, and the consumer
 * hands them out in exactly the order they were pushed. */
static void run_fifo(int tp, const char *transport) {
    test_inst in;
    inst_open(&in, tp, transport);
    orderly o;
    memset(&o, 0, sizeof o);
    o.in = &in;
    assert_int_equal(pthread_create(&o.th, NULL, orderly_main, &o), 0);
    ect_push_producer *p = producer_open(0);
    char consumer[64];
    snprintf(consumer, sizeof consumer, "127.0.0.1:%d", in.base);
    uint8_t *buf = malloc(FIFO_BYTES);
    assert_non_null(buf);
    const uint64_t shape[1] = {FIFO_BYTES / 2};
    for (int i = 0; i < FIFO_N; i++) {
        memset(buf, i, FIFO_BYTES);
        buf[FIFO_BYTES - 1] = (uint8_t)(i * 7);
        char tid[64], hash[64];
        snprintf(tid, sizeof tid, "fifo-%d", i);
        snprintf(hash, sizeof hash, "h-fifo-%d", i);
        ect_push_item it = {.transfer_id = tid,
                            .consumer = consumer,
                            .mm_hash = hash,
                            .shape = shape,
                            .ndim = 1,
                            .dtype = "torch.bfloat16",
                            .nbytes = FIFO_BYTES,
                            .data = buf}; /* copied into the staging pool */
        assert_int_equal(ect_push_producer_reserve(p, &it), 0);
        if (i % FIFO_STEP == FIFO_STEP - 1) ect_push_producer_flush(p);
    }
    ect_push_producer_flush(p);
    free(buf);
    int done = 0;
    uint64_t end = ect_now_ms() + DEADLINE_MS;
    ect_push_result r[16];
    while (done < FIFO_N) {
        assert_true(ect_now_ms() < end);
        size_t got = ect_push_producer_poll(p, r, 16, 1000);
        for (size_t i = 0; i < got; i++) {
            if (r[i].status) fail_msg("%s failed: %s", r[i].transfer_id, r[i].error);
            assert_int_equal(r[i].retries, 0);
            done++;
        }
    }
    while (atomic_load(&o.n_seen) < FIFO_N) {
        assert_true(ect_now_ms() < end);
        test_nap_ms(2);
    }
    atomic_store(&o.stop, true);
    pthread_join(o.th, NULL);
    for (int i = 0; i < FIFO_N; i++)
        if (o.seen[i] != i) fail_msg("arrival %d is item %d, not %d", i, o.seen[i], i);
    ect_push_producer_stat ps;
    ect_push_producer_stats(p, &ps);
    assert_int_equal(ps.done, FIFO_N);
    assert_int_equal(ps.full_refusals, 0);
    ect_push_producer_close(p);
    inst_close_drained(&in);
}

static void test_fifo_steps_in_flight_tcp(void **st) {
    (void)st;
    run_fifo(1, "tcp");
    run_fifo(2, "tcp");
}

static void test_fifo_steps_in_flight_shm(void **st) {
    (void)st;
    run_fifo(1, "shm");
}

int main(void) {
    ect_log_set_level(ECT_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_tp1),
        cmocka_unit_test(test_tcp_tp4),
        cmocka_unit_test(test_shm_tp1),
        cmocka_unit_test(test_shm_tp4),
        cmocka_unit_test(test_slow_engine_tcp_tp4),
        cmocka_unit_test(test_slow_engine_shm_tp1),
        cmocka_unit_test(test_never_released),
        cmocka_unit_test(test_fifo_steps_in_flight_tcp),
        cmocka_unit_test(test_fifo_steps_in_flight_shm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
