/*
 * producer_run — the push producer's dispatcher thread: a thin executor. Each
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
 * The table hands out no action twice while one is in flight, which is what
 * lets rounds overlap. A reserve a shard refuses because its pool is full is
 * not a failure: the table backs the item off and retries (pushes.h,
 * "Back-pressure"); the dispatcher's wait is cut short to the table's next
 * retry time. All decisions (grouping, discovery checks, holding a dead
 * address down, error texts) are the table's and the batcher's.
 *
 * Locking: the table and the batcher are called under p->mu; the mutex is
 * dropped around every send, write and release callback.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utlist.h>

#include "push/producer.h"
#include "util/sync.h"
#include "util/util.h"

#define MOD "producer"
#define WAKE_MS 50

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
    xo.curve_keys = p->o.curve_keys;
    ect_xport *x = NULL;
    if (ect_xport_open(kind, &xo, &x)) return NULL;
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

/* lane_ops.run of the write lanes: one batch, then the round hears of it. */
static void write_lane_run(void *ctx, lane *l, void *state, lane_job *lj) {
    ect_push_producer *p = ctx;
    (void)l;
    (void)state;
    write_batch((px *)lj);
    pthread_mutex_lock(&p->wmu);
    p->wpending--;
    pthread_cond_signal(&p->wcv);
    pthread_mutex_unlock(&p->wmu);
}

int pp_write_lanes_open(ect_push_producer *p) {
    lane_ops o = {.run = write_lane_run, .ctx = p};
    return lanes_open(&o, PP_MAX_LANES, PP_LANE_IDLE_MS, &p->wlanes);
}

/* Runs the round's write batches, sessions in parallel; returns when all
 * are in. Without mu. */
static void run_writes(ect_push_producer *p, px *list) {
    for (px *x = list; x; x = x->next) {
        x->xport = xport_for(p, x->xkind);
        if (!x->xport) {
            ECT_LOGW(MOD, "no transport for %s: %s", x->key, ect_last_error());
            x->rc = ECT_ENOTSUP;
            for (size_t k = 0; k < x->n; k++) x->status[k] = ECT_ENOTSUP;
            continue;
        }
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

/* Settles every exchange the lanes handed back. Caller holds mu. */
static void settle_done_locked(ect_push_producer *p) {
    px *x = p->done;
    p->done = NULL;
    p->done_tail = &p->done;
    uint64_t now = ect_now_ms();
    while (x) {
        px *next = x->next;
        pb_settle(&p->batch, x, now);
        x = next;
    }
}

/* Runs the table until it has nothing more to do now. Called and returns
 * with mu held; drops it around the work. */
static void run_rounds(ect_push_producer *p) {
    while (!p->stop) {
        uint64_t now = ect_now_ms();
        size_t n = push_next_actions(p->table, now, p->acts, p->acts_cap);
        if (!n) return;
        px *xs = NULL;
        pb_build(&p->batch, p->acts, n, now, &xs);
        pp_count_finished_locked(p, p->acts, n);
        pthread_mutex_unlock(&p->mu);
        pp_local(p, p->acts, n); /* p->acts is this thread's: only its local kinds are read */
        px *writes = NULL, **wtail = &writes, *failed = NULL;
        while (xs) {
            px *x = xs;
            xs = x->next;
            x->next = NULL;
            if (x->kind == PX_WRITE) {
                *wtail = x;
                wtail = &x->next;
            } else if (pp_lane_submit(p, x)) { /* it never goes out */
                x->rc = ECT_ENOMEM;
                x->held = true;
                snprintf(x->err, sizeof x->err, "%.300s", ect_last_error());
                x->next = failed;
                failed = x;
            }
        }
        run_writes(p, writes);
        pthread_mutex_lock(&p->mu);
        now = ect_now_ms();
        for (px *x = writes, *next; x; x = next) {
            next = x->next;
            pb_settle(&p->batch, x, now);
        }
        for (px *x = failed, *next; x; x = next) {
            next = x->next;
            pb_settle(&p->batch, x, now);
        }
    }
}

/* Closing: what is still in flight fails here without contacting the
 * consumer (a control exchange could take the full timeout); the shards'
 * TTL ends their reservations. Every source is given back, every result
 * queued. Caller holds mu; returns without it. */
static void close_all(ect_push_producer *p) {
    push_abort_all(p->table, "push producer closed");
    for (;;) {
        size_t n = push_next_actions(p->table, ect_now_ms(), p->acts, p->acts_cap);
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

void *pp_dispatch_main(void *arg) {
    ect_push_producer *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (!p->stop && !p->kick && !p->done) {
            uint64_t ms = WAKE_MS, wake = push_next_wake(p->table), now = ect_now_ms();
            if (wake) ms = wake <= now ? 0 : wake - now < ms ? wake - now : ms;
            ect_cond_wait_until(&p->wake, &p->mu, ect_deadline_ns(ms));
        }
        if (p->stop) break;
        p->kick = false;
        settle_done_locked(p);
        run_rounds(p);
    }
    close_all(p);
    return NULL;
}
