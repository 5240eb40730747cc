/*
 * zauth — the ZAP handler (RFC 27) and the CURVE / PLAIN socket setup
 * (zauth.h). The handler is one thread per context with a REP socket on
 * inproc://zeromq.zap.01 and a PAIR to be told to stop; it answers one
 * request at a time (libzmq asks once per new connection, so the load is the
 * connection rate, not the message rate).
 *
 * Why a handler is always there when a socket is a CURVE server: without one
 * libzmq 4.3 lets every client that knows the server's public key in (key
 * possession is the client's only proof then), which is not "accepted keys
 * only".
 */
#include "util/zauth.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "util/util.h"

#define MOD "zauth"
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_MAX_FRAMES 10
#define ZAP_DOMAIN "ect"

struct zauth {
    void *zctx;
    const ect_keyset *ks;
    char who[48];
    char stop_ep[80];
    void *rep;  /* handler thread's */
    void *stop; /* PAIR, closer's side */
    pthread_t thr;
    bool started;
    pthread_mutex_t mu; /* guards secret */
    char secret[ZAUTH_SECRET_LEN + 1];
    _Atomic uint64_t refused;
    uint64_t logged_refused; /* handler thread only */
    uint64_t next_log_ms;
};

/* -------------------------------------------------------------- handler */

typedef struct zap_req {
    zmq_msg_t f[ZAP_MAX_FRAMES];
    int n;
} zap_req;

static void req_clear(zap_req *r) {
    for (int i = 0; i < r->n; i++) zmq_msg_close(&r->f[i]);
    r->n = 0;
}

/* Reads one multipart request; frames beyond ZAP_MAX_FRAMES are dropped. */
static int req_read(void *sock, zap_req *r) {
    r->n = 0;
    bool more = true;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, 0) < 0) {
            zmq_msg_close(&m);
            req_clear(r);
            return -1;
        }
        more = zmq_msg_more(&m);
        if (r->n < ZAP_MAX_FRAMES)
            r->f[r->n++] = m;
        else
            zmq_msg_close(&m);
    }
    return 0;
}

static bool frame_is(const zauth_frame *f, const char *s) {
    size_t n = strlen(s);
    return f->n == n && memcmp(f->p, s, n) == 0;
}

static void frame_str(const zauth_frame *f, char *buf, size_t cap) {
    size_t n = f->n;
    if (n >= cap) n = cap - 1;
    if (n) memcpy(buf, f->p, n);
    buf[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)buf[i] < 32 || (unsigned char)buf[i] > 126) buf[i] = '?';
}

/* Constant time in the length of the expected secret. */
static bool secret_eq(const zauth_frame *f, const char *secret) {
    size_t n = strlen(secret);
    if (f->n != n || n == 0) return false;
    const unsigned char *p = f->p;
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++) d |= (unsigned char)(p[i] ^ (unsigned char)secret[i]);
    return d == 0;
}

static void note_refusal(zauth *a, const char *mech, const char *addr, const char *why) {
    uint64_t n = atomic_fetch_add(&a->refused, 1) + 1;
    uint64_t now = ect_now_ms();
    if (n == 1) {
        ECT_LOGW(MOD,
                 "%s: refused a %s client from %s: %s (further refusals are summed up "
                 "at most every %d s)",
                 a->who, mech, addr, why, ZAUTH_LOG_EVERY_MS / 1000);
        a->logged_refused = 1;
        a->next_log_ms = now + ZAUTH_LOG_EVERY_MS;
    } else if (now >= a->next_log_ms) {
        ECT_LOGW(MOD, "%s: refused %llu more clients (latest: %s from %s: %s); %llu since open",
                 a->who, (unsigned long long)(n - a->logged_refused), mech, addr, why,
                 (unsigned long long)n);
        a->logged_refused = n;
        a->next_log_ms = now + ZAUTH_LOG_EVERY_MS;
    }
}

/* Frames are version, request id, domain, address, identity, mechanism,
 * credentials... (RFC 27). */
bool zauth_decide(zauth *a, const zauth_frame *f, int n, char *user, size_t cap) {
    char mech[16] = "?", addr[64] = "?";
    if (cap) user[0] = '\0';
    if (n >= 6) frame_str(&f[5], mech, sizeof mech);
    if (n >= 4) frame_str(&f[3], addr, sizeof addr);
    if (n < 6 || !frame_is(&f[0], "1.0")) {
        note_refusal(a, mech, addr, "malformed ZAP request");
        return false;
    }
    if (frame_is(&f[5], "CURVE")) {
        if (n < 7 || f[6].n != ECT_KEY_BYTES || !a->ks) {
            note_refusal(a, mech, addr, "no CURVE keys accepted here");
            return false;
        }
        if (memcmp(f[6].p, a->ks->pub, ECT_KEY_BYTES) == 0) {
            snprintf(user, cap, "self");
            return true;
        }
        int i = ect_keys_find(a->ks, f[6].p);
        if (i < 0) {
            char z[ECT_KEY_Z85_LEN + 1];
            ect_key_z85(f[6].p, z);
            char why[96];
            snprintf(why, sizeof why, "public key %s is not in accept/", z);
            note_refusal(a, mech, addr, why);
            return false;
        }
        snprintf(user, cap, "%s", a->ks->accept_names[i]);
        return true;
    }
    if (frame_is(&f[5], "PLAIN")) {
        pthread_mutex_lock(&a->mu);
        bool ok = n >= 8 && a->secret[0] && frame_is(&f[6], ZAUTH_PLAIN_USER) &&
                  secret_eq(&f[7], a->secret);
        pthread_mutex_unlock(&a->mu);
        if (!ok) {
            note_refusal(a, mech, addr, "wrong event-port secret");
            return false;
        }
        snprintf(user, cap, "%s", ZAUTH_PLAIN_USER);
        return true;
    }
    note_refusal(a, mech, addr, "mechanism not allowed");
    return false;
}

static void answer(zauth *a, zap_req *r) {
    char user[128] = "";
    zauth_frame f[ZAP_MAX_FRAMES];
    for (int i = 0; i < r->n; i++)
        f[i] = (zauth_frame){zmq_msg_data(&r->f[i]), zmq_msg_size(&r->f[i])};
    bool ok = zauth_decide(a, f, r->n, user, sizeof user);
    const char *code = ok ? "200" : "400";
    const char *text = ok ? "OK" : "not accepted";
    zmq_send(a->rep, "1.0", 3, ZMQ_SNDMORE);
    if (r->n >= 2)
        zmq_send(a->rep, zmq_msg_data(&r->f[1]), zmq_msg_size(&r->f[1]), ZMQ_SNDMORE);
    else
        zmq_send(a->rep, "", 0, ZMQ_SNDMORE);
    zmq_send(a->rep, code, 3, ZMQ_SNDMORE);
    zmq_send(a->rep, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(a->rep, user, strlen(user), ZMQ_SNDMORE);
    zmq_send(a->rep, "", 0, 0);
}

static void *handler_main(void *arg) {
    zauth *a = arg;
    pthread_setname_np(pthread_self(), "ect-zauth");
    void *pipe = zmq_socket(a->zctx, ZMQ_PAIR);
    if (!pipe || zmq_connect(pipe, a->stop_ep) != 0) {
        ECT_LOGE(MOD, "%s: cannot reach the stop pipe; the handler stops", a->who);
        if (pipe) zmq_close(pipe);
        return NULL;
    }
    for (;;) {
        zmq_pollitem_t it[2] = {{.socket = a->rep, .events = ZMQ_POLLIN},
                                {.socket = pipe, .events = ZMQ_POLLIN}};
        int n = zmq_poll(it, 2, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (it[1].revents & ZMQ_POLLIN) break;
        if (it[0].revents & ZMQ_POLLIN) {
            zap_req r;
            if (req_read(a->rep, &r) != 0) continue;
            answer(a, &r);
            req_clear(&r);
        }
    }
    zmq_close(pipe);
    return NULL;
}

int zauth_open(void *zctx, const ect_keyset *ks, const char *who, zauth **out) {
    *out = NULL;
    zauth *a = calloc(1, sizeof *a);
    if (!a) return ect_set_error(ECT_ENOMEM, "zauth: out of memory");
    a->zctx = zctx;
    a->ks = ks;
    snprintf(a->who, sizeof a->who, "%s", who ? who : "?");
    snprintf(a->stop_ep, sizeof a->stop_ep, "inproc://ect-zauth-stop-%p", (void *)a);
    pthread_mutex_init(&a->mu, NULL);
    if (!zctx) { /* detached: zauth_decide only */
        *out = a;
        return 0;
    }
    int rc = 0, zero = 0;
    a->rep = zmq_socket(zctx, ZMQ_REP);
    a->stop = zmq_socket(zctx, ZMQ_PAIR);
    if (!a->rep || !a->stop) {
        rc = ect_set_error(ECT_EIO, "zauth: zmq_socket: %s", zmq_strerror(errno));
        goto fail;
    }
    zmq_setsockopt(a->rep, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(a->stop, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(a->rep, ZAP_ENDPOINT) != 0) {
        int e = errno;
        rc = ect_set_error(e == EADDRINUSE ? ECT_EEXIST : ECT_EIO, "zauth: bind %s: %s",
                           ZAP_ENDPOINT, zmq_strerror(e));
        goto fail;
    }
    if (zmq_bind(a->stop, a->stop_ep) != 0) {
        rc = ect_set_error(ECT_EIO, "zauth: bind %s: %s", a->stop_ep, zmq_strerror(errno));
        goto fail;
    }
    if (pthread_create(&a->thr, NULL, handler_main, a) != 0) {
        rc = ect_set_error(ECT_EIO, "zauth: cannot start the handler thread");
        goto fail;
    }
    a->started = true;
    *out = a;
    return 0;
fail:
    zauth_close(a);
    return rc;
}

void zauth_close(zauth *a) {
    if (!a) return;
    if (a->started) {
        zmq_send(a->stop, "", 0, 0);
        pthread_join(a->thr, NULL);
    }
    if (a->rep) zmq_close(a->rep);
    if (a->stop) zmq_close(a->stop);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

uint64_t zauth_refusals(zauth *a) { return a ? atomic_load(&a->refused) : 0; }

/* ----------------------------------------------------------- socket setup */

static int setopt(void *sock, int opt, const void *v, size_t n, const char *what) {
    if (zmq_setsockopt(sock, opt, v, n) == 0) return 0;
    int e = errno;
    if (e == EINVAL && !zmq_has("curve"))
        return ect_set_error(ECT_ENOTSUP, "this libzmq has no CURVE support (%s)", what);
    return ect_set_error(ECT_EIO, "zmq security option %s: %s", what, zmq_strerror(e));
}

int zauth_curve_server(void *sock, const ect_keyset *ks) {
    int one = 1;
    int rc = setopt(sock, ZMQ_ZAP_DOMAIN, ZAP_DOMAIN, strlen(ZAP_DOMAIN), "ZAP_DOMAIN");
    if (!rc) rc = setopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one, "CURVE_SERVER");
    if (!rc) rc = setopt(sock, ZMQ_CURVE_SECRETKEY, ks->sec, ECT_KEY_BYTES, "CURVE_SECRETKEY");
    return rc;
}

void zauth_set_secret(zauth *a, const char *secret) {
    pthread_mutex_lock(&a->mu);
    snprintf(a->secret, sizeof a->secret, "%s", secret);
    pthread_mutex_unlock(&a->mu);
}

int zauth_plain_server(zauth *a, void *sock, const char *secret) {
    zauth_set_secret(a, secret);
    int one = 1;
    int rc = setopt(sock, ZMQ_ZAP_DOMAIN, ZAP_DOMAIN, strlen(ZAP_DOMAIN), "ZAP_DOMAIN");
    if (!rc) rc = setopt(sock, ZMQ_PLAIN_SERVER, &one, sizeof one, "PLAIN_SERVER");
    return rc;
}

void zauth_new_secret(char secret[ZAUTH_SECRET_LEN + 1]) { ect_random_id(secret); }

int zauth_plain_client(void *sock, const char *secret) {
    int rc = setopt(sock, ZMQ_PLAIN_USERNAME, ZAUTH_PLAIN_USER, strlen(ZAUTH_PLAIN_USER),
                    "PLAIN_USERNAME");
    if (!rc) rc = setopt(sock, ZMQ_PLAIN_PASSWORD, secret, strlen(secret), "PLAIN_PASSWORD");
    return rc;
}

int zauth_curve_client(void *sock, const ect_keyset *ks, const char *server_z85) {
    uint8_t srv[ECT_KEY_BYTES];
    if (!server_z85 || strlen(server_z85) != ECT_KEY_Z85_LEN || !zmq_z85_decode(srv, server_z85))
        return ect_set_error(ECT_EINVAL, "CURVE server key: not 40 characters of Z85");
    int rc = setopt(sock, ZMQ_CURVE_SERVERKEY, srv, ECT_KEY_BYTES, "CURVE_SERVERKEY");
    if (!rc) rc = setopt(sock, ZMQ_CURVE_PUBLICKEY, ks->pub, ECT_KEY_BYTES, "CURVE_PUBLICKEY");
    if (!rc) rc = setopt(sock, ZMQ_CURVE_SECRETKEY, ks->sec, ECT_KEY_BYTES, "CURVE_SECRETKEY");
    return rc;
}

/* ------------------------------------------------------ server-key probe */

/* The cache: endpoint and this side's public key -> the server's key. Small
 * (one entry per server endpoint this process talks to); the oldest entry
 * is replaced when full. */
#define PROBE_CACHE 256
typedef struct probe_entry {
    char endpoint[300];
    char self[ECT_KEY_Z85_LEN + 1];
    char server[ECT_KEY_Z85_LEN + 1];
} probe_entry;
static probe_entry cache[PROBE_CACHE];
static unsigned cache_next;
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;

static bool cache_get(const char *ep, const char *self, char out[ECT_KEY_Z85_LEN + 1]) {
    bool hit = false;
    pthread_mutex_lock(&cache_mu);
    for (unsigned i = 0; i < PROBE_CACHE && !hit; i++)
        if (cache[i].endpoint[0] && strcmp(cache[i].endpoint, ep) == 0 &&
            strcmp(cache[i].self, self) == 0) {
            memcpy(out, cache[i].server, ECT_KEY_Z85_LEN + 1);
            hit = true;
        }
    pthread_mutex_unlock(&cache_mu);
    return hit;
}

static void cache_put(const char *ep, const char *self, const char *server) {
    pthread_mutex_lock(&cache_mu);
    probe_entry *e = &cache[cache_next++ % PROBE_CACHE];
    snprintf(e->endpoint, sizeof e->endpoint, "%s", ep);
    memcpy(e->self, self, ECT_KEY_Z85_LEN + 1);
    memcpy(e->server, server, ECT_KEY_Z85_LEN + 1);
    pthread_mutex_unlock(&cache_mu);
}

/* Local CURVE servers: port -> that server's own public key. */
#define LOCAL_MAX 256
static struct {
    int port;
    char pub[ECT_KEY_Z85_LEN + 1];
} local[LOCAL_MAX];

void zauth_local_server(int port, const ect_keyset *ks) {
    pthread_mutex_lock(&cache_mu);
    for (int i = 0; i < LOCAL_MAX; i++)
        if (local[i].port == 0 || local[i].port == port) {
            local[i].port = port;
            memcpy(local[i].pub, ks->pub_z85, sizeof local[i].pub);
            break;
        }
    pthread_mutex_unlock(&cache_mu);
}

void zauth_local_server_gone(int port) {
    pthread_mutex_lock(&cache_mu);
    for (int i = 0; i < LOCAL_MAX; i++)
        if (local[i].port == port) local[i].port = 0;
    pthread_mutex_unlock(&cache_mu);
}

/* The port of "tcp://HOST:PORT", or 0. */
static int endpoint_port(const char *ep) {
    const char *c = strrchr(ep, ':');
    return c ? atoi(c + 1) : 0;
}

static bool local_get(const char *ep, char out[ECT_KEY_Z85_LEN + 1]) {
    int port = endpoint_port(ep);
    bool hit = false;
    pthread_mutex_lock(&cache_mu);
    for (int i = 0; i < LOCAL_MAX && port > 0 && !hit; i++)
        if (local[i].port == port) {
            memcpy(out, local[i].pub, ECT_KEY_Z85_LEN + 1);
            hit = true;
        }
    pthread_mutex_unlock(&cache_mu);
    return hit;
}

void zauth_forget(const char *endpoint) {
    pthread_mutex_lock(&cache_mu);
    for (unsigned i = 0; i < PROBE_CACHE; i++)
        if (strcmp(cache[i].endpoint, endpoint) == 0) cache[i].endpoint[0] = '\0';
    pthread_mutex_unlock(&cache_mu);
}

/* 1: the server holds `cand` (handshake done, or refused us by ZAP, which it
 * can only do after opening our HELLO with its secret key); 0: it does not
 * (the connection dropped during the handshake); -1: no verdict (no
 * connection in time). */
static int probe_one(void *zctx, const ect_keyset *ks, int type, const char *ep, const char *cand,
                     int timeout_ms) {
    static _Atomic unsigned seq;
    char mep[96];
    snprintf(mep, sizeof mep, "inproc://ect-zauth-probe-%u", atomic_fetch_add(&seq, 1));
    void *s = zmq_socket(zctx, type), *m = NULL;
    int verdict = -1, zero = 0;
    if (!s) return -1;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (zauth_curve_client(s, ks, cand) != 0) goto out;
    if (zmq_socket_monitor(s, mep,
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_DISCONNECTED) != 0)
        goto out;
    if (!(m = zmq_socket(zctx, ZMQ_PAIR))) goto out;
    zmq_setsockopt(m, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_connect(m, mep) != 0 || zmq_connect(s, ep) != 0) goto out;
    uint64_t deadline = ect_now_ms() + (uint64_t)timeout_ms;
    while (verdict < 0) {
        uint64_t now = ect_now_ms();
        if (now >= deadline) break;
        zmq_pollitem_t it = {.socket = m, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, (long)(deadline - now)) <= 0) continue;
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, m, 0) < 0) {
            zmq_msg_close(&f);
            continue;
        }
        uint16_t ev = 0;
        if (zmq_msg_size(&f) >= 2) memcpy(&ev, zmq_msg_data(&f), sizeof ev);
        bool more = zmq_msg_more(&f);
        zmq_msg_close(&f);
        while (more) {
            zmq_msg_init(&f);
            more = zmq_msg_recv(&f, m, 0) >= 0 && zmq_msg_more(&f);
            zmq_msg_close(&f);
        }
        if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED || ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
            verdict = 1;
        else
            verdict = 0;
    }
out:
    if (s) {
        zmq_socket_monitor(s, NULL, 0);
        zmq_close(s);
    }
    if (m) zmq_close(m);
    return verdict;
}

int zauth_server_key(void *zctx, const ect_keyset *ks, int probe_type, const char *endpoint,
                     int timeout_ms, char out[ECT_KEY_Z85_LEN + 1]) {
    if (local_get(endpoint, out)) return 0;
    memcpy(out, ks->accept_z85[0], ECT_KEY_Z85_LEN + 1);
    if (ks->n_accept <= 1) return 0;
    if (cache_get(endpoint, ks->pub_z85, out)) return 0;
    bool answered = false;
    for (size_t i = 0; i < ks->n_accept; i++) {
        int v = probe_one(zctx, ks, probe_type, endpoint, ks->accept_z85[i], timeout_ms);
        if (v == 1) {
            memcpy(out, ks->accept_z85[i], ECT_KEY_Z85_LEN + 1);
            cache_put(endpoint, ks->pub_z85, out);
            ECT_LOGI(MOD, "%s holds accepted key '%s'", endpoint, ks->accept_names[i]);
            return 0;
        }
        if (v == 0) answered = true;
        if (v < 0 && !answered) break; /* nobody there: every probe would wait */
    }
    memcpy(out, ks->accept_z85[0], ECT_KEY_Z85_LEN + 1);
    ECT_LOGW(MOD, "%s: %s; trying accepted key '%s' (docs/SECURITY.md \"Which server key\")",
             endpoint,
             answered ? "holds none of the accepted keys" : "did not answer the key probe",
             ks->accept_names[0]);
    return 0;
}

int zauth_client(void *zctx, void *sock, const ect_keyset *ks, int probe_type, const char *endpoint,
                 int timeout_ms) {
    if (!ks) return 0;
    char srv[ECT_KEY_Z85_LEN + 1];
    zauth_server_key(zctx, ks, probe_type, endpoint, timeout_ms, srv);
    return zauth_curve_client(sock, ks, srv);
}
