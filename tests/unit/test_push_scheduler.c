/*
 * Tests for ect_push_scheduler and the event inbox against a fake consumer
 * shard (a REP thread answering peers / event_port / cancel, and a PUSH
 * socket the test writes event frames into): undecodable frames and frames
 * from unknown shards cost one frame each, late events are ignored, the
 * push wait makes an entry UNAVAILABLE, cancels reach the shard and a
 * failing shard gets exactly cancel_attempts tries, and an unreachable
 * consumer never blocks poll() nor close().
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <zmq.h>

#include "testutil.h"
#include "util/util.h"

static void nap(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct fake {
    void *zctx, *rep, *push;
    int port, event_port;
    pthread_t thr;
    atomic_bool stop;
    atomic_int cancels;
    atomic_bool refuse_cancels;
    char last_cancel[1024];
    /* ect_ready (accept_any): the items "ready" here, listed two at a time
     * (a shard may list fewer than max), or upstream's answer, or a refusal */
    pthread_mutex_t mu;
    int ready_mode; /* [mu] READY_LIST, READY_UPSTREAM, READY_REFUSE */
    char ready_tid[16][64];
    uint64_t ready_seq[16];
    int nready;               /* [mu] */
    uint64_t max_after;       /* [mu] the highest cursor asked with */
    bool backwards;           /* [mu] a cursor below an earlier one */
    int ready_asks, statuses; /* [mu] */
} fake;

enum { READY_LIST, READY_UPSTREAM, READY_REFUSE };
#define READY_PAGE 2

static int bound_port(void *s) {
    char ep[128];
    size_t sz = sizeof ep;
    zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &sz);
    return atoi(strrchr(ep, ':') + 1);
}

/* The fake's answer to ect_ready (under f->mu). */
static void fake_ready_answer(fake *f, const char *req, char *out, size_t cap) {
    f->ready_asks++;
    if (f->ready_mode == READY_UPSTREAM) {
        snprintf(out, cap, "{\"ok\":false,\"error\":\"unknown control op: 'ect_ready'\"}");
        return;
    }
    if (f->ready_mode == READY_REFUSE) {
        snprintf(out, cap, "{\"ok\":false,\"error\":\"ect_ready refused: not trusted\"}");
        return;
    }
    const char *a = strstr(req, "\"after\":");
    uint64_t after = a ? strtoull(a + 8, NULL, 10) : 0;
    if (after < f->max_after) f->backwards = true;
    if (after > f->max_after) f->max_after = after;
    size_t o = (size_t)snprintf(out, cap, "{\"ok\":true,\"result\":{\"items\":[");
    int listed = 0;
    bool more = false;
    uint64_t next = after;
    for (int i = 0; i < f->nready; i++) {
        if (f->ready_seq[i] <= after) continue;
        if (listed == READY_PAGE) {
            more = true;
            break;
        }
        o += (size_t)snprintf(out + o, cap - o,
                              "%s{\"seq\":%llu,\"transfer_id\":\"%s\",\"mm_hash\":\"h-%s\","
                              "\"reservation_id\":\"r\",\"nbytes\":8,\"shape\":[4],"
                              "\"dtype\":\"bfloat16\"}",
                              listed ? "," : "", (unsigned long long)f->ready_seq[i],
                              f->ready_tid[i], f->ready_tid[i]);
        next = f->ready_seq[i];
        listed++;
    }
    if (!more && f->nready && f->ready_seq[f->nready - 1] > next)
        next = f->ready_seq[f->nready - 1];
    snprintf(out + o, cap - o, "],\"next\":%llu,\"more\":%s}}", (unsigned long long)next,
             more ? "true" : "false");
}

static void *fake_main(void *arg) {
    fake *f = arg;
    int to = 50;
    zmq_setsockopt(f->rep, ZMQ_RCVTIMEO, &to, sizeof to);
    while (!atomic_load(&f->stop)) {
        char buf[1024];
        int n = zmq_recv(f->rep, buf, sizeof buf - 1, 0);
        if (n < 0) continue;
        buf[n] = 0;
        char out[4096];
        if (strstr(buf, "\"ect_ready\"")) {
            pthread_mutex_lock(&f->mu);
            fake_ready_answer(f, buf, out, sizeof out);
            pthread_mutex_unlock(&f->mu);
        } else if (strstr(buf, "\"status\"")) {
            pthread_mutex_lock(&f->mu);
            f->statuses++;
            pthread_mutex_unlock(&f->mu);
            snprintf(out, sizeof out, "{\"ok\":true,\"result\":null}");
        } else if (strstr(buf, "\"peers\""))
            snprintf(out, sizeof out, "{\"ok\":true,\"result\":{\"ports\":[%d]}}", f->port);
        else if (strstr(buf, "\"event_port\""))
            snprintf(out, sizeof out, "{\"ok\":true,\"result\":%d}", f->event_port);
        else if (strstr(buf, "\"cancel\"")) {
            atomic_fetch_add(&f->cancels, 1);
            snprintf(f->last_cancel, sizeof f->last_cancel, "%s", buf);
            if (atomic_load(&f->refuse_cancels))
                snprintf(out, sizeof out, "{\"ok\":false,\"error\":\"no\"}");
            else
                snprintf(out, sizeof out, "{\"ok\":true,\"result\":{\"cancelled\":true}}");
        } else
            snprintf(out, sizeof out, "{\"ok\":false,\"error\":\"unexpected\"}");
        zmq_send(f->rep, out, strlen(out), 0);
    }
    return NULL;
}

static void fake_open(fake *f) {
    memset(f, 0, sizeof *f);
    f->zctx = zmq_ctx_new();
    f->rep = zmq_socket(f->zctx, ZMQ_REP);
    f->push = zmq_socket(f->zctx, ZMQ_PUSH);
    int zero = 0;
    zmq_setsockopt(f->rep, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(f->push, ZMQ_LINGER, &zero, sizeof zero);
    assert_int_equal(zmq_bind(f->rep, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_bind(f->push, "tcp://127.0.0.1:*"), 0);
    pthread_mutex_init(&f->mu, NULL);
    f->port = bound_port(f->rep);
    f->event_port = bound_port(f->push);
    assert_int_equal(pthread_create(&f->thr, NULL, fake_main, f), 0);
}

static void fake_close(fake *f) {
    atomic_store(&f->stop, true);
    pthread_join(f->thr, NULL);
    zmq_close(f->rep);
    zmq_close(f->push);
    zmq_ctx_term(f->zctx);
    pthread_mutex_destroy(&f->mu);
}

static void fake_event(fake *f, const char *tid, int shard_port) {
    char ev[512];
    snprintf(ev, sizeof ev,
             "{\"transfer_id\":\"%s\",\"mm_hash\":\"h-%s\",\"ready\":true,\"reservation_id\":\"r\","
             "\"nbytes\":8,\"shape\":[4],\"dtype\":\"bfloat16\",\"shard\":%d}",
             tid, tid, shard_port);
    assert_true(zmq_send(f->push, ev, strlen(ev), 0) >= 0);
}

static uint64_t ttl_override;

static ect_push_scheduler *sched(int port, uint64_t push_wait_ms, double timeout_s) {
    ect_push_scheduler_opts o;
    ect_push_scheduler_opts_init(&o);
    if (ttl_override) o.ttl_ms = ttl_override;
    o.consumer_port = port;
    o.push_wait_ms = push_wait_ms;
    o.control_timeout_s = timeout_s;
    o.min_drain_interval_ms = 0;
    ect_push_scheduler *s = NULL;
    assert_int_equal(ect_push_scheduler_open(&o, &s), 0);
    return s;
}

static void wait_shards(ect_push_scheduler *s) {
    ect_push_scheduler_stat st;
    for (int i = 0; i < 500; i++) {
        ect_push_scheduler_poll(s);
        ect_push_scheduler_stats(s, &st);
        if (st.shards == 1) return;
        nap(5);
    }
    fail_msg("discovery did not finish");
}

static ect_push_state poll_until(ect_push_scheduler *s, const char *tid, ect_push_state want) {
    ect_push_sched_item it = {0};
    for (int i = 0; i < 500; i++) {
        ect_push_scheduler_poll(s);
        if (ect_push_scheduler_state(s, tid, &it) == 0 && it.state == want) return want;
        nap(5);
    }
    return it.state;
}

static void test_bad_frames_and_late_events(void **state) {
    (void)state;
    fake f;
    fake_open(&f);
    ect_push_scheduler *s = sched(f.port, 60000, 2);
    assert_int_equal(ect_push_scheduler_expect(s, "t", NULL), 0);
    assert_err(ect_push_scheduler_expect(s, "t", NULL), ECT_EEXIST, NULL);
    wait_shards(s);
    nap(50); /* the PULL connects */
    assert_true(zmq_send(f.push, "garbage{", 8, 0) >= 0);
    fake_event(&f, "t", f.port + 1); /* not a shard of this instance */
    fake_event(&f, "t", f.port);
    assert_int_equal(poll_until(s, "t", ECT_PUSH_AVAILABLE), ECT_PUSH_AVAILABLE);
    ect_push_scheduler_stat st;
    ect_push_scheduler_stats(s, &st);
    assert_int_equal(st.bad_frames, 2);
    assert_int_equal(st.events, 1);
    ect_push_sched_item it;
    assert_int_equal(ect_push_scheduler_next(s, &it), 0);
    assert_string_equal(it.transfer_id, "t");
    assert_string_equal(it.mm_hash, "h-t");
    assert_int_equal(it.state, ECT_PUSH_LOADING);
    assert_err(ect_push_scheduler_next(s, &it), ECT_ENOTFOUND, NULL);
    /* cancel reaches the shard once; a late event is ignored */
    assert_int_equal(ect_push_scheduler_cancel(s, "t"), 0);
    for (int i = 0; i < 400 && atomic_load(&f.cancels) < 1; i++) {
        ect_push_scheduler_poll(s);
        nap(5);
    }
    assert_int_equal(atomic_load(&f.cancels), 1);
    assert_non_null(strstr(f.last_cancel, "\"transfer_id\":\"t\""));
    fake_event(&f, "t", f.port);
    /* until the event came and the cancel's answer was taken (~60 s: only a
     * lost one reaches it; 40 polls here failed on a loaded machine) */
    for (int i = 0; i < 12000; i++) {
        ect_push_scheduler_poll(s);
        ect_push_scheduler_stats(s, &st);
        if (st.late_events >= 1 && st.cancels_sent >= 1) break;
        nap(5);
    }
    assert_int_equal(st.late_events, 1);
    assert_int_equal(st.cancels_sent, 1);
    assert_int_equal(ect_push_scheduler_state(s, "t", &it), 0);
    assert_int_equal(it.state, ECT_PUSH_CANCELLED);
    ect_push_scheduler_close(s);
    fake_close(&f);
}

/* No event within the push wait: UNAVAILABLE (retryable), and the shard is
 * told to cancel; a shard that refuses gets exactly 2 attempts. */
static void test_push_wait_and_cancel_attempts(void **state) {
    (void)state;
    fake f;
    fake_open(&f);
    atomic_store(&f.refuse_cancels, true);
    ect_push_scheduler *s = sched(f.port, 100, 2);
    wait_shards(s);
    assert_int_equal(ect_push_scheduler_expect(s, "w", "hw"), 0);
    assert_int_equal(poll_until(s, "w", ECT_PUSH_UNAVAILABLE), ECT_PUSH_UNAVAILABLE);
    ect_push_sched_item it;
    assert_int_equal(ect_push_scheduler_state(s, "w", &it), 0);
    assert_true(it.retryable);
    ect_push_scheduler_stat st;
    for (int i = 0; i < 400; i++) {
        ect_push_scheduler_poll(s);
        ect_push_scheduler_stats(s, &st);
        if (st.cancels_failed >= 2) break;
        nap(5);
    }
    for (int i = 0; i < 40; i++) { /* no third attempt */
        ect_push_scheduler_poll(s);
        nap(5);
    }
    assert_int_equal(atomic_load(&f.cancels), 2);
    ect_push_scheduler_stats(s, &st);
    assert_int_equal(st.cancels_failed, 2);
    assert_int_equal(st.cancels_sent, 0);
    ect_push_scheduler_close(s);
    fake_close(&f);
}

/* Nobody listens at the consumer's address: discovery retries in the
 * background with a 10-minute control timeout, poll() stays instant, the
 * push wait still works, and close() does not wait out the timeout. The
 * bounds are a tenth of that timeout: far above what a loaded machine's
 * scheduling adds (close under 2 s failed there), far below a wait for it. */
static void test_unreachable_consumer(void **state) {
    (void)state;
    void *z = zmq_ctx_new();
    void *tmp = zmq_socket(z, ZMQ_REP);
    assert_int_equal(zmq_bind(tmp, "tcp://127.0.0.1:*"), 0);
    int port = bound_port(tmp);
    zmq_close(tmp); /* the port is now closed */
    zmq_ctx_term(z);
    const double timeout_s = 600;
    const uint64_t bound_ms = (uint64_t)(timeout_s * 1000) / 10;
    ect_push_scheduler *s = sched(port, 100, timeout_s);
    assert_int_equal(ect_push_scheduler_expect(s, "u", NULL), 0);
    uint64_t worst = 0;
    for (int i = 0; i < 60; i++) {
        uint64_t t0 = ect_now_ns();
        assert_true(ect_push_scheduler_poll(s) >= 0);
        uint64_t dt = ect_now_ns() - t0;
        if (dt > worst) worst = dt;
        nap(5);
    }
    /* never waits on the network: a wait would be the control timeout */
    assert_true(worst < bound_ms * 1000000ull);
    ect_push_sched_item it;
    assert_int_equal(ect_push_scheduler_state(s, "u", &it), 0);
    assert_int_equal(it.state, ECT_PUSH_UNAVAILABLE);
    ect_push_scheduler_stat st;
    ect_push_scheduler_stats(s, &st);
    assert_int_equal(st.shards, 0);
    uint64_t t0 = ect_now_ms();
    ect_push_scheduler_close(s);
    assert_true(ect_now_ms() - t0 < bound_ms);
}

/* Arrived on every shard but never loaded: EXPIRED after the TTL, retryable,
 * and the shard is told to cancel. */
static void test_available_expires(void **state) {
    (void)state;
    fake f;
    fake_open(&f);
    ttl_override = 150;
    ect_push_scheduler *s = sched(f.port, 60000, 2);
    ttl_override = 0;
    wait_shards(s);
    nap(50);
    assert_int_equal(ect_push_scheduler_expect(s, "x", NULL), 0);
    fake_event(&f, "x", f.port);
    assert_int_equal(poll_until(s, "x", ECT_PUSH_AVAILABLE), ECT_PUSH_AVAILABLE);
    assert_int_equal(poll_until(s, "x", ECT_PUSH_EXPIRED), ECT_PUSH_EXPIRED);
    ect_push_sched_item it;
    assert_int_equal(ect_push_scheduler_state(s, "x", &it), 0);
    assert_true(it.retryable);
    assert_err(ect_push_scheduler_next(s, &it), ECT_ENOTFOUND, NULL); /* not handed out */
    for (int i = 0; i < 400 && atomic_load(&f.cancels) < 1; i++) {
        ect_push_scheduler_poll(s);
        nap(5);
    }
    assert_int_equal(atomic_load(&f.cancels), 1);
    assert_non_null(strstr(f.last_cancel, "\"reservation_id\":\"r\""));
    ect_push_scheduler_close(s);
    fake_close(&f);
}

typedef struct late_sender {
    fake *f;
    const char *tid;
} late_sender;

static void *send_event_main(void *arg) {
    late_sender *ls = arg;
    fake_event(ls->f, ls->tid, ls->f->port);
    return NULL;
}

/* ect_push_scheduler_wait sleeps until an event comes (no lost-event
 * rechecks here to wake it: a wait that missed the event would sit out its
 * 10-minute timeout and the test would time out), returns at once while an
 * arrived item waits for next, and refuses bad arguments. */
static void test_wait_wakes_on_event(void **state) {
    (void)state;
    fake f;
    fake_open(&f);
    ect_push_scheduler_opts o;
    ect_push_scheduler_opts_init(&o);
    o.consumer_port = f.port;
    o.push_wait_ms = 600000;
    o.recheck_ms = 0;
    ect_push_scheduler *s = NULL;
    assert_int_equal(ect_push_scheduler_open(&o, &s), 0);
    assert_err(ect_push_scheduler_wait(NULL, 0), ECT_EINVAL, "NULL");
    assert_err(ect_push_scheduler_wait(s, -1), ECT_EINVAL, "negative");
    assert_int_equal(ect_push_scheduler_expect(s, "w", NULL), 0);
    wait_shards(s);
    assert_int_equal(ect_push_scheduler_wait(s, 0), 0); /* nothing came: no wait at all */
    late_sender ls = {&f, "w"};
    pthread_t thr;
    assert_int_equal(pthread_create(&thr, NULL, send_event_main, &ls), 0);
    int got = 0;
    while (got == 0) got = ect_push_scheduler_wait(s, 600000); /* 0 only if interrupted */
    assert_int_equal(got, 1);
    pthread_join(thr, NULL);
    ect_push_sched_item it;
    assert_int_equal(ect_push_scheduler_state(s, "w", &it), 0);
    assert_int_equal(it.state, ECT_PUSH_AVAILABLE);
    /* an arrived item not yet taken: the wait returns at once */
    assert_int_equal(ect_push_scheduler_wait(s, 600000), 0);
    assert_int_equal(ect_push_scheduler_next(s, &it), 0);
    assert_string_equal(it.transfer_id, "w");
    ect_push_scheduler_close(s);
    fake_close(&f);
}

/* ---- ect_ready (accept_any): items whose every event was lost */

/* Makes tid "ready" on the fake with the next seq. */
static void fake_ready(fake *f, const char *tid) {
    pthread_mutex_lock(&f->mu);
    assert_true(f->nready < 16);
    snprintf(f->ready_tid[f->nready], sizeof f->ready_tid[0], "%s", tid);
    f->ready_seq[f->nready] = f->nready ? f->ready_seq[f->nready - 1] + 1 : 1;
    f->nready++;
    pthread_mutex_unlock(&f->mu);
}

static ect_push_scheduler *sched_any(int port) {
    ect_push_scheduler_opts o;
    ect_push_scheduler_opts_init(&o);
    o.consumer_port = port;
    o.push_wait_ms = 600000;
    o.control_timeout_s = 30;
    o.min_drain_interval_ms = 0;
    o.accept_any = 1;
    o.recheck_ms = 50;
    ect_push_scheduler *s = NULL;
    assert_int_equal(ect_push_scheduler_open(&o, &s), 0);
    return s;
}

/* Polls s until tid is in state want (a generous deadline: ~60 s). */
static void poll_to_state(ect_push_scheduler *s, const char *tid, ect_push_state want) {
    ect_push_sched_item it = {0};
    for (int i = 0; i < 12000; i++) {
        ect_push_scheduler_poll(s);
        if (ect_push_scheduler_state(s, tid, &it) == 0 && it.state == want) return;
        nap(5);
    }
    fail_msg("%s: %s, not %s", tid, ect_push_state_name(it.state), ect_push_state_name(want));
}

/* Polls s until the fake has been asked with a cursor of at least `after`
 * (so the answer before it was applied), and `asks` listings at least. */
static void poll_to_cursor(ect_push_scheduler *s, fake *f, uint64_t after, int asks) {
    for (int i = 0; i < 12000; i++) {
        ect_push_scheduler_poll(s);
        pthread_mutex_lock(&f->mu);
        bool done = f->max_after >= after && f->ready_asks >= asks;
        pthread_mutex_unlock(&f->mu);
        if (done) return;
        nap(5);
    }
    fail_msg("the scheduler never asked ect_ready with after >= %llu", (unsigned long long)after);
}

/* Five items ready on the shard, none of whose events reached the
 * scheduler: listed (two at a time: it asks again while more remain, the
 * cursor only moves on), each becomes AVAILABLE, counted as listed, and is
 * then loaded and finished normally; an item known from its event is a
 * duplicate; a finished item listed again (a shard restarted) stays
 * finished. Fails without the listing: nothing would ever arrive. */
static void test_accept_any_lists_lost_items(void **state) {
    (void)state;
    fake f;
    fake_open(&f);
    char tid[5][8];
    for (int i = 0; i < 5; i++) {
        snprintf(tid[i], sizeof tid[i], "a%d", i);
        fake_ready(&f, tid[i]);
    }
    ect_push_scheduler *s = sched_any(f.port);
    wait_shards(s);
    for (int i = 0; i < 5; i++) poll_to_state(s, tid[i], ECT_PUSH_AVAILABLE);
    poll_to_cursor(s, &f, 5, 4); /* pages after 0, 2, 4, then the cursor at the end */
    ect_push_scheduler_stat st;
    ect_push_scheduler_stats(s, &st);
    assert_int_equal(st.listed, 5);
    assert_int_equal(st.events, 0);
    /* known from its event first: the listing is a harmless duplicate */
    nap(50); /* the PULL connects */
    fake_event(&f, "k", f.port);
    poll_to_state(s, "k", ECT_PUSH_AVAILABLE);
    fake_ready(&f, "k");
    poll_to_cursor(s, &f, 6, 0);
    ect_push_scheduler_stats(s, &st);
    assert_int_equal(st.listed, 5);
    /* each handed out once, loaded and finished as usual */
    int got = 0;
    ect_push_sched_item it;
    while (ect_push_scheduler_next(s, &it) == 0) {
        assert_int_equal(it.reported, 1);
        assert_int_equal(it.nbytes, 8);
        assert_int_equal(ect_push_scheduler_loaded(s, it.transfer_id), 0);
        assert_int_equal(ect_push_scheduler_finished(s, it.transfer_id), 0);
        got++;
    }
    assert_int_equal(got, 6);
    /* listed again after it finished: not resurrected */
    fake_ready(&f, "a0");
    poll_to_cursor(s, &f, 7, 0);
    assert_int_equal(ect_push_scheduler_state(s, "a0", &it), 0);
    assert_int_equal(it.state, ECT_PUSH_CANCELLED);
    assert_err(ect_push_scheduler_next(s, &it), ECT_ENOTFOUND, NULL);
    ect_push_scheduler_stats(s, &st);
    assert_int_equal(st.listed, 5);
    pthread_mutex_lock(&f.mu);
    assert_false(f.backwards); /* the cursor never went back: each item listed once */
    pthread_mutex_unlock(&f.mu);
    ect_push_scheduler_close(s);
    fake_close(&f);
}

/* A shard that does not know ect_ready (upstream) or refuses it is asked
 * once and never again (two status rounds of a waiting item span more than
 * two listing intervals), and nothing else changes: events still deliver. */
static void test_upstream_shard_not_listed_again(void **state) {
    (void)state;
    for (int mode = READY_UPSTREAM; mode <= READY_REFUSE; mode++) {
        fake f;
        fake_open(&f);
        pthread_mutex_lock(&f.mu);
        f.ready_mode = mode;
        pthread_mutex_unlock(&f.mu);
        ect_push_scheduler *s = sched_any(f.port);
        wait_shards(s);
        poll_to_cursor(s, &f, 0, 1);
        assert_int_equal(ect_push_scheduler_expect(s, "w", "h-w"), 0);
        for (int i = 0; i < 12000; i++) {
            ect_push_scheduler_poll(s);
            pthread_mutex_lock(&f.mu);
            int n = f.statuses;
            pthread_mutex_unlock(&f.mu);
            if (n >= 2) break;
            nap(5);
        }
        pthread_mutex_lock(&f.mu);
        assert_true(f.statuses >= 2);
        assert_int_equal(f.ready_asks, 1);
        pthread_mutex_unlock(&f.mu);
        fake_event(&f, "e", f.port);
        poll_to_state(s, "e", ECT_PUSH_AVAILABLE);
        fake_event(&f, "w", f.port);
        poll_to_state(s, "w", ECT_PUSH_AVAILABLE);
        ect_push_scheduler_stat st;
        ect_push_scheduler_stats(s, &st);
        assert_int_equal(st.listed, 0);
        assert_int_equal(st.events, 2);
        ect_push_scheduler_close(s);
        fake_close(&f);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_frames_and_late_events),
        cmocka_unit_test(test_push_wait_and_cancel_attempts),
        cmocka_unit_test(test_unreachable_consumer),
        cmocka_unit_test(test_available_expires),
        cmocka_unit_test(test_wait_wakes_on_event),
        cmocka_unit_test(test_accept_any_lists_lost_items),
        cmocka_unit_test(test_upstream_shard_not_listed_again),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
