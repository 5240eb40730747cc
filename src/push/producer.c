/*
 * producer — the public calls of the push producer (see ectransfer.h). They
 * run on the caller's threads and only touch memory under the producer's
 * mutex: reserve queues an item (and copies its source into the staging pool
 * when it is not borrowed), flush hands the queue to the dispatcher
 * (producer_run.c) and wakes it, poll drains the results. Nothing here
 * touches a socket, so no call waits on the network.
 *
 * Dedup: every item stays in `items` from reserve until ttl_ms after it
 * finished (at most max_tombstones finished ones), so a repeated transfer_id
 * is refused at once on the caller's thread.
 *
 * Staging back-pressure: a copy that does not fit waits (staging_wait_ms) on
 * `room`, which every free of staging memory signals. Before waiting it
 * hands the unflushed queue to the dispatcher: the caller may be filling the
 * pool with items of its own step, and those only drain once sent.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utlist.h>
#include <zmq.h>

#include "mem/memkind.h"
#include "mem/pool.h"
#include "push/producer.h"
#include "util/hostport.h"
#include "util/sync.h"
#include "util/util.h"
#include "wire/dtype.h"

#define MOD "producer"

static void q_append(pitem **head, pitem **tail, pitem *it) {
    it->next = NULL;
    if (*tail)
        (*tail)->next = it;
    else
        *head = it;
    *tail = it;
}

void ect_push_producer_opts_init(ect_push_producer_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->staging_size = 256ull << 20;
    o->control_timeout_ms = CTL_DEFAULT_TIMEOUT_MS;
    o->refresh_after_ms = PUSH_DEFAULT_REFRESH_MS;
    o->input_wait_ms = PUSH_DEFAULT_TTL_MS;
    o->ttl_ms = PUSH_DEFAULT_TTL_MS;
    o->max_tombstones = PUSH_DEFAULT_MAX_TOMBSTONES;
    o->connect_timeout_ms = 5000;
    o->io_timeout_ms = 30000;
    o->listen_host = "127.0.0.1";
    o->down_backoff_ms = 1000;
    o->down_backoff_max_ms = 30000;
    o->push_wait_ms = PUSH_DEFAULT_PUSH_WAIT_MS;
    o->staging_wait_ms = 60000;
    o->expect_shards = 0;
}

static int check_opts(const ect_push_producer_opts *o) {
    if (o->control_timeout_ms < 1 || o->control_timeout_ms > 3600000)
        return ect_set_error(ECT_EINVAL, "control_timeout_ms must be 1..3600000, not %d",
                             o->control_timeout_ms);
    if (o->refresh_after_ms == 0) return ect_set_error(ECT_EINVAL, "refresh_after_ms must be > 0");
    if (o->input_wait_ms == 0) return ect_set_error(ECT_EINVAL, "input_wait_ms must be > 0");
    if (o->ttl_ms == 0) return ect_set_error(ECT_EINVAL, "ttl_ms must be > 0");
    if (o->max_tombstones == 0) return ect_set_error(ECT_EINVAL, "max_tombstones must be > 0");
    if (o->connect_timeout_ms < 1 || o->connect_timeout_ms > 600000)
        return ect_set_error(ECT_EINVAL, "connect_timeout_ms must be 1..600000, not %d",
                             o->connect_timeout_ms);
    if (o->io_timeout_ms < 1 || o->io_timeout_ms > 3600000)
        return ect_set_error(ECT_EINVAL, "io_timeout_ms must be 1..3600000, not %d",
                             o->io_timeout_ms);
    if (o->down_backoff_ms < 1 || o->down_backoff_ms > 3600000)
        return ect_set_error(ECT_EINVAL, "down_backoff_ms must be 1..3600000, not %d",
                             o->down_backoff_ms);
    if (o->down_backoff_max_ms < o->down_backoff_ms || o->down_backoff_max_ms > 3600000)
        return ect_set_error(ECT_EINVAL,
                             "down_backoff_max_ms must be down_backoff_ms (%d)..3600000, not %d",
                             o->down_backoff_ms, o->down_backoff_max_ms);
    if (o->push_wait_ms < 1 || o->push_wait_ms > 86400000)
        return ect_set_error(ECT_EINVAL, "push_wait_ms must be 1..86400000, not %" PRIu64,
                             o->push_wait_ms);
    if (o->staging_wait_ms > 3600000)
        return ect_set_error(ECT_EINVAL, "staging_wait_ms must be 0..3600000, not %" PRIu64,
                             o->staging_wait_ms);
    if (o->expect_shards > PUSH_MAX_SHARDS)
        return ect_set_error(ECT_EINVAL, "expect_shards must be 0..%d, not %u", PUSH_MAX_SHARDS,
                             o->expect_shards);
    if (!o->listen_host || !*o->listen_host || strlen(o->listen_host) > PP_HOST_MAX)
        return ect_set_error(ECT_EINVAL, "listen_host must be a non-empty host name");
    if (o->transport && *o->transport && strcmp(o->transport, "tcp") &&
        strcmp(o->transport, "shm") && strcmp(o->transport, "ucx"))
        return ect_set_error(ECT_EINVAL, "transport must be tcp, shm or ucx, not '%.32s'",
                             o->transport);
    return 0;
}

int ect_push_producer_open(const ect_push_producer_opts *opts, ect_push_producer **out) {
    if (!out) return ect_set_error(ECT_EINVAL, "ect_push_producer_open: out is NULL");
    *out = NULL;
    ect_push_producer_opts def;
    if (!opts) {
        ect_push_producer_opts_init(&def);
        opts = &def;
    }
    int rc = check_opts(opts);
    if (rc) return rc;
    ect_push_producer *p = calloc(1, sizeof *p);
    if (!p) return ect_set_error(ECT_ENOMEM, "push producer: out of memory");
    p->o = *opts;
    snprintf(p->listen_host, sizeof p->listen_host, "%s", opts->listen_host);
    p->o.listen_host = p->listen_host;
    snprintf(p->transport, sizeof p->transport, "%s", opts->transport ? opts->transport : "");
    p->o.transport = p->transport;
    pthread_mutex_init(&p->mu, NULL);
    ect_cond_init(&p->wake);
    ect_cond_init(&p->results);
    ect_cond_init(&p->room);
    pthread_mutex_init(&p->wmu, NULL);
    pthread_cond_init(&p->wcv, NULL);
    if (opts->staging_size) {
        ect_pool_opts po;
        ect_pool_opts_init(&po);
        po.capacity = opts->staging_size;
        po.use_memfd = 1; /* shm peers may map it one day; costs nothing */
        if ((rc = ect_pool_open(&po, &p->pool))) goto fail;
    }
    push_opts pso;
    push_opts_init(&pso);
    pso.refresh_after_ms = opts->refresh_after_ms;
    pso.input_wait_ms = opts->input_wait_ms;
    pso.ttl_ms = opts->ttl_ms;
    pso.max_tombstones = opts->max_tombstones;
    pso.push_wait_ms = opts->push_wait_ms;
    if ((rc = push_open(&pso, &p->table))) goto fail;
    p->acts_cap = 1024;
    if (!(p->acts = calloc(p->acts_cap, sizeof *p->acts)) || !(p->zctx = zmq_ctx_new())) {
        rc = ect_set_error(ECT_ENOMEM, "push producer: out of memory");
        goto fail;
    }
    if ((rc = down_open((uint64_t)opts->down_backoff_ms, (uint64_t)opts->down_backoff_max_ms,
                        &p->downs)) ||
        (rc = pp_lanes_open(p)) || (rc = pp_write_lanes_open(p)))
        goto fail;
    if (pthread_create(&p->thread, NULL, pp_dispatch_main, p)) {
        rc = ect_set_error(ECT_ENOMEM, "push producer: cannot start the dispatcher thread");
        goto fail;
    }
    p->thread_started = true;
    *out = p;
    return 0;
fail:
    ect_push_producer_close(p);
    return rc;
}

static int check_str(const char *s, size_t max, const char *field) {
    if (!s || !*s) return ect_set_error(ECT_EINVAL, "%s must be a non-empty string", field);
    if (strlen(s) > max)
        return ect_set_error(ECT_EINVAL, "%s is longer than %zu bytes", field, max);
    return 0;
}

/* Hands the unflushed queue to the dispatcher (flush's work). Caller holds mu. */
static int hand_over_locked(ect_push_producer *p) {
    int n = 0;
    for (pitem *it = p->queued; it; it = it->next) {
        it->phase = PI_HANDED;
        n++;
    }
    if (p->queued) {
        if (p->handed_tail)
            p->handed_tail->next = p->queued;
        else
            p->handed = p->queued;
        p->handed_tail = p->queued_tail;
        p->queued = p->queued_tail = NULL;
        p->st.steps++;
    }
    LL_CONCAT2(p->stage_h, p->stage_q, snext);
    p->stage_q = NULL;
    pthread_cond_signal(&p->wake);
    return n;
}

/* ect_pool_alloc of a staging copy, waiting for room (see the top). */
static int staging_alloc(ect_push_producer *p, uint64_t n, uint64_t *off) {
    int rc = ect_pool_alloc(p->pool, n, off);
    if (rc != ECT_EFULL) return rc;
    uint64_t cap = ect_pool_capacity(p->pool);
    if (n > cap)
        return ect_set_error(ECT_EFULL,
                             "the item (%" PRIu64
                             " bytes) is larger than the staging pool (%" PRIu64
                             " bytes): raise staging_size or borrow the source",
                             n, cap);
    if (!p->o.staging_wait_ms) return rc;
    uint64_t t0 = ect_now_ms(), end = t0 + p->o.staging_wait_ms;
    pthread_mutex_lock(&p->mu);
    p->st.staging_waits++;
    hand_over_locked(p);
    for (;;) {
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return ect_set_error(ECT_ECLOSED, "push producer is closing");
        }
        /* Allocating under mu is fine (the pool has its own lock and frees
         * signal `room` under mu), and it closes the gap between a failed
         * try and the wait, where a free could be missed. */
        if ((rc = ect_pool_alloc(p->pool, n, off)) != ECT_EFULL) break;
        uint64_t now = ect_now_ms();
        if (now >= end) break;
        ect_cond_wait_until(&p->room, &p->mu, ect_deadline_ns(end - now > 100 ? 100 : end - now));
    }
    pthread_mutex_unlock(&p->mu);
    if (rc == ECT_EFULL)
        return ect_set_error(ECT_EFULL,
                             "the staging pool (%" PRIu64 " bytes) stayed full for %" PRIu64
                             " ms (staging_wait_ms) with %" PRIu64 " bytes wanted",
                             cap, ect_now_ms() - t0, n);
    return rc;
}

/* Takes the source: borrowed, or copied into the staging pool. Caller holds no lock. */
static int take_src(ect_push_producer *p, pitem *it, const void *data, uint64_t nbytes,
                    ect_push_release_fn release, void *user) {
    if (!data && nbytes) return ect_set_error(ECT_EINVAL, "data is NULL");
    if (release) {
        it->src = data;
        it->release = release;
        it->release_user = user;
        return 0;
    }
    if (!p->pool)
        return ect_set_error(ECT_EINVAL, "release is NULL but the producer has no staging pool "
                                         "(staging_size 0): borrow the source");
    uint64_t off = 0;
    /* A device source is copied device-to-host by the driver; the staging
     * pool is pinned on the first one so that copy runs at bus speed. */
    if (nbytes && mem_is_device(data, NULL) && ect_pool_mem_kind(p->pool) == ECT_MEM_HOST &&
        pool_pin(p->pool) != 0)
        ECT_LOGW(MOD, "pinning the staging pool failed (%s): device copies run slower",
                 ect_last_error());
    int rc = staging_alloc(p, nbytes ? nbytes : 1, &off);
    if (rc) return rc;
    if ((rc = ect_mem_copy((char *)ect_pool_base(p->pool) + off, data, nbytes))) {
        char why[256];
        snprintf(why, sizeof why, "%s", ect_last_error());
        ect_pool_free(p->pool, off);
        return ect_set_error(rc, "staging the source: %s", why);
    }
    it->src = (char *)ect_pool_base(p->pool) + off;
    it->in_pool = true;
    it->pool_off = off;
    return 0;
}

int ect_push_producer_reserve(ect_push_producer *p, const ect_push_item *item) {
    if (!p || !item) return ect_set_error(ECT_EINVAL, "ect_push_producer_reserve: NULL argument");
    int rc;
    if ((rc = check_str(item->transfer_id, PUSH_KEY_MAX, "transfer_id")) ||
        (rc = check_str(item->mm_hash, PUSH_KEY_MAX, "mm_hash")) ||
        (rc = check_str(item->consumer, PUSH_ADDR_MAX, "consumer")))
        return rc;
    if (item->ndim > WIRE_MAX_NDIM)
        return ect_set_error(ECT_EINVAL, "ndim must be 0..%d, not %zu", WIRE_MAX_NDIM, item->ndim);
    if (item->ndim && !item->shape) return ect_set_error(ECT_EINVAL, "shape is NULL");
    if (!item->dtype) return ect_set_error(ECT_EINVAL, "dtype is NULL");
    if ((rc = wire_check_nbytes(item->dtype, item->shape, item->ndim, item->nbytes, "item")))
        return rc;
    pitem *it = calloc(1, sizeof *it);
    if (!it) return ect_set_error(ECT_ENOMEM, "push producer: out of memory");
    snprintf(it->transfer_id, sizeof it->transfer_id, "%s", item->transfer_id);
    snprintf(it->mm_hash, sizeof it->mm_hash, "%s", item->mm_hash);
    snprintf(it->consumer, sizeof it->consumer, "%s", item->consumer);
    if ((rc = ect_hostport_parse("consumer", item->consumer, 1, 65535, it->host, sizeof it->host,
                                 &it->port))) {
        free(it);
        return rc;
    }
    it->ndim = item->ndim;
    if (item->ndim) memcpy(it->shape, item->shape, item->ndim * sizeof *item->shape);
    snprintf(it->dtype, sizeof it->dtype, "%s", wire_dtype_canonical(item->dtype));
    it->nbytes = item->nbytes;
    it->t0_ns = ect_now_ns();

    pthread_mutex_lock(&p->mu);
    pitem *old = NULL;
    HASH_FIND_STR(p->items, it->transfer_id, old);
    bool closing = p->stop;
    pthread_mutex_unlock(&p->mu);
    if (closing) {
        free(it);
        return ect_set_error(ECT_ECLOSED, "push producer is closing");
    }
    if (old) {
        free(it);
        return ect_set_error(ECT_EEXIST, "transfer_id '%s' already pushed", item->transfer_id);
    }
    if (item->data &&
        (rc = take_src(p, it, item->data, item->nbytes, item->release, item->release_user))) {
        free(it);
        return rc;
    }
    it->src_held = item->data != NULL;
    it->phase = PI_QUEUED;
    pthread_mutex_lock(&p->mu);
    HASH_FIND_STR(p->items, it->transfer_id, old); /* a racing reserve of the same id */
    if (old || p->stop) {
        pthread_mutex_unlock(&p->mu);
        if (it->in_pool) ect_pool_free(p->pool, it->pool_off);
        free(it);
        return old ? ect_set_error(ECT_EEXIST, "transfer_id '%s' already pushed", item->transfer_id)
                   : ect_set_error(ECT_ECLOSED, "push producer is closing");
    }
    HASH_ADD_STR(p->items, transfer_id, it);
    q_append(&p->queued, &p->queued_tail, it);
    p->n_live++;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int ect_push_producer_stage(ect_push_producer *p, const char *transfer_id, const void *data,
                            uint64_t nbytes, ect_push_release_fn release, void *release_user) {
    if (!p || !transfer_id) return ect_set_error(ECT_EINVAL, "ect_push_producer_stage: NULL");
    pthread_mutex_lock(&p->mu);
    pitem *it = NULL;
    HASH_FIND_STR(p->items, transfer_id, it);
    int rc = 0;
    if (!it)
        rc = ect_set_error(ECT_ENOTFOUND, "no push for transfer_id '%s'", transfer_id);
    else if (it->phase == PI_DONE || it->src_held || it->stage_queued || it->src)
        rc = ect_set_error(ECT_ESTATE, "transfer_id '%s' is %s", transfer_id,
                           it->phase == PI_DONE ? "finished" : "already staged");
    else if (nbytes != it->nbytes)
        rc = ect_set_error(ECT_EINVAL, "nbytes %" PRIu64 " differs from the item's %" PRIu64,
                           nbytes, it->nbytes);
    if (!rc) it->stage_queued = true; /* holds the item while we copy unlocked */
    pthread_mutex_unlock(&p->mu);
    if (rc) return rc;
    pitem tmp = {0};
    rc = take_src(p, &tmp, data, nbytes, release, release_user);
    pthread_mutex_lock(&p->mu);
    it->stage_queued = false;
    if (!rc && it->phase == PI_DONE) /* cancelled while we copied */
        rc = ect_set_error(ECT_ESTATE, "transfer_id '%s' finished while staging", transfer_id);
    if (!rc) {
        it->src = tmp.src;
        it->release = tmp.release;
        it->release_user = tmp.release_user;
        it->in_pool = tmp.in_pool;
        it->pool_off = tmp.pool_off;
        it->src_held = true;
        if (it->phase == PI_HANDED) { /* the dispatcher learns of it at the next flush */
            it->stage_queued = true;
            LL_APPEND2(p->stage_q, it, snext);
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (rc && tmp.in_pool) ect_pool_free(p->pool, tmp.pool_off); /* never fire the callback */
    return rc;
}

int ect_push_producer_flush(ect_push_producer *p) {
    if (!p) return ect_set_error(ECT_EINVAL, "ect_push_producer_flush: NULL");
    pthread_mutex_lock(&p->mu);
    if (p->stop) {
        pthread_mutex_unlock(&p->mu);
        return ect_set_error(ECT_ECLOSED, "push producer is closing");
    }
    int n = hand_over_locked(p);
    pthread_mutex_unlock(&p->mu);
    return n;
}

void pp_release_src(ect_push_producer *p, pitem *it) {
    pthread_mutex_lock(&p->mu);
    bool held = it->src_held;
    it->src_held = false;
    const void *src = it->src;
    it->src = NULL;
    pthread_mutex_unlock(&p->mu);
    if (!held) return;
    if (it->in_pool) {
        ect_pool_free(p->pool, it->pool_off);
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->room);
        pthread_mutex_unlock(&p->mu);
    } else if (it->release)
        it->release(it->release_user, src, it->nbytes);
    it->in_pool = false;
}

static void push_result(ect_push_producer *p, const ect_push_result *r) {
    if (p->res_n == p->res_cap) {
        size_t cap = p->res_cap ? p->res_cap * 2 : 64;
        ect_push_result *n = malloc(cap * sizeof *n);
        if (!n) { /* keep the newest: drop the oldest result */
            ECT_LOGW(MOD, "out of memory: dropping the result of %s",
                     p->res[p->res_head].transfer_id);
            p->res_head = (p->res_head + 1) % p->res_cap;
            p->res_n--;
        } else {
            for (size_t i = 0; i < p->res_n; i++) n[i] = p->res[(p->res_head + i) % p->res_cap];
            free(p->res);
            p->res = n;
            p->res_cap = cap;
            p->res_head = 0;
        }
    }
    p->res[(p->res_head + p->res_n) % p->res_cap] = *r;
    p->res_n++;
}

void pp_finish_locked(ect_push_producer *p, pitem *it, int status, const char *error) {
    if (it->phase == PI_DONE) return;
    if (it->phase == PI_QUEUED) {
        /* unlink from the queue */
        pitem **pp = &p->queued, *prev = NULL;
        while (*pp && *pp != it) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) {
            *pp = it->next;
            if (p->queued_tail == it) p->queued_tail = prev;
        }
    }
    it->phase = PI_DONE;
    it->done_ms = ect_now_ms();
    ect_push_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.transfer_id, sizeof r.transfer_id, "%s", it->transfer_id);
    r.status = status;
    snprintf(r.error, sizeof r.error, "%s", error ? error : "");
    r.latency_ns = ect_now_ns() - it->t0_ns;
    r.shards = (uint32_t)it->n_shards;
    snprintf(r.transport, sizeof r.transport, "%s", it->used_kind);
    r.retries = it->retries;
    push_result(p, &r);
    if (status == 0)
        p->st.done++;
    else if (status == ECT_ECANCELED)
        p->st.cancelled++;
    else
        p->st.failed++;
    p->n_live--;
    DL_APPEND2(p->tombs, it, tprev, tnext);
    p->n_tombs++;
    pthread_cond_broadcast(&p->results);
}

void pp_expire_locked(ect_push_producer *p, uint64_t now_ms) {
    while (p->tombs) {
        pitem *it = p->tombs;
        bool over = p->n_tombs > p->o.max_tombstones;
        if (!over && now_ms - it->done_ms < p->o.ttl_ms) break;
        if (it->stage_queued || it->src_held) break; /* a stage still refers to it */
        DL_DELETE2(p->tombs, it, tprev, tnext);
        p->n_tombs--;
        HASH_DEL(p->items, it);
        free(it->ports);
        free(it->keys);
        free(it->kinds);
        free(it);
    }
}

int ect_push_producer_cancel(ect_push_producer *p, const char *transfer_id) {
    if (!p || !transfer_id) return ect_set_error(ECT_EINVAL, "ect_push_producer_cancel: NULL");
    pthread_mutex_lock(&p->mu);
    pitem *it = NULL;
    HASH_FIND_STR(p->items, transfer_id, it);
    if (!it || it->phase == PI_DONE) {
        pthread_mutex_unlock(&p->mu);
        return ect_set_error(ECT_ENOTFOUND, "no push in flight for transfer_id '%s'", transfer_id);
    }
    if (it->phase == PI_QUEUED) { /* nothing went out yet: end it here */
        pp_finish_locked(p, it, ECT_ECANCELED, "cancelled before it was sent");
        pthread_mutex_unlock(&p->mu);
        pp_release_src(p, it);
        return 0;
    }
    int rc = 0;
    if (p->n_cancels == p->cap_cancels) {
        size_t cap = p->cap_cancels ? p->cap_cancels * 2 : 16;
        char **n = realloc(p->cancels, cap * sizeof *n);
        if (!n)
            rc = ect_set_error(ECT_ENOMEM, "push producer: out of memory");
        else {
            p->cancels = n;
            p->cap_cancels = cap;
        }
    }
    if (!rc && !(p->cancels[p->n_cancels] = strdup(transfer_id)))
        rc = ect_set_error(ECT_ENOMEM, "push producer: out of memory");
    if (!rc) {
        p->n_cancels++;
        pthread_cond_signal(&p->wake);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

size_t ect_push_producer_poll(ect_push_producer *p, ect_push_result *out, size_t max,
                              int timeout_ms) {
    if (!p || !out || !max) return 0;
    pthread_mutex_lock(&p->mu);
    if (!p->res_n && timeout_ms != 0) {
        if (timeout_ms < 0) {
            while (!p->res_n && !p->stop) pthread_cond_wait(&p->results, &p->mu);
        } else {
            uint64_t end = ect_deadline_ns((uint64_t)timeout_ms);
            while (!p->res_n && !p->stop)
                if (ect_cond_wait_until(&p->results, &p->mu, end)) break;
        }
    }
    size_t n = 0;
    while (n < max && p->res_n) {
        out[n++] = p->res[p->res_head];
        p->res_head = (p->res_head + 1) % p->res_cap;
        p->res_n--;
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

size_t ect_push_producer_pending(ect_push_producer *p) {
    if (!p) return 0;
    pthread_mutex_lock(&p->mu);
    size_t n = p->n_live;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void ect_push_producer_stats(ect_push_producer *p, ect_push_producer_stat *st) {
    if (!p || !st) return;
    pthread_mutex_lock(&p->mu);
    *st = p->st;
    pthread_mutex_unlock(&p->mu);
    if (p->pool) {
        ect_pool_stat ps;
        ect_pool_stats(p->pool, &ps);
        st->staged_bytes_in_use = ps.used;
    }
}

void ect_push_producer_close(ect_push_producer *p) {
    if (!p) return;
    if (p->thread_started) {
        pthread_mutex_lock(&p->mu);
        p->stop = true;
        pthread_cond_broadcast(&p->wake);
        pthread_cond_broadcast(&p->results);
        pthread_cond_broadcast(&p->room);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
    }
    /* Single-threaded from here. The dispatcher closed the control lanes and
     * the transports on its way out (or never started). */
    if (p->lanes) pp_lanes_close(p); /* the dispatcher never started */
    lanes_close(p->wlanes, true);
    pitem *it, *tmp;
    HASH_ITER(hh, p->items, it, tmp) {
        pp_release_src(p, it);
        for (size_t i = 0; it->keys && i < it->n_shards; i++) free(it->keys[i]);
        free(it->keys);
        free(it->kinds);
        free(it->ports);
        HASH_DEL(p->items, it);
        free(it);
    }
    for (size_t i = 0; i < p->n_cancels; i++) free(p->cancels[i]);
    free(p->cancels);
    free(p->res);
    free(p->acts);
    push_close(p->table);
    down_close(p->downs);
    if (p->zctx) zmq_ctx_term(p->zctx);
    ect_pool_close(p->pool);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->results);
    pthread_cond_destroy(&p->room);
    pthread_cond_destroy(&p->wcv);
    pthread_mutex_destroy(&p->wmu);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
