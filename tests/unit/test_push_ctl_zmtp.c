/*
 * Tests for the control client's own ZMTP connections (no CURVE keys:
 * src/push/control_link.c) against servers that misbehave on purpose: a
 * scripted REP (our codec on an accepted socket, one behaviour per
 * connection) and a real libzmq REP that is restarted. What is checked is
 * what control_client.h promises of the libzmq path: an idle connection is
 * reused, one whose server went away is replaced before the next request, a
 * handshake lost before the request left is retried (not in fail-fast mode),
 * a request lost with its connection costs the timeout (fail-fast: refused at
 * once), a silent server costs the timeout, bad replies are ECT_EPROTO and
 * the next call starts afresh.
 */
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.h>

#include "testutil.h"
#include "push/control_client.h"
#include "util/util.h"
#include "wire/zmtp.h"

#define LONG_MS 30000 /* a timeout no passing case comes near */
#define SHORT_MS 300  /* for the cases that must wait the timeout out */
#define SERVER_WAIT_MS 60000

static const char reply_ok[] = "{\"ok\":true,\"result\":{\"ports\":[5555]}}";

/* What the scripted server does on one connection. */
typedef enum {
    S_SERVE,       /* answer every request with reply_ok until the client closes */
    S_SERVE_ONE,   /* answer one request, then close */
    S_CLOSE,       /* close at once, before the handshake */
    S_HALF_REPLY,  /* take the request, send part of the reply, close */
    S_BAD_REPLY,   /* answer with bytes that are not a reply */
    S_MULTI_REPLY, /* answer with two body frames */
    S_SILENT,      /* take the request, never answer, wait for the client to go */
    S_GATHER3,     /* take three requests before answering any; the second {"ok": false} */
} s_act;

typedef struct server {
    int lfd, port;
    s_act script[4];
    int n;
    atomic_int accepted, requests, closed;
    pthread_t th;
} server;

static int listen_any(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 8), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* Writes everything queued; false when the peer is gone. */
static bool s_flush(zmtp_conn *z, int fd, size_t limit) {
    size_t n;
    const uint8_t *p;
    while ((p = zmtp_conn_out(z, &n)) != NULL && limit > 0) {
        if (n > limit) n = limit;
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return false;
        zmtp_conn_sent(z, (size_t)w);
        limit -= (size_t)w;
    }
    return true;
}

/* Reads until a request is whole; false on EOF, error or a long silence. */
static bool s_next(zmtp_conn *z, int fd, zmtp_msg *m) {
    for (;;) {
        if (!s_flush(z, fd, SIZE_MAX)) return false;
        int rc = zmtp_conn_next(z, m);
        if (rc) return rc == 1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, SERVER_WAIT_MS) != 1) return false;
        uint8_t buf[4096];
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0 || zmtp_conn_feed(z, buf, (size_t)r) != 0) return false;
    }
}

static const char reply_refused[] = "{\"ok\":false,\"error\":\"refused here\"}";

/* S_GATHER3: only a client that wrote all three requests before reading a
 * reply is answered at all. */
static void s_gather3(server *s, zmtp_conn *z, int fd) {
    uint8_t env[3][64];
    size_t envn[3];
    zmtp_msg m;
    for (int i = 0; i < 3; i++) {
        if (!s_next(z, fd, &m) || m.envelope_len > sizeof env[i]) return;
        atomic_fetch_add(&s->requests, 1);
        memcpy(env[i], m.envelope, m.envelope_len);
        envn[i] = m.envelope_len;
    }
    for (int i = 0; i < 3; i++) {
        const char *r = i == 1 ? reply_refused : reply_ok;
        zmtp_conn_send_rep(z, env[i], envn[i], r, strlen(r));
    }
    if (!s_flush(z, fd, SIZE_MAX)) return;
    uint8_t b;
    while (recv(fd, &b, 1, 0) > 0) {
    } /* until the client goes */
}

static void s_connection(server *s, int fd, s_act act) {
    zmtp_conn *z = NULL;
    if (zmtp_conn_new(ZMTP_REP, 1 << 20, &z) != 0) return;
    if (act == S_GATHER3) {
        s_gather3(s, z, fd);
        zmtp_conn_free(z);
        return;
    }
    zmtp_msg m;
    while (act != S_CLOSE && s_next(z, fd, &m)) {
        atomic_fetch_add(&s->requests, 1);
        if (act == S_SILENT) {
            uint8_t b;
            while (recv(fd, &b, 1, 0) > 0) {
            } /* until the client gives up */
            break;
        }
        size_t env = m.envelope_len;
        uint8_t envb[64];
        memcpy(envb, m.envelope, env < sizeof envb ? env : sizeof envb);
        if (act == S_BAD_REPLY) {
            zmtp_conn_send_rep(z, envb, env, "not json", 8);
        } else if (act == S_MULTI_REPLY) { /* envelope, then two body frames */
            uint8_t first[2 + 2] = {1, 2, '{', '}'};
            uint8_t both[sizeof envb + sizeof first];
            memcpy(both, envb, env);
            memcpy(both + env, first, sizeof first);
            zmtp_conn_send_rep(z, both, env + sizeof first, "{}", 2);
        } else {
            zmtp_conn_send_rep(z, envb, env, reply_ok, strlen(reply_ok));
        }
        size_t limit = act == S_HALF_REPLY ? env + 2 + 5 : SIZE_MAX;
        if (!s_flush(z, fd, limit) || act != S_SERVE) break;
    }
    zmtp_conn_free(z);
}

static void *s_run(void *arg) {
    server *s = arg;
    for (int i = 0; i < s->n; i++) {
        struct pollfd p = {.fd = s->lfd, .events = POLLIN};
        if (poll(&p, 1, SERVER_WAIT_MS) != 1) break;
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0) break;
        atomic_fetch_add(&s->accepted, 1);
        s_connection(s, fd, s->script[i]);
        close(fd);
        atomic_fetch_add(&s->closed, 1);
    }
    return NULL;
}

/* Waits until the server closed its n-th connection: over loopback its FIN
 * is in our socket by then. */
static void wait_closed(server *s, int n) {
    while (atomic_load(&s->closed) < n) test_nap_ms(1);
}

static void server_start(server *s, int n, const s_act *script) {
    memset(s, 0, sizeof *s);
    s->lfd = listen_any(&s->port);
    s->n = n;
    memcpy(s->script, script, (size_t)n * sizeof *script);
    assert_int_equal(pthread_create(&s->th, NULL, s_run, s), 0);
}

static void server_stop(server *s) {
    pthread_join(s->th, NULL);
    close(s->lfd);
}

static ctl_client *client(void *z, int timeout_ms, bool fail_fast) {
    ctl_client *c = NULL;
    assert_int_equal(ctl_client_open(z, timeout_ms, &c), 0);
    ctl_client_fail_fast(c, fail_fast);
    return c;
}

static int call_peers(ctl_client *c, const char *host, int port) {
    wire_ctl_request req = {.op = WIRE_OP_PEERS};
    wire_ctl_reply rep;
    int rc = ctl_call(c, host, port, &req, &rep);
    if (rc == 0) {
        assert_true(rep.ok);
        assert_int_equal(rep.u.peers.n, 1);
        assert_int_equal(rep.u.peers.ports[0], 5555);
    }
    wire_ctl_reply_clear(&rep);
    return rc;
}

/* One connection carries every call. */
static void test_idle_connection_reused(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    server s;
    server_start(&s, 1, (s_act[]){S_SERVE});
    ctl_client *c = client(z, LONG_MS, true);
    for (int i = 0; i < 5; i++) assert_int_equal(call_peers(c, "127.0.0.1", s.port), 0);
    ctl_client_close(c); /* the server sees EOF and ends */
    server_stop(&s);
    assert_int_equal(atomic_load(&s.accepted), 1);
    assert_int_equal(atomic_load(&s.requests), 5);
    zmq_ctx_term(z);
}

/* A server that closes after each answer: the idle connection is found
 * dead before the next request, which goes on a new one, in both modes. */
static void test_replaced_after_server_closed(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    for (int ff = 0; ff < 2; ff++) {
        server s;
        server_start(&s, 3, (s_act[]){S_SERVE_ONE, S_SERVE_ONE, S_SERVE_ONE});
        ctl_client *c = client(z, LONG_MS, ff);
        for (int i = 0; i < 3; i++) {
            assert_int_equal(call_peers(c, "127.0.0.1", s.port), 0);
            wait_closed(&s, i + 1);
        }
        server_stop(&s);
        assert_int_equal(atomic_load(&s.accepted), 3);
        ctl_client_close(c);
    }
    zmq_ctx_term(z);
}

/* A connection lost before the handshake finished never carried the request:
 * it is retried on a new one (libzmq's REQ keeps the request queued through
 * a reconnect); in fail-fast mode the loss ends the call at once. */
static void test_handshake_lost_retried(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    server s;
    server_start(&s, 2, (s_act[]){S_CLOSE, S_SERVE});
    ctl_client *c = client(z, LONG_MS, false);
    assert_int_equal(call_peers(c, "127.0.0.1", s.port), 0);
    ctl_client_close(c);
    server_stop(&s);
    assert_int_equal(atomic_load(&s.accepted), 2);
    assert_int_equal(atomic_load(&s.requests), 1);

    server_start(&s, 1, (s_act[]){S_CLOSE});
    c = client(z, LONG_MS, true);
    uint64_t t0 = ect_now_ms();
    assert_err(call_peers(c, "127.0.0.1", s.port), ECT_ECONNREFUSED, "closed the connection");
    assert_true(ect_now_ms() - t0 < LONG_MS / 2);
    ctl_client_close(c);
    server_stop(&s);
    zmq_ctx_term(z);
}

/* A peer that closes in the middle of its reply: the request is lost; fail
 * fast says so at once, otherwise the timeout passes (libzmq's REQ never
 * resends). The next call connects afresh. */
static void test_peer_closes_mid_reply(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    server s;
    server_start(&s, 2, (s_act[]){S_HALF_REPLY, S_SERVE_ONE});
    ctl_client *c = client(z, LONG_MS, true);
    uint64_t t0 = ect_now_ms();
    assert_err(call_peers(c, "127.0.0.1", s.port), ECT_ECONNREFUSED, "closed the connection");
    assert_true(ect_now_ms() - t0 < LONG_MS / 2);
    assert_int_equal(call_peers(c, "127.0.0.1", s.port), 0);
    ctl_client_close(c);
    server_stop(&s);

    server_start(&s, 2, (s_act[]){S_HALF_REPLY, S_SERVE_ONE});
    c = client(z, SHORT_MS, false);
    t0 = ect_now_ms();
    assert_err(call_peers(c, "127.0.0.1", s.port), ECT_ETIMEDOUT, "within 300 ms");
    assert_true(ect_now_ms() - t0 >= SHORT_MS - 5);
    assert_int_equal(atomic_load(&s.requests), 1); /* never sent twice */
    ctl_client_close(c);
    c = client(z, LONG_MS, false);
    assert_int_equal(call_peers(c, "127.0.0.1", s.port), 0);
    ctl_client_close(c);
    server_stop(&s);
    zmq_ctx_term(z);
}

/* A server that takes the request and never answers costs the timeout, in
 * both modes. */
static void test_silent_server_times_out(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    for (int ff = 0; ff < 2; ff++) {
        server s;
        server_start(&s, 1, (s_act[]){S_SILENT});
        ctl_client *c = client(z, SHORT_MS, ff);
        uint64_t t0 = ect_now_ms();
        assert_err(call_peers(c, "127.0.0.1", s.port), ECT_ETIMEDOUT, "no reply to peers");
        assert_true(ect_now_ms() - t0 >= SHORT_MS - 5);
        ctl_client_close(c); /* the server sees EOF */
        server_stop(&s);
        assert_int_equal(atomic_load(&s.requests), 1);
    }
    zmq_ctx_term(z);
}

typedef struct caller {
    ctl_client *c;
    int port, rc;
    char err[256];
} caller;

static void *call_thread(void *arg) {
    caller *k = arg;
    k->rc = call_peers(k->c, "127.0.0.1", k->port);
    snprintf(k->err, sizeof k->err, "%s", ect_last_error());
    return NULL;
}

/* zmq_ctx_shutdown of the client's context ends a wait at once, as it ends
 * a libzmq socket's (the scheduler and the inbox stop their threads so):
 * waiting for a reply, and retrying a refused connect. */
static void test_context_shutdown_ends_wait(void **st) {
    (void)st;
    for (int refused = 0; refused < 2; refused++) {
        void *z = zmq_ctx_new();
        server s = {0};
        caller k = {.c = client(z, LONG_MS, false)};
        if (refused) { /* bound, not listening */
            s.lfd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in a = {.sin_family = AF_INET,
                                    .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
            socklen_t len = sizeof a;
            assert_int_equal(bind(s.lfd, (struct sockaddr *)&a, sizeof a), 0);
            assert_int_equal(getsockname(s.lfd, (struct sockaddr *)&a, &len), 0);
            k.port = ntohs(a.sin_port);
        } else {
            server_start(&s, 1, (s_act[]){S_SILENT});
            k.port = s.port;
        }
        pthread_t th;
        uint64_t t0 = ect_now_ms();
        assert_int_equal(pthread_create(&th, NULL, call_thread, &k), 0);
        if (!refused)
            while (atomic_load(&s.requests) == 0) test_nap_ms(1); /* it waits for the reply */
        else
            test_nap_ms(150); /* a pause: some refused attempts */
        zmq_ctx_shutdown(z);
        pthread_join(th, NULL);
        assert_true(ect_now_ms() - t0 < LONG_MS / 2);
        assert_int_equal(k.rc, ECT_EIO);
        assert_non_null(strstr(k.err, "shutting down"));
        ctl_client_close(k.c);
        if (refused)
            close(s.lfd);
        else
            server_stop(&s);
        zmq_ctx_term(z);
    }
}

/* Replies that are not one control reply: ECT_EPROTO, and the next call
 * starts on a new connection. */
static void test_bad_replies(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    server s;
    server_start(&s, 3, (s_act[]){S_BAD_REPLY, S_MULTI_REPLY, S_SERVE_ONE});
    ctl_client *c = client(z, LONG_MS, true);
    assert_err(call_peers(c, "127.0.0.1", s.port), ECT_EPROTO, "bad reply to peers");
    assert_err(call_peers(c, "127.0.0.1", s.port), ECT_EPROTO, "several frames");
    assert_int_equal(call_peers(c, "127.0.0.1", s.port), 0);
    ctl_client_close(c);
    server_stop(&s);
    assert_int_equal(atomic_load(&s.accepted), 3);
    zmq_ctx_term(z);
}

/* Not fail-fast: a refused connect is retried every 100 ms, so a server
 * that starts listening within the timeout is served (the pause before it
 * listens only makes the first attempts meet a refusal). */
static void *listen_late(void *arg) {
    server *s = arg;
    test_nap_ms(250);
    if (listen(s->lfd, 8) != 0) return NULL;
    return s_run(s);
}

static void test_server_comes_up_within_timeout(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    server s = {.n = 1, .script = {S_SERVE_ONE}};
    s.lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(s.lfd, (struct sockaddr *)&a, sizeof a), 0); /* bound: refuses */
    assert_int_equal(getsockname(s.lfd, (struct sockaddr *)&a, &len), 0);
    s.port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&s.th, NULL, listen_late, &s), 0);
    ctl_client *c = client(z, LONG_MS, false);
    assert_int_equal(call_peers(c, "127.0.0.1", s.port), 0);
    ctl_client_close(c);
    server_stop(&s);
    zmq_ctx_term(z);
}

/* ---- a real libzmq REP, restarted on the same port */

typedef struct zserver {
    void *z;
    int port; /* 0: any; then the one bound */
    int serve;
    atomic_bool bound, done;
    pthread_t th;
} zserver;

static void *z_run(void *arg) {
    zserver *s = arg;
    void *rep = zmq_socket(s->z, ZMQ_REP);
    int zero = 0, wait = SERVER_WAIT_MS, one = 1;
    zmq_setsockopt(rep, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(rep, ZMQ_RCVTIMEO, &wait, sizeof wait);
    zmq_setsockopt(rep, ZMQ_IPV6, &one, sizeof one);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", s->port);
    if (s->port == 0) snprintf(ep, sizeof ep, "tcp://127.0.0.1:*");
    if (zmq_bind(rep, ep) == 0) {
        size_t len = sizeof ep;
        zmq_getsockopt(rep, ZMQ_LAST_ENDPOINT, ep, &len);
        s->port = atoi(strrchr(ep, ':') + 1);
    } else {
        s->port = 0;
    }
    atomic_store(&s->bound, true);
    char buf[256];
    for (int i = 0; s->port && i < s->serve; i++) {
        if (zmq_recv(rep, buf, sizeof buf, 0) < 0) break;
        zmq_send(rep, reply_ok, strlen(reply_ok), 0);
    }
    zmq_close(rep);
    atomic_store(&s->done, true);
    return NULL;
}

static void zserver_start(zserver *s, int port, int serve) {
    memset(s, 0, sizeof *s);
    s->z = zmq_ctx_new();
    s->port = port;
    s->serve = serve;
    assert_int_equal(pthread_create(&s->th, NULL, z_run, s), 0);
    while (!atomic_load(&s->bound)) test_nap_ms(1); /* readiness by event */
    assert_true(s->port > 0);
}

static void zserver_stop(zserver *s) {
    pthread_join(s->th, NULL);
    zmq_ctx_term(s->z); /* its connections are closed when this returns */
}

static void test_libzmq_server_restarted(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    for (int ff = 0; ff < 2; ff++) {
        zserver s;
        zserver_start(&s, 0, 2);
        int port = s.port;
        ctl_client *c = client(z, LONG_MS, ff);
        assert_int_equal(call_peers(c, "127.0.0.1", port), 0);
        assert_int_equal(call_peers(c, "127.0.0.1", port), 0);
        zserver_stop(&s); /* gone; then back on the same port */
        zserver_start(&s, port, 1);
        assert_int_equal(call_peers(c, "127.0.0.1", port), 0);
        zserver_stop(&s);
        ctl_client_close(c);
    }
    zmq_ctx_term(z);
}

/* ctl_call_many runs n peers exchanges (all want_ok) on c. */
static void call_many_peers(ctl_client *c, int port, size_t n, wire_ctl_reply *rep,
                            ctl_exchange *x, char err[][160]) {
    static const wire_ctl_request req = {.op = WIRE_OP_PEERS};
    for (size_t i = 0; i < n; i++)
        x[i] = (ctl_exchange){.req = &req, .rep = &rep[i], .want_ok = true, .err = err[i],
                              .err_cap = 160};
    ctl_call_many(c, "127.0.0.1", port, x, n);
}

/* Three exchanges pipelined: the server reads all three requests before it
 * answers any (a client that waited for a reply first would only time out),
 * and each gets its own outcome: the second's {"ok": false} fails only it,
 * on the same connection. */
static void test_many_pipelined(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    server s;
    server_start(&s, 1, (s_act[]){S_GATHER3});
    ctl_client *c = client(z, LONG_MS, true);
    wire_ctl_reply rep[3];
    ctl_exchange x[3];
    char err[3][160];
    call_many_peers(c, s.port, 3, rep, x, err);
    assert_int_equal(x[0].rc, 0);
    assert_int_equal(rep[0].u.peers.ports[0], 5555);
    assert_int_equal(x[1].rc, ECT_EPROTO);
    assert_non_null(strstr(err[1], "refused here"));
    assert_int_equal(x[2].rc, 0);
    assert_int_equal(rep[2].u.peers.ports[0], 5555);
    for (int i = 0; i < 3; i++) wire_ctl_reply_clear(&rep[i]);
    ctl_client_close(c);
    server_stop(&s);
    assert_int_equal(atomic_load(&s.accepted), 1);
    assert_int_equal(atomic_load(&s.requests), 3);
    zmq_ctx_term(z);
}

/* A libzmq REP answers requests pipelined on one connection in order (the
 * upstream consumer's socket); the wrong count is refused up front. */
static void test_many_libzmq_rep(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    zserver s;
    zserver_start(&s, 0, 6);
    ctl_client *c = client(z, LONG_MS, true);
    wire_ctl_reply rep[CTL_MANY_MAX];
    ctl_exchange x[CTL_MANY_MAX];
    char err[CTL_MANY_MAX][160];
    for (int round = 0; round < 2; round++) {
        call_many_peers(c, s.port, 3, rep, x, err);
        for (int i = 0; i < 3; i++) {
            assert_int_equal(x[i].rc, 0);
            assert_int_equal(rep[i].u.peers.ports[0], 5555);
            wire_ctl_reply_clear(&rep[i]);
        }
    }
    assert_err(ctl_call_many(c, "127.0.0.1", s.port, x, 0), ECT_EINVAL, "ctl_call_many");
    assert_err(ctl_call_many(c, "127.0.0.1", s.port, x, CTL_MANY_MAX + 1), ECT_EINVAL,
               "ctl_call_many");
    ctl_client_close(c);
    zserver_stop(&s);
    zmq_ctx_term(z);
}

/* Host names and IPv6 literals, as the libzmq path takes them. */
static void test_hosts(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    zserver s;
    zserver_start(&s, 0, 1);
    ctl_client *c = client(z, LONG_MS, true);
    assert_int_equal(call_peers(c, "localhost", s.port), 0); /* ::1 first is refused, then v4 */
    ctl_client_close(c);
    zserver_stop(&s);
    /* ::1, bare and bracketed, when this machine has IPv6 loopback */
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    socklen_t len = sizeof a;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 4) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0) {
        int port = ntohs(a.sin6_port);
        server v6 = {.lfd = fd, .port = port, .n = 2, .script = {S_SERVE_ONE, S_SERVE_ONE}};
        assert_int_equal(pthread_create(&v6.th, NULL, s_run, &v6), 0);
        c = client(z, LONG_MS, true);
        assert_int_equal(call_peers(c, "::1", port), 0);
        wait_closed(&v6, 1);
        assert_int_equal(call_peers(c, "[::1]", port), 0);
        ctl_client_close(c);
        pthread_join(v6.th, NULL);
    }
    if (fd >= 0) close(fd);
    zmq_ctx_term(z);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idle_connection_reused),
        cmocka_unit_test(test_replaced_after_server_closed),
        cmocka_unit_test(test_handshake_lost_retried),
        cmocka_unit_test(test_peer_closes_mid_reply),
        cmocka_unit_test(test_silent_server_times_out),
        cmocka_unit_test(test_bad_replies),
        cmocka_unit_test(test_context_shutdown_ends_wait),
        cmocka_unit_test(test_server_comes_up_within_timeout),
        cmocka_unit_test(test_libzmq_server_restarted),
        cmocka_unit_test(test_hosts),
        cmocka_unit_test(test_many_pipelined),
        cmocka_unit_test(test_many_libzmq_rep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
