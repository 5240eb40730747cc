/*
 * producer_run — the push producer's rounds and its dispatcher thread. Each
 * round it asks the records table (pushes.h) for the actions due, has the
 * batcher (batch.h) turn them into exchanges, and carries those out:
 *
 *   control exchanges   on the lane of their shard address (producer_lanes.c);
 *                       they come back on p->done and are settled later, so a
 *                       consumer that is slow or hung holds up only its own
 *                       work, never another consumer's pushes;
 *   write batches       one ect_xport_write_batch per destination session,
 *                       sessions in parallel on the write lanes (the last on
 *                       this thread), settled when the round's writes are in;
 *   local actions       sources given back, results queued.
 *
 * Rounds run with the baton (producer.h): on this thread, or on the lane or
 * caller that found the work while nobody ran them; this thread finishes the
 * rounds they hand over and keeps the timers. The table hands out no action
 * twice while one is in flight, which is what lets exchanges overlap. A
 * reserve a shard refuses because its pool is full is not a failure: the
 * table backs the item off and retries (pushes.h, "Back-pressure"); the
 * dispatcher's wait is cut short to the table's next retry time. All
 * decisions (grouping, discovery checks, holding a dead address down, error
 * texts) are the table's and the batcher's.
 *
 * Writes in flight: a round whose writes are of large items and do not
 * cover every live item of the table (other steps are being reserved,
 * written or completed) does not wait for them. Each goes to its session's
 * write lane "async|" + key, so a session's writes run back to back in the
 * order the rounds made them, and the round goes on: the next step's
 * reserve and the previous step's complete go out while a copy runs. The
 * lane hands the finished write back on p->done like a control exchange;
 * when nobody runs rounds and no write waits behind it there, it settles it
 * itself (the item's complete is queued from there), else the baton's
 * holder or the dispatcher does. A lone step (every live item in this
 * round's writes) still writes on the running thread and waits: no hand-off
 * in its path. Either way an item's complete is built only once its write
 * settled, after the write's ack.
 *
 * Locking: the table and the batcher are called under p->mu; the mutex is
 * dropped around every send, write and release callback.
 */
#include <pthread.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utlist.h>

#include "push/producer.h"
#include "util/sync.h"
#include "util/util.h"
#include "xport/xport.h"

#define MOD "producer"
#define WAKE_MS 50
#define ASYNC_KEY "async|" /* a write lane whose writes no round waits for */
/* Items from this size on are written unwaited with steps in flight: their
 * copy or send (~80 us a MiB over shm, more over tcp) dwarfs the two thread
 * hand-offs it costs; smaller ones keep the round's write (the 64 KiB rows of
 * `ect bench push` spent more cpu per item unwaited, BENCHMARKS.md). */
#define ASYNC_MIN_ITEM (1u << 20)

static ect_xport *xport_for(ect_push_producer *p, const char *kind) {
    for (pp_xport *e = p->xports; e; e = e->next)
        if (!strcmp(e->kind, kind)) return e->x;
    ect_xport_opts xo;
    ect_xport_opts_init(&xo);
    char listen[PUSH_HOST_MAX + 8];
    snprintf(listen, sizeof listen, "%s:0", p->listen_host);
    xo.listen = listen;
    xo.connect_timeout_ms = p->o.connect_timeout_ms;
    xo.io_timeout_ms = p->o.io_timeout_ms;
    ect_xport *x = NULL;
    if (xp_open_keyed(kind, &xo, p->keys, &x)) return NULL;
    if (!strcmp(kind, "shm")) xp_set_offer_id(x, p->batch.shm_id);
    pp_xport *e = calloc(1, sizeof *e);
    if (!e) {
        ect_xport_close(x);
        ect_set_error(ECT_ENOMEM, "out of memory");
        return NULL;
    }
    ect_strcpy_cut(e->kind, sizeof e->kind, kind);
    e->x = x;
    LL_PREPEND(p->xports, e);
    return x;
}

static void write_batch(px *x) {
    x->rc = ect_xport_write_batch(x->xport, x->session, x->w, x->n, x->status);
}

/* An unwaited write is in: it goes to p->done and is settled here when
 * nobody runs rounds and no write waits behind it on this lane, else by the
 * baton's holder or the dispatcher (see the top). */
static void write_async_done(ect_push_producer *p, px *x, lane *l) {
    bool behind = lane_has_queued(l), wake = false;
    pthread_mutex_lock(&p->mu);
    x->lj.next = NULL;
    x->next = NULL;
    *p->done_tail = x;
    p->done_tail = &x->next;
    if (!p->running) {
        if (behind || p->stop)
            wake = true;
        else
            pp_run_locked(p, PP_RUN_WRITER, NULL);
    }
    pthread_mutex_unlock(&p->mu);
    if (wake) pthread_cond_signal(&p->wake);
    pthread_mutex_lock(&p->wmu); /* after p->done: closing waits for this */
    p->wflight--;
    pthread_cond_broadcast(&p->wcv);
    pthread_mutex_unlock(&p->wmu);
}

/* lane_ops.run of the write lanes: one batch, then the round hears of it
 * (or, unwaited, p->done). */
static void write_lane_run(void *ctx, lane *l, void *state, lane_job *lj) {
    ect_push_producer *p = ctx;
    (void)state;
    write_batch((px *)lj);
    if (!strncmp(lane_key(l), ASYNC_KEY, sizeof ASYNC_KEY - 1)) {
        write_async_done(p, (px *)lj, l);
        return;
    }
    pthread_mutex_lock(&p->wmu);
    p->wpending--;
    pthread_cond_broadcast(&p->wcv);
    pthread_mutex_unlock(&p->wmu);
}

int pp_write_lanes_open(ect_push_producer *p) {
    lane_ops o = {.run = write_lane_run, .ctx = p, .name = "ect-push-write"};
    return lanes_open(&o, PP_MAX_LANES, PP_LANE_IDLE_MS, &p->wlanes);
}

/* Picks x's initiator; without one every write of x fails here. */
static bool write_xport(ect_push_producer *p, px *x) {
    if ((x->xport = xport_for(p, x->xkind)) != NULL) return true;
    ECT_LOGW(MOD, "no transport for %s: %s", x->key, ect_last_error());
    x->rc = ECT_ENOTSUP;
    for (size_t k = 0; k < x->n; k++) x->status[k] = ECT_ENOTSUP;
    return false;
}

/* Runs the round's write batches, sessions in parallel; returns when all
 * are in. Skips a write that failed before it ran. Without mu. */
static void run_writes(ect_push_producer *p, px *list) {
    for (px *x = list; x; x = x->next) {
        if (x->rc || (!x->xport && !write_xport(p, x))) continue;
        bool queued = false;
        if (x->next) { /* the last one runs on this thread */
            pthread_mutex_lock(&p->wmu);
            p->wpending++;
            pthread_mutex_unlock(&p->wmu);
            queued = lanes_submit(p->wlanes, x->key, &x->lj) == 0;
            if (!queued) {
                pthread_mutex_lock(&p->wmu);
                p->wpending--;
                pthread_mutex_unlock(&p->wmu);
            }
        }
        if (!queued) write_batch(x);
    }
    pthread_mutex_lock(&p->wmu);
    while (p->wpending) pthread_cond_wait(&p->wcv, &p->wmu);
    pthread_mutex_unlock(&p->wmu);
}

/* Queues each write of the list on its session's unwaited lane (see the
 * top); returns those that did not go (failed, or no lane: the round runs
 * them), *nq the number that went. Without mu. */
static px *launch_writes(ect_push_producer *p, px *list, uint64_t *nq) {
    px *left = NULL, **tail = &left;
    *nq = 0;
    while (list) {
        px *x = list;
        list = x->next;
        x->next = NULL;
        if (write_xport(p, x)) {
            char key[PP_LANE_KEY_MAX];
            snprintf(key, sizeof key, ASYNC_KEY "%s", x->key);
            pthread_mutex_lock(&p->wmu);
            p->wflight++;
            pthread_mutex_unlock(&p->wmu);
            if (lanes_submit(p->wlanes, key, &x->lj) == 0) {
                (*nq)++;
                continue;
            }
            pthread_mutex_lock(&p->wmu);
            p->wflight--;
            pthread_mutex_unlock(&p->wmu);
        }
        *tail = x;
        tail = &x->next;
    }
    return left;
}

/* Whether the round's writes go out unwaited: they are of large items
 * (ASYNC_MIN_ITEM on average) and the table has live items beyond their
 * members (other steps in flight). Caller holds mu. */
static bool writes_async_locked(ect_push_producer *p, const px *xs) {
    size_t members = 0;
    uint64_t bytes = 0;
    for (const px *x = xs; x; x = x->next) {
        if (x->kind != PX_WRITE) continue;
        members += x->n;
        for (size_t i = 0; i < x->n; i++) bytes += x->w[i].len;
    }
    if (!members || bytes / members < ASYNC_MIN_ITEM) return false;
    push_stats st;
    push_get_stats(p->table, &st);
    return st.live > members;
}

/* Closing: waits until no unwaited write is out (they read the sources and
 * the transports). Caller holds mu; dropped meanwhile. */
static void wait_writes_out(ect_push_producer *p) {
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_lock(&p->wmu);
    while (p->wflight) pthread_cond_wait(&p->wcv, &p->wmu);
    pthread_mutex_unlock(&p->wmu);
    pthread_mutex_lock(&p->mu);
}

/* Settles the exchanges of the list x. Caller holds mu. */
static void settle_list_locked(ect_push_producer *p, px *x) {
    uint64_t now = pp_now(p);
    while (x) {
        px *next = x->next;
        pp_route_settled_locked(p, x);
        pb_settle(&p->batch, x, now);
        x = next;
    }
}

/* Settles every exchange the lanes handed back. Caller holds mu. */
static void settle_done_locked(ect_push_producer *p) {
    px *x = p->done;
    p->done = NULL;
    p->done_tail = &p->done;
    settle_list_locked(p, x);
}

typedef struct runner {
    pp_run_mode mode;
    bool quiet_ok;        /* this round is a lender's flush's: lanes may stay asleep */
    const char *lane_key; /* PP_RUN_LANE: the lane this thread runs */
    bool own_queued;      /* it queued an exchange on its own lane */
} runner;

static bool has_local(const push_action *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i].kind == PUSH_ACT_RELEASE_SOURCE || a[i].kind == PUSH_ACT_FINISHED) return true;
    return false;
}

/* Whether this thread hands the rest of the round to the dispatcher: a
 * caller must not block (a waited write) nor run release callbacks; a lane
 * that queued work on its own lane must not hold it up with writes. */
static bool hands_off(const runner *r, bool writes, bool local) {
    if (r->mode == PP_RUN_CALLER) return writes || local;
    return r->mode == PP_RUN_LANE && r->own_queued && writes;
}

/* Queues the round's control exchanges on their lanes; the writes go to
 * *writes, those that never went out to *failed. Without mu. */
static void submit_round(ect_push_producer *p, runner *r, px *xs, px **writes, px **failed) {
    px **wtail = writes;
    while (xs) {
        px *x = xs;
        xs = x->next;
        x->next = NULL;
        if (x->kind == PX_WRITE) {
            *wtail = x;
            wtail = &x->next;
            continue;
        }
        if (x->kind == PX_PUT) (void)(x->xport = xport_for(p, x->xkind)); /* NULL: unsent */
        if (r->lane_key) {
            char key[PP_LANE_KEY_MAX];
            pp_lane_key(x, key);
            r->own_queued |= strcmp(key, r->lane_key) == 0;
        }
        if (pp_lane_submit(p, x, r->quiet_ok)) { /* it never goes out */
            x->rc = ECT_ENOMEM;
            x->held = true;
            snprintf(x->err, sizeof x->err, "%.300s", ect_last_error());
            x->next = *failed;
            *failed = x;
        }
    }
}

/* The rest of a round after its submits: local actions (p->acts[0..nacts)),
 * writes (async: unwaited, see the top), then settling what is in. Called
 * without mu; returns with it. */
static void finish_round(ect_push_producer *p, size_t nacts, px *writes, px *failed, bool async) {
    pp_local(p, p->acts, nacts); /* p->acts is the baton's: only its local kinds are read */
    uint64_t nq = 0;
    if (async) writes = launch_writes(p, writes, &nq);
    run_writes(p, writes);
    pthread_mutex_lock(&p->mu);
    p->wasync += nq;
    settle_list_locked(p, writes);
    settle_list_locked(p, failed);
}

/* Picks the lane of each complete_batch of the round (caller holds mu): the
 * running lane's own when nothing else will be queued on it first. */
static void route_completes_locked(ect_push_producer *p, const runner *r, px *xs) {
    const char *runner_lane = r->mode == PP_RUN_LANE && !r->own_queued ? r->lane_key : NULL;
    for (px *x = xs; x && runner_lane; x = x->next)
        if (x->kind != PX_COMPLETE && x->kind != PX_WRITE && !strcmp(x->key, runner_lane))
            runner_lane = NULL;
    for (px *x = xs; x; x = x->next)
        if (x->kind == PX_COMPLETE) pp_route_complete_locked(p, x, runner_lane);
}

/* Runs the table until it has nothing more to do now. Called and returns
 * with mu held; drops it around the work. Returns true when it handed the
 * baton to the dispatcher (p->ho) in the middle of a round. */
static bool run_rounds(ect_push_producer *p, runner *r) {
    while (!p->stop) {
        /* This look at the table sees every flush so far: a kick set before
         * it is answered here, and only one set after it (mu dropped around
         * the work) makes the baton's holder look again. Left set, it sent a
         * lane that had just queued a flush's reserve on itself to hand the
         * empty baton to the dispatcher, which then took the step's write
         * and sent its complete to the other lane (two hand-offs more). */
        p->kick = false;
        r->quiet_ok = p->kick_lender; /* the lender's poll runs this round's exchanges */
        p->kick_lender = false;
        uint64_t now = pp_now(p);
        size_t n = push_next_actions(p->table, now, p->acts, p->acts_cap);
        if (!n) return false;
        px *xs = NULL;
        pb_build(&p->batch, p->acts, n, now, &xs);
        route_completes_locked(p, r, xs);
        pp_count_finished_locked(p, p->acts, n);
        bool async = writes_async_locked(p, xs);
        pthread_mutex_unlock(&p->mu);
        px *writes = NULL, *failed = NULL;
        submit_round(p, r, xs, &writes, &failed);
        if (hands_off(r, writes != NULL && !async, has_local(p->acts, n))) {
            pthread_mutex_lock(&p->mu);
            p->ho = (pp_handoff){
                .set = true, .nacts = n, .writes = writes, .failed = failed, .async = async};
            pthread_cond_signal(&p->wake);
            return true;
        }
        finish_round(p, n, writes, failed, async);
    }
    return false;
}

/* Whether more work that came in meanwhile goes to the dispatcher: a
 * caller's flush does one pass, not other threads' work for as long as it
 * keeps coming; a lane with its own exchanges queued goes back to them, a
 * write lane to the writes that may come. */
static bool leaves_the_rest(const runner *r) {
    return r->mode == PP_RUN_CALLER || r->mode == PP_RUN_WRITER ||
           (r->mode == PP_RUN_LANE && r->own_queued);
}

/* Settles and runs rounds while there is work; the caller holds the baton
 * and mu. Lets go of the baton at the end, unless handed to the dispatcher. */
static void run_with_baton(ect_push_producer *p, runner *r) {
    for (;;) {
        settle_done_locked(p);
        if (run_rounds(p, r)) return;
        if (p->stop || (!p->done && !p->kick)) break;
        /* A lane waits to settle what came back while a caller held the
         * baton (pp_wait_caller_locked): it takes the baton instead of the
         * dispatcher, and runs the step's write and complete itself. */
        if (r->mode == PP_RUN_CALLER && p->baton_waiters) break;
        if (leaves_the_rest(r)) { /* the baton, with no round to finish */
            p->ho = (pp_handoff){.set = true};
            pthread_cond_signal(&p->wake);
            return;
        }
    }
    p->running = false;
    /* the dispatcher's wait may need a shorter deadline (a backoff), or it is closing */
    if (p->stop || push_next_wake(p->table)) pthread_cond_signal(&p->wake);
}

void pp_run_locked(ect_push_producer *p, pp_run_mode mode, const char *lane_key) {
    if (p->running || p->stop) return;
    p->running = true;
    runner r = {mode, false, lane_key, false};
    p->caller_runs = mode == PP_RUN_CALLER;
    run_with_baton(p, &r);
    if (!p->caller_runs) return;
    p->caller_runs = false; /* let go of, or handed to the dispatcher */
    if (p->baton_waiters) pthread_cond_broadcast(&p->baton);
}

void pp_wait_caller_locked(ect_push_producer *p) {
    while (p->running && p->caller_runs && !p->stop) {
        p->baton_waiters++;
        pthread_cond_wait(&p->baton, &p->mu);
        p->baton_waiters--;
    }
}

/* The dispatcher took the baton with a round handed to it (p->ho). */
static void take_handoff(ect_push_producer *p) {
    pp_handoff ho = p->ho;
    p->ho = (pp_handoff){0};
    p->handoffs++;
    pthread_mutex_unlock(&p->mu);
    finish_round(p, ho.nacts, ho.writes, ho.failed, ho.async);
}

uint64_t pp_handoffs(ect_push_producer *p) {
    pthread_mutex_lock(&p->mu);
    uint64_t n = p->handoffs;
    pthread_mutex_unlock(&p->mu);
    return n;
}

uint64_t pp_async_writes(ect_push_producer *p) {
    pthread_mutex_lock(&p->mu);
    uint64_t n = p->wasync;
    pthread_mutex_unlock(&p->mu);
    return n;
}

uint64_t pp_now(ect_push_producer *p) {
    uint64_t ms = atomic_load_explicit(&p->clock_ms, memory_order_relaxed);
    return ms ? ms : ect_now_ms();
}

void pp_set_clock(ect_push_producer *p, uint64_t ms) { atomic_store(&p->clock_ms, ms); }

uint64_t pp_pipelined(ect_push_producer *p) {
    pthread_mutex_lock(&p->mu);
    uint64_t n = p->pipelined;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* Closing: what is still in flight fails here without contacting the
 * consumer (a control exchange could take the full timeout; those in
 * progress were cut short, ect_push_producer_close); the shards'
 * TTL ends their reservations; unwaited writes are waited for first (they
 * read the sources). Every source is given back, every result queued.
 * Caller holds mu; returns without it. */
static void close_all(ect_push_producer *p) {
    wait_writes_out(p);
    push_abort_all(p->table, "push producer closed");
    for (;;) {
        size_t n = push_next_actions(p->table, pp_now(p), p->acts, p->acts_cap);
        pp_count_finished_locked(p, p->acts, n);
        pthread_mutex_unlock(&p->mu);
        if (!n) break;
        pp_local(p, p->acts, n); /* aborting: local actions only */
        pthread_mutex_lock(&p->mu);
    }
    pp_lanes_close(p);
    pthread_mutex_lock(&p->mu); /* the lanes are gone: what they handed back is only freed */
    px *x = p->done;
    p->done = NULL;
    p->done_tail = &p->done;
    pthread_mutex_unlock(&p->mu);
    while (x) {
        px *next = x->next;
        px_free(x);
        x = next;
    }
    while (p->xports) {
        pp_xport *e = p->xports;
        LL_DELETE(p->xports, e);
        ect_xport_close(e->x);
        free(e);
    }
}

/* The dispatcher: takes the baton when it is handed over, when work came
 * back that nobody runs (a lane with more queued), and on its timer (input
 * waits, backoffs, tombstones); otherwise it sleeps. */
void *pp_dispatch_main(void *arg) {
    ect_push_producer *p = arg;
    pthread_setname_np(pthread_self(), "ect-push-disp");
    runner self = {PP_RUN_DISPATCHER, false, NULL, false};
    bool timed = false;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (p->ho.set) { /* the baton came with the rest of a round */
            take_handoff(p);
            run_with_baton(p, &self);
            continue;
        }
        if (p->stop && !p->running) break;
        if (!p->stop && !p->running && (timed || p->kick || p->done)) {
            p->running = true;
            run_with_baton(p, &self);
            timed = false;
            continue;
        }
        uint64_t ms = WAKE_MS, wake = push_next_wake(p->table), now = pp_now(p);
        if (wake && !p->running) ms = wake <= now ? 0 : wake - now < ms ? wake - now : ms;
        timed |= ect_cond_wait_until(&p->wake, &p->mu, ect_deadline_ns(ms)) != 0;
    }
    close_all(p);
    return NULL;
}
