/*
 * lanes — see lanes.h. One mutex guards the pool: the index of live lanes by
 * key, every lane's queue and flags, and the list of all threads not yet
 * joined. Each lane waits on its own condition variable (a submit wakes only
 * its lane). A lane that idles out leaves the index under the mutex, so a
 * submit after that starts a fresh lane instead of queueing on one that is
 * ending; its thread is joined by the next submit or by close.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <uthash.h>

#include "util/lanes.h"
#include "util/sync.h"
#include "util/util.h"

struct lane {
    lane_pool *lp;
    char *key;
    char *group; /* NULL: none */
    pthread_t th;
    pthread_cond_t cv;
    lane_job *head, *tail; /* [mu] queued, not started */
    lane_job *resume;      /* [mu] handed back by a borrower: runs before head, chain intact */
    void *state;           /* ops.start's, once `started` */
    bool started;          /* [mu] state is made: the lane may be lent */
    bool running;          /* [mu] its thread runs a job */
    bool lent;             /* [mu] another thread runs its jobs (lanes_lend) */
    bool quiet;            /* [mu] a job was queued without waking the thread */
    bool indexed;          /* [mu] in lp->by_key: accepts jobs */
    bool done;             /* [mu] the thread is about to return: join it */
    atomic_int waking;     /* submits signalling cv after the lock: not freed meanwhile */
    UT_hash_handle hh;     /* lp->by_key [mu] */
    struct lane *next;     /* lp->all [mu] */
};

struct lane_pool {
    lane_ops ops;
    size_t max;
    uint64_t idle_ms;
    pthread_mutex_t mu;
    lane *by_key; /* [mu] live lanes */
    lane *all;    /* [mu] every thread not yet joined */
    size_t live;  /* [mu] */
    bool stop, drain;
};

int lanes_open(const lane_ops *ops, size_t max_lanes, uint64_t idle_ms, lane_pool **out) {
    *out = NULL;
    if (!ops || !ops->run || !max_lanes || !idle_ms)
        return ect_set_error(ECT_EINVAL, "lanes: run, max_lanes and idle_ms are required");
    lane_pool *lp = calloc(1, sizeof *lp);
    if (!lp) return ect_set_error(ECT_ENOMEM, "lanes: out of memory");
    lp->ops = *ops;
    lp->max = max_lanes;
    lp->idle_ms = idle_ms;
    pthread_mutex_init(&lp->mu, NULL);
    *out = lp;
    return 0;
}

static void unindex(lane_pool *lp, lane *l) {
    if (!l->indexed) return;
    HASH_DELETE(hh, lp->by_key, l);
    l->indexed = false;
    lp->live--;
}

/* Whether the lane's own thread has a job to take now (mu held). */
static bool has_work_locked(const lane *l) {
    return !l->lent && (l->resume || (l->head && !l->quiet));
}

/* Takes the next job: the one a borrower handed back, else the head (mu held). */
static lane_job *pop_locked(lane *l) {
    lane_job *j = l->resume;
    if (j) {
        l->resume = NULL; /* its chain (next) is the job's own */
        return j;
    }
    j = l->head;
    l->head = j->next;
    if (!l->head) l->tail = NULL;
    j->next = NULL;
    return j;
}

static void *lane_main(void *arg) {
    lane *l = arg;
    lane_pool *lp = l->lp;
    pthread_setname_np(pthread_self(), lp->ops.name ? lp->ops.name : "ect-lane");
    void *state = lp->ops.start ? lp->ops.start(lp->ops.ctx, l->key) : NULL;
    lane_job *cancelled = NULL, *resumed = NULL;
    pthread_mutex_lock(&lp->mu);
    l->state = state;
    l->started = true;
    for (;;) {
        if (lp->stop && !l->lent) l->quiet = false; /* closing: the queue is the thread's */
        if (!has_work_locked(l)) {
            uint64_t end = ect_deadline_ns(lp->idle_ms);
            bool idle = false;
            /* a lent lane neither idles out nor stops: its state is in use */
            while (!has_work_locked(l) && (l->lent || (!lp->stop && !idle))) {
                if (l->lent) /* lanes_lend_end signals when it leaves work */
                    ect_cond_wait_until(&l->cv, &lp->mu, ect_deadline_ns(lp->idle_ms));
                else
                    idle = ect_cond_wait_until(&l->cv, &lp->mu, end) != 0;
            }
            /* closing, or idle so long: jobs left to a borrower are its own again */
            if (!l->lent && (idle || lp->stop)) l->quiet = false;
            if (!has_work_locked(l)) break; /* idle (or stopping): end */
        }
        if (lp->stop && !lp->drain) {
            resumed = l->resume; /* its chain (next) travels with it */
            l->resume = NULL;
            cancelled = l->head;
            l->head = l->tail = NULL;
            break;
        }
        lane_job *j = pop_locked(l);
        l->running = true;
        pthread_mutex_unlock(&lp->mu);
        lp->ops.run(lp->ops.ctx, l, state, j);
        pthread_mutex_lock(&lp->mu);
        l->running = false;
        if (l->quiet && l->head && !l->lent && lp->ops.lendable) { /* left to a borrower */
            pthread_mutex_unlock(&lp->mu);
            lp->ops.lendable(lp->ops.ctx);
            pthread_mutex_lock(&lp->mu);
        }
    }
    unindex(lp, l); /* from here a submit for the key starts a new lane */
    pthread_mutex_unlock(&lp->mu);
    if (resumed) lp->ops.cancel(lp->ops.ctx, resumed);
    while (cancelled) {
        lane_job *j = cancelled;
        cancelled = j->next;
        j->next = NULL;
        lp->ops.cancel(lp->ops.ctx, j);
    }
    if (lp->ops.stop) lp->ops.stop(lp->ops.ctx, state);
    pthread_mutex_lock(&lp->mu);
    l->done = true;
    pthread_mutex_unlock(&lp->mu);
    return NULL;
}

static void lane_free(lane *l) {
    while (atomic_load(&l->waking)) sched_yield(); /* a submit's signal is on its way out */
    pthread_cond_destroy(&l->cv);
    free(l->key);
    free(l->group);
    free(l);
}

/* Live lanes of group g (caller holds mu). At most max_lanes: a scan. */
static size_t group_live_locked(lane_pool *lp, const char *g) {
    size_t n = 0;
    for (lane *l = lp->by_key; l; l = l->hh.next)
        if (l->group && strcmp(l->group, g) == 0) n++;
    return n;
}

/* Joins the lanes whose threads returned (or are returning). Caller holds
 * mu; it is dropped around each join. */
static void reap_locked(lane_pool *lp) {
    for (lane **pp = &lp->all; *pp;) {
        lane *l = *pp;
        if (!l->done) {
            pp = &l->next;
            continue;
        }
        *pp = l->next;
        pthread_mutex_unlock(&lp->mu);
        pthread_join(l->th, NULL);
        lane_free(l);
        pthread_mutex_lock(&lp->mu);
        pp = &lp->all; /* the list may have changed meanwhile */
    }
}

static int submit(lane_pool *lp, const char *key, const char *group, size_t group_max,
                  lane_job *j, bool *quiet);

int lanes_submit(lane_pool *lp, const char *key, lane_job *j) {
    return submit(lp, key, NULL, 0, j, NULL);
}

int lanes_submit_quiet(lane_pool *lp, const char *key, lane_job *j, bool *quiet) {
    *quiet = false;
    return submit(lp, key, NULL, 0, j, quiet);
}

int lanes_submit_group(lane_pool *lp, const char *key, const char *group, size_t group_max,
                       lane_job *j) {
    return submit(lp, key, group, group_max, j, NULL);
}

void lanes_wake_quiet(lane_pool *lp) {
    pthread_mutex_lock(&lp->mu);
    for (lane *l = lp->by_key; l; l = l->hh.next)
        if (l->quiet) {
            l->quiet = false;
            pthread_cond_signal(&l->cv); /* under the lock: rare (a fallback) */
        }
    pthread_mutex_unlock(&lp->mu);
}

/* lanes_submit_group; with quiet, an idle lane is not woken (*quiet set). */
static int submit(lane_pool *lp, const char *key, const char *group, size_t group_max,
                  lane_job *j, bool *quiet) {
    pthread_mutex_lock(&lp->mu);
    reap_locked(lp);
    int rc = 0;
    lane *l = NULL;
    HASH_FIND_STR(lp->by_key, key, l);
    if (!l) {
        bool cv = false;
        if (lp->stop)
            rc = ect_set_error(ECT_ECLOSED, "lanes: closing");
        else if (lp->live >= lp->max)
            rc = ect_set_error(ECT_EBUSY, "%zu lanes run already", lp->max);
        else if (group && group_live_locked(lp, group) >= group_max)
            rc = ect_set_error(ECT_EBUSY, "%zu lanes of %.64s run already", group_max, group);
        else if (!(l = calloc(1, sizeof *l)) || !(l->key = strdup(key)) ||
                 (group && !(l->group = strdup(group))))
            rc = ect_set_error(ECT_ENOMEM, "lanes: out of memory");
        if (!rc) {
            l->lp = lp;
            ect_cond_init(&l->cv);
            cv = true;
            if (pthread_create(&l->th, NULL, lane_main, l) != 0)
                rc = ect_set_error(ECT_ENOMEM, "lanes: cannot start a thread");
        }
        if (rc) {
            if (l) {
                if (cv) pthread_cond_destroy(&l->cv);
                free(l->key);
                free(l->group);
                free(l);
            }
            pthread_mutex_unlock(&lp->mu);
            return rc;
        }
        HASH_ADD_KEYPTR(hh, lp->by_key, l->key, strlen(l->key), l);
        l->indexed = true;
        lp->live++;
        l->next = lp->all;
        lp->all = l;
    }
    j->next = NULL;
    if (l->tail)
        l->tail->next = j;
    else
        l->head = j;
    l->tail = j;
    /* lent: the borrower runs it, or hands it back with a signal; quiet: an
     * idle lane's job waits for a borrower or lanes_wake_quiet */
    bool alone = l->head == j || l->quiet; /* nothing queued it was woken for */
    bool own = l->running && pthread_equal(pthread_self(), l->th); /* its own round */
    bool asleep = l->started && (!l->running || own) && !l->resume && !lp->stop && alone;
    bool stay = l->lent || (quiet && asleep);
    if (!l->lent) l->quiet = stay;
    if (quiet) *quiet = stay && !l->lent;
    if (stay) {
        pthread_mutex_unlock(&lp->mu);
        return 0;
    }
    /* Signalled after the unlock: a lane woken under the lock would at once
     * block on it again (two more futex calls and a switch per job). The
     * lane cannot miss it (it looks at its queue under the lock before it
     * waits); `waking` keeps it from being freed until the signal is out. */
    atomic_fetch_add(&l->waking, 1);
    pthread_mutex_unlock(&lp->mu);
    pthread_cond_signal(&l->cv);
    atomic_fetch_sub(&l->waking, 1);
    return 0;
}

lane *lanes_lend(lane_pool *lp, lane_job **j, void **state) {
    *j = NULL;
    *state = NULL;
    pthread_mutex_lock(&lp->mu);
    lane *l = NULL;
    for (lane *e = lp->by_key; e && !l; e = e->hh.next)
        if (e->quiet && e->started && !e->running && !e->lent && !e->resume && !lp->stop && e->head)
            l = e;
    if (l) {
        l->lent = true;
        l->quiet = false;
        *j = pop_locked(l);
        *state = l->state;
    }
    pthread_mutex_unlock(&lp->mu);
    return l;
}

lane_job *lane_lend_next(lane *l) {
    lane_pool *lp = l->lp;
    pthread_mutex_lock(&lp->mu);
    lane_job *j = lp->stop || !(l->resume || l->head) ? NULL : pop_locked(l);
    pthread_mutex_unlock(&lp->mu);
    return j;
}

void lanes_lend_end(lane *l, lane_job *resume) {
    lane_pool *lp = l->lp;
    pthread_mutex_lock(&lp->mu);
    l->resume = resume;
    l->lent = false;
    /* its thread sleeps on: woken only for work left (or closing) */
    bool wake = resume || l->head || lp->stop;
    atomic_fetch_add(&l->waking, 1);
    pthread_mutex_unlock(&lp->mu);
    if (wake) pthread_cond_signal(&l->cv);
    atomic_fetch_sub(&l->waking, 1);
}

lane_job *lane_take_queued(lane *l) { return lane_take_queued_max(l, SIZE_MAX); }

lane_job *lane_take_queued_max(lane *l, size_t max) {
    if (!max) return NULL;
    lane_pool *lp = l->lp;
    pthread_mutex_lock(&lp->mu);
    lane_job *q = l->head, *last = q;
    for (size_t n = 1; last && n < max; n++) last = last->next;
    if (!last || !last->next) { /* all of them */
        l->head = l->tail = NULL;
    } else {
        l->head = last->next;
        last->next = NULL;
    }
    pthread_mutex_unlock(&lp->mu);
    return q;
}

bool lane_has_queued(lane *l) {
    lane_pool *lp = l->lp;
    pthread_mutex_lock(&lp->mu);
    bool q = l->head != NULL;
    pthread_mutex_unlock(&lp->mu);
    return q;
}

size_t lanes_queued(lane_pool *lp, const char *key) {
    pthread_mutex_lock(&lp->mu);
    lane *l = NULL;
    HASH_FIND_STR(lp->by_key, key, l);
    size_t n = 0;
    for (lane_job *j = l ? l->head : NULL; j; j = j->next) n++;
    pthread_mutex_unlock(&lp->mu);
    return n;
}

const char *lane_key(const lane *l) { return l->key; }

size_t lanes_count_group(lane_pool *lp, const char *group) {
    pthread_mutex_lock(&lp->mu);
    size_t n = group_live_locked(lp, group);
    pthread_mutex_unlock(&lp->mu);
    return n;
}

size_t lanes_count(lane_pool *lp) {
    pthread_mutex_lock(&lp->mu);
    size_t n = lp->live;
    pthread_mutex_unlock(&lp->mu);
    return n;
}

void lanes_close(lane_pool *lp, bool drain) {
    if (!lp) return;
    pthread_mutex_lock(&lp->mu);
    lp->stop = true;
    lp->drain = drain;
    for (lane *l = lp->all; l; l = l->next) pthread_cond_signal(&l->cv);
    while (lp->all) {
        lane *l = lp->all;
        lp->all = l->next;
        pthread_mutex_unlock(&lp->mu);
        pthread_join(l->th, NULL); /* lanes end in parallel: each was told above */
        lane_free(l);
        pthread_mutex_lock(&lp->mu);
    }
    pthread_mutex_unlock(&lp->mu);
    pthread_mutex_destroy(&lp->mu);
    free(lp);
}
