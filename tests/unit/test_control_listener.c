/*
 * Tests for push/control_listener: the shard's control port as our own ZMTP
 * 3.0 REP listener (no CURVE keys), over real sockets on loopback. libzmq
 * REQ and DEALER peers are answered, 50 at once; raw TCP peers play the
 * hostile or broken ones: half a greeting then silence (others served; the
 * handshake deadline, shortened here, closes it), a ZMTP 2.0 greeting, a
 * message over the size bound, a close mid-message and right after a whole
 * request, connections beyond the bound, and a pipelining peer that reads
 * none of a reply larger than the socket buffers while a REQ is served.
 * "Closed" is seen as EOF (or a reset) on the raw peer's socket: readiness
 * by event; every blocking read has a generous deadline so a bug fails
 * rather than hangs.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <zmq.h>

#include "testutil.h"
#include "push/control_client.h"
#include "ctl_req.h"
#include "push/control_listener.h"
#include "push/control_server.h"
#include "util/util.h"

#define CAP (8u << 20)
#define DEADLINE_S 60 /* a bound on every blocking read: a bug fails, not hangs */

typedef struct fx {
    void *zctx;
    ect_pool *pool;
    ctl_server *srv;
    int port;
} fx;

static const char *fx_ip = "127.0.0.1"; /* the bind address fx_open_with uses */

static void fx_open_with(fx *f, int handshake_ms, int max_conns, const char *dst_key) {
    memset(f, 0, sizeof *f);
    f->zctx = zmq_ctx_new();
    ect_pool_opts po;
    ect_pool_opts_init(&po);
    po.capacity = CAP;
    assert_int_equal(ect_pool_open(&po, &f->pool), 0);
    ctl_server_opts o;
    ctl_server_opts_init(&o);
    o.rsv.mem = &rsv_pool_ops;
    o.rsv.mem_ctx = f->pool;
    o.dst_session = "127.0.0.1:9";
    o.transport = "tcp";
    o.dst_key = dst_key;
    o.pool_base = (uint64_t)(uintptr_t)ect_pool_base(f->pool);
    o.handshake_ms = handshake_ms;
    o.max_conns = max_conns;
    o.ip = fx_ip;
    assert_int_equal(ctl_server_open(f->zctx, &o, &f->srv), 0);
    f->port = ctl_server_port(f->srv);
    assert_true(f->port > 0);
}

static void fx_open(fx *f) { fx_open_with(f, 0, 0, "00112233aabbccdd"); }

static void fx_close(fx *f) {
    assert_int_equal(ctl_server_check(f->srv), 0);
    ctl_server_close(f->srv);
    ect_pool_close(f->pool);
    zmq_ctx_term(f->zctx);
}

/* ------------------------------------------------------- libzmq peers */

static void *zsock(fx *f, int type) {
    void *s = zmq_socket(f->zctx, type);
    int zero = 0, to = DEADLINE_S * 1000;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &to, sizeof to);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", f->port);
    assert_int_equal(zmq_connect(s, ep), 0);
    return s;
}

static const char peers_req[] = "{\"op\":\"peers\"}";

/* Receives one frame into buf (NUL-terminated); returns its size. */
static int zrecv_text(void *s, char *buf, size_t cap) {
    int n = zmq_recv(s, buf, cap - 1, 0);
    assert_true(n >= 0);
    buf[(size_t)n < cap ? (size_t)n : cap - 1] = 0;
    return n;
}

/* A REQ peer's peers call: the reply lists this shard's port. */
static void req_peers_ok(fx *f) {
    void *s = zsock(f, ZMQ_REQ);
    assert_int_equal(zmq_send(s, peers_req, strlen(peers_req), 0), (int)strlen(peers_req));
    char buf[256];
    zrecv_text(s, buf, sizeof buf);
    char want[64];
    snprintf(want, sizeof want, "%d", f->port);
    assert_non_null(strstr(buf, "\"ok\":true"));
    assert_non_null(strstr(buf, want));
    zmq_close(s);
}

static void test_req_and_dealer(void **state) {
    (void)state;
    fx f;
    fx_open(&f);
    req_peers_ok(&f);
    /* a DEALER with a routing envelope: it comes back as sent */
    void *d = zsock(&f, ZMQ_DEALER);
    zmq_send(d, "hop1", 4, ZMQ_SNDMORE);
    zmq_send(d, "hop-two", 7, ZMQ_SNDMORE);
    zmq_send(d, "", 0, ZMQ_SNDMORE);
    zmq_send(d, peers_req, strlen(peers_req), 0);
    char buf[256];
    assert_int_equal(zrecv_text(d, buf, sizeof buf), 4);
    assert_string_equal(buf, "hop1");
    assert_int_equal(zrecv_text(d, buf, sizeof buf), 7);
    assert_string_equal(buf, "hop-two");
    assert_int_equal(zrecv_text(d, buf, sizeof buf), 0);
    zrecv_text(d, buf, sizeof buf);
    assert_non_null(strstr(buf, "\"ok\":true"));
    /* pipelined: two requests before any reply, answered in order */
    zmq_send(d, "", 0, ZMQ_SNDMORE);
    zmq_send(d, "{bad", 4, 0);
    zmq_send(d, "", 0, ZMQ_SNDMORE);
    zmq_send(d, peers_req, strlen(peers_req), 0);
    assert_int_equal(zrecv_text(d, buf, sizeof buf), 0);
    zrecv_text(d, buf, sizeof buf);
    assert_string_equal(buf, "{\"ok\":false,\"error\":\"malformed control request\"}");
    assert_int_equal(zrecv_text(d, buf, sizeof buf), 0);
    zrecv_text(d, buf, sizeof buf);
    assert_non_null(strstr(buf, "\"ok\":true"));
    zmq_close(d);
    /* our own client */
    ctl_client *cli;
    assert_int_equal(ctl_client_open(f.zctx, DEADLINE_S * 1000, &cli), 0);
    wire_ctl_request q = test_reserve_req("t1", "h1", 4, 64, "bfloat16");
    wire_ctl_reply r;
    assert_int_equal(ctl_call_ok(cli, "127.0.0.1", f.port, &q, &r), 0);
    assert_true(r.u.reserve.write);
    assert_string_equal(r.u.reserve.dst_key, "00112233aabbccdd");
    wire_ctl_reply_clear(&r);
    ctl_client_close(cli);
    fx_close(&f);
}

#define NPEERS 50

static void test_many_req(void **state) {
    (void)state;
    fx f;
    fx_open(&f);
    void *s[NPEERS];
    for (int i = 0; i < NPEERS; i++) {
        s[i] = zsock(&f, ZMQ_REQ);
        assert_true(zmq_send(s[i], peers_req, strlen(peers_req), 0) > 0);
    }
    for (int i = NPEERS - 1; i >= 0; i--) {
        char buf[256];
        zrecv_text(s[i], buf, sizeof buf);
        assert_non_null(strstr(buf, "\"ok\":true"));
        zmq_close(s[i]);
    }
    assert_int_equal(ctl_server_bad_requests(f.srv), 0);
    fx_close(&f);
}

/* ---------------------------------------------------------- raw peers */

/* rcvbuf > 0: that receive buffer, set before connecting (the window the
 * peer is offered is fixed then). */
static int raw_connect_buf(int port, int rcvbuf) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct timeval tv = {.tv_sec = DEADLINE_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static int raw_connect(int port) { return raw_connect_buf(port, 0); }

static void raw_send(int fd, const void *p, size_t n) {
    assert_int_equal(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static void raw_read_exact(int fd, void *p, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = recv(fd, (uint8_t *)p + got, n - got, 0);
        assert_true(k > 0);
        got += (size_t)k;
    }
}

/* The first 11 bytes of a ZMTP 3.0 greeting as libzmq sends it: signature
 * (its 8-byte length field 1) and major version. */
static const uint8_t zmtp3_head[11] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3};

/* Our greeting's signature arrives: the server accepted this connection. */
static void raw_expect_greeting(int fd) {
    uint8_t g[11];
    raw_read_exact(fd, g, sizeof g);
    assert_memory_equal(g, zmtp3_head, sizeof g);
}

/* Our whole greeting and READY (a REP's). */
static void raw_expect_handshake(int fd) {
    uint8_t g[64], h[2], cmd[255];
    raw_read_exact(fd, g, sizeof g);
    assert_memory_equal(g, zmtp3_head, sizeof zmtp3_head);
    raw_read_exact(fd, h, 2);
    assert_int_equal(h[0], 0x04);
    raw_read_exact(fd, cmd, h[1]);
    assert_memory_equal(cmd, "\x05READY", 6);
    assert_non_null(memmem(cmd, h[1], "REP", 3));
}

/* The server closed the connection: EOF (or a reset, when it closed with our
 * bytes unread), never the read deadline. Bytes before it are skipped. */
static void raw_expect_closed(int fd) {
    uint8_t buf[4096];
    for (;;) {
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k > 0) continue;
        if (k == 0) return;
        assert_int_equal(errno, ECONNRESET);
        return;
    }
}

/* A whole ZMTP 3.0 NULL greeting and READY as a peer of socket type `type`. */
static void raw_handshake(int fd, const char *type) {
    uint8_t g[64] = {0};
    memcpy(g, zmtp3_head, sizeof zmtp3_head);
    memcpy(g + 12, "NULL", 4);
    raw_send(fd, g, sizeof g);
    uint8_t cmd[64];
    size_t tl = strlen(type), n = 0;
    cmd[n++] = 0x04;
    cmd[n++] = (uint8_t)(1 + 5 + 1 + 11 + 4 + tl);
    cmd[n++] = 5;
    memcpy(cmd + n, "READY", 5);
    n += 5;
    cmd[n++] = 11;
    memcpy(cmd + n, "Socket-Type", 11);
    n += 11;
    uint32_t be = htonl((uint32_t)tl);
    memcpy(cmd + n, &be, 4);
    n += 4;
    memcpy(cmd + n, type, tl);
    n += tl;
    raw_send(fd, cmd, n);
}

/* One frame's header: flags, and the size short (< 256) or long. */
static size_t frame_head(uint8_t *h, uint8_t more, uint64_t size) {
    if (size < 256) {
        h[0] = more;
        h[1] = (uint8_t)size;
        return 2;
    }
    h[0] = (uint8_t)(more | 0x02);
    for (int i = 0; i < 8; i++) h[1 + i] = (uint8_t)(size >> (56 - 8 * i));
    return 9;
}

/* A REQ's request: the empty delimiter, then the body. */
static void raw_send_request(int fd, const void *body, size_t len) {
    uint8_t h[9], delim[2] = {0x01, 0};
    raw_send(fd, delim, 2);
    size_t hl = frame_head(h, 0, len);
    raw_send(fd, h, hl);
    raw_send(fd, body, len);
}

/* The next frame that is not a command: its flags, and its body (caller frees). */
static uint8_t *raw_read_frame(int fd, uint8_t *flags, uint64_t *size) {
    for (;;) {
        uint8_t h[9];
        raw_read_exact(fd, h, 1);
        uint64_t n = 0;
        if (h[0] & 0x02) {
            raw_read_exact(fd, h + 1, 8);
            for (int i = 0; i < 8; i++) n = n << 8 | h[1 + i];
        } else {
            raw_read_exact(fd, h + 1, 1);
            n = h[1];
        }
        assert_true(n < (64u << 20));
        uint8_t *b = malloc(n + 1);
        raw_read_exact(fd, b, n);
        b[n] = 0;
        if (h[0] & 0x04) { /* a command (READY) */
            free(b);
            continue;
        }
        *flags = h[0];
        *size = n;
        return b;
    }
}

/* A REQ's reply after our greeting: the delimiter, then the body (caller frees). */
static char *raw_read_reply(int fd, uint64_t *size) {
    uint8_t flags;
    uint64_t n;
    free(raw_read_frame(fd, &flags, &n));
    assert_int_equal(n, 0);
    assert_true(flags & 0x01);
    uint8_t *b = raw_read_frame(fd, &flags, size);
    assert_false(flags & 0x01);
    return (char *)b;
}

static void test_raw_req_answered(void **state) {
    (void)state;
    fx f;
    fx_open(&f);
    int fd = raw_connect(f.port);
    raw_handshake(fd, "REQ");
    raw_expect_handshake(fd);
    raw_send_request(fd, peers_req, strlen(peers_req));
    uint64_t n;
    char *rep = raw_read_reply(fd, &n);
    assert_non_null(strstr(rep, "\"ok\":true"));
    free(rep);
    close(fd);
    fx_close(&f);
}

/* Half a greeting, then silence: others are served meanwhile; with the
 * handshake deadline the stalled connection is closed. */
static void test_stalled_greeting(void **state) {
    (void)state;
    fx f;
    fx_open(&f); /* the default deadline (30 s): the stall lasts the whole check */
    int fd = raw_connect(f.port);
    raw_send(fd, zmtp3_head, 5);
    raw_expect_greeting(fd);
    req_peers_ok(&f);
    req_peers_ok(&f);
    close(fd);
    fx_close(&f);

    fx_open_with(&f, 50, 0, NULL); /* a short deadline: the stalled peer is closed */
    fd = raw_connect(f.port);
    raw_send(fd, zmtp3_head, 5);
    raw_expect_closed(fd);
    close(fd);
    fd = raw_connect(f.port); /* greeting done, READY never sent */
    uint8_t g[64] = {0};
    memcpy(g, zmtp3_head, sizeof zmtp3_head);
    memcpy(g + 12, "NULL", 4);
    raw_send(fd, g, sizeof g);
    raw_expect_closed(fd);
    close(fd);
    req_peers_ok(&f);
    fx_close(&f);
}

/* A ZMTP 2.0 peer (revision 1 after the signature) is refused; the server
 * keeps serving. */
static void test_zmtp2_refused(void **state) {
    (void)state;
    fx f;
    fx_open(&f);
    int fd = raw_connect(f.port);
    const uint8_t v2[12] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 1, 3 /* REQ */};
    raw_send(fd, v2, sizeof v2);
    raw_expect_closed(fd);
    close(fd);
    /* a ZMTP 3.0 peer of a type REP cannot talk to (PUB) is refused too */
    fd = raw_connect(f.port);
    raw_handshake(fd, "PUB");
    raw_expect_closed(fd);
    close(fd);
    req_peers_ok(&f);
    fx_close(&f);
}

/* A message over the bound closes that connection the moment its size is
 * known; a REQ handshaken before it is still served. */
static void test_oversize_closes_one(void **state) {
    (void)state;
    fx f;
    fx_open(&f);
    void *other = zsock(&f, ZMQ_REQ);
    int fd = raw_connect(f.port);
    raw_handshake(fd, "REQ");
    raw_expect_greeting(fd);
    uint8_t delim[2] = {0x01, 0}, h[9];
    raw_send(fd, delim, 2);
    size_t hl = frame_head(h, 0, (uint64_t)CTL_MAX_RECV_BYTES + 1);
    raw_send(fd, h, hl);
    raw_expect_closed(fd);
    close(fd);
    assert_true(zmq_send(other, peers_req, strlen(peers_req), 0) > 0);
    char buf[256];
    zrecv_text(other, buf, sizeof buf);
    assert_non_null(strstr(buf, "\"ok\":true"));
    zmq_close(other);
    fx_close(&f);
}

/* A peer that closes mid-message is dropped; one that closes right after a
 * whole request still has it handled (its reply goes nowhere), as libzmq
 * does. */
static void test_close_mid_message(void **state) {
    (void)state;
    fx f;
    fx_open(&f);
    int fd = raw_connect(f.port);
    raw_handshake(fd, "REQ");
    raw_expect_handshake(fd); /* all read: our close is a FIN */
    uint8_t part[2 + 2 + 5] = {0x01, 0, 0x00, 100, '{', '"', 'o', 'p', '"'};
    raw_send(fd, part, sizeof part); /* 5 of 100 body bytes */
    close(fd);
    req_peers_ok(&f);
    assert_int_equal(ctl_server_bad_requests(f.srv), 0);

    fd = raw_connect(f.port);
    raw_handshake(fd, "REQ");
    raw_expect_handshake(fd); /* all read: our close is a FIN */
    raw_send_request(fd, "{not json", 9);
    close(fd);
    req_peers_ok(&f); /* its request reached the server after the one above */
    assert_int_equal(ctl_server_bad_requests(f.srv), 1);
    fx_close(&f);
}

/* Connections beyond max_conns are closed at once; one freed makes room. */
static void test_connection_bound(void **state) {
    (void)state;
    fx f;
    fx_open_with(&f, 0, 2, NULL);
    int a = raw_connect(f.port), b = raw_connect(f.port);
    raw_expect_greeting(a);
    raw_expect_greeting(b);
    int c = raw_connect(f.port);
    raw_expect_closed(c);
    close(c);
    close(a); /* room again: a REQ is served (libzmq reconnects if it came too soon) */
    req_peers_ok(&f);
    close(b);
    fx_close(&f);
}

/* ------------------------------------------------ a reply that must wait */

typedef struct bigreq {
    int fd;
    char **bodies;
    size_t *lens;
    int count;
} bigreq;

/* The pipelining peer's writer: every request, back to back. */
static void *send_requests(void *arg) {
    bigreq *r = arg;
    for (int i = 0; i < r->count; i++) raw_send_request(r->fd, r->bodies[i], r->lens[i]);
    return NULL;
}

/* A reserve_batch of n items named p<i>-<k>: its reply carries dst_key once
 * per item. */
static char *batch_body(int i, size_t n, size_t *len) {
    wire_reserve_item *it = calloc(n, sizeof *it);
    for (size_t k = 0; k < n; k++) {
        char tid[32];
        snprintf(tid, sizeof tid, "p%d-%zu", i, k);
        it[k].req = test_reserve_req(tid, tid, 1, 1, "bfloat16").u.reserve;
    }
    wire_ctl_request q = {.op = WIRE_OP_RESERVE_BATCH};
    q.u.reserve_batch.n = n;
    q.u.reserve_batch.items = it;
    char *out = NULL;
    assert_int_equal(wire_ctl_encode_request(&q, &out), 0);
    free(it);
    *len = strlen(out);
    return out;
}

/* The most a socket pair buffers one way: the sender's largest send buffer
 * (tcp_wmem's third field) plus the reader's receive buffer. */
static uint64_t buffered_max(int fd) {
    uint64_t wmax = 4u << 20;
    FILE *fp = fopen("/proc/sys/net/ipv4/tcp_wmem", "r");
    if (fp) {
        unsigned long long a, b, c;
        if (fscanf(fp, "%llu %llu %llu", &a, &b, &c) == 3) wmax = c;
        fclose(fp);
    }
    int rcv = 0;
    socklen_t sl = sizeof rcv;
    getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, &sl);
    return wmax + (uint64_t)rcv;
}

/* A peer pipelines requests whose replies together exceed what the kernel
 * buffers, and reads nothing until a REQ has been served; then it gets every
 * reply whole, in order. */
static void test_slow_reader(void **state) {
    (void)state;
    char key[WIRE_KEY_MAX + 1];
    memset(key, 'k', WIRE_KEY_MAX);
    key[WIRE_KEY_MAX] = 0;
    fx f;
    fx_open_with(&f, 0, 0, key);
    int fd = raw_connect_buf(f.port, 4096); /* a slow reader's small window */
    raw_handshake(fd, "DEALER");
    raw_expect_handshake(fd);
    const size_t items = 1024; /* about 4.2 MB of reply each */
    uint64_t per = items * WIRE_KEY_MAX;
    bigreq r = {.fd = fd, .count = (int)(buffered_max(fd) / per) + 2};
    r.bodies = calloc((size_t)r.count, sizeof *r.bodies);
    r.lens = calloc((size_t)r.count, sizeof *r.lens);
    for (int i = 0; i < r.count; i++) r.bodies[i] = batch_body(i, items, &r.lens[i]);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, send_requests, &r), 0);
    req_peers_ok(&f); /* served while the pipelining peer reads nothing */
    for (int i = 0; i < r.count; i++) {
        uint64_t n;
        char *rep = raw_read_reply(fd, &n);
        assert_true(n > per);
        assert_null(strstr(rep, "\"ok\":false"));
        size_t keys = 0; /* every item's reservation, in full */
        for (const char *p = rep; (p = strstr(p, "\"dst_key\":\"kkk")) != NULL; p++) keys++;
        assert_int_equal(keys, items);
        free(rep);
    }
    assert_int_equal(pthread_join(th, NULL), 0);
    close(fd);
    for (int i = 0; i < r.count; i++) free(r.bodies[i]);
    free(r.bodies);
    free(r.lens);
    assert_int_equal(ctl_server_bad_requests(f.srv), 0);
    fx_close(&f);
}

/* Bind addresses as libzmq takes them: the wildcard (v4 peers reach it), an
 * interface's name; a host name is refused with the option named. */
static void test_bind_forms(void **state) {
    (void)state;
    static const char *const ok[] = {"*", "lo", "0.0.0.0"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        fx f;
        fx_ip = ok[i];
        fx_open(&f);
        req_peers_ok(&f); /* over 127.0.0.1 */
        fx_close(&f);
    }
    fx_ip = "127.0.0.1";
    ctl_server_opts o;
    ctl_server_opts_init(&o);
    o.ip = "no-such-host.invalid";
    o.rsv.mem = &rsv_pool_ops;
    o.dst_session = "x:1";
    ctl_server *s = NULL;
    void *z = zmq_ctx_new();
    assert_err(ctl_server_open(z, &o, &s), ECT_EINVAL, "neither a numeric address");
    assert_null(s);
    o.ip = "127.0.0.1";
    o.handshake_ms = -1;
    assert_err(ctl_server_open(z, &o, &s), ECT_EINVAL, "handshake_ms");
    zmq_ctx_term(z);
}

/* n with thousands separators, bold, as docs/PROTOCOL.md writes a limit. */
static void doc_number(uint64_t n, const char *unit, char *out, size_t cap) {
    char d[32], g[48];
    snprintf(d, sizeof d, "%llu", (unsigned long long)n);
    size_t len = strlen(d), k = 0;
    for (size_t i = 0; i < len; i++) {
        if (i && (len - i) % 3 == 0) g[k++] = ',';
        g[k++] = d[i];
    }
    g[k] = 0;
    snprintf(out, cap, "**%s%s**", g, unit);
}

/* The limits docs/PROTOCOL.md states are the code's. */
static void test_doc_limits(void **state) {
    (void)state;
    const char *md = test_protocol_md();
    char want[64];
    doc_number(CTL_LISTENER_HANDSHAKE_MS, " ms", want, sizeof want);
    assert_non_null(strstr(md, want));
    doc_number(CTL_LISTENER_MAX_CONNS, "", want, sizeof want);
    assert_non_null(strstr(md, want));
    doc_number((uint64_t)CTL_MAX_RECV_BYTES, "", want, sizeof want);
    assert_non_null(strstr(md, want));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_req_and_dealer),    cmocka_unit_test(test_many_req),
        cmocka_unit_test(test_raw_req_answered),  cmocka_unit_test(test_stalled_greeting),
        cmocka_unit_test(test_zmtp2_refused),     cmocka_unit_test(test_oversize_closes_one),
        cmocka_unit_test(test_close_mid_message), cmocka_unit_test(test_connection_bound),
        cmocka_unit_test(test_slow_reader),       cmocka_unit_test(test_doc_limits),
        cmocka_unit_test(test_bind_forms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
