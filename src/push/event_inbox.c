/*
 * event_inbox — PULL socket + discovery thread. The thread publishes its
 * result (shard control ports and event ports) once, under the mutex; the
 * caller's drain picks it up and connects. The thread's ZMQ context is its
 * own so that inbox_close can interrupt a discovery exchange blocked on an
 * unreachable consumer (zmq_ctx_shutdown makes it return ETERM) instead of
 * waiting out the control timeout.
 */
#include "push/event_inbox.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "push/control_client.h"
#include "util/util.h"
#include "util/zauth.h"

#define MOD "inbox"
#define INBOX_MAX_SHARDS 64

struct inbox {
    inbox_opts o;
    char host[256];
    void *pull;
    void *dctx; /* discovery thread's context */
    pthread_t thr;
    bool thr_started;
    atomic_bool stop;
    pthread_mutex_t mu;
    bool found; /* guarded by mu */
    int ports[INBOX_MAX_SHARDS], event_ports[INBOX_MAX_SHARDS];
    /* per shard: its event_port reply's PLAIN secret, or with keys the
     * public key its control port proved to hold (the event port has the
     * same pair) */
    char secrets[INBOX_MAX_SHARDS][WIRE_SECRET_MAX + 1];
    char srvkeys[INBOX_MAX_SHARDS][ECT_KEY_Z85_LEN + 1];
    size_t n;
    bool connected; /* caller's thread only */
    uint64_t bad_frames;
};

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* One discovery attempt. */
static int discover(inbox *b, ctl_client *cli, int *ports, int *evp, size_t *n,
                    char (*secrets)[WIRE_SECRET_MAX + 1], char (*srvkeys)[ECT_KEY_Z85_LEN + 1]) {
    int rc = ctl_peers(cli, b->host, b->o.port, ports, INBOX_MAX_SHARDS, n);
    if (rc) return rc;
    if (*n != (size_t)b->o.tp_size) {
        ctl_forget_peers(cli, b->host, b->o.port);
        return ect_set_error(ECT_EPROTO, "consumer %s:%d reports %zu shards, expected tp_size %d",
                             b->host, b->o.port, *n, b->o.tp_size);
    }
    for (size_t i = 0; i < *n; i++) {
        rc = ctl_event_port_secret(cli, b->host, ports[i], &evp[i], secrets[i]);
        if (rc) {
            ctl_forget_peers(cli, b->host, b->o.port);
            return rc;
        }
        if (b->o.keys) {
            char ep[300];
            bool v6 = strchr(b->host, ':') != NULL;
            snprintf(ep, sizeof ep, v6 ? "tcp://[%s]:%d" : "tcp://%s:%d", b->host, ports[i]);
            zauth_server_key(b->dctx, b->o.keys, ZMQ_REQ, ep, b->o.timeout_ms, srvkeys[i]);
        }
    }
    return 0;
}

static void *discovery_main(void *arg) {
    inbox *b = arg;
    pthread_setname_np(pthread_self(), "ect-ev-discover");
    ctl_client *cli = NULL;
    if (ctl_client_open(b->dctx, b->o.timeout_ms, &cli)) {
        ECT_LOGE(MOD, "discovery: %s", ect_last_error());
        return NULL;
    }
    ctl_client_set_keys(cli, b->o.keys);
    int ports[INBOX_MAX_SHARDS], evp[INBOX_MAX_SHARDS];
    char secrets[INBOX_MAX_SHARDS][WIRE_SECRET_MAX + 1];
    char srvkeys[INBOX_MAX_SHARDS][ECT_KEY_Z85_LEN + 1];
    size_t n = 0;
    bool warned = false;
    while (!atomic_load(&b->stop)) {
        if (discover(b, cli, ports, evp, &n, secrets, srvkeys) == 0) {
            pthread_mutex_lock(&b->mu);
            memcpy(b->ports, ports, n * sizeof *ports);
            memcpy(b->event_ports, evp, n * sizeof *evp);
            memcpy(b->secrets, secrets, n * sizeof *secrets);
            memcpy(b->srvkeys, srvkeys, n * sizeof *srvkeys);
            b->n = n;
            b->found = true;
            pthread_mutex_unlock(&b->mu);
            ECT_LOGI(MOD, "discovered %zu shard(s) of %s:%d", n, b->host, b->o.port);
            break;
        }
        if (atomic_load(&b->stop)) break; /* interrupted by inbox_close */
        if (!warned) {
            ECT_LOGW(MOD, "discovery of %s:%d: %s (retrying)", b->host, b->o.port,
                     ect_last_error());
            warned = true;
        }
        for (int waited = 0; waited < b->o.retry_ms && !atomic_load(&b->stop); waited += 20)
            nap_ms(20);
    }
    ctl_client_close(cli);
    return NULL;
}

int inbox_open(void *zctx, const inbox_opts *o, inbox **out) {
    *out = NULL;
    if (!zctx || !o || !o->host || !*o->host || strlen(o->host) > 255)
        return ect_set_error(ECT_EINVAL, "event inbox: host required (at most 255 bytes)");
    if (o->port < 1 || o->port > 65535)
        return ect_set_error(ECT_EINVAL, "event inbox: port %d: 1..65535", o->port);
    if (o->tp_size < 1 || o->tp_size > INBOX_MAX_SHARDS)
        return ect_set_error(ECT_EINVAL, "event inbox: tp_size %d: 1..64", o->tp_size);
    if (o->timeout_ms < 1) return ect_set_error(ECT_EINVAL, "event inbox: timeout_ms must be >= 1");
    inbox *b = calloc(1, sizeof *b);
    if (!b) return ect_set_error(ECT_ENOMEM, "event inbox: out of memory");
    b->o = *o;
    if (b->o.retry_ms < 1) b->o.retry_ms = 200;
    snprintf(b->host, sizeof b->host, "%s", o->host);
    b->o.host = b->host;
    pthread_mutex_init(&b->mu, NULL);
    int rc;
    b->pull = zmq_socket(zctx, ZMQ_PULL);
    b->dctx = zmq_ctx_new();
    if (!b->pull || !b->dctx) {
        rc = ect_set_error(ECT_EIO, "event inbox: cannot create sockets: %s", zmq_strerror(errno));
        goto fail;
    }
    int zero = 0, one = 1;
    zmq_setsockopt(b->pull, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(b->pull, ZMQ_IPV6, &one, sizeof one);
    int64_t maxmsg = WIRE_CTL_MAX_FRAME;
    zmq_setsockopt(b->pull, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (pthread_create(&b->thr, NULL, discovery_main, b) != 0) {
        rc = ect_set_error(ECT_EIO, "event inbox: cannot start the discovery thread");
        goto fail;
    }
    b->thr_started = true;
    *out = b;
    return 0;
fail:
    inbox_close(b);
    return rc;
}

static int secure_connect(inbox *b, size_t i) {
    if (b->o.keys) return zauth_curve_client(b->pull, b->o.keys, b->srvkeys[i]);
    if (b->secrets[i][0]) return zauth_plain_client(b->pull, b->secrets[i]);
    /* an upstream shard, or event auth off: no handshake (NULL mechanism) */
    zmq_setsockopt(b->pull, ZMQ_PLAIN_USERNAME, NULL, 0);
    return 0;
}

static void connect_found(inbox *b) {
    pthread_mutex_lock(&b->mu);
    bool found = b->found;
    pthread_mutex_unlock(&b->mu);
    if (!found) return;
    for (size_t i = 0; i < b->n; i++) {
        char ep[300];
        bool v6 = strchr(b->host, ':') != NULL;
        snprintf(ep, sizeof ep, v6 ? "tcp://[%s]:%d" : "tcp://%s:%d", b->host, b->event_ports[i]);
        /* Security options apply to the connects after them: one set per shard. */
        int rc = secure_connect(b, i);
        if (rc) {
            ECT_LOGE(MOD, "events from %s: %s", ep, ect_last_error());
            continue;
        }
        if (zmq_connect(b->pull, ep) != 0) ECT_LOGE(MOD, "connect %s: %s", ep, zmq_strerror(errno));
    }
    b->connected = true;
}

#define INBOX_UNFOUND_NAP_MS 5

bool inbox_wait(inbox *b, int timeout_ms) {
    uint64_t deadline = ect_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        if (!b->connected) connect_found(b);
        uint64_t now = ect_now_ms();
        long left = now >= deadline ? 0 : (long)(deadline - now); /* never negative: -1 is forever */
        if (!b->connected) { /* discovery still running on its thread */
            if (left == 0) return false;
            nap_ms(left < INBOX_UNFOUND_NAP_MS ? (int)left : INBOX_UNFOUND_NAP_MS);
            continue;
        }
        zmq_pollitem_t it = {.socket = b->pull, .events = ZMQ_POLLIN};
        return zmq_poll(&it, 1, left) > 0;
    }
}

size_t inbox_drain(inbox *b, inbox_fn fn, void *user, size_t max) {
    if (!b->connected) connect_found(b);
    if (!b->connected) return 0;
    size_t delivered = 0;
    for (size_t i = 0; i < max; i++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, b->pull, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }
        wire_event ev;
        if (wire_ctl_decode_event(zmq_msg_data(&m), zmq_msg_size(&m), &ev) != 0) {
            b->bad_frames++;
            ECT_LOGW(MOD, "dropping an undecodable event frame: %s", ect_last_error());
            zmq_msg_close(&m);
            continue;
        }
        zmq_msg_close(&m);
        size_t shard = SIZE_MAX;
        for (size_t k = 0; k < b->n; k++)
            if (b->ports[k] == ev.shard) shard = k;
        if (shard == SIZE_MAX) {
            b->bad_frames++;
            ECT_LOGW(MOD, "dropping an event from unknown shard port %u", (unsigned)ev.shard);
        } else {
            fn(user, &ev, shard);
            delivered++;
        }
        wire_event_clear(&ev);
    }
    return delivered;
}

size_t inbox_shards(inbox *b, int *ports, size_t cap) {
    pthread_mutex_lock(&b->mu);
    size_t n = b->found ? b->n : 0;
    for (size_t i = 0; i < n && i < cap; i++) ports[i] = b->ports[i];
    pthread_mutex_unlock(&b->mu);
    return n;
}

uint64_t inbox_bad_frames(const inbox *b) { return b->bad_frames; }

void inbox_close(inbox *b) {
    if (!b) return;
    atomic_store(&b->stop, true);
    if (b->dctx) zmq_ctx_shutdown(b->dctx); /* interrupts an exchange in flight */
    if (b->thr_started) pthread_join(b->thr, NULL);
    if (b->dctx) zmq_ctx_term(b->dctx);
    if (b->pull) zmq_close(b->pull);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
