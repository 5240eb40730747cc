/*
 * consumer — the consumer worker's side of a pull: its memfd pool
 * (registered with the data plane) and a DEALER to the producer: without
 * keys our own ZMTP DEALER driven by the calling thread (dealer_link.h),
 * with keys libzmq's (CURVE) and its socket monitor; both report the
 * connection's ends the same way (on_link_events).
 *
 * load(): (1) the pool's resident cache (an earlier transfer); (2) a remote
 * pull into a fresh allocation. Each pull carries a fresh token (extension
 * key `token`, echoed by ectransfer producers in ECTransferComplete), so a
 * completion that arrives after its request timed out is recognised and
 * never taken for a later request's, even one for the same mm_hash.
 *
 * A timed-out region is not freed at once: the producer may still be
 * writing into it, and freeing it would let that late write land in the next
 * allocation. It is quarantined until its late completion arrives (then
 * freed) or quarantine_ms passes. A completion without a token (an upstream
 * producer) is matched by mm_hash alone.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "mem/pool.h"
#include "pull/dealer_link.h"
#include "pull/pull_internal.h"
#include "util/hostport.h"
#include "util/metrics.h"
#include "util/util.h"
#include "util/zauth.h"
#include "wire/dtype.h"
#include "xport/xport.h"

#define MOD "pull"

typedef struct quarantined {
    uint64_t token, offset, nbytes, until_ms;
    struct quarantined *next;
} quarantined;

struct ect_pull_consumer {
    ect_pull_consumer_opts o;
    char producer[300], transport[16], pool_device[32], advertise[256];
    char session[320]; /* the consumer_session_id the producer is told (advertised) */
    ect_pool *pool;
    ect_xport *x;
    char key[ECT_XPORT_KEY_MAX];
    bool registered;
    bool windows;        /* each pull gets its own write key (every transport) */
    bool offers;         /* shm with windows: offer them to the producer before the pull */
    uint64_t shm_id;     /* the producer's offer id, from the latest ECTransferComplete
                            that named one ("ect_shm_id"); 0: none yet */
    uint32_t batch_max;  /* the producer takes ECTransferPullBatch of this many pulls, from the
                            latest ECTransferComplete ("ect_batch") on this connection; 0: none */
    uint64_t align;      /* the pool's allocation alignment */
    dealer_link *dl;     /* without keys: our own ZMTP DEALER (dealer_link.h) */
    void *zctx, *dealer; /* with keys: libzmq's DEALER */
    char *curve_keys;
    ect_keyset *keys; /* NULL: keys off */
    void *mon;        /* PAIR reading the DEALER's socket monitor */
    bool up;          /* a connection to the producer is established */
    bool gone;        /* it was, and the producer went away (no reconnect yet) */
    uint64_t gone_ms; /* when */
    uint64_t next_token;
    quarantined *q;
    ect_pull_consumer_stat st;
    /* metrics: the caller's thread writes, a scrape reads */
    met_source *met;
    met_counter m_bytes, m_remote, m_local, m_failed, m_timeouts, m_requests;
    met_hist m_latency; /* load -> complete of remote pulls */
};

void ect_pull_consumer_opts_init(ect_pull_consumer_opts *o) {
    memset(o, 0, sizeof *o);
    o->transport = "tcp";
    o->pool_size = 1000000000ull;
    o->alignment = 64;
    o->timeout_ms = 60000;
    o->quarantine_ms = 60000;
    ect_xport_opts xo; /* the data plane's caps, as its own defaults */
    ect_xport_opts_init(&xo);
    o->max_conns = xo.max_conns;
    o->max_conns_per_peer = xo.max_conns_per_peer;
}

static void quarantine_sweep(ect_pull_consumer *c, bool all) {
    uint64_t now = ect_now_ms();
    for (quarantined **pp = &c->q; *pp;) {
        quarantined *e = *pp;
        /* Past its time and no write still landing in it (its window is
         * closed, but an accepted write finishes). */
        if (all ||
            (now >= e->until_ms &&
             !xp_range_busy(c->x, (uint8_t *)ect_pool_base(c->pool) + e->offset, e->nbytes))) {
            ect_pool_free(c->pool, e->offset);
            *pp = e->next;
            free(e);
            c->st.quarantined--;
        } else {
            pp = &e->next;
        }
    }
}

/* A late completion for a quarantined token: its write is over, free. */
static bool quarantine_release(ect_pull_consumer *c, uint64_t token) {
    for (quarantined **pp = &c->q; *pp; pp = &(*pp)->next)
        if ((*pp)->token == token) {
            quarantined *e = *pp;
            ect_pool_free(c->pool, e->offset);
            *pp = e->next;
            free(e);
            c->st.quarantined--;
            return true;
        }
    return false;
}

static void view_from_info(ect_pull_consumer *c, const ect_resident_info *in, ect_pull_view *v,
                           int cached) {
    memset(v, 0, sizeof *v);
    v->data = (const char *)ect_pool_base(c->pool) + in->offset;
    v->nbytes = in->nbytes;
    v->ndim = in->ndim;
    memcpy(v->shape, in->shape, sizeof v->shape);
    memcpy(v->dtype, in->dtype, sizeof v->dtype);
    v->cached = cached;
    v->mem_kind = ect_pool_mem_kind(c->pool);
    v->device = ect_pool_device(c->pool);
}

/* A connection event (dealer_link's DL_* bits, or the libzmq monitor's
 * mapped to them): CONNECTED marks the producer up, DISCONNECTED of an
 * established connection marks it gone (logged once) until the next
 * CONNECTED (both DEALERs keep reconnecting). */
static void on_link_events(ect_pull_consumer *c, int ev) {
    /* both at once: a connection made and lost in one dl_pump (a loss waits
     * 100 ms for the next connect, so never the other way round) */
    if (ev & DL_CONNECTED) {
        if (c->gone) ECT_LOGI(MOD, "producer %s reachable again", c->producer);
        c->up = true;
        c->gone = false;
    }
    if (ev & DL_DISCONNECTED) c->batch_max = 0; /* the next producer says again */
    if ((ev & DL_DISCONNECTED) && c->up) {
        c->up = false;
        c->gone = true;
        c->gone_ms = ect_now_ms();
        c->st.producer_lost++;
        ECT_LOGW(MOD, "producer %s gone (connection lost%s%s); pulls fail at once until it is back",
                 c->producer, c->dl ? ": " : "", c->dl ? dl_lost_reason(c->dl) : "");
    }
}

/* Takes the connection events that happened without blocking (our DEALER:
 * drives it once; libzmq's: reads its monitor). */
static void drain_monitor(ect_pull_consumer *c) {
    if (c->dl) {
        int ev = dl_pump(c->dl, 0);
        if (ev > 0) on_link_events(c, ev);
        return;
    }
    for (int id; (id = pull_monitor_next(c->mon)) >= 0;) {
        if (id == ZMQ_EVENT_CONNECTED) on_link_events(c, DL_CONNECTED);
        if (id == ZMQ_EVENT_DISCONNECTED) on_link_events(c, DL_DISCONNECTED);
    }
}

static int gone_error(ect_pull_consumer *c, const char *mm_hash) {
    return ect_set_error(ECT_ECLOSED,
                         "pull load of %s: producer %s is gone (connection lost %" PRIu64
                         " ms ago, not back yet)",
                         mm_hash, c->producer, ect_now_ms() - c->gone_ms);
}

/* A pull in flight: its request went out, its completion is awaited. The
 * fields a set's pull uses come first and the large own-window key last, so
 * a pull under a shared window touches a line or two of its ~2.4 KB. */
typedef struct pend {
    const char *mm_hash;
    const ect_pull_meta *meta;
    uint64_t token, off, t0;
    const char *skey; /* shared: its load_many's one window's key (not copied per pull) */
    bool win;         /* wkey is this pull's own write window */
    bool shared;      /* skey is its load_many's one window (share_window), closed there */
    bool free_late;   /* undone while under the shared window: freed once it is closed */
    bool meta_ok;     /* meta equals one that passed check_meta in this load_many */
    void *msg;        /* its ECTransferPull, encoded, until sent */
    size_t len;
    bool done; /* its completion arrived: status, reason */
    int status;
    char reason[WIRE_PULL_MAX_STR + 1];
    char wkey[ECT_XPORT_KEY_MAX]; /* its own window's key (win); not touched otherwise */
} pend;

/* A pull of mm_hash not started yet: every field set but the own window's
 * key (not zero-filled: a pend carries a write key and a reason, ~2.4 KB,
 * and a load_many's set of them was cleared whole each call). */
static void pend_init(pend *pd, const char *mm_hash, const ect_pull_meta *meta) {
    pd->mm_hash = mm_hash;
    pd->meta = meta;
    pd->token = pd->off = pd->t0 = 0;
    pd->skey = NULL; /* wkey is read only once open_own_window wrote it (win) */
    pd->win = pd->shared = pd->free_late = pd->meta_ok = false;
    pd->msg = NULL;
    pd->len = 0;
    pd->done = false;
    pd->status = 0;
    pd->reason[0] = '\0';
}

/* Decodes one message off libzmq's DEALER (non-blocking) into *done:
 * 1, 0 when it was dropped (several frames: not ours; it is counted), -1
 * when none was waiting; *drc is the decoder's result. */
static int recv_zmq_complete(ect_pull_consumer *c, wire_pull_msg *done, int *drc) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, c->dealer, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        return -1;
    }
    if (zmq_msg_more(&m)) { /* not ours: drop the whole message */
        c->st.malformed++;
        while (zmq_msg_more(&m)) {
            zmq_msg_close(&m);
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, c->dealer, ZMQ_DONTWAIT) < 0) break;
        }
        zmq_msg_close(&m);
        return 0;
    }
    *drc = wire_pull_decode_any(zmq_msg_data(&m), zmq_msg_size(&m), done);
    zmq_msg_close(&m);
    return 1;
}

/* The same off our own DEALER. */
static int recv_own_complete(ect_pull_consumer *c, wire_pull_msg *done, int *drc) {
    zmtp_msg m;
    if (dl_next(c->dl, &m) != 1) return -1;
    if (m.multi) { /* not ours: drop the whole message */
        c->st.malformed++;
        return 0;
    }
    *drc = wire_pull_decode_any(m.body, m.body_len, done);
    return 1;
}

/* The unanswered pull a completion settles: by its token (a load_many's
 * tokens are consecutive, so first at its index), or (an upstream producer
 * echoes none) the first unanswered one of that mm_hash; NULL: none. */
static pend *find_pend(pend *pd, size_t n, const wire_transfer_complete *done) {
    if (done->has_token && n) {
        uint64_t k = done->token - pd[0].token;
        if (k < n && !pd[k].done && pd[k].token == done->token &&
            !strcmp(done->mm_hash, pd[k].mm_hash))
            return &pd[k];
    }
    for (size_t i = 0; i < n; i++)
        if (!pd[i].done && !strcmp(done->mm_hash, pd[i].mm_hash) &&
            (!done->has_token || done->token == pd[i].token))
            return &pd[i];
    return NULL;
}

/* Settles the pulls of pd[0..n) an ECTransferDone names (written: status
 * 0); a token of none of them is stale (a late one frees its quarantined
 * region). Returns how many it settled. */
static int take_done(ect_pull_consumer *c, pend *pd, size_t n, const wire_transfer_done *d) {
    int settled = 0;
    for (size_t i = 0; i < d->n; i++) {
        uint64_t k = n ? d->tokens[i] - pd[0].token : 0;
        pend *mine = k < n && pd[k].token == d->tokens[i] && !pd[k].done ? &pd[k] : NULL;
        for (size_t j = 0; !mine && j < n; j++)
            if (!pd[j].done && pd[j].token == d->tokens[i]) mine = &pd[j];
        if (mine) {
            mine->done = true;
            mine->status = 0;
            settled++;
        } else {
            c->st.stale++;
            quarantine_release(c, d->tokens[i]);
        }
    }
    return settled;
}

/* Takes one message off the DEALER (non-blocking) and settles the pulls it
 * completes among pd[0..n): an ECTransferDone by tokens (take_done), an
 * ECTransferComplete by token, or (an upstream producer echoes none) the
 * first unanswered one of that mm_hash. A completion of none of them is
 * stale (a late one frees its quarantined region). Returns the number of
 * pulls it settled, or -1 when no message was waiting. */
static int take_complete(ect_pull_consumer *c, pend *pd, size_t n) {
    wire_pull_msg m;
    int drc = 0;
    int got = c->dl ? recv_own_complete(c, &m, &drc) : recv_zmq_complete(c, &m, &drc);
    if (got <= 0) return got;
    if (!drc && m.type == WIRE_PULL_DONE) {
        int settled = take_done(c, pd, n, &m.u.done);
        wire_pull_msg_free(&m);
        return settled;
    }
    if (drc || m.type != WIRE_PULL_COMPLETE || m.u.complete.ext_error) {
        c->st.malformed++;
        ECT_LOGD(MOD, "DEALER frame dropped: %s",
                 drc                            ? ect_last_error()
                 : m.type != WIRE_PULL_COMPLETE ? "not an ECTransferComplete"
                                                : m.u.complete.ext_error);
        wire_pull_msg_free(&m);
        return 0;
    }
    wire_transfer_complete done = m.u.complete;
    if (done.shm_id) c->shm_id = done.shm_id;
    c->batch_max = done.batch_max; /* this producer's latest word */
    pend *mine = find_pend(pd, n, &done);
    if (mine) {
        mine->done = true;
        mine->status = done.status;
        if (done.error) snprintf(mine->reason, sizeof mine->reason, "%s", done.error);
    } else {
        c->st.stale++;
        if (done.has_token) quarantine_release(c, done.token);
        ECT_LOGD_ID(MOD, NULL, done.mm_hash, "stale ECTransferComplete for %s dropped",
                    done.mm_hash);
    }
    wire_pull_msg_free(&m);
    return mine ? 1 : 0;
}

/* Waits until every pull of pd[0..n) that is not done is answered, or the
 * deadline (ECT_ETIMEDOUT), or the producer is gone (ECT_ECLOSED): those
 * still unanswered get that status. */
static void wait_complete(ect_pull_consumer *c, pend *pd, size_t n, uint64_t deadline) {
    size_t left = 0;
    for (size_t i = 0; i < n; i++) left += !pd[i].done;
    int why = 0;
    while (left && !why) {
        uint64_t now = ect_now_ms();
        if (now >= deadline) {
            why = ECT_ETIMEDOUT;
            break;
        }
        if (c->dl) { /* our DEALER: drive it, then take what came */
            int ev = dl_pump(c->dl, deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now));
            if (ev > 0) on_link_events(c, ev);
            for (int got; left && (got = take_complete(c, pd, n)) >= 0;) left -= (size_t)got;
            if (left && c->gone) why = ECT_ECLOSED;
            continue;
        }
        zmq_pollitem_t it[2] = {{c->dealer, 0, ZMQ_POLLIN, 0}, {c->mon, 0, ZMQ_POLLIN, 0}};
        int rc = zmq_poll(it, 2, (long)(deadline - now));
        if (rc <= 0) continue;
        if (it[1].revents & ZMQ_POLLIN) {
            drain_monitor(c);
            if (c->gone) why = ECT_ECLOSED;
        }
        /* every frame waiting, not one per poll: completions come in bursts */
        if (!why && (it[0].revents & ZMQ_POLLIN))
            for (int got; left && (got = take_complete(c, pd, n)) >= 0;) left -= (size_t)got;
    }
    for (size_t i = 0; i < n; i++)
        if (!pd[i].done) pd[i].status = why;
}

/* Undoes a prepared pull that was not sent: its message, window, region
 * (a region under its load_many's shared window only once that is closed). */
static void unprepare_pull(ect_pull_consumer *c, pend *pd) {
    free(pd->msg);
    pd->msg = NULL;
    if (pd->win) xp_window_close(c->x, pd->wkey);
    if (pd->shared)
        pd->free_late = true;
    else
        ect_pool_free(c->pool, pd->off);
}

/* The meta of a pull of mm_hash: present, within the pool's bounds, and
 * its shape and dtype giving its nbytes (not 0). */
static int check_meta(const char *mm_hash, const ect_pull_meta *meta) {
    if (!meta)
        return ect_set_error(ECT_EINVAL, "pull load: %s is not resident and meta is NULL", mm_hash);
    if (meta->ndim > ECT_POOL_MAX_NDIM)
        return ect_set_error(ECT_EINVAL, "pull load: meta.ndim %u over %d", meta->ndim,
                             ECT_POOL_MAX_NDIM);
    int rc =
        wire_check_nbytes(meta->dtype, meta->shape, meta->ndim, meta->nbytes, "pull load meta");
    if (rc) return rc;
    if (meta->nbytes == 0) return ect_set_error(ECT_EINVAL, "pull load: meta.nbytes is 0");
    return 0;
}

/* Whether meta a and b say the same (a set's items mostly share one: the
 * dtype table's scan of check_meta then runs once a set, not once a pull). */
static bool same_meta(const ect_pull_meta *a, const ect_pull_meta *b) {
    if (a->nbytes != b->nbytes || a->ndim != b->ndim || a->ndim > ECT_POOL_MAX_NDIM) return false;
    for (uint32_t i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return strncmp(a->dtype, b->dtype, sizeof a->dtype) == 0;
}

/* Checks meta (unless pd->meta_ok) and takes the pull's region, token and
 * start time. On failure nothing is left behind. The caller drained the
 * monitor just before (once for a whole load_many). */
static int reserve_pull(ect_pull_consumer *c, pend *pd) {
    const char *mm_hash = pd->mm_hash;
    const ect_pull_meta *meta = pd->meta;
    int rc = pd->meta_ok ? 0 : check_meta(mm_hash, meta);
    if (rc) return rc;
    uint64_t off;
    rc = ect_pool_alloc(c->pool, meta->nbytes, &off);
    if (rc)
        return ect_set_error(rc, "pull load of %s: consumer pool: %s", mm_hash, ect_last_error());

    if (c->gone) {
        ect_pool_free(c->pool, off);
        c->st.failed++;
        met_add(&c->m_failed, 1);
        return gone_error(c, mm_hash);
    }
    pd->off = off;
    pd->token = ++c->next_token;
    pd->t0 = ect_now_ns();
    met_add(&c->m_requests, 1);
    return 0;
}

/* Opens the pull's own write key over [off, off + nbytes) (docs/PROTOCOL.md
 * "Write windows"), on every transport (ucx: its own rkey); on failure its
 * region is freed. */
static int open_own_window(ect_pull_consumer *c, pend *pd) {
    pd->win = c->windows && !pd->shared;
    if (!pd->win) return 0;
    int rc = xp_window_open(c->x, c->key, pd->off, pd->meta->nbytes, pd->wkey);
    if (rc) {
        ect_pool_free(c->pool, pd->off);
        pd->win = false;
        return ect_set_error(rc, "pull load of %s: write window: %s", pd->mm_hash,
                             ect_last_error());
    }
    return 0;
}

/* The ECTransferPull of a reserved pull (with its window's key); its
 * strings are borrowed from pd and c. */
static wire_transfer_pull pull_of(ect_pull_consumer *c, const pend *pd) {
    return (wire_transfer_pull){.mm_hash = (char *)pd->mm_hash,
                                .dst_ptr = (uint64_t)(uintptr_t)ect_pool_base(c->pool),
                                .dst_offset = pd->off,
                                .consumer_session_id = c->session,
                                .dst_key = pd->shared ? (char *)pd->skey
                                           : pd->win  ? (char *)pd->wkey
                                                      : c->key,
                                .has_token = true,
                                .token = pd->token};
}

/* Encodes the ECTransferPull of a reserved pull into pd->msg (send_pull
 * sends it); on failure undoes the pull. */
static int encode_pull(ect_pull_consumer *c, pend *pd) {
    wire_transfer_pull req = pull_of(c, pd);
    int rc = wire_transfer_pull_encode(&req, &pd->msg, &pd->len);
    if (rc) {
        pd->msg = NULL;
        unprepare_pull(c, pd);
    }
    return rc;
}

/* Reserves the pull, opens its window and encodes its ECTransferPull. On
 * failure nothing is left behind. */
static int prepare_pull(ect_pull_consumer *c, pend *pd) {
    int rc = reserve_pull(c, pd);
    if (!rc) rc = open_own_window(c, pd);
    if (!rc) rc = encode_pull(c, pd);
    return rc;
}

typedef struct span {
    uint64_t off, end;
} span;

static int by_off(const void *a, const void *b) {
    uint64_t x = ((const span *)a)->off, y = ((const span *)b)->off;
    return x < y ? -1 : x > y;
}

/* One write window over the regions of a load_many's reserved pulls
 * (statuses[i] == 1) when they lie end to end in the pool, as a consumer
 * that pulls sets of items gets them in its steady state (the pool hands
 * back the ranges the last set freed): one window, one grant and one
 * mapping on the data plane for the set instead of one per pull (issue 13).
 * Every byte it covers belongs to one of the set's regions: each region
 * starts on the pool's alignment, and the next starts at the first aligned
 * offset after its end (the bytes between are its allocation's rounding,
 * no one else's). The pulls are marked shared and point at its key (skey:
 * key, which must outlive their requests' encoding).
 * False, and each pull opens its own, when fewer than two are reserved,
 * they are not end to end, or the window cannot be opened. */
static bool share_window(ect_pull_consumer *c, pend *pd, const int *statuses, size_t n,
                         char key[ECT_XPORT_KEY_MAX]) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += statuses[i] == 1;
    if (!c->windows || k < 2) return false;
    span few[64], *sp = k <= 64 ? few : malloc(k * sizeof *sp);
    if (!sp) return false;
    k = 0;
    bool sorted = true; /* the pool mostly hands a set's regions out in order */
    for (size_t i = 0; i < n; i++)
        if (statuses[i] == 1) {
            sp[k] = (span){pd[i].off, pd[i].off + pd[i].meta->nbytes};
            sorted = sorted && (k == 0 || sp[k - 1].off < sp[k].off);
            k++;
        }
    if (!sorted) qsort(sp, k, sizeof *sp, by_off);
    bool end_to_end = true;
    for (size_t j = 1; j < k && end_to_end; j++)
        end_to_end = sp[j].off == (sp[j - 1].end + c->align - 1) / c->align * c->align;
    bool ok =
        end_to_end && xp_window_open(c->x, c->key, sp[0].off, sp[k - 1].end - sp[0].off, key) == 0;
    if (sp != few) free(sp);
    if (!ok) return false;
    for (size_t i = 0; i < n; i++)
        if (statuses[i] == 1) {
            pd[i].shared = true;
            pd[i].skey = key;
        }
    return true;
}

/* Sends a prepared pull's ECTransferPull; on failure undoes the pull. */
/* Our DEALER queues it (the next dl_pump writes every queued pull in one
 * go); libzmq's hands it to its I/O thread. */
static int send_pull(ect_pull_consumer *c, pend *pd) {
    int sent = c->dl ? dl_send(c->dl, pd->msg, pd->len)
                     : (zmq_send(c->dealer, pd->msg, pd->len, ZMQ_DONTWAIT) < 0 ? -1 : 0);
    free(pd->msg);
    pd->msg = NULL;
    if (sent != 0) {
        char why[ECT_ERROR_LEN];
        snprintf(why, sizeof why, "%s", c->dl ? ect_last_error() : zmq_strerror(zmq_errno()));
        unprepare_pull(c, pd);
        return ect_set_error(ECT_ECONNREFUSED, "pull load of %s: cannot send ECTransferPull: %s",
                             pd->mm_hash, why);
    }
    return 0;
}

/* Pulls in one ECTransferPullBatch at most (the producer's ect_batch may allow more). */
#define PULL_BATCH_MAX 256

/* Sends the prepared pulls pd[idx[0..k)] (not encoded) as one
 * ECTransferPullBatch. On failure the caller undoes them. */
static int send_batch(ect_pull_consumer *c, pend *pd, const size_t *idx, size_t k) {
    wire_transfer_pull *ps = malloc(k * sizeof *ps);
    if (!ps) return ect_set_error(ECT_ENOMEM, "pull load_many: out of memory");
    for (size_t i = 0; i < k; i++) ps[i] = pull_of(c, &pd[idx[i]]);
    void *msg = NULL;
    size_t len = 0;
    int rc = wire_transfer_pull_batch_encode(&(wire_transfer_pull_batch){ps, k}, &msg, &len);
    free(ps);
    if (rc) return rc;
    int sent = c->dl ? dl_send(c->dl, msg, len)
                     : (zmq_send(c->dealer, msg, len, ZMQ_DONTWAIT) < 0 ? -1 : 0);
    free(msg);
    if (sent != 0)
        return ect_set_error(ECT_ECONNREFUSED,
                             "pull load_many: cannot send ECTransferPullBatch: %s",
                             c->dl ? ect_last_error() : zmq_strerror(zmq_errno()));
    return 0;
}

/* Offers (shm: docs/PROTOCOL.md "shm", "Offers") the windows of the
 * prepared pulls pd[0..n) (statuses[i] == 1; NULL: all) and the shared one
 * (NULL: none) to the producer's connection it named in a completion, so
 * its writes into them need no BEGIN. Best effort: a refused offer only
 * means the producer asks with a BEGIN as before. */
#define PULL_OFFER_MAX 250
static void offer_windows(ect_pull_consumer *c, const pend *pd, size_t n, const int *statuses,
                          const char *shared_key) {
    if (!c->offers || !c->windows || !c->shm_id) return;
    const char *keys[PULL_OFFER_MAX];
    size_t k = 0;
    if (shared_key) keys[k++] = shared_key;
    for (size_t i = 0; i < n; i++) {
        if ((statuses && statuses[i] != 1) || !pd[i].win) continue;
        keys[k++] = pd[i].wkey;
        if (k == PULL_OFFER_MAX) {
            (void)xp_window_offer(c->x, c->shm_id, keys, k);
            k = 0;
        }
    }
    if (k) (void)xp_window_offer(c->x, c->shm_id, keys, k);
}

static int start_pull(ect_pull_consumer *c, pend *pd) {
    int rc = prepare_pull(c, pd);
    if (rc) return rc;
    offer_windows(c, pd, 1, NULL, NULL);
    return send_pull(c, pd);
}

/* Settles a started pull once answered (or not): closes its window, and
 * quarantines (no answer), frees (refused) or publishes (done) its region. */
static int finish_pull(ect_pull_consumer *c, pend *pd, ect_pull_view *view) {
    const char *mm_hash = pd->mm_hash;
    const ect_pull_meta *meta = pd->meta;
    int rc = pd->status;
    if (pd->win) xp_window_close(c->x, pd->wkey); /* answered or not: no write lands from now on */
    if (rc == ECT_ETIMEDOUT || rc == ECT_ECLOSED) {
        if (rc == ECT_ETIMEDOUT) {
            c->st.timeouts++;
            met_add(&c->m_timeouts, 1);
        } else {
            c->st.failed++;
            met_add(&c->m_failed, 1);
        }
        quarantined *q = calloc(1, sizeof *q);
        if (q) {
            q->token = pd->token;
            q->offset = pd->off;
            q->nbytes = meta->nbytes;
            q->until_ms = ect_now_ms() + (uint64_t)c->o.quarantine_ms;
            q->next = c->q;
            c->q = q;
            c->st.quarantined++;
        } else {
            ect_pool_free(c->pool, pd->off); /* cannot track it: best effort */
        }
        if (rc == ECT_ECLOSED) return gone_error(c, mm_hash);
        return ect_set_error(ECT_ETIMEDOUT,
                             "pull load of %s: no ECTransferComplete from %s within %d ms", mm_hash,
                             c->producer, c->o.timeout_ms);
    }
    if (rc != 0) {
        c->st.failed++;
        met_add(&c->m_failed, 1);
        ect_pool_free(c->pool, pd->off);
        return ect_set_error(
            rc < 0 ? rc : ECT_EIO, "pull load of %s: producer answered status %d (%s)%s%s", mm_hash,
            rc, ect_strerror(rc < 0 ? rc : ECT_EIO), pd->reason[0] ? ": " : "", pd->reason);
    }
    ect_resident_info info;
    rc = ect_pool_put(c->pool, mm_hash, pd->off, meta->nbytes, meta->shape, meta->ndim, meta->dtype,
                      1);
    if (rc) {
        char why[256];
        snprintf(why, sizeof why, "%s", ect_last_error());
        ect_pool_free(c->pool, pd->off);
        if (rc == ECT_EEXIST && ect_pool_acquire(c->pool, mm_hash, &info) == 0) {
            view_from_info(c, &info, view, 1);
            c->st.local++;
            return 0;
        }
        return ect_set_error(rc, "pull load of %s: %s", mm_hash, why);
    }
    /* The item is what was just put (and leased): no lookup for it. */
    info = (ect_resident_info){.offset = pd->off, .nbytes = meta->nbytes, .ndim = meta->ndim};
    memcpy(info.shape, meta->shape, sizeof info.shape);
    memcpy(info.dtype, meta->dtype, sizeof info.dtype);
    view_from_info(c, &info, view, 0);
    c->st.remote++;
    met_add(&c->m_remote, 1);
    met_add(&c->m_bytes, meta->nbytes);
    met_observe_ns(&c->m_latency, ect_now_ns() - pd->t0);
    return 0;
}

/* The resident copy of mm_hash, leased into *view: 0, or ECT_ENOTFOUND. */
static int load_local(ect_pull_consumer *c, const char *mm_hash, ect_pull_view *view) {
    ect_resident_info info;
    if (pool_try_acquire(c->pool, mm_hash, &info) != 0) return ECT_ENOTFOUND; /* no text */
    view_from_info(c, &info, view, 1);
    c->st.local++;
    met_add(&c->m_local, 1);
    return 0;
}

static int check_hash(const char *mm_hash) {
    size_t hl = mm_hash ? strlen(mm_hash) : 0;
    if (hl == 0 || hl > ECT_MM_HASH_MAX)
        return ect_set_error(ECT_EINVAL, "pull load: mm_hash must be 1..%d bytes", ECT_MM_HASH_MAX);
    return 0;
}

int ect_pull_consumer_load(ect_pull_consumer *c, const char *mm_hash, const ect_pull_meta *meta,
                           ect_pull_view *view) {
    if (!c || !mm_hash || !view) return ect_set_error(ECT_EINVAL, "pull load: NULL argument");
    int rc = check_hash(mm_hash);
    if (rc) return rc;
    quarantine_sweep(c, false);
    if (load_local(c, mm_hash, view) == 0) return 0;
    pend pd;
    pend_init(&pd, mm_hash, meta);
    drain_monitor(c);
    if ((rc = start_pull(c, &pd)) != 0) return rc;
    wait_complete(c, &pd, 1, ect_now_ms() + (uint64_t)c->o.timeout_ms);
    return finish_pull(c, &pd, view);
}

int ect_pull_consumer_load_many(ect_pull_consumer *c, size_t n, const char *const *mm_hashes,
                                const ect_pull_meta *metas, ect_pull_view *views, int *statuses) {
    if (!c || (n && (!mm_hashes || !views || !statuses)))
        return ect_set_error(ECT_EINVAL, "pull load_many: NULL argument");
    if (n == 0) return 0;
    pend *pd = n <= SIZE_MAX / sizeof *pd ? malloc(n * sizeof *pd) : NULL; /* set by pend_init */
    if (!pd) return ect_set_error(ECT_ENOMEM, "pull load_many: out of memory");
    quarantine_sweep(c, false);
    drain_monitor(c);
    int first = 0;
    char first_err[ECT_ERROR_LEN] = "";
    /* note(i, rc): item i ended with rc; the first failure's text is kept */
#define NOTE(i, rc_)                                                                               \
    do {                                                                                           \
        statuses[i] = (rc_);                                                                       \
        if ((rc_) && !first) {                                                                     \
            first = (rc_);                                                                         \
            snprintf(first_err, sizeof first_err, "%s", ect_last_error());                         \
        }                                                                                          \
    } while (0)
    /* every request goes out before any completion is awaited */
    const ect_pull_meta *checked = NULL; /* the latest meta that passed check_meta */
    for (size_t i = 0; i < n; i++) {
        pend_init(&pd[i], mm_hashes[i], metas ? &metas[i] : NULL);
        pd[i].done = true; /* not in flight unless started */
        pd[i].status = ECT_ECANCELED;
        int rc = mm_hashes[i]
                     ? check_hash(mm_hashes[i])
                     : ect_set_error(ECT_EINVAL, "pull load_many: mm_hashes[%zu] is NULL", i);
        if (!rc && load_local(c, mm_hashes[i], &views[i]) == 0) {
            statuses[i] = 0;
            continue;
        }
        pd[i].meta_ok = checked && pd[i].meta && same_meta(checked, pd[i].meta);
        if (!rc) rc = reserve_pull(c, &pd[i]);
        if (rc) {
            NOTE(i, rc);
            continue;
        }
        checked = pd[i].meta;
        statuses[i] = 1; /* reserved, then prepared, then in flight */
    }
    char shared_key[ECT_XPORT_KEY_MAX];
    bool shared = share_window(c, pd, statuses, n, shared_key);
    size_t reserved = 0;
    for (size_t i = 0; i < n; i++) reserved += statuses[i] == 1;
    /* a producer that said it takes them gets the set in ECTransferPullBatch */
    size_t *idx = c->batch_max >= 2 && reserved >= 2 ? malloc(reserved * sizeof *idx) : NULL;
    for (size_t i = 0; i < n; i++) {
        if (statuses[i] != 1) continue;
        int rc = open_own_window(c, &pd[i]);
        if (!rc && !idx) rc = encode_pull(c, &pd[i]);
        if (rc) NOTE(i, rc);
    }
    offer_windows(c, pd, n, statuses, shared ? shared_key : NULL);
    /* The requests go out in one tight loop, after every region and window
     * is ready: they reach the producer together, as one burst its lane
     * writes as one batch (sent while preparing, they trickled in). */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (statuses[i] != 1) continue;
        if (idx) { /* batched below */
            idx[k++] = i;
            continue;
        }
        int rc = send_pull(c, &pd[i]);
        if (rc) {
            NOTE(i, rc);
            continue;
        }
        pd[i].done = false;
        pd[i].status = 0;
    }
    size_t cap = c->batch_max < PULL_BATCH_MAX ? c->batch_max : PULL_BATCH_MAX;
    for (size_t at = 0; at < k; at += cap) {
        size_t m = k - at < cap ? k - at : cap;
        int rc = send_batch(c, pd, idx + at, m);
        for (size_t j = at; j < at + m; j++) {
            size_t i = idx[j];
            if (rc) {
                unprepare_pull(c, &pd[i]);
                NOTE(i, rc);
                continue;
            }
            pd[i].done = false;
            pd[i].status = 0;
        }
    }
    free(idx);
    wait_complete(c, pd, n, ect_now_ms() + (uint64_t)c->o.timeout_ms);
    if (shared) { /* answered or not: no write lands from now on */
        xp_window_close(c->x, shared_key);
        for (size_t i = 0; i < n; i++)
            if (pd[i].free_late) ect_pool_free(c->pool, pd[i].off);
    }
    for (size_t i = 0; i < n; i++) {
        if (statuses[i] != 1) continue;
        int rc = finish_pull(c, &pd[i], &views[i]);
        NOTE(i, rc);
    }
#undef NOTE
    free(pd);
    if (first) return ect_set_error(first, "%s", first_err);
    return 0;
}

int ect_pull_consumer_release(ect_pull_consumer *c, const char *mm_hash) {
    if (!c || !mm_hash) return ect_set_error(ECT_EINVAL, "pull release: NULL argument");
    return ect_pool_release(c->pool, mm_hash);
}

ect_pool *ect_pull_consumer_pool(ect_pull_consumer *c) { return c ? c->pool : NULL; }

void ect_pull_consumer_stats(ect_pull_consumer *c, ect_pull_consumer_stat *st) {
    memset(st, 0, sizeof *st);
    if (c) *st = c->st;
}

static void collect(void *ctx, met_out *o) {
    ect_pull_consumer *c = ctx;
    ect_pool_stat ps;
    ect_pool_stats(c->pool, &ps);
    char l[128];
    met_labels(l, sizeof l, "transport", c->transport, "direction", "in", (const char *)NULL);
    met_out_moved(o, l, met_get(&c->m_bytes), met_get(&c->m_remote));
    met_out_counter(o, "ectransfer_local_hits_total", "Loads answered by the resident cache.", NULL,
                    met_get(&c->m_local));
    met_out_latency(o, "load_to_complete", &c->m_latency);
    met_out_failure(o, "pull_failed", met_get(&c->m_failed));
    met_out_failure(o, "timeout", met_get(&c->m_timeouts));
    met_out_control_requests(o, met_get(&c->m_requests));
    met_out_pool(o, (double)ps.capacity, (double)ps.used, (double)ps.resident_bytes);
}

static int open_zmq_dealer(ect_pull_consumer *c, const char *host, int port);

int ect_pull_consumer_open(const ect_pull_consumer_opts *o, ect_pull_consumer **out) {
    if (!out) return ect_set_error(ECT_EINVAL, "pull consumer: out is NULL");
    *out = NULL;
    if (!o || !o->producer)
        return ect_set_error(ECT_EINVAL, "pull consumer: producer (HOST:PORT) is required");
    if (!o->transport || strlen(o->transport) >= 16)
        return ect_set_error(ECT_EINVAL, "pull consumer: transport missing");
    if (o->timeout_ms < 1)
        return ect_set_error(ECT_EINVAL, "pull consumer: timeout_ms must be >= 1");
    if (o->quarantine_ms < 0)
        return ect_set_error(ECT_EINVAL, "pull consumer: quarantine_ms must be >= 0");
    int kind;
    if ((o->pool_device && strlen(o->pool_device) >= 32) ||
        ect_mem_parse_device(o->pool_device, &kind, NULL) != 0)
        return ect_set_error(ECT_EINVAL, "pull consumer: pool_device: %s",
                             o->pool_device && strlen(o->pool_device) >= 32 ? "too long"
                                                                            : ect_last_error());
    if (kind == ECT_MEM_CUDA && strcmp(o->transport, "ucx") == 0)
        return ect_set_error(ECT_ENOTSUP,
                             "pull consumer: pool_device %s: the ucx transport "
                             "cannot receive into CUDA memory (use tcp or shm)",
                             o->pool_device);
    if (o->pool_memory && kind == ECT_MEM_HOST && strcmp(o->transport, "shm") == 0)
        return ect_set_error(ECT_EINVAL, "pull consumer: pool_memory: shm needs an fd-backed "
                                         "pool; a caller's host buffer has none (use tcp, or a "
                                         "CUDA buffer)");
    char host[256];
    int port;
    int rc = ect_hostport_parse("pull consumer: producer", o->producer, 1, 65535, host, sizeof host,
                                &port);
    if (rc) return rc;
    if (o->advertise &&
        (!*o->advertise || strlen(o->advertise) > 255 || ect_host_is_wildcard(o->advertise)))
        return ect_set_error(ECT_EINVAL,
                             "pull consumer: advertise '%.64s': a host name or "
                             "address the producer can reach, not a wildcard",
                             o->advertise);
    if (o->data_port < 0 || o->data_port > 65535)
        return ect_set_error(ECT_EINVAL, "pull consumer: data_port %d: 0..65535", o->data_port);
    char lhost[256] = "127.0.0.1", lbuf[300];
    int lport = 0;
    if (o->xport_listen && (rc = ect_hostport_parse("pull consumer: xport_listen", o->xport_listen,
                                                    0, 65535, lhost, sizeof lhost, &lport)))
        return rc;
    if (o->data_port) lport = o->data_port;
    ect_hostport_format(lhost, lport, lbuf, sizeof lbuf);
    ect_pull_consumer *c = calloc(1, sizeof *c);
    if (!c) return ect_set_error(ECT_ENOMEM, "pull consumer: out of memory");
    c->o = *o;
    snprintf(c->producer, sizeof c->producer, "%s", o->producer);
    snprintf(c->transport, sizeof c->transport, "%s", o->transport);
    c->o.producer = c->producer;
    c->o.transport = c->transport;
    c->o.xport_listen = NULL;
    snprintf(c->advertise, sizeof c->advertise, "%s", o->advertise ? o->advertise : "");
    c->o.advertise = c->advertise[0] ? c->advertise : NULL;
    snprintf(c->pool_device, sizeof c->pool_device, "%s", o->pool_device ? o->pool_device : "cpu");
    c->o.pool_device = c->pool_device;
    c->next_token = ect_random_u64() >> 16; /* distinct across restarts of this process */
    c->o.curve_keys = NULL;
    if (o->curve_keys && (!(c->curve_keys = strdup(o->curve_keys)) ||
                          (rc = ect_keys_load(c->curve_keys, &c->keys)))) {
        if (!rc) rc = ect_set_error(ECT_ENOMEM, "pull consumer: out of memory");
        goto fail;
    }
    c->o.curve_keys = c->curve_keys;
    ect_pool_opts po;
    ect_pool_opts_init(&po);
    po.capacity = o->pool_size;
    po.alignment = o->alignment;
    ect_mem_parse_device(c->pool_device, &po.mem_kind, &po.device);
    po.external = o->pool_memory;
    po.use_memfd = po.mem_kind != ECT_MEM_CUDA && !po.external;
    if ((rc = ect_pool_open(&po, &c->pool)) != 0) goto fail;
    ect_xport_opts xo;
    ect_xport_opts_init(&xo);
    if (o->xport_listen || o->data_port) xo.listen = lbuf;
    xo.max_conns = o->max_conns;
    xo.max_conns_per_peer = o->max_conns_per_peer;
    if ((rc = xp_open_keyed(c->transport, &xo, c->keys, &c->x)) != 0) goto fail;
    if ((rc = ect_session_advertise(ect_xport_session(c->x), c->o.advertise, host, c->session,
                                    sizeof c->session)) != 0)
        goto fail;
    if ((rc = ect_xport_register_mem(c->x, ect_pool_base(c->pool), ect_pool_capacity(c->pool),
                                     ect_pool_mem_kind(c->pool), ect_pool_fd(c->pool), 0,
                                     c->key)) != 0)
        goto fail;
    c->registered = true;
    c->windows = true;
    c->offers = strcmp(ect_xport_kind(c->x), "shm") == 0;
    ect_pool_stat ps;
    ect_pool_stats(c->pool, &ps);
    c->align = ps.alignment ? ps.alignment : 1;
    if ((rc = xp_region_set_private(c->x, c->key)) != 0) goto fail;
    if (!c->keys) {
        dealer_link_opts dlo = {.host = host,
                                .port = port,
                                .max_msg = (uint64_t)ECT_PULL_MAX_MSG_BYTES,
                                .heartbeat_ivl_ms = ECT_PULL_HEARTBEAT_IVL_MS,
                                .heartbeat_timeout_ms = ECT_PULL_HEARTBEAT_TIMEOUT_MS};
        if ((rc = dl_open(&dlo, &c->dl)) != 0) goto fail;
    } else if ((rc = open_zmq_dealer(c, host, port)) != 0) {
        goto fail;
    }
    if ((rc = met_source_add("pull_consumer", NULL, collect, c, &c->met))) goto fail;
    *out = c;
    return 0;
fail:
    ECT_RETURN_AFTER(rc, ect_pull_consumer_close(c));
}

/* With keys: libzmq's DEALER (CURVE), its socket monitor on a PAIR. */
static int open_zmq_dealer(ect_pull_consumer *c, const char *host, int port) {
    const ect_pull_consumer_opts *o = &c->o;
    int rc;
    c->zctx = zmq_ctx_new();
    if (!c->zctx || !(c->dealer = zmq_socket(c->zctx, ZMQ_DEALER)))
        return ect_set_error(ECT_ENOMEM, "pull consumer: cannot create the DEALER");
    int zero = 0;
    zmq_setsockopt(c->dealer, ZMQ_LINGER, &zero, sizeof zero);
    if (strchr(host, ':')) {
        int one = 1;
        zmq_setsockopt(c->dealer, ZMQ_IPV6, &one, sizeof one);
    }
    zmq_setsockopt(c->dealer, ZMQ_RCVTIMEO, &o->timeout_ms, sizeof o->timeout_ms);
    /* Death detection: a closed connection shows at once as a monitor event;
     * a silent one (host gone, link cut) after the heartbeat timeout. */
    int hb_ivl = ECT_PULL_HEARTBEAT_IVL_MS, hb_to = ECT_PULL_HEARTBEAT_TIMEOUT_MS;
    zmq_setsockopt(c->dealer, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl);
    zmq_setsockopt(c->dealer, ZMQ_HEARTBEAT_TIMEOUT, &hb_to, sizeof hb_to);
    int64_t maxmsg = ECT_PULL_MAX_MSG_BYTES;
    zmq_setsockopt(c->dealer, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    char monep[64];
    snprintf(monep, sizeof monep, "inproc://ect-pull-consumer-mon-%p", (void *)c);
    if (zmq_socket_monitor(c->dealer, monep, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0 ||
        !(c->mon = zmq_socket(c->zctx, ZMQ_PAIR)) || zmq_connect(c->mon, monep) != 0)
        return ect_set_error(ECT_EIO, "pull consumer: socket monitor: %s",
                             zmq_strerror(zmq_errno()));
    zmq_setsockopt(c->mon, ZMQ_LINGER, &zero, sizeof zero);
    char ep[320];
    ect_tcp_endpoint(host, port, ep, sizeof ep);
    if ((rc = zauth_client(c->zctx, c->dealer, c->keys, ZMQ_DEALER, ep, o->timeout_ms))) return rc;
    if (zmq_connect(c->dealer, ep) != 0)
        return ect_set_error(ECT_EINVAL, "pull consumer: cannot connect DEALER to %s: %s", ep,
                             zmq_strerror(zmq_errno()));
    return 0;
}

void ect_pull_consumer_close(ect_pull_consumer *c) {
    if (!c) return;
    met_source_remove(c->met);
    /* Unregister first: no late write can land once the pool is withdrawn. */
    if (c->registered) ect_xport_unregister(c->x, c->key);
    ect_xport_close(c->x);
    if (c->dealer) zmq_socket_monitor(c->dealer, NULL, 0);
    if (c->mon) zmq_close(c->mon);
    if (c->dealer) zmq_close(c->dealer);
    if (c->zctx) zmq_ctx_term(c->zctx);
    dl_close(c->dl);
    if (c->pool) quarantine_sweep(c, true);
    ect_pool_close(c->pool);
    ect_keys_free(c->keys);
    free(c->curve_keys);
    free(c);
}
