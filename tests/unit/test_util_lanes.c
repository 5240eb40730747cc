/*
 * Tests for util/lanes, the keyed worker lanes: order per key on one thread,
 * keys in parallel (a blocked key does not hold up another), the lane limit,
 * per-lane state made and ended on the lane's thread, idle lanes ending, the
 * jobs queued behind one seen (lane_has_queued) and taken back, the lanes' thread name, and
 * close with and without draining. Readiness by state (polls with generous deadlines), never by
 * sleeping.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "util/lanes.h"
#include "util/util.h"

typedef struct job {
    lane_job lj; /* first: a lane_job * is a job * */
    int key, seq;
    pthread_t ran_on;
    atomic_bool ran, cancelled;
    atomic_bool *wait_for;            /* run blocks until this is true */
    atomic_bool *set;                 /* run sets this */
    bool take_behind;                 /* run takes the jobs queued behind it */
    size_t take_max;                  /* at most this many of them (0: all) */
    bool queued_before, queued_after; /* lane_has_queued around that take */
} job;

static atomic_int starts, stops, order_errors, last_seq[8];
static lane_job *taken;
static pthread_t main_thread; /* lends in test_lend */

static void *on_start(void *ctx, const char *key) {
    (void)ctx;
    atomic_fetch_add(&starts, 1);
    return strdup(key);
}

static void wait_true(atomic_bool *b) {
    uint64_t end = ect_now_ms() + 20000;
    while (!atomic_load(b)) {
        assert_true(ect_now_ms() < end);
        usleep(1000);
    }
}

static void on_run(void *ctx, lane *l, void *state, lane_job *lj) {
    (void)ctx;
    job *j = (job *)lj;
    char want[16];
    snprintf(want, sizeof want, "k%d", j->key);
    assert_string_equal(state, want); /* this lane's own state */
    assert_string_equal(lane_key(l), want);
    char name[16] = "";
    assert_int_equal(pthread_getname_np(pthread_self(), name, sizeof name), 0);
    if (!pthread_equal(pthread_self(), main_thread)) /* a lane's own thread, not a lender */
        assert_string_equal(name, "ect-test-lane");  /* ops.name names it */
    if (j->wait_for) wait_true(j->wait_for);
    if (atomic_exchange(&last_seq[j->key], j->seq) != j->seq - 1)
        atomic_fetch_add(&order_errors, 1);
    j->ran_on = pthread_self();
    if (j->take_behind) {
        j->queued_before = lane_has_queued(l);
        taken = j->take_max ? lane_take_queued_max(l, j->take_max) : lane_take_queued(l);
        j->queued_after = lane_has_queued(l);
    }
    if (j->set) atomic_store(j->set, true);
    atomic_store(&j->ran, true);
}

static void on_stop(void *ctx, void *state) {
    (void)ctx;
    free(state);
    atomic_fetch_add(&stops, 1);
}

static void on_cancel(void *ctx, lane_job *lj) {
    (void)ctx;
    atomic_store(&((job *)lj)->cancelled, true);
}

static const lane_ops OPS = {on_start, on_run, on_stop, on_cancel, NULL, NULL, "ect-test-lane"};

static void reset(void) {
    atomic_store(&starts, 0);
    atomic_store(&stops, 0);
    atomic_store(&order_errors, 0);
    for (int i = 0; i < 8; i++) atomic_store(&last_seq[i], 0);
    taken = NULL;
}

static int submit(lane_pool *lp, job *j, int key, int seq) {
    j->key = key;
    j->seq = seq;
    char k[16];
    snprintf(k, sizeof k, "k%d", key);
    return lanes_submit(lp, k, &j->lj);
}

static void test_order_parallel_and_limit(void **state) {
    (void)state;
    reset();
    lane_pool *lp;
    assert_err(lanes_open(&OPS, 0, 100, &lp), ECT_EINVAL, "max_lanes");
    assert_int_equal(lanes_open(&OPS, 2, 60000, &lp), 0);
    static job a[50], b;
    atomic_bool b_ran = false;
    /* key 0's first job waits until key 1's job ran: only lanes in parallel finish */
    a[0].wait_for = &b_ran;
    for (int i = 0; i < 50; i++) assert_int_equal(submit(lp, &a[i], 0, i + 1), 0);
    b.set = &b_ran;
    assert_int_equal(submit(lp, &b, 1, 1), 0);
    job c = {0};
    assert_err(submit(lp, &c, 2, 1), ECT_EBUSY, "2 lanes"); /* the limit; c stays ours */
    for (int i = 0; i < 50; i++) wait_true(&a[i].ran);
    wait_true(&b.ran);
    assert_int_equal(atomic_load(&order_errors), 0);
    for (int i = 1; i < 50; i++) assert_true(pthread_equal(a[i].ran_on, a[0].ran_on));
    assert_false(pthread_equal(a[0].ran_on, b.ran_on));
    assert_int_equal(lanes_count(lp), 2);
    lanes_close(lp, false);
    assert_int_equal(atomic_load(&starts), 2);
    assert_int_equal(atomic_load(&stops), 2);
}

static void test_idle_lanes_end(void **state) {
    (void)state;
    reset();
    lane_pool *lp;
    assert_int_equal(lanes_open(&OPS, 1, 20, &lp), 0);
    job j1 = {0}, j2 = {0};
    assert_int_equal(submit(lp, &j1, 0, 1), 0);
    wait_true(&j1.ran);
    uint64_t end = ect_now_ms() + 20000;
    while (lanes_count(lp) > 0) { /* it idles out after 20 ms */
        assert_true(ect_now_ms() < end);
        usleep(1000);
    }
    assert_int_equal(submit(lp, &j2, 1, 1), 0); /* room again: a new lane, its own state */
    wait_true(&j2.ran);
    lanes_close(lp, false);
    assert_int_equal(atomic_load(&starts), 2);
    assert_int_equal(atomic_load(&stops), 2);
}

static void test_take_queued_and_close(void **state) {
    (void)state;
    reset();
    lane_pool *lp;
    assert_int_equal(lanes_open(&OPS, 4, 60000, &lp), 0);
    atomic_bool go = false;
    static job j[4];
    j[0].wait_for = &go;
    j[0].take_behind = true;
    for (int i = 0; i < 4; i++) assert_int_equal(submit(lp, &j[i], 0, i + 1), 0);
    atomic_store(&go, true);
    wait_true(&j[0].ran);
    int n = 0;
    for (lane_job *q = taken; q; q = q->next) assert_ptr_equal(q, &j[1 + n++].lj);
    assert_int_equal(n, 3);
    assert_true(j[0].queued_before); /* three waited behind it */
    assert_false(j[0].queued_after); /* and were taken */
    for (int i = 1; i < 4; i++) assert_false(atomic_load(&j[i].ran));

    /* close without drain: a job either ran (it had started) or is cancelled */
    atomic_bool go2 = false;
    static job k[3];
    k[0].wait_for = &go2;
    for (int i = 0; i < 3; i++) assert_int_equal(submit(lp, &k[i], 1, i + 1), 0);
    atomic_store(&go2, true);
    lanes_close(lp, false);
    for (int i = 0; i < 3; i++) assert_true(atomic_load(&k[i].ran) != atomic_load(&k[i].cancelled));

    /* with drain: everything queued runs */
    reset();
    assert_int_equal(lanes_open(&OPS, 4, 60000, &lp), 0);
    static job d[20];
    for (int i = 0; i < 20; i++) assert_int_equal(submit(lp, &d[i], i % 3, i / 3 + 1), 0);
    lanes_close(lp, true);
    for (int i = 0; i < 20; i++) assert_true(atomic_load(&d[i].ran));
    assert_int_equal(atomic_load(&order_errors), 0);
    lanes_close(NULL, true);
}

/* lane_take_queued_max takes the first `max` jobs behind the running one;
 * the rest stay queued and run on the lane, in order. */
static void test_take_queued_max(void **state) {
    (void)state;
    reset();
    lane_pool *lp;
    assert_int_equal(lanes_open(&OPS, 4, 60000, &lp), 0);
    atomic_bool go = false;
    static job j[6];
    j[0].wait_for = &go;
    j[0].take_behind = true;
    j[0].take_max = 2;
    for (int i = 0; i < 6; i++) assert_int_equal(submit(lp, &j[i], 0, i + 1), 0);
    assert_true(lanes_queued(lp, "k0") >= 5); /* j[0] may have started */
    assert_int_equal(lanes_queued(lp, "k9"), 0);
    atomic_store(&go, true);
    for (int i = 3; i < 6; i++) wait_true(&j[i].ran);
    assert_int_equal(lanes_queued(lp, "k0"), 0);
    int n = 0;
    for (lane_job *q = taken; q; q = q->next) assert_ptr_equal(q, &j[1 + n++].lj);
    assert_int_equal(n, 2);
    assert_true(j[0].queued_after); /* three stayed */
    for (int i = 1; i < 3; i++) assert_false(atomic_load(&j[i].ran));
    /* the three left ran in order, after the taken ones' sequence numbers */
    assert_int_equal(atomic_load(&order_errors), 1); /* j[3] follows j[0]: seq 4 after 1 */
    assert_int_equal(atomic_load(&last_seq[0]), 6);
    lanes_close(lp, false);
}

/* A group (a peer) holds at most group_max lanes: a new key of a full group
 * is refused, a job for a lane it runs already is queued, and another group
 * still gets a lane while the first group's lanes are blocked. */
static void test_group_cap(void **state) {
    (void)state;
    reset();
    lane_pool *lp;
    assert_int_equal(lanes_open(&OPS, 8, 60000, &lp), 0);
    atomic_bool go = false;
    static job t[4], q, other, after;
    char k[16];
    for (int i = 0; i < 2; i++) {
        t[i].wait_for = &go; /* the "tarpit" lanes block */
        t[i].key = i;
        t[i].seq = 1;
        snprintf(k, sizeof k, "k%d", i);
        assert_int_equal(lanes_submit_group(lp, k, "peerA", 2, &t[i].lj), 0);
    }
    for (int i = 2; i < 4; i++) {
        t[i].key = i;
        t[i].seq = 1;
        snprintf(k, sizeof k, "k%d", i);
        assert_err(lanes_submit_group(lp, k, "peerA", 2, &t[i].lj), ECT_EBUSY, "peerA");
    }
    q.key = 0; /* the running lane of k0 queues more, group full or not */
    q.seq = 2;
    assert_int_equal(lanes_submit_group(lp, "k0", "peerA", 2, &q.lj), 0);
    other.key = 5;
    other.seq = 1;
    assert_int_equal(lanes_submit_group(lp, "k5", "peerB", 2, &other.lj), 0);
    wait_true(&other.ran); /* served while peerA's lanes are blocked */
    assert_false(atomic_load(&t[0].ran));
    assert_int_equal(lanes_count_group(lp, "peerA"), 2);
    assert_int_equal(lanes_count_group(lp, "nobody"), 0);
    /* a plain submit counts against no group */
    after.key = 6;
    after.seq = 1;
    assert_int_equal(submit(lp, &after, 6, 1), 0);
    atomic_store(&go, true);
    wait_true(&q.ran);
    wait_true(&after.ran);
    lanes_close(lp, true);
    assert_int_equal(atomic_load(&order_errors), 0);
}

/* Quiet-submits j (key 0, seq) until the lane's thread was idle for it (it
 * runs those it was not: each is waited for and the next seq used).
 * Returns the seq after the quiet one. */
static int submit_quiet_idle(lane_pool *lp, job *spare, job *j, int seq) {
    for (;;) {
        job *t = spare ? spare : j;
        memset(t, 0, sizeof *t);
        t->key = 0;
        t->seq = seq++;
        bool quiet = false;
        assert_int_equal(lanes_submit_quiet(lp, "k0", &t->lj, &quiet), 0);
        if (quiet && t == j) return seq;
        if (!quiet) {
            wait_true(&t->ran); /* the thread was busy: it runs it */
            continue;
        }
        spare = NULL; /* quiet, but the spare: hand it out by a wake and retry with j */
        lanes_wake_quiet(lp);
        wait_true(&t->ran);
    }
}

/* Lending: a job queued quietly on an idle lane is left to a borrower, who
 * runs it and the jobs queued meanwhile on its own thread with the lane's
 * state; a job handed back runs on the lane's thread, before the queue, in
 * order; lanes_wake_quiet hands a quiet job to the lane's thread. */
static void test_lend(void **state) {
    (void)state;
    reset();
    lane_pool *lp;
    assert_int_equal(lanes_open(&OPS, 4, 60000, &lp), 0);
    static job a[8], spare;
    assert_int_equal(submit(lp, &a[0], 0, 1), 0);
    wait_true(&a[0].ran);
    pthread_t lane_th = a[0].ran_on;
    int seq = submit_quiet_idle(lp, &spare, &a[1], 2);
    lane_job *j = NULL;
    void *st = NULL;
    lane *l = lanes_lend(lp, &j, &st);
    assert_non_null(l);
    assert_ptr_equal(j, &a[1].lj);
    on_run(NULL, l, st, j);
    assert_true(pthread_equal(a[1].ran_on, pthread_self()));
    assert_int_equal(submit(lp, &a[2], 0, seq++), 0); /* lent: queued for the borrower */
    j = lane_lend_next(l);
    assert_ptr_equal(j, &a[2].lj);
    on_run(NULL, l, st, j);
    assert_true(pthread_equal(a[2].ran_on, pthread_self()));
    assert_null(lane_lend_next(l));
    lanes_lend_end(l, NULL);
    assert_null(lanes_lend(lp, &j, &st)); /* nothing left to lend */
    seq = submit_quiet_idle(lp, NULL, &a[3], seq);
    l = lanes_lend(lp, &j, &st);
    assert_ptr_equal(j, &a[3].lj);
    assert_int_equal(submit(lp, &a[4], 0, seq++), 0);
    lanes_lend_end(l, j); /* handed back unrun: the lane's thread runs it, then a[4] */
    wait_true(&a[4].ran);
    assert_true(a[3].ran);
    assert_true(pthread_equal(a[3].ran_on, lane_th));
    assert_true(pthread_equal(a[4].ran_on, lane_th));
    seq = submit_quiet_idle(lp, NULL, &a[5], seq);
    lanes_wake_quiet(lp);
    wait_true(&a[5].ran);
    assert_true(pthread_equal(a[5].ran_on, lane_th));
    assert_int_equal(atomic_load(&order_errors), 0);
    lanes_close(lp, false);
    assert_int_equal(atomic_load(&starts), 1);
    assert_int_equal(atomic_load(&stops), 1);
}

int main(void) {
    main_thread = pthread_self();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_parallel_and_limit),
        cmocka_unit_test(test_idle_lanes_end),
        cmocka_unit_test(test_take_queued_and_close),
        cmocka_unit_test(test_take_queued_max),
        cmocka_unit_test(test_group_cap),
        cmocka_unit_test(test_lend),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
