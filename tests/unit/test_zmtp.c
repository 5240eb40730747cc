/*
 * Tests for the sans-I/O ZMTP codec (src/wire/zmtp.c) against real libzmq
 * sockets over loopback TCP: our REQ on a raw socket to a libzmq REP, a
 * libzmq REQ and DEALER to a raw accepted socket driven by our REP, and the
 * bytes of both ends compared with what libzmq itself sends. Then the
 * refusals, fed by hand: old greetings and other mechanisms at the byte that
 * shows them, bad flags, frames over the bound before any body byte, replies
 * without delimiter, long envelopes; PING answered with PONG; any split of
 * the input giving the same messages.
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.h>

#include "testutil.h"
#include "util/util.h"
#include "wire/zmtp.h"

#define MAXMSG 4096
#define WAIT_MS 60000 /* a wait that only a broken peer reaches */

/* ---- byte buffers and sockets */

typedef struct bytes {
    uint8_t *p;
    size_t len;
} bytes;

static void bytes_add(bytes *b, const void *d, size_t n) {
    b->p = realloc(b->p, b->len + n + 1);
    assert_non_null(b->p);
    if (n) memcpy(b->p + b->len, d, n);
    b->len += n;
}

static int tcp_listen(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 4), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static int tcp_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons((uint16_t)port)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static int zmq_bound_port(void *s) {
    char ep[64];
    size_t len = sizeof ep;
    assert_int_equal(zmq_bind(s, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &len), 0);
    return atoi(strrchr(ep, ':') + 1);
}

static void *zsock(void *z, int type) {
    void *s = zmq_socket(z, type);
    int zero = 0, wait = WAIT_MS;
    assert_non_null(s);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &wait, sizeof wait);
    return s;
}

/* A libzmq socket of some type that connects to a listener of ours: made
 * by zpeer_open (set its options on p->s then), connected and accepted by
 * zpeer_accept (p->fd), all closed by zpeer_close. */
typedef struct zpeer {
    void *z, *s;
    int lfd, port, fd;
} zpeer;

static void zpeer_open(zpeer *p, int type) {
    p->z = zmq_ctx_new();
    p->lfd = tcp_listen(&p->port);
    p->s = zsock(p->z, type);
    p->fd = -1;
}

static int zpeer_accept(zpeer *p) {
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", p->port);
    assert_int_equal(zmq_connect(p->s, ep), 0);
    p->fd = accept(p->lfd, NULL, NULL);
    assert_true(p->fd >= 0);
    return p->fd;
}

static void zpeer_close(zpeer *p) {
    close(p->fd);
    close(p->lfd);
    zmq_close(p->s);
    zmq_ctx_term(p->z);
}

/* Writes everything c has queued to fd. */
static void flush_out(zmtp_conn *c, int fd) {
    size_t n;
    const uint8_t *p;
    while ((p = zmtp_conn_out(c, &n)) != NULL) {
        ssize_t w = write(fd, p, n);
        assert_true(w > 0);
        zmtp_conn_sent(c, (size_t)w);
    }
}

/* Waits for bytes on fd and feeds them to c (every byte kept in *seen when
 * not NULL). */
static void feed_next(zmtp_conn *c, int fd, bytes *seen) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, WAIT_MS), 1);
    uint8_t buf[4096];
    ssize_t r = read(fd, buf, sizeof buf);
    assert_true(r > 0);
    if (seen) bytes_add(seen, buf, (size_t)r);
    assert_int_equal(zmtp_conn_feed(c, buf, (size_t)r), 0);
}

/* Drives c on fd (sending what it queues, feeding what arrives) until a
 * whole message is there. */
static void pump_until_msg(zmtp_conn *c, int fd, zmtp_msg *m, bytes *seen) {
    for (;;) {
        flush_out(c, fd);
        int rc = zmtp_conn_next(c, m);
        assert_true(rc >= 0);
        if (rc == 1) return;
        feed_next(c, fd, seen);
    }
}

/* Drives c on fd until the peer's READY is in. */
static void pump_until_ready(zmtp_conn *c, int fd, bytes *seen) {
    while (!zmtp_conn_ready(c)) {
        flush_out(c, fd);
        feed_next(c, fd, seen);
    }
}

/* Reads from fd, feeding c (sending nothing), until c fails; returns the
 * error. */
static int pump_until_error(zmtp_conn *c, int fd) {
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        assert_int_equal(poll(&p, 1, WAIT_MS), 1);
        uint8_t buf[4096];
        ssize_t r = read(fd, buf, sizeof buf);
        assert_true(r > 0);
        int rc = zmtp_conn_feed(c, buf, (size_t)r);
        if (rc) return rc;
    }
}

/* What a fresh conn of `role` queues first: its greeting and READY. */
static bytes handshake_of(zmtp_role role) {
    zmtp_conn *c = NULL;
    assert_int_equal(zmtp_conn_new(role, MAXMSG, &c), 0);
    size_t n;
    const uint8_t *p = zmtp_conn_out(c, &n);
    bytes b = {0};
    bytes_add(&b, p, n);
    zmtp_conn_free(c);
    return b;
}

/* A conn of `role` that has been fed the handshake of the other role. */
static zmtp_conn *ready_conn(zmtp_role role, uint64_t max_msg) {
    zmtp_conn *c = NULL;
    assert_int_equal(zmtp_conn_new(role, max_msg, &c), 0);
    bytes h = handshake_of(role == ZMTP_REQ ? ZMTP_REP : ZMTP_REQ);
    assert_int_equal(zmtp_conn_feed(c, h.p, h.len), 0);
    assert_true(zmtp_conn_ready(c));
    free(h.p);
    size_t n;
    zmtp_conn_out(c, &n);
    zmtp_conn_sent(c, n);
    return c;
}

/* ---- against libzmq */

/* Our REQ to a libzmq REP: a request answered, and our handshake is
 * byte for byte the one a libzmq REQ sends (libzmq REP's, the same). */
static void test_req_to_libzmq_rep(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    void *rep = zsock(z, ZMQ_REP);
    int fd = tcp_connect(zmq_bound_port(rep));
    zmtp_conn *c = NULL;
    assert_int_equal(zmtp_conn_new(ZMTP_REQ, MAXMSG, &c), 0);
    assert_false(zmtp_conn_ready(c));
    assert_string_equal(zmtp_conn_peer_type(c), "");
    assert_int_equal(zmtp_conn_send_req(c, "hello", 5), 0);
    bytes seen = {0};
    size_t n;
    zmtp_conn_out(c, &n);
    bytes hs = handshake_of(ZMTP_REQ); /* the request waits for the handshake */
    assert_int_equal(n, hs.len);
    free(hs.p);
    pump_until_ready(c, fd, &seen);
    zmtp_conn_out(c, &n);
    assert_int_equal(n, 2 + 2 + 5);
    flush_out(c, fd);
    char buf[64];
    assert_int_equal(zmq_recv(rep, buf, sizeof buf, 0), 5);
    assert_memory_equal(buf, "hello", 5);
    char big[1000];
    memset(big, 'x', sizeof big); /* a long frame on the way back */
    assert_int_equal(zmq_send(rep, big, sizeof big, 0), (int)sizeof big);
    zmtp_msg m;
    pump_until_msg(c, fd, &m, &seen);
    assert_int_equal(m.body_len, sizeof big);
    assert_memory_equal(m.body, big, sizeof big);
    assert_false(m.multi);
    assert_true(zmtp_conn_ready(c));
    assert_string_equal(zmtp_conn_peer_type(c), "REP");
    /* libzmq REP's greeting and READY are what our REP queues */
    bytes ours = handshake_of(ZMTP_REP);
    assert_true(seen.len > ours.len);
    assert_memory_equal(seen.p, ours.p, ours.len);
    /* and its reply: delimiter, then the long frame (flags 2, 8-byte size) */
    static const uint8_t reply_head[] = {1, 0, 2, 0, 0, 0, 0, 0, 0, 0x03, 0xe8};
    assert_int_equal(seen.len, ours.len + sizeof reply_head + sizeof big);
    assert_memory_equal(seen.p + ours.len, reply_head, sizeof reply_head);
    assert_int_equal(zmtp_conn_next(c, &m), 0);
    free(ours.p);
    free(seen.p);
    zmtp_conn_free(c);
    close(fd);
    zmq_close(rep);
    zmq_ctx_term(z);
}

/* A libzmq REQ or DEALER to our REP on an accepted socket. */
static void serve_one(int type) {
    zpeer zp;
    zpeer_open(&zp, type);
    void *s = zp.s;
    int fd = zpeer_accept(&zp);
    zmtp_conn *c = NULL;
    assert_int_equal(zmtp_conn_new(ZMTP_REP, MAXMSG, &c), 0);
    if (type == ZMQ_REQ) {
        assert_int_equal(zmq_send(s, "hello", 5, 0), 5);
    } else {
        assert_int_equal(zmq_send(s, "id1", 3, ZMQ_SNDMORE), 3);
        assert_int_equal(zmq_send(s, "", 0, ZMQ_SNDMORE), 0);
        assert_int_equal(zmq_send(s, "hello", 5, 0), 5);
    }
    zmtp_msg m;
    bytes seen = {0};
    pump_until_msg(c, fd, &m, &seen);
    assert_int_equal(m.body_len, 5);
    assert_memory_equal(m.body, "hello", 5);
    assert_false(m.multi);
    if (type == ZMQ_REQ) {
        static const uint8_t env[] = {1, 0};
        assert_string_equal(zmtp_conn_peer_type(c), "REQ");
        assert_int_equal(m.envelope_len, sizeof env);
        assert_memory_equal(m.envelope, env, sizeof env);
        /* a libzmq REQ's greeting, READY and request are what our REQ sends */
        zmtp_conn *r = NULL;
        assert_int_equal(zmtp_conn_new(ZMTP_REQ, MAXMSG, &r), 0);
        assert_int_equal(zmtp_conn_send_req(r, "hello", 5), 0);
        bytes rep = handshake_of(ZMTP_REP);
        assert_int_equal(zmtp_conn_feed(r, rep.p, rep.len), 0); /* releases the request */
        free(rep.p);
        size_t n;
        const uint8_t *p = zmtp_conn_out(r, &n);
        assert_int_equal(seen.len, n);
        assert_memory_equal(seen.p, p, n);
        zmtp_conn_free(r);
    } else {
        static const uint8_t env[] = {1, 3, 'i', 'd', '1', 1, 0};
        assert_string_equal(zmtp_conn_peer_type(c), "DEALER");
        assert_int_equal(m.envelope_len, sizeof env);
        assert_memory_equal(m.envelope, env, sizeof env);
    }
    assert_int_equal(zmtp_conn_send_rep(c, m.envelope, m.envelope_len, "world", 5), 0);
    flush_out(c, fd);
    char buf[64];
    if (type == ZMQ_DEALER) {
        assert_int_equal(zmq_recv(s, buf, sizeof buf, 0), 3);
        assert_memory_equal(buf, "id1", 3);
        assert_int_equal(zmq_recv(s, buf, sizeof buf, 0), 0);
    }
    assert_int_equal(zmq_recv(s, buf, sizeof buf, 0), 5);
    assert_memory_equal(buf, "world", 5);
    free(seen.p);
    zmtp_conn_free(c);
    zpeer_close(&zp);
}

static void test_libzmq_req_to_rep(void **st) {
    (void)st;
    serve_one(ZMQ_REQ);
}

static void test_libzmq_dealer_to_rep(void **st) {
    (void)st;
    serve_one(ZMQ_DEALER);
}

/* The pull channel's roles (issue 13, fifth pass). */

/* Our DEALER to a libzmq ROUTER: both ways, and libzmq ROUTER's handshake is
 * byte for byte what our ROUTER queues. */
static void test_dealer_to_libzmq_router(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    void *router = zsock(z, ZMQ_ROUTER);
    int fd = tcp_connect(zmq_bound_port(router));
    zmtp_conn *c = NULL;
    assert_int_equal(zmtp_conn_new(ZMTP_DEALER, MAXMSG, &c), 0);
    assert_int_equal(zmtp_conn_send(c, "hello", 5), 0);
    assert_int_equal(zmtp_conn_ping(c), 0); /* before READY: nothing */
    bytes seen = {0};
    pump_until_ready(c, fd, &seen);
    flush_out(c, fd);
    char id[256], buf[64];
    int idl = zmq_recv(router, id, sizeof id, 0);
    assert_true(idl > 0);
    assert_int_equal(zmq_recv(router, buf, sizeof buf, 0), 5);
    assert_memory_equal(buf, "hello", 5);
    char big[1000];
    memset(big, 'y', sizeof big);
    assert_int_equal(zmq_send(router, id, (size_t)idl, ZMQ_SNDMORE), idl);
    assert_int_equal(zmq_send(router, big, sizeof big, 0), (int)sizeof big);
    zmtp_msg m;
    pump_until_msg(c, fd, &m, &seen);
    assert_int_equal(m.body_len, sizeof big);
    assert_memory_equal(m.body, big, sizeof big);
    assert_false(m.multi);
    assert_int_equal(m.envelope_len, 0);
    assert_string_equal(zmtp_conn_peer_type(c), "ROUTER");
    bytes ours = handshake_of(ZMTP_ROUTER);
    assert_int_equal(seen.len, ours.len + 9 + sizeof big); /* no identity frame on the wire */
    assert_memory_equal(seen.p, ours.p, ours.len);
    free(ours.p);
    free(seen.p);
    zmtp_conn_free(c);
    close(fd);
    zmq_close(router);
    zmq_ctx_term(z);
}

/* Reads from fd into *seen (feeding c) until `want` shows up in it. */
static void pump_until_bytes(zmtp_conn *c, int fd, bytes *seen, const uint8_t *want, size_t n) {
    while (seen->len < n || !memmem(seen->p, seen->len, want, n)) {
        flush_out(c, fd);
        feed_next(c, fd, seen);
    }
}

/* A libzmq DEALER (heartbeats on) or REQ to our ROUTER on an accepted
 * socket: what the DEALER sends is what our DEALER sends, its PING is our
 * zmtp_conn_ping's; the REQ's delimiter is our ROUTER's envelope. */
static void route_one(int type) {
    zpeer zp;
    zpeer_open(&zp, type);
    void *s = zp.s;
    /* ms: its first PING comes soon. Its timeout (by default the interval:
     * no traffic from us within 1 ms of a PING and libzmq drops the
     * connection and dials again, to a listener nobody accepts on) set to a
     * wait only a broken peer reaches: a busy machine that keeps this thread
     * off its CPU for a millisecond must not lose the reply. */
    int ivl = 1, hb_timeout = WAIT_MS;
    if (type == ZMQ_DEALER) {
        zmq_setsockopt(s, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl);
        zmq_setsockopt(s, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof hb_timeout);
    }
    int fd = zpeer_accept(&zp);
    zmtp_conn *c = NULL;
    assert_int_equal(zmtp_conn_new(ZMTP_ROUTER, MAXMSG, &c), 0);
    assert_int_equal(zmq_send(s, "hello", 5, 0), 5);
    zmtp_msg m;
    bytes seen = {0};
    pump_until_msg(c, fd, &m, &seen);
    assert_int_equal(m.body_len, 5);
    assert_memory_equal(m.body, "hello", 5);
    assert_false(m.multi);
    zmtp_conn *d = NULL; /* what ours sends in the libzmq peer's place */
    assert_int_equal(zmtp_conn_new(type == ZMQ_REQ ? ZMTP_REQ : ZMTP_DEALER, MAXMSG, &d), 0);
    assert_int_equal(
        type == ZMQ_REQ ? zmtp_conn_send_req(d, "hello", 5) : zmtp_conn_send(d, "hello", 5), 0);
    bytes rh = handshake_of(ZMTP_ROUTER);
    assert_int_equal(zmtp_conn_feed(d, rh.p, rh.len), 0);
    free(rh.p);
    size_t n;
    const uint8_t *p = zmtp_conn_out(d, &n);
    assert_true(seen.len >= n);
    assert_memory_equal(seen.p, p, n);
    if (type == ZMQ_REQ) {
        static const uint8_t env[] = {1, 0};
        assert_string_equal(zmtp_conn_peer_type(c), "REQ");
        assert_int_equal(m.envelope_len, sizeof env);
        assert_memory_equal(m.envelope, env, sizeof env);
        assert_int_equal(zmtp_conn_send_rep(c, m.envelope, m.envelope_len, "world", 5), 0);
    } else {
        assert_string_equal(zmtp_conn_peer_type(c), "DEALER");
        assert_int_equal(m.envelope_len, 0);
        zmtp_conn_sent(d, n);
        assert_int_equal(zmtp_conn_ping(d), 0);
        p = zmtp_conn_out(d, &n);
        static const uint8_t ping[] = {4, 7, 4, 'P', 'I', 'N', 'G', 0, 0};
        assert_int_equal(n, sizeof ping);
        assert_memory_equal(p, ping, sizeof ping);
        pump_until_bytes(c, fd, &seen, ping, sizeof ping); /* libzmq's, the same bytes */
        assert_int_equal(zmtp_conn_send(c, "world", 5), 0);
    }
    flush_out(c, fd);
    char buf[64];
    assert_int_equal(zmq_recv(s, buf, sizeof buf, 0), 5);
    assert_memory_equal(buf, "world", 5);
    zmtp_conn_free(d);
    free(seen.p);
    zmtp_conn_free(c);
    zpeer_close(&zp);
}

static void test_libzmq_dealer_to_router(void **st) {
    (void)st;
    route_one(ZMQ_DEALER);
}

static void test_libzmq_req_to_router(void **st) {
    (void)st;
    route_one(ZMQ_REQ);
}

/* A ROUTER's messages: [body], [empty][body] (a REQ's), anything else multi;
 * a DEALER's: frames as they are. */
static void test_router_dealer_messages(void **st) {
    (void)st;
    zmtp_conn *r = NULL;
    assert_int_equal(zmtp_conn_new(ZMTP_ROUTER, MAXMSG, &r), 0);
    bytes h = handshake_of(ZMTP_DEALER);
    static const uint8_t in[] = {0, 1, 'a', 1, 0, 0, 1, 'b', 1, 1, 'c', 0, 1, 'd', 1, 0, 0, 0};
    bytes_add(&h, in, sizeof in);
    assert_int_equal(zmtp_conn_feed(r, h.p, h.len), 0);
    free(h.p);
    zmtp_msg m;
    assert_int_equal(zmtp_conn_next(r, &m), 1);
    assert_true(m.body_len == 1 && m.body[0] == 'a' && !m.multi && !m.envelope_len);
    assert_int_equal(zmtp_conn_next(r, &m), 1);
    assert_true(m.body_len == 1 && m.body[0] == 'b' && !m.multi && m.envelope_len == 2);
    assert_int_equal(zmtp_conn_next(r, &m), 1);
    assert_true(m.body_len == 1 && m.body[0] == 'c' && m.multi);
    assert_int_equal(zmtp_conn_next(r, &m), 1); /* [empty][empty]: the delimiter, an empty body */
    assert_true(m.body_len == 0 && m.envelope_len == 2 && !m.multi);
    assert_int_equal(zmtp_conn_next(r, &m), 0);
    assert_err(zmtp_conn_send_req(r, "x", 1), ECT_EINVAL, "not a REQ");
    zmtp_conn_free(r);
    zmtp_conn *d = NULL;
    assert_int_equal(zmtp_conn_new(ZMTP_DEALER, MAXMSG, &d), 0);
    h = handshake_of(ZMTP_ROUTER);
    bytes_add(&h, in, sizeof in);
    assert_int_equal(zmtp_conn_feed(d, h.p, h.len), 0);
    free(h.p);
    assert_int_equal(zmtp_conn_next(d, &m), 1);
    assert_true(m.body_len == 1 && m.body[0] == 'a' && !m.multi);
    assert_int_equal(zmtp_conn_next(d, &m), 1); /* a DEALER has no delimiter: multi */
    assert_true(m.body_len == 0 && m.multi && !m.envelope_len);
    assert_err(zmtp_conn_send_rep(d, NULL, 0, "x", 1), ECT_EINVAL, "not a REP");
    zmtp_conn_free(d);
    assert_int_equal(zmtp_conn_new(ZMTP_REQ, MAXMSG, &d), 0);
    assert_err(zmtp_conn_send(d, "x", 1), ECT_EINVAL, "not a DEALER");
    zmtp_conn_free(d);
}

/* A real CurveZMQ client is refused at the mechanism, not after 64 bytes. */
static void test_libzmq_curve_refused(void **st) {
    (void)st;
    zpeer zp;
    zpeer_open(&zp, ZMQ_REQ);
    void *s = zp.s;
    char spub[41], ssec[41], cpub[41], csec[41];
    assert_int_equal(zmq_curve_keypair(spub, ssec), 0);
    assert_int_equal(zmq_curve_keypair(cpub, csec), 0);
    zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, spub, 40);
    zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, cpub, 40);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, csec, 40);
    int fd = zpeer_accept(&zp);
    zmtp_conn *c = NULL;
    assert_int_equal(zmtp_conn_new(ZMTP_REP, MAXMSG, &c), 0);
    /* our signature and major version only: a libzmq peer sends the rest of
     * its greeting then (given all 64 bytes at once, a CurveZMQ libzmq
     * closes without showing its mechanism) */
    size_t n;
    const uint8_t *p = zmtp_conn_out(c, &n);
    assert_int_equal(write(fd, p, 11), 11);
    zmtp_conn_sent(c, 11);
    assert_err(pump_until_error(c, fd), ECT_EPROTO, "\"C...\" is not NULL");
    zmtp_conn_free(c);
    zpeer_close(&zp);
}

/* ---- refusals, fed by hand */

static const uint8_t sig[10] = {0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F};

static void test_old_greetings_refused_at_once(void **st) {
    (void)st;
    zmtp_conn *c = NULL;
    /* ZMTP 2.0: signature, then revision 1 (and socket type): the 11th byte */
    assert_int_equal(zmtp_conn_new(ZMTP_REQ, MAXMSG, &c), 0);
    assert_int_equal(zmtp_conn_feed(c, sig, sizeof sig), 0);
    assert_err(zmtp_conn_feed(c, (const uint8_t *)"\x01\x04", 2), ECT_EPROTO, "major version 1");
    assert_err(zmtp_conn_feed(c, sig, 1), ECT_EPROTO, "major version 1"); /* final */
    assert_err(zmtp_conn_next(c, &(zmtp_msg){0}), ECT_EPROTO, "major version 1");
    assert_err(zmtp_conn_send_req(c, "x", 1), ECT_EPROTO, "major version 1");
    assert_false(zmtp_conn_ready(c));
    zmtp_conn_free(c);
    /* ZMTP 1.0: a length byte, not 0xFF: the first byte */
    assert_int_equal(zmtp_conn_new(ZMTP_REP, MAXMSG, &c), 0);
    assert_err(zmtp_conn_feed(c, (const uint8_t *)"\x01\x00", 2), ECT_EPROTO, "ZMTP 1.0");
    zmtp_conn_free(c);
    /* ZMTP 1.0 with a long identity: 0xFF, 8 bytes of length, flags without bit 0 */
    assert_int_equal(zmtp_conn_new(ZMTP_REP, MAXMSG, &c), 0);
    static const uint8_t v1[10] = {0xFF, 0, 0, 0, 0, 0, 0, 1, 0, 0};
    assert_err(zmtp_conn_feed(c, v1, sizeof v1), ECT_EPROTO, "ZMTP 1.0");
    zmtp_conn_free(c);
}

static void test_mechanism_refused(void **st) {
    (void)st;
    static const char *mechs[] = {"CURVE", "PLAIN", "NULLX", "NUL"};
    for (size_t i = 0; i < ECT_ARRAY_LEN(mechs); i++) {
        zmtp_conn *c = NULL;
        assert_int_equal(zmtp_conn_new(ZMTP_REQ, MAXMSG, &c), 0);
        uint8_t g[ZMTP_GREETING_LEN] = {0};
        memcpy(g, sig, sizeof sig);
        g[10] = 3;
        memcpy(g + 12, mechs[i], strlen(mechs[i]));
        /* NUL: "NUL" then a 0 where 'L' belongs; NULLX: the X; others: byte 12 */
        size_t at = i == 2 ? 16 : i == 3 ? 15 : 12;
        assert_int_equal(zmtp_conn_feed(c, g, at), 0);
        assert_err(zmtp_conn_feed(c, g + at, 1), ECT_EPROTO, "is not NULL");
        zmtp_conn_free(c);
    }
}

static void test_bad_flags(void **st) {
    (void)st;
    static const uint8_t bad[] = {0x08, 0x80, 0x05, 0x07};
    for (size_t i = 0; i < sizeof bad; i++) {
        zmtp_conn *c = ready_conn(i % 2 ? ZMTP_REP : ZMTP_REQ, MAXMSG);
        assert_err(zmtp_conn_feed(c, bad + i, 1), ECT_EPROTO, "flag");
        zmtp_conn_free(c);
    }
}

/* A frame header announcing more than max_msg is refused at its size byte,
 * before any body byte; exactly max_msg is taken. */
static void test_frame_over_max_refused_at_header(void **st) {
    (void)st;
    zmtp_conn *c = ready_conn(ZMTP_REQ, MAXMSG);
    static const uint8_t over[] = {1, 0, 2, 0, 0, 0, 0, 0, 0, 0x10, 0x01}; /* 4097 */
    assert_err(zmtp_conn_feed(c, over, sizeof over), ECT_ERANGE, "more than 4096");
    zmtp_conn_free(c);
    c = ready_conn(ZMTP_REQ, MAXMSG);
    static const uint8_t huge[] = {1, 0, 2, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    assert_err(zmtp_conn_feed(c, huge, sizeof huge), ECT_ERANGE, NULL);
    zmtp_conn_free(c);
    /* the frames of one message count together: an envelope of 4000 + body of 97 */
    c = ready_conn(ZMTP_REP, MAXMSG);
    uint8_t env[] = {3, 0, 0, 0, 0, 0, 0, 0x0F, 0xA0};
    assert_int_equal(zmtp_conn_feed(c, env, sizeof env), 0);
    uint8_t *fill = calloc(1, 4000);
    assert_int_equal(zmtp_conn_feed(c, fill, 4000), 0);
    static const uint8_t rest[] = {1, 0, 0, 97};
    assert_err(zmtp_conn_feed(c, rest, sizeof rest), ECT_ERANGE, NULL);
    zmtp_conn_free(c);
    /* exactly the bound */
    c = ready_conn(ZMTP_REQ, MAXMSG);
    static const uint8_t exact[] = {1, 0, 2, 0, 0, 0, 0, 0, 0, 0x10, 0x00};
    assert_int_equal(zmtp_conn_feed(c, exact, sizeof exact), 0);
    uint8_t *body = malloc(MAXMSG);
    memset(body, 7, MAXMSG);
    assert_int_equal(zmtp_conn_feed(c, body, MAXMSG), 0);
    zmtp_msg m;
    assert_int_equal(zmtp_conn_next(c, &m), 1);
    assert_int_equal(m.body_len, MAXMSG);
    assert_memory_equal(m.body, body, MAXMSG);
    free(body);
    free(fill);
    zmtp_conn_free(c);
}

static void test_ping_answered_with_pong(void **st) {
    (void)st;
    zmtp_conn *c = ready_conn(ZMTP_REP, MAXMSG);
    static const uint8_t ping[] = {4, 10, 4, 'P', 'I', 'N', 'G', 0, 100, 'c', 't', 'x'};
    static const uint8_t pong[] = {4, 8, 4, 'P', 'O', 'N', 'G', 'c', 't', 'x'};
    assert_int_equal(zmtp_conn_feed(c, ping, sizeof ping), 0);
    size_t n;
    const uint8_t *p = zmtp_conn_out(c, &n);
    assert_int_equal(n, sizeof pong);
    assert_memory_equal(p, pong, sizeof pong);
    zmtp_conn_sent(c, n);
    assert_null(zmtp_conn_out(c, &n));
    /* a PONG, an unknown command: ignored; a PING with 17 bytes of context: no */
    static const uint8_t quiet[] = {4, 5, 4, 'P', 'O', 'N', 'G', 4, 4, 3, 'F', 'O', 'O'};
    assert_int_equal(zmtp_conn_feed(c, quiet, sizeof quiet), 0);
    assert_null(zmtp_conn_out(c, &n));
    uint8_t longping[7 + 2 + 17] = {4, 7 + 17, 4, 'P', 'I', 'N', 'G'};
    assert_err(zmtp_conn_feed(c, longping, sizeof longping), ECT_EPROTO, "PING");
    zmtp_conn_free(c);
    /* before READY a PING is out of place */
    assert_int_equal(zmtp_conn_new(ZMTP_REP, MAXMSG, &c), 0);
    bytes h = handshake_of(ZMTP_REQ);
    assert_int_equal(zmtp_conn_feed(c, h.p, ZMTP_GREETING_LEN), 0);
    assert_err(zmtp_conn_feed(c, ping, sizeof ping), ECT_EPROTO, "before READY");
    free(h.p);
    zmtp_conn_free(c);
}

static void test_reply_without_delimiter_refused(void **st) {
    (void)st;
    zmtp_conn *c = ready_conn(ZMTP_REQ, MAXMSG);
    static const uint8_t plain[] = {0, 5, 'h', 'e', 'l', 'l', 'o'};
    assert_err(zmtp_conn_feed(c, plain, sizeof plain), ECT_EPROTO, "delimiter");
    assert_err(zmtp_conn_next(c, &(zmtp_msg){0}), ECT_EPROTO, "delimiter");
    zmtp_conn_free(c);
    c = ready_conn(ZMTP_REQ, MAXMSG);
    static const uint8_t lone[] = {0, 0}; /* an empty frame without MORE */
    assert_err(zmtp_conn_feed(c, lone, sizeof lone), ECT_EPROTO, "delimiter");
    zmtp_conn_free(c);
}

/* A REP drops a message without delimiter, as libzmq's does, and serves the
 * next; an envelope of more than ZMTP_MAX_ENVELOPE frames is refused; a
 * message with two body frames is flagged. */
static void test_rep_envelopes(void **st) {
    (void)st;
    zmtp_conn *c = ready_conn(ZMTP_REP, MAXMSG);
    static const uint8_t in[] = {1, 1, 'a', 0, 1,   'b',          /* no delimiter: dropped */
                                 1, 0, 1,   1, 'x', 0,   1, 'y'}; /* two body frames */
    assert_int_equal(zmtp_conn_feed(c, in, sizeof in), 0);
    zmtp_msg m;
    assert_int_equal(zmtp_conn_next(c, &m), 1);
    assert_int_equal(m.envelope_len, 2);
    assert_int_equal(m.body_len, 1);
    assert_int_equal(m.body[0], 'x');
    assert_true(m.multi);
    assert_int_equal(zmtp_conn_next(c, &m), 0);
    for (int i = 0; i < ZMTP_MAX_ENVELOPE; i++)
        assert_int_equal(zmtp_conn_feed(c, (const uint8_t *)"\x01\x01r", 3), 0);
    assert_err(zmtp_conn_feed(c, (const uint8_t *)"\x01\x01r", 3), ECT_EPROTO, "envelope");
    zmtp_conn_free(c);
}

static void test_handshake_refusals(void **st) {
    (void)st;
    static const struct {
        zmtp_role role;
        const char *ready; /* the command frame after a good greeting */
        size_t len;
        const char *why;
    } cases[] = {
        {ZMTP_REQ, "\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB", 27, "PUB socket"},
        {ZMTP_REP, "\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x03REP", 27, "REP socket"},
        {ZMTP_REQ, "\x04\x06\x05READY", 8, "without Socket-Type"},
        {ZMTP_REQ, "\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x09REP", 27, "malformed"},
        {ZMTP_REQ,
         "\x04\x0a\x05"
         "ERROR\x03"
         "bad",
         12, "ERROR \"bad\""},
        {ZMTP_REQ, "\x00\x01x", 3, "before the peer's READY"},
        {ZMTP_REQ, "\x04\x00", 2, "command of 0 bytes"},
        {ZMTP_REQ, "\x06\x00\x00\x00\x00\x00\x00\x30\x00", 9, "command of"},
        {ZMTP_REQ, "\x04\x02\x09R", 4, "command name"},
        {ZMTP_DEALER, "\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x03REQ", 27, "REQ socket"},
        {ZMTP_DEALER, "\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB", 27, "our DEALER"},
        {ZMTP_ROUTER, "\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x03REP", 27, "our ROUTER"},
        {ZMTP_ROUTER, "\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x03SUB", 27, "SUB socket"},
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(cases); i++) {
        zmtp_conn *c = NULL;
        assert_int_equal(zmtp_conn_new(cases[i].role, MAXMSG, &c), 0);
        bytes h = handshake_of(ZMTP_REP);
        assert_int_equal(zmtp_conn_feed(c, h.p, ZMTP_GREETING_LEN), 0);
        assert_err(zmtp_conn_feed(c, (const uint8_t *)cases[i].ready, cases[i].len), ECT_EPROTO,
                   cases[i].why);
        assert_false(zmtp_conn_ready(c));
        free(h.p);
        zmtp_conn_free(c);
    }
    /* READY twice */
    zmtp_conn *c = ready_conn(ZMTP_REQ, MAXMSG);
    bytes h = handshake_of(ZMTP_REP);
    assert_err(zmtp_conn_feed(c, h.p + ZMTP_GREETING_LEN, h.len - ZMTP_GREETING_LEN), ECT_EPROTO,
               "twice");
    free(h.p);
    zmtp_conn_free(c);
}

/* ---- any split of the input gives the same messages and the same output */

typedef struct outcome {
    bytes msgs; /* each message: env_len, body_len, multi, envelope, body */
    bytes out;  /* what the conn queued after the handshake */
    int rc;
} outcome;

static void record(zmtp_conn *c, outcome *o) {
    zmtp_msg m;
    int rc;
    while ((rc = zmtp_conn_next(c, &m)) == 1) {
        uint64_t h[3] = {m.envelope_len, m.body_len, m.multi};
        bytes_add(&o->msgs, h, sizeof h);
        bytes_add(&o->msgs, m.envelope, m.envelope_len);
        bytes_add(&o->msgs, m.body, m.body_len);
    }
    if (rc < 0 && !o->rc) o->rc = rc;
    size_t n;
    const uint8_t *p;
    while ((p = zmtp_conn_out(c, &n)) != NULL) {
        bytes_add(&o->out, p, n);
        zmtp_conn_sent(c, n);
    }
}

/* Feeds in[] in pieces of the lengths that rnd draws (0: all at once). */
static outcome feed_split(zmtp_role role, const bytes *in, uint64_t seed, size_t max_piece) {
    outcome o = {0};
    zmtp_conn *c = NULL;
    assert_int_equal(zmtp_conn_new(role, MAXMSG, &c), 0);
    size_t n;
    zmtp_conn_out(c, &n);
    zmtp_conn_sent(c, n);
    for (size_t at = 0; at < in->len && !o.rc;) {
        size_t k = max_piece ? 1 + (size_t)(test_rand(&seed) % max_piece) : in->len;
        if (k > in->len - at) k = in->len - at;
        int rc = zmtp_conn_feed(c, in->p + at, k);
        if (rc) o.rc = rc;
        record(c, &o);
        at += k;
    }
    record(c, &o);
    zmtp_conn_free(c);
    return o;
}

static void check_splits(zmtp_role role, const bytes *in, int want_msgs) {
    outcome lump = feed_split(role, in, 1, 0);
    assert_int_equal(lump.rc, 0);
    size_t per = sizeof(uint64_t) * 3, seen = 0, nmsgs = 0;
    while (seen < lump.msgs.len) {
        uint64_t h[3];
        memcpy(h, lump.msgs.p + seen, sizeof h);
        seen += per + h[0] + h[1];
        nmsgs++;
    }
    assert_int_equal(nmsgs, want_msgs);
    size_t pieces[] = {1, 2, 3, 7, 64};
    for (size_t i = 0; i < ECT_ARRAY_LEN(pieces); i++) {
        outcome o = feed_split(role, in, 42 + i, pieces[i]);
        assert_int_equal(o.rc, 0);
        assert_int_equal(o.msgs.len, lump.msgs.len);
        assert_memory_equal(o.msgs.p, lump.msgs.p, lump.msgs.len);
        assert_int_equal(o.out.len, lump.out.len);
        if (o.out.len) assert_memory_equal(o.out.p, lump.out.p, o.out.len);
        free(o.msgs.p);
        free(o.out.p);
    }
    free(lump.msgs.p);
    free(lump.out.p);
}

static void test_any_split_same_messages(void **st) {
    (void)st;
    /* what a DEALER sends a REP: handshake, routed request, PING, two-frame
     * body, a long body */
    bytes in = handshake_of(ZMTP_REQ);
    static const uint8_t a[] = {1,   3,   'i', 'd', '1', 1, 0,   0,   5,   'h', 'e',
                                'l', 'l', 'o', 4,   9,   4, 'P', 'I', 'N', 'G', 0,
                                0,   'k', 'k', 1,   0,   1, 1,   'x', 0,   1,   'y'};
    bytes_add(&in, a, sizeof a);
    uint8_t lh[] = {1, 0, 2, 0, 0, 0, 0, 0, 0, 1, 44};
    bytes_add(&in, lh, sizeof lh);
    uint8_t body[300];
    test_fill_pattern(body, sizeof body, 9);
    bytes_add(&in, body, sizeof body);
    check_splits(ZMTP_REP, &in, 3);
    free(in.p);
    /* what a REP sends a REQ: handshake and two replies */
    in = handshake_of(ZMTP_REP);
    static const uint8_t b[] = {1, 0, 0, 2, 'o', 'k', 1, 0, 0, 0};
    bytes_add(&in, b, sizeof b);
    check_splits(ZMTP_REQ, &in, 2);
    free(in.p);
}

static void test_bad_arguments(void **st) {
    (void)st;
    zmtp_conn *c = (zmtp_conn *)1;
    assert_err(zmtp_conn_new(ZMTP_REQ, 0, &c), ECT_EINVAL, NULL);
    assert_null(c);
    assert_err(zmtp_conn_new((zmtp_role)7, 1, &c), ECT_EINVAL, NULL);
    assert_int_equal(zmtp_conn_new(ZMTP_REQ, 1, &c), 0);
    assert_err(zmtp_conn_send_rep(c, NULL, 0, "x", 1), ECT_EINVAL, "not a REP");
    assert_err(zmtp_conn_feed(c, NULL, 1), ECT_EINVAL, NULL);
    zmtp_conn_sent(c, 1u << 20); /* more than queued: clamped */
    size_t n = 1;
    assert_null(zmtp_conn_out(c, &n));
    assert_int_equal(n, 0);
    zmtp_conn_free(c);
    zmtp_conn_free(NULL);
    assert_int_equal(zmtp_conn_new(ZMTP_REP, 1, &c), 0);
    assert_err(zmtp_conn_send_req(c, "x", 1), ECT_EINVAL, "not a REQ");
    zmtp_conn_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_req_to_libzmq_rep),
        cmocka_unit_test(test_libzmq_req_to_rep),
        cmocka_unit_test(test_libzmq_dealer_to_rep),
        cmocka_unit_test(test_dealer_to_libzmq_router),
        cmocka_unit_test(test_libzmq_dealer_to_router),
        cmocka_unit_test(test_libzmq_req_to_router),
        cmocka_unit_test(test_router_dealer_messages),
        cmocka_unit_test(test_libzmq_curve_refused),
        cmocka_unit_test(test_old_greetings_refused_at_once),
        cmocka_unit_test(test_mechanism_refused),
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_frame_over_max_refused_at_header),
        cmocka_unit_test(test_ping_answered_with_pong),
        cmocka_unit_test(test_reply_without_delimiter_refused),
        cmocka_unit_test(test_rep_envelopes),
        cmocka_unit_test(test_handshake_refusals),
        cmocka_unit_test(test_any_split_same_messages),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
