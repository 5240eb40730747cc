/*
 * router — the pull producer's request handler. No sockets: the producer's
 * ROUTER thread feeds it one request frame at a time, and it answers through
 * ops.reply (completions for refused pulls, ECTransferReady pages) or hands
 * accepted pulls to ops.dispatch. A pull is accepted only while the item is
 * resident: the handler takes a lease on it, so it cannot be evicted until
 * the write lane that owns the job releases it.
 *
 * ECTransferRequest is answered from the pool's resident items
 * (inventory.c).
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

#include "pull/pull_internal.h"
#include "util/util.h"

#define MOD "pull"

void pull_job_free(pull_job *j) {
    if (!j) return;
    free(j->mm_hash);
    free(j->session);
    free(j->dst_key);
    free(j);
}

void pull_router_complete(pull_router *r, const pull_peer *peer, const char *mm_hash, int status,
                          bool has_token, uint64_t token, const char *reason) {
    /* ect_batch only to a consumer that sends tokens (ours): an upstream
     * one gets its completions as before */
    wire_transfer_complete m = {.mm_hash = (char *)mm_hash,
                                .status = status,
                                .has_token = has_token,
                                .token = token,
                                .error = (char *)reason,
                                .shm_id = r->shm_id,
                                .batch_max = has_token ? r->batch_max : 0};
    void *buf = NULL;
    size_t len = 0;
    if (wire_transfer_complete_encode(&m, &buf, &len) != 0) {
        ECT_LOGW_ID(MOD, NULL, mm_hash, "cannot encode ECTransferComplete for %s: %s", mm_hash,
                    ect_last_error());
        return;
    }
    int rc = r->ops.reply(r->ops.user, peer, buf, len);
    if (rc)
        ECT_LOGW_ID(MOD, NULL, mm_hash, "ECTransferComplete for %s not sent: %s", mm_hash,
                    ect_strerror(rc));
    free(buf);
}

static bool same_peer(const pull_peer *a, const pull_peer *b) {
    if (a->conn || b->conn) return a->conn == b->conn && a->delim == b->delim;
    return a->id_len == b->id_len && a->delim == b->delim && !memcmp(a->id, b->id, a->id_len);
}

/* The accumulator of peer's batched pulls, made if need be; NULL: no memory. */
static pull_done_acc *done_acc(pull_router *r, const pull_peer *peer) {
    for (size_t i = 0; i < r->n_acc; i++)
        if (same_peer(&r->acc[i].peer, peer)) return &r->acc[i];
    if (r->n_acc == r->cap_acc) {
        size_t cap = r->cap_acc ? 2 * r->cap_acc : 4;
        pull_done_acc *a = realloc(r->acc, cap * sizeof *a);
        if (!a) return NULL;
        r->acc = a;
        r->cap_acc = cap;
    }
    pull_done_acc *a = &r->acc[r->n_acc++];
    *a = (pull_done_acc){.peer = *peer};
    return a;
}

static void send_done(pull_router *r, pull_done_acc *a) {
    wire_transfer_done m = {.tokens = a->tokens, .n = a->n};
    void *buf = NULL;
    size_t len = 0;
    int rc = wire_transfer_done_encode(&m, &buf, &len);
    if (!rc) rc = r->ops.reply(r->ops.user, &a->peer, buf, len);
    if (rc)
        ECT_LOGW(MOD, "ECTransferDone of %zu pulls not sent: %s", a->n, ect_last_error());
    else
        r->st.done_msgs++;
    free(buf);
    a->n = 0;
}

void pull_router_answer(pull_router *r, const pull_peer *peer, const char *mm_hash, int status,
                        bool has_token, uint64_t token, bool batched, const char *reason) {
    pull_done_acc *a = status == 0 && batched && has_token ? done_acc(r, peer) : NULL;
    if (a && a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 64;
        uint64_t *t = cap <= WIRE_PULL_MAX_ITEMS ? realloc(a->tokens, cap * sizeof *t) : NULL;
        if (t) {
            a->tokens = t;
            a->cap = cap;
        } else if (a->n) {
            send_done(r, a); /* full (or no memory to grow): what it holds goes now */
        }
    }
    if (!a || a->n == a->cap) { /* no accumulator: its own completion */
        pull_router_complete(r, peer, mm_hash, status, has_token, token, reason);
        return;
    }
    a->tokens[a->n++] = token;
}

void pull_router_flush_done(pull_router *r) {
    for (size_t i = 0; i < r->n_acc; i++)
        if (r->acc[i].n) send_done(r, &r->acc[i]);
    /* peers come and go: forget them all once nothing is held */
    for (size_t i = 0; i < r->n_acc; i++) free(r->acc[i].tokens);
    r->n_acc = 0;
}

void pull_router_fini(pull_router *r) {
    for (size_t i = 0; i < r->n_acc; i++) free(r->acc[i].tokens);
    free(r->acc);
    r->acc = NULL;
    r->n_acc = r->cap_acc = 0;
}

/* Answers a refused pull and logs why. */
static void refuse(pull_router *r, const pull_peer *peer, const wire_transfer_pull *p, int status,
                   const char *reason) {
    r->st.pulls_refused++;
    ECT_LOGW_ID(MOD, NULL, p->mm_hash, "pull of %s for %s refused (%s): %s", p->mm_hash,
                p->consumer_session_id, ect_strerror(status), reason);
    pull_router_complete(r, peer, p->mm_hash, status, p->has_token, p->token, reason);
}

/* An IP address as 16 bytes (v4 mapped); false when s is not one. */
static bool ip_bytes(const char *s, unsigned char out[16]) {
    struct in_addr a4;
    if (inet_pton(AF_INET, s, &a4) == 1) {
        memset(out, 0, 10);
        out[10] = out[11] = 0xff;
        memcpy(out + 12, &a4, 4);
        return true;
    }
    return inet_pton(AF_INET6, s, out) == 1;
}

static bool same_ip(const char *a, const char *b) {
    unsigned char x[16], y[16];
    return ip_bytes(a, x) && ip_bytes(b, y) && memcmp(x, y, 16) == 0;
}

int pull_allow_check(const char *allow) {
    if (strcmp(allow, "*") == 0) return 0;
    const char *s = allow;
    for (;;) {
        const char *e = strchr(s, ',');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        char item[128];
        unsigned char ip[16];
        bool ok = n > 0 && n < sizeof item;
        if (ok) {
            memcpy(item, s, n);
            item[n] = '\0';
            ok = ip_bytes(item, ip);
        }
        if (!ok)
            return ect_set_error(ECT_EINVAL,
                                 "pull producer: connect_allow: '%.*s' is not an IP address "
                                 "(give '*', or IP addresses separated by commas)",
                                 (int)(n < 64 ? n : 64), s);
        if (!e) return 0;
        s = e + 1;
    }
}

/* The connect policy: may a pull from peer make us write to `session`? */
static bool session_allowed(const pull_router *r, const pull_peer *peer, const char *session,
                            char *why, size_t cap) {
    if (strncmp(session, "shm:", 4) == 0) return true; /* same host by construction */
    const char *hp = strncmp(session, "ucx:", 4) == 0 ? session + 4 : session;
    char host[256];
    int port;
    if (ect_hostport_parse("consumer_session_id", hp, 1, 65535, host, sizeof host, &port) != 0) {
        snprintf(why, cap, "%s", ect_last_error());
        return false;
    }
    if (r->allow && strcmp(r->allow, "*") == 0) return true;
    if (!r->allow) {
        if (peer->addr[0] && same_ip(host, peer->addr)) return true;
        snprintf(why, cap,
                 "consumer_session_id %.120s: this producer writes only to the address the pull "
                 "came from (%s); see connect_allow",
                 session, peer->addr[0] ? peer->addr : "unknown");
        return false;
    }
    const char *s = r->allow;
    while (*s) {
        const char *e = strchr(s, ',');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        char item[128];
        if (n < sizeof item) {
            memcpy(item, s, n);
            item[n] = '\0';
            if (strcmp(item, host) == 0 || same_ip(item, host)) return true;
        }
        s += n + (e ? 1 : 0);
    }
    snprintf(why, cap, "consumer_session_id %.120s: host not in this producer's connect_allow",
             session);
    return false;
}

/* The consumer_session_id the connect policy last allowed for one
 * message's peer: a batch's entries all name the batch's one session, so
 * the policy (a parse of the address, two inet_pton) runs once a batch, not
 * once an entry. */
typedef struct session_memo {
    bool set;
    char session[WIRE_PULL_MAX_STR + 1];
} session_memo;

/* session_allowed, remembered in memo (NULL: none) while it allows. */
static bool session_allowed_memo(const pull_router *r, const pull_peer *peer, const char *session,
                                 session_memo *memo, char *why, size_t cap) {
    if (memo && memo->set && strcmp(memo->session, session) == 0) return true;
    if (!session_allowed(r, peer, session, why, cap)) return false;
    if (memo && strlen(session) < sizeof memo->session) { /* the decoder's bound: always */
        memcpy(memo->session, session, strlen(session) + 1);
        memo->set = true;
    }
    return true;
}

/* Takes p's extension fields (dst_key) into the job it dispatches. */
static void handle_pull(pull_router *r, const pull_peer *peer, wire_transfer_pull *p, bool batched,
                        session_memo *memo) {
    if (p->ext_error) {
        refuse(r, peer, p, ECT_EPROTO, p->ext_error);
        return;
    }
    r->st.pulls++;
    uint64_t dst;
    char why[320];
    if (!p->dst_key) {
        refuse(r, peer, p, ECT_EINVAL,
               "ECTransferPull.dst_key: missing (this producer needs the region key)");
        return;
    }
    if (!session_allowed_memo(r, peer, p->consumer_session_id, memo, why, sizeof why)) {
        refuse(r, peer, p, ECT_EACCES, why);
        return;
    }
    if (!ect_add_u64(p->dst_ptr, p->dst_offset, &dst)) {
        refuse(r, peer, p, ECT_EOVERFLOW, "ECTransferPull: dst_ptr + dst_offset overflows");
        return;
    }
    ect_resident_info info;
    int rc = ect_pool_acquire(r->pool, p->mm_hash, &info);
    if (rc) {
        snprintf(why, sizeof why, "mm_hash %s is unknown or evicted", p->mm_hash);
        refuse(r, peer, p, rc == ECT_EINVAL ? ECT_EINVAL : ECT_ENOTFOUND, why);
        return;
    }
    if (!ect_add_u64(dst, info.nbytes, &(uint64_t){0})) {
        ect_pool_release(r->pool, p->mm_hash);
        refuse(r, peer, p, ECT_EOVERFLOW, "ECTransferPull: destination range overflows");
        return;
    }
    pull_job *j = calloc(1, sizeof *j);
    if (!j) {
        ect_pool_release(r->pool, p->mm_hash);
        refuse(r, peer, p, ECT_ENOMEM, "producer out of memory");
        return;
    }
    j->peer = *peer;
    /* The decoded strings move into the job (no copy per pull). */
    j->mm_hash = p->mm_hash;
    j->session = p->consumer_session_id;
    j->dst_key = p->dst_key;
    p->mm_hash = p->consumer_session_id = p->dst_key = NULL;
    j->dst_addr = dst;
    j->has_token = p->has_token;
    j->token = p->token;
    j->batched = batched;
    j->src_offset = info.offset;
    j->nbytes = info.nbytes;
    rc = r->ops.dispatch(r->ops.user, j);
    if (rc) {
        snprintf(why, sizeof why, "%s", ect_last_error());
        pull_router_refuse_job(r, j, rc, why);
    }
}

void pull_router_refuse_job(pull_router *r, pull_job *j, int status, const char *reason) {
    r->st.pulls_refused++;
    ECT_LOGW_ID(MOD, NULL, j->mm_hash, "pull of %s for %s refused (%s): %s", j->mm_hash, j->session,
                ect_strerror(status), reason);
    ect_pool_release(r->pool, j->mm_hash);
    pull_router_complete(r, &j->peer, j->mm_hash, status, j->has_token, j->token, reason);
    pull_job_free(j);
}

static void handle_request(pull_router *r, const pull_peer *peer, const wire_transfer_request *q) {
    r->st.requests++;
    wire_pull_item *items;
    size_t n;
    if (pull_inv_snapshot(r->pool, q->mm_hashes, q->n_mm_hashes, &items, &n) != 0) {
        ECT_LOGW(MOD, "ECTransferRequest %s not answered: %s", q->request_id, ect_last_error());
        return;
    }
    size_t page = r->page_items ? r->page_items : WIRE_PULL_MAX_ITEMS;
    if (page > WIRE_PULL_MAX_ITEMS) page = WIRE_PULL_MAX_ITEMS;
    size_t i = 0;
    do {
        size_t k = n - i < page ? n - i : page;
        wire_transfer_ready m = {.request_id = q->request_id,
                                 .items = items ? items + i : NULL, /* none: NULL + 0 is UB */
                                 .n_items = k,
                                 .producer_session_id = (char *)r->session_id,
                                 .more = i + k < n};
        void *buf;
        size_t len;
        if (wire_transfer_ready_encode(&m, &buf, &len) != 0) {
            ECT_LOGW(MOD, "cannot encode ECTransferReady: %s", ect_last_error());
            break;
        }
        int rc = r->ops.reply(r->ops.user, peer, buf, len);
        free(buf);
        if (rc) {
            ECT_LOGW(MOD, "ECTransferReady for %s not sent: %s", q->request_id, ect_strerror(rc));
            break;
        }
        r->st.ready_pages++;
        i += k;
    } while (i < n);
    pull_inv_items_free(items, n);
}

void pull_router_handle(pull_router *r, const pull_peer *peer, const void *buf, size_t len) {
    r->st.frames++;
    wire_pull_msg m;
    if (wire_pull_decode_any(buf, len, &m) != 0) {
        r->st.malformed++;
        ECT_LOGD(MOD, "malformed ROUTER frame dropped: %s", ect_last_error());
        return;
    }
    switch (m.type) {
    case WIRE_PULL_PULL: handle_pull(r, peer, &m.u.pull, false, NULL); break;
    case WIRE_PULL_PULL_BATCH: {
        r->st.batches++;
        session_memo memo = {.set = false};
        for (size_t i = 0; i < m.u.batch.n; i++)
            handle_pull(r, peer, &m.u.batch.pulls[i], true, &memo);
        break;
    }
    case WIRE_PULL_REQUEST: handle_request(r, peer, &m.u.request); break;
    default:
        r->st.malformed++;
        ECT_LOGD(MOD, "ROUTER frame of type %s dropped (not a request)",
                 wire_pull_type_name(m.type));
        break;
    }
    wire_pull_msg_free(&m);
}

void pull_meta_from_item(const wire_pull_item *it, const char *session, ect_pull_meta *meta) {
    memset(meta, 0, sizeof *meta);
    meta->nbytes = it->num_bytes;
    meta->ndim = it->ndim;
    for (uint32_t d = 0; d < it->ndim && d < ECT_POOL_MAX_NDIM; d++) meta->shape[d] = it->shape[d];
    snprintf(meta->dtype, sizeof meta->dtype, "%s", it->dtype);
    snprintf(meta->producer_session_id, sizeof meta->producer_session_id, "%s",
             session ? session : "");
}
