/*
 * producer — the generation-1 producer: save queue + save thread (owns PUB),
 * ROUTER thread (owns ROUTER), one write lane per consumer session.
 *
 * Why lanes: upstream's save thread waited for each item's pull before the
 * next (head-of-line blocking). Here the ROUTER thread never waits on a
 * consumer: it hands the pulls it accepted from one burst of frames to the
 * lanes of their consumer sessions, one lane job per session (util/lanes:
 * started on demand, ended after LANE_IDLE_MS without work), so a consumer
 * that is slow or gone holds up only its own lane. On our own listener
 * (no keys) a lane answers its pulls itself: it takes stat_mu, which the
 * ROUTER thread holds but while it sleeps in poll() (ctl_listener's lock),
 * queues the answers on the consumer's connection and writes them without
 * blocking, waking the ROUTER thread through its eventfd only for what the
 * socket did not take (issue 13, tenth pass: one thread hand-off fewer a
 * round). With libzmq's ROUTER (keys) lanes push finished jobs onto a
 * completion queue and wake the ROUTER thread through that eventfd; only
 * the ROUTER thread sends on a libzmq socket. The one write the ROUTER
 * thread does itself is one that needs no answer from the consumer
 * (xp_write_ready: over shm, a copy into a window
 * the consumer offered, on a connection already made): those it writes and
 * answers at once, up to READY_BURST_BYTES a burst, which saves the set two
 * thread wake-ups (to the lane and back) and the hand-offs (issue 13,
 * seventh pass).
 *
 * The ROUTER socket: without CURVE keys it is our own ZMTP listener
 * (push/control_listener in ROUTER mode, issue 13) served by the ROUTER
 * thread itself, each peer known by its connection id; with keys, libzmq's
 * ROUTER (CURVE and ZAP stay libzmq's), each peer known by its identity.
 *
 * Memory: items are copied into a memfd pool (so the shm back end can map
 * it) and made resident without a lease; a pull leases its item for the
 * duration of the write. When the save thread needs room, the pool reclaims
 * unleased items least recently used first. The inventory a consumer asks
 * for is read from the pool's resident items (inventory.c): nothing to keep
 * in step.
 */

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "pull/pull_internal.h"
#include "push/control_listener.h"
#include "util/hostport.h"
#include "util/lanes.h"
#include "util/sync.h"
#include "util/metrics.h"
#include "util/util.h"
#include "util/zauth.h"
#include "wire/dtype.h"
#include "xport/xport.h"

#define MOD "pull"
#define LANE_IDLE_MS 5000
#define SAVE_JOIN_MS 5000

typedef struct save_item {
    wire_pull_item item; /* mm_hash owned */
    const void *data;
    ect_pull_release_fn release; /* NULL: data is a heap copy we free */
    void *user;
    struct save_item *next;
} save_item;

/* The pulls of one consumer session accepted in one burst of ROUTER frames,
 * on their way through its lane as one lane job (one submit, one wake-up of
 * the lane, one write batch). */
typedef struct lane_pull {
    lane_job lj;
    pull_job *head, **tail; /* chained through pull_job.next, in arrival order */
    struct lane_pull *next; /* the burst's groups, in order of first arrival */
} lane_pull;

typedef struct completion {
    pull_peer peer;
    char *mm_hash;
    int status;
    bool has_token, batched;
    uint64_t token;
    char reason[256];
} completion;

/* The completions of one write batch, queued for the ROUTER thread in one
 * allocation (not one per pull). */
typedef struct comp_batch {
    struct comp_batch *next;
    size_t n;
    completion c[];
} comp_batch;

struct ect_pull_producer {
    ect_pull_producer_opts o;
    char host[256], transport[16];
    int port;
    char *allow; /* copy of o.connect_allow, or NULL */
    char session_id[ECT_ID_LEN + 1];
    ect_pool *pool;
    ect_xport *x;
    char key[ECT_XPORT_KEY_MAX];
    bool registered;
    void *zctx, *router, *pub; /* router: with CURVE keys only */
    ctl_listener *lst;         /* the ROUTER without keys */
    char *curve_keys;
    ect_keyset *keys; /* NULL: keys off */
    zauth *auth;      /* ZAP handler on zctx with keys */
    int efd;
    pull_router r;           /* ROUTER thread only, except r.st under stat_mu */
    pthread_mutex_t stat_mu; /* r; own listener: its lock (the ROUTER thread but in poll) */

    pthread_mutex_t mu; /* save queue, flush, stats */
    pthread_cond_t cv;
    save_item *q_head, *q_tail;
    uint64_t q_enqueued, q_done; /* items ever queued / finished by the save thread */
    uint64_t q_bytes, max_q;     /* bytes saved but not yet stored, and their bound */
    bool save_stop;
    bool save_exited; /* the save thread is past its last use of the producer */
    pthread_t save_thread, router_thread;
    bool save_started, router_started;
    atomic_bool router_stop;

    lane_pool *lanes;        /* one write lane per consumer session */
    lane_pull *burst;        /* ROUTER thread: pulls accepted, not yet on a lane */
    pthread_mutex_t comp_mu; /* completions */
    comp_batch *c_head, **c_tail;

    atomic_uint_fast64_t saved, save_failed, notifications, pulls_ok, pulls_failed;
    atomic_uint_fast64_t bytes_out; /* bytes of the pulls written */
    /* Pulls the ROUTER thread wrote itself, and jobs it handed to lanes
     * (pull_producer_handoffs). ready_writes: it may (shm, with offers). */
    atomic_uint_fast64_t ready_pulls, lane_jobs;
    bool ready_writes;
    met_source *met;
};

void ect_pull_producer_opts_init(ect_pull_producer_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 14579;
    o->transport = "tcp";
    o->pool_size = 1000000000ull;
    o->alignment = 64;
    o->connect_timeout_ms = 3000;
    o->io_timeout_ms = 10000;
    o->max_lanes = 256;
    o->max_lanes_per_peer = 32;
    o->page_items = WIRE_PULL_MAX_ITEMS;
    o->max_queued_bytes = 1ull << 30;
}

/* ---- save thread */

static void release_item(save_item *s) {
    if (s->release)
        s->release(s->user, s->data);
    else
        free((void *)s->data);
    free(s->item.mm_hash);
    free(s);
}

/* Copies one item into the pool; 0 when it is resident (new or already). */
static int store(ect_pull_producer *p, save_item *s) {
    ect_resident_info info;
    if (ect_pool_lookup(p->pool, s->item.mm_hash, &info) == 0) {
        if (info.nbytes == s->item.num_bytes) return 0;
        /* Same hash, other bytes: replace when nobody is reading it. */
        if (ect_pool_remove(p->pool, s->item.mm_hash) != 0) return ECT_EBUSY;
    }
    uint64_t off;
    int rc = ect_pool_alloc(p->pool, s->item.num_bytes, &off);
    if (rc) return rc;
    /* A source in device memory is copied by the driver (device to host). */
    rc = ect_mem_copy((char *)ect_pool_base(p->pool) + off, s->data, s->item.num_bytes);
    if (rc) {
        ECT_LOGW_ID(MOD, NULL, s->item.mm_hash, "save of %s: %s", s->item.mm_hash,
                    ect_last_error());
        ect_pool_free(p->pool, off);
        return rc;
    }
    rc = ect_pool_put(p->pool, s->item.mm_hash, off, s->item.num_bytes, s->item.shape, s->item.ndim,
                      s->item.dtype, 0);
    if (rc) ect_pool_free(p->pool, off);
    return rc;
}

static void publish(ect_pull_producer *p, wire_pull_item *items, size_t n) {
    for (size_t i = 0; i < n; i += WIRE_PULL_MAX_ITEMS) {
        size_t k = n - i < WIRE_PULL_MAX_ITEMS ? n - i : WIRE_PULL_MAX_ITEMS;
        wire_hash_notification m = {
            .items = items + i, .n_items = k, .producer_session_id = p->session_id};
        void *buf;
        size_t len;
        if (wire_hash_notification_encode(&m, &buf, &len) != 0) {
            ECT_LOGE(MOD, "cannot encode ECHashNotification: %s", ect_last_error());
            continue;
        }
        if (zmq_send(p->pub, buf, len, ZMQ_DONTWAIT) < 0)
            ECT_LOGW(MOD, "ECHashNotification not sent: %s", zmq_strerror(zmq_errno()));
        else
            atomic_fetch_add(&p->notifications, 1);
        free(buf);
    }
}

static void *save_main(void *arg) {
    ect_pull_producer *p = arg;
    pthread_setname_np(pthread_self(), "ect-pull-save");
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->q_head && !p->save_stop) pthread_cond_wait(&p->cv, &p->mu);
        save_item *batch = p->q_head;
        p->q_head = p->q_tail = NULL;
        bool stop = p->save_stop;
        pthread_mutex_unlock(&p->mu);
        if (!batch && stop) break;
        /* Everything queued together is stored, then announced together. */
        size_t n = 0, cap = 0, done = 0;
        uint64_t done_bytes = 0;
        for (save_item *s = batch; s; s = s->next) cap++;
        wire_pull_item *ok = calloc(cap, sizeof *ok);
        while (batch) {
            save_item *s = batch;
            batch = s->next;
            int rc = stop ? ect_set_error(ECT_ECLOSED, "producer closed before it was stored")
                          : store(p, s);
            if (rc == 0 && ok) {
                ok[n] = s->item;
                ok[n].mm_hash = strdup(s->item.mm_hash);
                if (ok[n].mm_hash) n++;
                atomic_fetch_add(&p->saved, 1);
            } else {
                atomic_fetch_add(&p->save_failed, 1);
                ECT_LOGE_ID(MOD, NULL, s->item.mm_hash, "save of %s failed (%s): %s",
                            s->item.mm_hash, ect_strerror(rc), ect_last_error());
            }
            done_bytes += s->item.num_bytes;
            release_item(s);
            done++;
        }
        if (n) publish(p, ok, n);
        if (ok) pull_inv_items_free(ok, n);
        pthread_mutex_lock(&p->mu);
        p->q_done += done;
        p->q_bytes -= done_bytes;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        if (stop) break;
    }
    pthread_mutex_lock(&p->mu);
    p->save_exited = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int ect_pull_producer_save(ect_pull_producer *p, const char *mm_hash, const void *data,
                           uint64_t nbytes, const uint64_t *shape, size_t ndim, const char *dtype,
                           ect_pull_release_fn release, void *user) {
    if (!p || !mm_hash || !data || !dtype || (ndim && !shape))
        return ect_set_error(ECT_EINVAL, "pull save: NULL argument");
    size_t hl = strlen(mm_hash);
    if (hl == 0 || hl > ECT_MM_HASH_MAX)
        return ect_set_error(ECT_EINVAL, "pull save: mm_hash must be 1..%d bytes", ECT_MM_HASH_MAX);
    if (nbytes == 0) return ect_set_error(ECT_EINVAL, "pull save: nbytes is 0");
    if (ndim > ECT_POOL_MAX_NDIM)
        return ect_set_error(ECT_EINVAL, "pull save: ndim %zu over %d", ndim, ECT_POOL_MAX_NDIM);
    if (strlen(dtype) >= WIRE_PULL_DTYPE_CAP)
        return ect_set_error(ECT_EINVAL, "pull save: dtype: Unsupported torch dtype string");
    int rc = wire_check_nbytes(dtype, shape, ndim, nbytes, "pull save");
    if (rc) return rc;
    save_item *s = calloc(1, sizeof *s);
    if (!s || !(s->item.mm_hash = strdup(mm_hash))) {
        free(s);
        return ect_set_error(ECT_ENOMEM, "pull save: out of memory");
    }
    s->item.ndim = (uint32_t)ndim;
    for (size_t d = 0; d < ndim; d++) s->item.shape[d] = shape[d];
    snprintf(s->item.dtype, sizeof s->item.dtype, "%s", dtype);
    s->item.num_bytes = nbytes;
    s->release = release;
    s->user = user;
    /* Bound what waits for the save thread before taking a snapshot, so a
     * caller that saves faster than the pool fills gets told instead of
     * growing the heap. A lone item larger than the bound still goes in. */
    pthread_mutex_lock(&p->mu);
    if (p->q_bytes > 0 && p->q_bytes + nbytes > p->max_q) {
        uint64_t queued = p->q_bytes;
        pthread_mutex_unlock(&p->mu);
        free(s->item.mm_hash);
        free(s);
        return ect_set_error(ECT_EBUSY,
                             "pull save: %llu bytes already wait for the save thread; %llu more "
                             "would pass max_queued_bytes (%llu): flush, or save later",
                             (unsigned long long)queued, (unsigned long long)nbytes,
                             (unsigned long long)p->max_q);
    }
    p->q_bytes += nbytes;
    pthread_mutex_unlock(&p->mu);
    if (release) {
        s->data = data;
    } else {
        void *copy = malloc(nbytes);
        if (!copy) {
            pthread_mutex_lock(&p->mu);
            p->q_bytes -= nbytes;
            pthread_mutex_unlock(&p->mu);
            free(s->item.mm_hash);
            free(s);
            return ect_set_error(ECT_ENOMEM, "pull save: out of memory for a %llu-byte snapshot",
                                 (unsigned long long)nbytes);
        }
        int crc = ect_mem_copy(copy, data, nbytes); /* a device source: one copy to host */
        if (crc) {
            char why[256];
            snprintf(why, sizeof why, "%s", ect_last_error());
            free(copy);
            pthread_mutex_lock(&p->mu);
            p->q_bytes -= nbytes;
            pthread_mutex_unlock(&p->mu);
            free(s->item.mm_hash);
            free(s);
            return ect_set_error(crc, "pull save: %s", why);
        }
        s->data = copy;
    }
    pthread_mutex_lock(&p->mu);
    if (p->save_stop) {
        p->q_bytes -= nbytes;
        pthread_mutex_unlock(&p->mu);
        if (!release) free((void *)s->data);
        free(s->item.mm_hash);
        free(s);
        return ect_set_error(ECT_ECLOSED, "pull save: producer is closing");
    }
    if (p->q_tail)
        p->q_tail->next = s;
    else
        p->q_head = s;
    p->q_tail = s;
    p->q_enqueued++;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int ect_pull_producer_flush(ect_pull_producer *p, int timeout_ms) {
    if (!p) return ect_set_error(ECT_EINVAL, "pull flush: NULL producer");
    uint64_t end = ect_deadline_ns(timeout_ms > 0 ? (uint64_t)timeout_ms : 0);
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    uint64_t target = p->q_enqueued;
    while (p->q_done < target && rc == 0)
        if (ect_cond_wait_until(&p->cv, &p->mu, end) && p->q_done < target) rc = ECT_ETIMEDOUT;
    pthread_mutex_unlock(&p->mu);
    if (rc) return ect_set_error(rc, "pull flush: save queue not drained within %d ms", timeout_ms);
    return 0;
}

/* ---- write lanes */

static void wake_router(ect_pull_producer *p) {
    uint64_t one = 1;
    ssize_t w = write(p->efd, &one, sizeof one);
    (void)w; /* a full counter still wakes the poller */
}

/* The pulls one write_batch carries at most: items and bytes (a larger
 * batch would hold back the first item's completion for little gain). */
#define LANE_BATCH_ITEMS 64
#define LANE_BATCH_BYTES (4ull << 20)

/* Settles one pull whose write ended with jrc (why: the batch's error
 * text): releases its lease, counts and logs it, and fills c, its
 * completion, taking j's mm_hash. */
static void settle_job(ect_pull_producer *p, pull_job *j, int jrc, const char *why,
                       completion *c) {
    ect_pool_release(p->pool, j->mm_hash);
    if (jrc) {
        ECT_LOGW_ID(MOD, NULL, j->mm_hash, "write of %s to %s failed (%s): %s", j->mm_hash,
                    j->session, ect_strerror(jrc), why);
        atomic_fetch_add(&p->pulls_failed, 1);
    } else {
        atomic_fetch_add(&p->bytes_out, j->nbytes);
        atomic_fetch_add(&p->pulls_ok, 1);
    }
    *c = (completion){.peer = j->peer,
                      .mm_hash = j->mm_hash,
                      .status = jrc,
                      .has_token = j->has_token,
                      .batched = j->batched,
                      .token = j->token};
    j->mm_hash = NULL;
    if (jrc) {
        /* reason is a summary: a cut one is still the cause (the full text was logged above) */
        int cut = snprintf(c->reason, sizeof c->reason, "write to %s failed: %s", j->session, why);
        (void)cut;
    }
}

/* The writes of the n pulls js[] (one session), from the pool. */
static void jobs_writes(ect_pull_producer *p, pull_job *const *js, size_t n, ect_write *w) {
    for (size_t i = 0; i < n; i++)
        w[i] = (ect_write){.src = (const char *)ect_pool_base(p->pool) + js[i]->src_offset,
                           .dst_addr = js[i]->dst_addr,
                           .len = js[i]->nbytes,
                           .dst_key = js[i]->dst_key};
}

/* Answers the completions of cb (and frees them) on the ROUTER (stat_mu
 * held): in ECTransferDone for batched pulls (pull_router_flush_done sends
 * it), in their own ECTransferComplete otherwise. */
static void answer_batch(ect_pull_producer *p, comp_batch *cb) {
    for (size_t i = 0; i < cb->n; i++) {
        completion *c = &cb->c[i];
        pull_router_answer(&p->r, &c->peer, c->mm_hash, c->status, c->has_token, c->token,
                           c->batched, c->status ? c->reason : NULL);
        free(c->mm_hash);
    }
    free(cb);
}

/* Our own listener (lane): answers cb on the consumer's connection now and
 * writes it without blocking; wakes the ROUTER thread only when the socket
 * left some for its poll (POLLOUT). */
static void answer_on_lane(ect_pull_producer *p, comp_batch *cb) {
    pthread_mutex_lock(&p->stat_mu); /* the listener's lock */
    answer_batch(p, cb);
    pull_router_flush_done(&p->r);
    bool left = ctl_listener_flush(p->lst);
    pthread_mutex_unlock(&p->stat_mu);
    if (left) wake_router(p);
}

/* libzmq's ROUTER (lane): queues cb for the ROUTER thread and wakes it. */
static void queue_completions(ect_pull_producer *p, comp_batch *cb) {
    pthread_mutex_lock(&p->comp_mu);
    *p->c_tail = cb;
    p->c_tail = &cb->next;
    pthread_mutex_unlock(&p->comp_mu);
    wake_router(p);
}

/* Writes the n pulls js[] (one session: the lane's) with one
 * ect_xport_write_batch, so their acknowledgements overlap instead of each
 * write waiting for its own, then answers them in order, in one allocation:
 * itself on our own listener, else through the ROUTER thread (one wake-up). */
static void run_jobs(ect_pull_producer *p, pull_job **js, size_t n) {
    ect_write w[LANE_BATCH_ITEMS];
    int st[LANE_BATCH_ITEMS];
    jobs_writes(p, js, n, w);
    for (size_t i = 0; i < n; i++) st[i] = 0;
    int rc = ect_xport_write_batch(p->x, js[0]->session, w, n, st);
    char why[ECT_ERROR_LEN] = "";
    if (rc) snprintf(why, sizeof why, "%s", ect_last_error());
    bool any = false;
    for (size_t i = 0; i < n; i++) any = any || st[i];
    for (size_t i = 0; !any && i < n; i++) st[i] = rc; /* a failed batch fails each */
    comp_batch *cb = malloc(sizeof *cb + n * sizeof cb->c[0]);
    for (size_t i = 0; i < n; i++) {
        completion done;
        settle_job(p, js[i], st[i], why, cb ? &cb->c[i] : &done);
        if (!cb) {
            ECT_LOGE_ID(MOD, NULL, done.mm_hash, "out of memory: completion of %s dropped",
                        done.mm_hash);
            free(done.mm_hash);
        }
    }
    if (!cb) return;
    cb->n = n;
    cb->next = NULL;
    if (p->lst)
        answer_on_lane(p, cb);
    else
        queue_completions(p, cb);
}

/* Appends lp's pulls to *tail and frees lp. */
static void take_pulls(lane_pull *lp, pull_job ***tail) {
    **tail = lp->head;
    *tail = lp->tail;
    free(lp);
}

/* lane_ops.run: the pulls of one burst on their session's lane, and with
 * them those queued behind it (a consumer with several pulls in flight), in
 * order, in write batches of up to LANE_BATCH_ITEMS items /
 * LANE_BATCH_BYTES bytes. */
static void lane_run(void *ctx, lane *l, void *state, lane_job *lj) {
    (void)state;
    ect_pull_producer *p = ctx;
    lane_job *rest = lane_take_queued(l);
    pull_job *chain = NULL, **tail = &chain;
    take_pulls((lane_pull *)lj, &tail);
    for (lane_job *nx; rest; rest = nx) {
        nx = rest->next;
        take_pulls((lane_pull *)rest, &tail);
    }
    while (chain) {
        pull_job *js[LANE_BATCH_ITEMS];
        size_t n = 0;
        uint64_t bytes = 0;
        while (chain && n < LANE_BATCH_ITEMS &&
               (n == 0 || bytes + chain->nbytes <= LANE_BATCH_BYTES)) {
            js[n] = chain;
            bytes += chain->nbytes;
            chain = chain->next;
            n++;
        }
        run_jobs(p, js, n);
        for (size_t i = 0; i < n; i++) pull_job_free(js[i]);
    }
}

/* router ops.dispatch (ROUTER thread): holds j in its session's group of
 * this burst; flush_burst hands the groups to their lanes. */
static int dispatch(void *user, pull_job *j) {
    ect_pull_producer *p = user;
    lane_pull **pp = &p->burst;
    while (*pp && strcmp((*pp)->head->session, j->session) != 0) pp = &(*pp)->next;
    if (!*pp) {
        lane_pull *lp = calloc(1, sizeof *lp);
        if (!lp) return ect_set_error(ECT_ENOMEM, "producer out of memory for a lane");
        lp->head = j;
        lp->tail = &lp->head;
        *pp = lp;
    } else {
        *(*pp)->tail = j;
    }
    j->next = NULL;
    (*pp)->tail = &j->next;
    return 0;
}

/* Queues one burst group on its session's lane; on failure refuses each
 * of its pulls (the lane caps, or closing) and frees the group. */
static void submit_group(ect_pull_producer *p, lane_pull *lp) {
    pull_job *j = lp->head;
    /* A lane counts against the peer that asked (its IP address; a peer
     * whose address ZMQ cannot tell is grouped under "?"): one peer naming
     * many sessions that never answer holds at most max_lanes_per_peer. */
    const char *group = j->peer.addr[0] ? j->peer.addr : "?";
    int rc = lanes_submit_group(p->lanes, j->session, group, p->o.max_lanes_per_peer, &lp->lj);
    if (!rc) {
        atomic_fetch_add(&p->lane_jobs, 1);
        return;
    }
    char why[ECT_ERROR_LEN];
    if (rc == ECT_EBUSY && lanes_count(p->lanes) >= p->o.max_lanes)
        snprintf(why, sizeof why, "producer serves %u consumer sessions already", p->o.max_lanes);
    else if (rc == ECT_EBUSY)
        snprintf(why, sizeof why,
                 "producer serves %u consumer sessions of peer %s already (max_lanes_per_peer)",
                 p->o.max_lanes_per_peer, group);
    else if (rc == ECT_ECLOSED)
        snprintf(why, sizeof why, "producer is closing");
    else
        snprintf(why, sizeof why, "%s", ect_last_error());
    for (pull_job *nx; j; j = nx) {
        nx = j->next;
        pull_router_refuse_job(&p->r, j, rc, why);
    }
    free(lp);
}

/* Bytes of pulls the ROUTER thread writes itself per burst at most; the
 * rest go to their lanes (a large copy here would hold up every other
 * consumer's requests). */
#define READY_BURST_BYTES LANE_BATCH_BYTES

/* Answers a pull written (or failed) on the ROUTER thread, at once. */
static void complete_here(ect_pull_producer *p, pull_job *j, int jrc, const char *why) {
    completion c;
    settle_job(p, j, jrc, why, &c);
    pull_router_answer(&p->r, &c.peer, c.mm_hash, c.status, c.has_token, c.token, c.batched,
                       c.status ? c.reason : NULL);
    free(c.mm_hash);
    pull_job_free(j);
    atomic_fetch_add(&p->ready_pulls, 1);
}

/* Writes, on the ROUTER thread, the pulls js[0..n) that need no answer from
 * their consumer (xp_write_ready: shm copies into windows it offered) and
 * answers them at once; appends the others to *kt. */
static void write_ready_batch(ect_pull_producer *p, pull_job **js, size_t n, pull_job ***kt) {
    ect_write w[LANE_BATCH_ITEMS];
    int st[LANE_BATCH_ITEMS];
    jobs_writes(p, js, n, w);
    xp_write_ready(p->x, js[0]->session, w, n, st);
    char why[ECT_ERROR_LEN] = "";
    for (size_t i = 0; i < n && !why[0]; i++)
        if (st[i] < 0) snprintf(why, sizeof why, "%s", ect_last_error());
    for (size_t i = 0; i < n; i++) {
        if (st[i] > 0) {
            **kt = js[i];
            *kt = &js[i]->next;
        } else {
            complete_here(p, js[i], st[i], why);
        }
    }
}

/* The pulls of lp that need no answer from their consumer, written and
 * answered here (no hand-off to the lane and back: two wake-ups a set),
 * within *budget bytes; what is left stays in lp, in order, for its lane. */
static void write_ready_pulls(ect_pull_producer *p, lane_pull *lp, uint64_t *budget) {
    pull_job *keep = NULL, **kt = &keep, *chain = lp->head;
    while (chain) {
        pull_job *js[LANE_BATCH_ITEMS];
        size_t n = 0;
        for (; chain && n < LANE_BATCH_ITEMS; chain = chain->next) {
            if (chain->nbytes > *budget) {
                *kt = chain;
                kt = &chain->next;
                continue;
            }
            *budget -= chain->nbytes;
            js[n++] = chain;
        }
        if (n) write_ready_batch(p, js, n, &kt);
    }
    *kt = NULL;
    lp->head = keep;
    lp->tail = keep ? kt : &lp->head;
}

/* Hands the pulls accepted in this burst to their lanes, one job per
 * consumer session, in order of first arrival, after writing here those
 * that need no answer (ROUTER thread, stat_mu held). */
static void flush_burst(ect_pull_producer *p) {
    uint64_t budget = READY_BURST_BYTES;
    while (p->burst) {
        lane_pull *lp = p->burst;
        p->burst = lp->next;
        if (p->ready_writes) write_ready_pulls(p, lp, &budget);
        if (lp->head)
            submit_group(p, lp);
        else
            free(lp);
    }
}

/* ---- ROUTER thread */

static int reply(void *user, const pull_peer *peer, const void *msg, size_t len) {
    ect_pull_producer *p = user;
    if (p->lst) {
        int rc = ctl_listener_send(p->lst, peer->conn, peer->delim, msg, len);
        if (rc == ECT_ENOTFOUND) { /* the peer went away: dropped, as libzmq's ROUTER drops it */
            ECT_LOGD(MOD, "reply to a peer that is gone dropped");
            return 0;
        }
        return rc;
    }
    if (zmq_send(p->router, peer->id, peer->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        (peer->delim && zmq_send(p->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) ||
        zmq_send(p->router, msg, len, ZMQ_DONTWAIT) < 0)
        return ect_set_error(ECT_EIO, "ROUTER send: %s", zmq_strerror(zmq_errno()));
    return 0;
}

static void drain_completions(ect_pull_producer *p) {
    uint64_t v;
    ssize_t r = read(p->efd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&p->comp_mu);
    comp_batch *cb = p->c_head;
    p->c_head = NULL;
    p->c_tail = &p->c_head;
    pthread_mutex_unlock(&p->comp_mu);
    pthread_mutex_lock(&p->stat_mu); /* an answer may send an ECTransferDone (r.st) */
    for (comp_batch *nx; cb; cb = nx) {
        nx = cb->next;
        answer_batch(p, cb);
    }
    pthread_mutex_unlock(&p->stat_mu);
}

/* Reads one multipart message; frames beyond 3 are discarded. Returns the
 * number of frames, or -1 when nothing was there. */
static int recv_multipart(void *sock, zmq_msg_t f[3]) {
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return n ? n : -1;
        }
        more = zmq_msg_more(&m);
        if (n < 3)
            f[n] = m;
        else
            zmq_msg_close(&m);
        n++;
    }
    return n;
}

static void handle_frames(ect_pull_producer *p) {
    for (int budget = 0; budget < 256; budget++) {
        zmq_msg_t f[3];
        int n = recv_multipart(p->router, f);
        if (n < 0) return;
        pull_peer peer = {0};
        zmq_msg_t *payload = NULL;
        if (n == 2 || (n == 3 && zmq_msg_size(&f[1]) == 0)) {
            payload = &f[n - 1];
            peer.delim = n == 3;
        }
        size_t idl = zmq_msg_size(&f[0]);
        /* The counters change before the reply leaves, so a peer that has
         * its answer and then reads the stats sees them counted. */
        pthread_mutex_lock(&p->stat_mu);
        if (!payload || idl == 0 || idl > sizeof peer.id) {
            p->r.st.frames++;
            p->r.st.malformed++;
            ECT_LOGD(MOD, "ROUTER message of %d frames dropped", n);
        } else {
            memcpy(peer.id, zmq_msg_data(&f[0]), idl);
            peer.id_len = idl;
            const char *pa = zmq_msg_gets(payload, "Peer-Address");
            if (pa) snprintf(peer.addr, sizeof peer.addr, "%s", pa);
            pull_router_handle(&p->r, &peer, zmq_msg_data(payload), zmq_msg_size(payload));
        }
        pthread_mutex_unlock(&p->stat_mu);
        for (int i = 0; i < n && i < 3; i++) zmq_msg_close(&f[i]);
    }
}

/* ctl_listener on_msg: one message from one of our listener's peers. A
 * message of several body frames is malformed, as libzmq's ROUTER path
 * counts one of more than [identity][delimiter][body]. */
static void on_listener_msg(void *ctx, uint64_t conn, const char *peer_addr, const void *body,
                            size_t len, bool multi, bool delim) {
    ect_pull_producer *p = ctx; /* stat_mu held: the listener's lock */
    pull_peer peer = {.conn = conn, .delim = delim};
    ect_strcpy_cut(peer.addr, sizeof peer.addr, peer_addr);
    if (multi) {
        p->r.st.frames++;
        p->r.st.malformed++;
        ECT_LOGD(MOD, "ROUTER message of several body frames dropped");
    } else {
        pull_router_handle(&p->r, &peer, body, len);
    }
}

static void flush_burst_locked(ect_pull_producer *p) {
    pthread_mutex_lock(&p->stat_mu);
    flush_burst(p);
    pthread_mutex_unlock(&p->stat_mu);
}

/* The batched pulls answered in this pass, one ECTransferDone per peer. */
static void flush_done_locked(ect_pull_producer *p) {
    pthread_mutex_lock(&p->stat_mu);
    pull_router_flush_done(&p->r);
    pthread_mutex_unlock(&p->stat_mu);
}

/* One burst: the frames waiting on the ROUTER (at most 256), then their
 * accepted pulls on their lanes. */
static void handle_burst(ect_pull_producer *p) {
    handle_frames(p);
    flush_burst_locked(p);
}

/* The ROUTER thread on our own listener, stat_mu held but in poll() (the
 * listener's lock; the lanes answer under it): one pass (its messages
 * handled as they come, up to CTL_LISTENER_BURST per peer), their pulls
 * on their lanes, then the pass's answers, all written at once. The
 * eventfd only wakes the pass (a lane left bytes for POLLOUT, or close). */
static void listener_main(ect_pull_producer *p) {
    pthread_mutex_lock(&p->stat_mu);
    while (!atomic_load(&p->router_stop)) {
        if (ctl_listener_pass(p->lst, 100)) {
            uint64_t v;
            ssize_t r = read(p->efd, &v, sizeof v);
            (void)r;
        }
        flush_burst(p);
        pull_router_flush_done(&p->r);
        ctl_listener_flush(p->lst);
    }
    pthread_mutex_unlock(&p->stat_mu);
}

static void *router_main(void *arg) {
    ect_pull_producer *p = arg;
    pthread_setname_np(pthread_self(), "ect-pull-router");
    if (p->lst) {
        listener_main(p);
        return NULL;
    }
    while (!atomic_load(&p->router_stop)) {
        zmq_pollitem_t it[2] = {{p->router, 0, ZMQ_POLLIN, 0}, {NULL, p->efd, ZMQ_POLLIN, 0}};
        int rc = zmq_poll(it, 2, 100);
        if (rc < 0 && zmq_errno() != EINTR) {
            ECT_LOGE(MOD, "ROUTER poll: %s", zmq_strerror(zmq_errno()));
            break;
        }
        if (rc <= 0) continue;
        if (it[0].revents & ZMQ_POLLIN) handle_burst(p);
        if (it[1].revents & ZMQ_POLLIN) drain_completions(p);
        flush_done_locked(p);
    }
    return NULL;
}

/* ---- open / close */

static int set_linger0(void *s) {
    int z = 0;
    return zmq_setsockopt(s, ZMQ_LINGER, &z, sizeof z);
}

/* Without keys: our own listener on the ROUTER port, the PUB on the next
 * one; port 0 tries ephemeral ports until the next one is free too. */
static int bind_pair_own(ect_pull_producer *p) {
    char ep[320];
    for (int attempt = 0; attempt < 64; attempt++) {
        ctl_listener_opts lo = {.ip = p->host,
                                .port = p->o.port,
                                .max_msg = (uint64_t)ECT_PULL_MAX_MSG_BYTES,
                                .on_msg = on_listener_msg,
                                .what = "pull producer ROUTER",
                                .v4_wildcard = !strchr(p->host, ':'), /* as ZMQ_IPV6 is set */
                                .lock = &p->stat_mu,
                                .ctx = p};
        int rc = ctl_listener_open(&lo, &p->lst);
        if (rc) { /* ECT_EIO for any address that cannot be bound, as with libzmq's bind */
            char why[ECT_ERROR_LEN];
            snprintf(why, sizeof why, "%s", ect_last_error());
            return ect_set_error(rc == ECT_ENOMEM ? rc : ECT_EIO,
                                 "pull producer: cannot bind ROUTER: %s", why);
        }
        int port = ctl_listener_port(p->lst);
        if (port > 0 && port < 65535) {
            ect_tcp_endpoint(p->host, port + 1, ep, sizeof ep);
            if (zmq_bind(p->pub, ep) == 0) {
                p->port = port;
                ctl_listener_watch(p->lst, p->efd);
                return 0;
            }
            if (p->o.port != 0)
                return ect_set_error(ECT_EIO, "pull producer: cannot bind PUB %s: %s", ep,
                                     zmq_strerror(zmq_errno()));
        }
        ctl_listener_close(p->lst);
        p->lst = NULL;
    }
    return ect_set_error(ECT_EIO, "pull producer: cannot bind a ROUTER/PUB port pair on %s: %s",
                         p->host, zmq_strerror(zmq_errno()));
}

static int bind_pair(ect_pull_producer *p) {
    char ep[320];
    for (int attempt = 0; attempt < 64; attempt++) {
        int port = p->o.port;
        if (port == 0) {
            ect_tcp_endpoint(p->host, 0, ep, sizeof ep); /* any free port */
            if (zmq_bind(p->router, ep) != 0) break;
            char last[320];
            size_t ll = sizeof last;
            zmq_getsockopt(p->router, ZMQ_LAST_ENDPOINT, last, &ll);
            port = ect_tcp_endpoint_port(last);
            if (port <= 0 || port >= 65535) {
                zmq_unbind(p->router, last);
                continue;
            }
        } else {
            ect_tcp_endpoint(p->host, port, ep, sizeof ep);
            if (zmq_bind(p->router, ep) != 0)
                return ect_set_error(ECT_EIO, "pull producer: cannot bind ROUTER %s: %s", ep,
                                     zmq_strerror(zmq_errno()));
        }
        ect_tcp_endpoint(p->host, port + 1, ep, sizeof ep);
        if (zmq_bind(p->pub, ep) == 0) {
            p->port = port;
            return 0;
        }
        int e = zmq_errno();
        if (p->o.port != 0)
            return ect_set_error(ECT_EIO, "pull producer: cannot bind PUB %s: %s", ep,
                                 zmq_strerror(e));
        char last[320];
        ect_tcp_endpoint(p->host, port, last, sizeof last);
        zmq_unbind(p->router, last);
    }
    return ect_set_error(ECT_EIO, "pull producer: cannot bind a ROUTER/PUB port pair on %s: %s",
                         p->host, zmq_strerror(zmq_errno()));
}

static int validate(const ect_pull_producer_opts *o) {
    if (!o->host || !o->host[0] || strlen(o->host) >= 256)
        return ect_set_error(ECT_EINVAL, "pull producer: host must be 1..255 bytes");
    if (o->port < 0 || o->port > 65534)
        return ect_set_error(ECT_EINVAL, "pull producer: port %d outside 0..65534", o->port);
    if (!o->transport || strlen(o->transport) >= 16)
        return ect_set_error(ECT_EINVAL, "pull producer: transport missing");
    if (o->max_lanes == 0)
        return ect_set_error(ECT_EINVAL, "pull producer: max_lanes must be at least 1");
    if (o->max_lanes_per_peer == 0)
        return ect_set_error(ECT_EINVAL, "pull producer: max_lanes_per_peer must be at least 1");
    if (o->connect_allow && pull_allow_check(o->connect_allow) != 0) return ECT_EINVAL;
    if (o->max_queued_bytes == 0)
        return ect_set_error(ECT_EINVAL, "pull producer: max_queued_bytes must be at least 1");
    if (o->page_items == 0 || o->page_items > WIRE_PULL_MAX_ITEMS)
        return ect_set_error(ECT_EINVAL, "pull producer: page_items must be 1..%d",
                             WIRE_PULL_MAX_ITEMS);
    return 0;
}

static void collect(void *ctx, met_out *o) {
    ect_pull_producer *p = ctx;
    ect_pull_producer_stat st;
    ect_pull_producer_stats(p, &st);
    ect_pool_stat ps;
    ect_pool_stats(p->pool, &ps);
    char l[128];
    met_labels(l, sizeof l, "transport", p->transport, "direction", "out", (const char *)NULL);
    met_out_moved(o, l, atomic_load(&p->bytes_out), st.pulls_ok);
    met_out_pool(o, (double)ps.capacity, (double)ps.used, (double)ps.resident_bytes);
    met_out_failure(o, "pull_failed", st.pulls_failed);
    met_out_failure(o, "save_failed", st.save_failed);
    met_out_counter(o, "ectransfer_bad_requests_total",
                    "Frames refused as malformed or an unknown op.", NULL, st.malformed);
    met_out_control_requests(o, st.requests + st.pulls_ok + st.pulls_failed);
    met_out_counter(o, "ectransfer_events_sent_total", "Events sent to the scheduler.", NULL,
                    st.notifications);
    met_out_counter(o, "ectransfer_evictions_total", "Resident items reclaimed.", NULL, st.evicted);
    met_out_gauge(o, "ectransfer_pool_leased_items",
                  "Resident items leased now (a pull is writing them).", NULL, (double)ps.leased);
    met_out_gauge(o, "ectransfer_lanes", "Write lanes running now (consumer sessions served).",
                  NULL, (double)st.lanes);
}

ect_xport *pull_producer_xport(ect_pull_producer *p) { return p->x; }

/* On shm, our connections ask consumers to offer their windows before the
 * pull (docs/PROTOCOL.md "shm", "Offers"), named by a random id every
 * ECTransferComplete carries ("ect_shm_id"), so the write needs no BEGIN. */
static void offer_id_draw(ect_pull_producer *p) {
    if (strcmp(ect_xport_kind(p->x), "shm") != 0) return;
    while (!p->r.shm_id) p->r.shm_id = ect_random_u64();
    xp_set_offer_id(p->x, p->r.shm_id);
    p->ready_writes = true; /* offered windows take copies without an answer */
}

void pull_producer_batches(ect_pull_producer *p, uint64_t *batches, uint64_t *done_msgs) {
    pthread_mutex_lock(&p->stat_mu);
    *batches = p->r.st.batches;
    *done_msgs = p->r.st.done_msgs;
    pthread_mutex_unlock(&p->stat_mu);
}

void pull_producer_handoffs(ect_pull_producer *p, uint64_t *lane_jobs, uint64_t *ready_pulls) {
    *lane_jobs = atomic_load(&p->lane_jobs);
    *ready_pulls = atomic_load(&p->ready_pulls);
}

int ect_pull_producer_open(const ect_pull_producer_opts *opts, ect_pull_producer **out) {
    if (!out) return ect_set_error(ECT_EINVAL, "pull producer: out is NULL");
    *out = NULL;
    ect_pull_producer_opts defaults;
    if (!opts) {
        ect_pull_producer_opts_init(&defaults);
        opts = &defaults;
    }
    int rc = validate(opts);
    if (rc) return rc;
    ect_pull_producer *p = calloc(1, sizeof *p);
    if (!p) return ect_set_error(ECT_ENOMEM, "pull producer: out of memory");
    p->o = *opts;
    p->efd = -1;
    snprintf(p->host, sizeof p->host, "%s", opts->host);
    snprintf(p->transport, sizeof p->transport, "%s", opts->transport);
    p->o.host = p->host;
    p->o.transport = p->transport;
    if (opts->connect_allow && !(p->allow = strdup(opts->connect_allow))) {
        free(p);
        return ect_set_error(ECT_ENOMEM, "pull producer: connect_allow");
    }
    p->o.connect_allow = p->allow;
    p->o.xport_listen = NULL;
    ect_random_id(p->session_id);
    pthread_mutex_init(&p->mu, NULL);
    ect_cond_init(&p->cv);
    pthread_mutex_init(&p->comp_mu, NULL);
    p->c_tail = &p->c_head;
    pthread_mutex_init(&p->stat_mu, NULL);
    p->o.curve_keys = NULL;
    if (opts->curve_keys && (!(p->curve_keys = strdup(opts->curve_keys)) ||
                             (rc = ect_keys_load(p->curve_keys, &p->keys)))) {
        if (!rc) rc = ect_set_error(ECT_ENOMEM, "pull producer: out of memory");
        goto fail;
    }
    p->o.curve_keys = p->curve_keys;

    ect_pool_opts po;
    ect_pool_opts_init(&po);
    po.capacity = opts->pool_size;
    po.alignment = opts->alignment;
    po.use_memfd = 1;
    if ((rc = ect_pool_open(&po, &p->pool)) != 0) goto fail;
    lane_ops lo = {.run = lane_run, .ctx = p, .name = "ect-pull-lane"};
    if ((rc = lanes_open(&lo, opts->max_lanes, LANE_IDLE_MS, &p->lanes)) != 0) goto fail;

    ect_xport_opts xo;
    ect_xport_opts_init(&xo);
    char listen[300];
    ect_hostport_format(p->host, 0, listen, sizeof listen);
    xo.listen = opts->xport_listen ? opts->xport_listen : listen;
    xo.connect_timeout_ms = opts->connect_timeout_ms;
    xo.io_timeout_ms = opts->io_timeout_ms;
    if ((rc = xp_open_keyed(p->transport, &xo, p->keys, &p->x)) != 0) goto fail;
    offer_id_draw(p);
    if ((rc = ect_xport_register(p->x, ect_pool_base(p->pool), ect_pool_capacity(p->pool),
                                 ect_pool_fd(p->pool), 0, p->key)) != 0)
        goto fail;
    p->registered = true;

    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->efd < 0) {
        rc = ect_set_errno(errno, "pull producer: eventfd");
        goto fail;
    }
    p->zctx = zmq_ctx_new();
    if (!p->zctx) {
        rc = ect_set_error(ECT_ENOMEM, "pull producer: zmq_ctx_new failed");
        goto fail;
    }
    if (p->keys) p->router = zmq_socket(p->zctx, ZMQ_ROUTER);
    p->pub = zmq_socket(p->zctx, ZMQ_PUB);
    if ((p->keys && !p->router) || !p->pub) {
        rc = ect_set_error(ECT_ENOMEM, "pull producer: zmq_socket failed");
        goto fail;
    }
    int one = 1;
    int64_t maxmsg = ECT_PULL_MAX_MSG_BYTES;
    for (int i = 0; i < 2; i++) {
        void *s = i ? p->pub : p->router;
        if (!s) continue;
        set_linger0(s);
        if (strchr(p->host, ':')) /* an IPv6 host: ZMQ needs to be told */
            zmq_setsockopt(s, ZMQ_IPV6, &one, sizeof one);
        zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    }
    if (p->keys && ((rc = zauth_open(p->zctx, p->keys, "pull producer", &p->auth)) ||
                    (rc = zauth_curve_server(p->router, p->keys)) ||
                    (rc = zauth_curve_server(p->pub, p->keys))))
        goto fail;
    if ((rc = p->keys ? bind_pair(p) : bind_pair_own(p)) != 0) goto fail;
    if (p->keys) zauth_local_server(p->port, p->keys);

    p->r.pool = p->pool;
    p->r.session_id = p->session_id;
    p->r.allow = p->allow;
    p->r.batch_max = WIRE_PULL_MAX_ITEMS;
    p->r.page_items = opts->page_items;
    p->max_q = opts->max_queued_bytes;
    p->r.ops = (pull_router_ops){.user = p, .reply = reply, .dispatch = dispatch};

    if (pthread_create(&p->save_thread, NULL, save_main, p) != 0) {
        rc = ect_set_error(ECT_ENOMEM, "pull producer: cannot start the save thread");
        goto fail;
    }
    p->save_started = true;
    if (pthread_create(&p->router_thread, NULL, router_main, p) != 0) {
        rc = ect_set_error(ECT_ENOMEM, "pull producer: cannot start the ROUTER thread");
        goto fail;
    }
    p->router_started = true;
    ECT_LOGI(MOD, "pull producer %s: ROUTER %s:%d, PUB %s:%d, %s session %s", p->session_id,
             p->host, p->port, p->host, p->port + 1, p->transport, ect_xport_session(p->x));
    if ((rc = met_source_add("pull_producer", NULL, collect, p, &p->met))) goto fail;
    *out = p;
    return 0;
fail:
    ECT_RETURN_AFTER(rc, ect_pull_producer_close(p));
}

static void stop_save(ect_pull_producer *p) {
    pthread_mutex_lock(&p->mu);
    p->save_stop = true; /* the poison pill: the thread drains, releases and exits */
    pthread_cond_broadcast(&p->cv);
    uint64_t end = ect_deadline_ns(SAVE_JOIN_MS);
    while (p->save_started && !p->save_exited)
        if (ect_cond_wait_until(&p->cv, &p->mu, end)) break;
    bool late = p->save_started && !p->save_exited;
    pthread_mutex_unlock(&p->mu);
    if (!p->save_started) return;
    if (late) ECT_LOGE(MOD, "save thread did not stop within %d ms; waiting for it", SAVE_JOIN_MS);
    pthread_join(p->save_thread, NULL);
}

void ect_pull_producer_close(ect_pull_producer *p) {
    if (!p) return;
    met_source_remove(p->met);
    stop_save(p);
    if (p->router_started) {
        atomic_store(&p->router_stop, true);
        wake_router(p); /* no wait for the poll's timeout */
        pthread_join(p->router_thread, NULL);
    }
    /* Lanes finish their queued jobs (each bounded by the data plane's
     * timeouts) and end. */
    lanes_close(p->lanes, true);
    while (p->c_head) {
        comp_batch *cb = p->c_head;
        p->c_head = cb->next;
        for (size_t i = 0; i < cb->n; i++) free(cb->c[i].mm_hash);
        free(cb);
    }
    while (p->q_head) { /* only if the save thread never started */
        save_item *s = p->q_head;
        p->q_head = s->next;
        release_item(s);
    }
    if (p->registered) ect_xport_unregister(p->x, p->key);
    ect_xport_close(p->x);
    ctl_listener_close(p->lst);
    if (p->router) zmq_close(p->router);
    if (p->pub) zmq_close(p->pub);
    if (p->keys && p->port) zauth_local_server_gone(p->port);
    zauth_close(p->auth); /* after the sockets it checks, before the context */
    if (p->zctx) zmq_ctx_term(p->zctx);
    ect_keys_free(p->keys);
    free(p->curve_keys);
    if (p->efd >= 0) close(p->efd);
    ect_pool_close(p->pool);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->comp_mu);
    pthread_mutex_destroy(&p->stat_mu);
    pull_router_fini(&p->r);
    free(p->allow);
    free(p);
}

int ect_pull_producer_port(const ect_pull_producer *p) { return p ? p->port : 0; }
const char *ect_pull_producer_session_id(const ect_pull_producer *p) {
    return p ? p->session_id : "";
}
ect_pool *ect_pull_producer_pool(ect_pull_producer *p) { return p ? p->pool : NULL; }

void ect_pull_producer_stats(ect_pull_producer *p, ect_pull_producer_stat *st) {
    memset(st, 0, sizeof *st);
    if (!p) return;
    st->saved = atomic_load(&p->saved);
    st->save_failed = atomic_load(&p->save_failed);
    st->notifications = atomic_load(&p->notifications);
    st->pulls_ok = atomic_load(&p->pulls_ok);
    pthread_mutex_lock(&p->stat_mu);
    st->pulls_failed = atomic_load(&p->pulls_failed) + p->r.st.pulls_refused;
    st->malformed = p->r.st.malformed;
    st->requests = p->r.st.requests;
    pthread_mutex_unlock(&p->stat_mu);
    ect_pool_stat ps;
    ect_pool_stats(p->pool, &ps);
    st->evicted = ps.reclaimed; /* least recently used items reclaimed to make room */
    st->lanes = p->lanes ? (uint32_t)lanes_count(p->lanes) : 0;
}
