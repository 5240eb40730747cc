/*
 * Tests for push/control_listener in ROUTER mode (the pull producer's
 * ROUTER without CURVE keys, issue 13), driven on the test thread against
 * real libzmq DEALER and REQ peers on loopback: messages handed on as they
 * come (pipelined, no reply needed first), replies sent later by
 * connection id in any order (a REQ peer's delimiter echoed), a message of
 * several body frames flagged, a reply to a peer that went away refused
 * with ECT_ENOTFOUND, a message over max_msg closing only its connection,
 * the watched fd reported, and REP mode refusing ctl_listener_send.
 * Readiness by event: every wait drives passes until the condition holds,
 * with a generous deadline so a bug fails rather than hangs.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.h>

#include "testutil.h"
#include "pull/pull_internal.h"
#include "push/control_listener.h"
#include "util/util.h"

#define DEADLINE_MS 60000
#define MAX_GOT 16

typedef struct got {
    uint64_t conn;
    char peer[64];
    char body[64];
    bool multi, delim;
} got;

typedef struct fx {
    ctl_listener *l;
    void *zctx;
    int port;
    got msgs[MAX_GOT];
    int n;
    size_t reply_len; /* > 0: on_msg answers each message with that many bytes, uncounted */
    uint8_t *reply;
} fx;

static void on_msg(void *ctx, uint64_t conn, const char *peer, const void *body, size_t len,
                   bool multi, bool delim) {
    fx *f = ctx;
    if (f->reply_len) {
        assert_false(multi || delim);
        assert_int_equal(ctl_listener_send(f->l, conn, false, f->reply, f->reply_len), 0);
        f->n++;
        return;
    }
    assert_true(f->n < MAX_GOT);
    got *g = &f->msgs[f->n++];
    g->conn = conn;
    snprintf(g->peer, sizeof g->peer, "%s", peer);
    snprintf(g->body, sizeof g->body, "%.*s", (int)len, (const char *)body);
    g->multi = multi;
    g->delim = delim;
}

static void fx_open(fx *f, uint64_t max_msg) {
    memset(f, 0, sizeof *f);
    ctl_listener_opts o = {
        .ip = "127.0.0.1", .max_msg = max_msg, .on_msg = on_msg, .ctx = f, .what = "test"};
    assert_int_equal(ctl_listener_open(&o, &f->l), 0);
    f->port = ctl_listener_port(f->l);
    f->zctx = zmq_ctx_new();
}

static void fx_close(fx *f) {
    ctl_listener_close(f->l);
    zmq_ctx_term(f->zctx);
}

static void *zsock(fx *f, int type) {
    void *s = zmq_socket(f->zctx, type);
    int zero = 0, never = -1; /* no reconnect: a closed connection stays closed */
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &never, sizeof never);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", f->port);
    assert_int_equal(zmq_connect(s, ep), 0);
    return s;
}

/* Drives passes until f has n messages. */
static void wait_msgs(fx *f, int n) {
    uint64_t end = ect_now_ms() + DEADLINE_MS;
    while (f->n < n && ect_now_ms() < end) ctl_listener_pass(f->l, 10);
    assert_int_equal(f->n, n);
}

/* Drives passes until s has a frame; returns its size, text in buf. */
static int zrecv_driven(fx *f, void *s, char *buf, size_t cap) {
    uint64_t end = ect_now_ms() + DEADLINE_MS;
    for (;;) {
        zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 0) == 1) break;
        assert_true(ect_now_ms() < end);
        ctl_listener_pass(f->l, 10);
    }
    int n = zmq_recv(s, buf, cap - 1, ZMQ_DONTWAIT);
    assert_true(n >= 0);
    buf[(size_t)n < cap ? (size_t)n : cap - 1] = 0;
    return n;
}

static void wait_conns(fx *f, size_t n) {
    uint64_t end = ect_now_ms() + DEADLINE_MS;
    while (ctl_listener_conns(f->l) != n && ect_now_ms() < end) ctl_listener_pass(f->l, 10);
    assert_int_equal(ctl_listener_conns(f->l), n);
}

/* A DEALER pipelines three messages; they come as sent, and replies sent
 * after the pass (outside on_msg), in reverse order, arrive in that order.
 * A REQ peer's message carries its delimiter, and the reply reaches it. */
static void test_pipelined_and_later_replies(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 1024);
    void *d = zsock(&f, ZMQ_DEALER);
    for (int i = 0; i < 3; i++) {
        char m[8];
        snprintf(m, sizeof m, "m%d", i);
        assert_int_equal(zmq_send(d, m, 2, 0), 2);
    }
    wait_msgs(&f, 3);
    for (int i = 0; i < 3; i++) {
        char m[8];
        snprintf(m, sizeof m, "m%d", i);
        assert_string_equal(f.msgs[i].body, m);
        assert_false(f.msgs[i].delim);
        assert_false(f.msgs[i].multi);
        assert_true(f.msgs[i].conn == f.msgs[0].conn);
        assert_string_equal(f.msgs[i].peer, "127.0.0.1");
    }
    for (int i = 2; i >= 0; i--) {
        char r[8];
        snprintf(r, sizeof r, "r%d", i);
        assert_int_equal(ctl_listener_send(f.l, f.msgs[0].conn, false, r, 2), 0);
    }
    ctl_listener_flush(f.l);
    char buf[64];
    for (int i = 2; i >= 0; i--) {
        char r[8];
        snprintf(r, sizeof r, "r%d", i);
        assert_int_equal(zrecv_driven(&f, d, buf, sizeof buf), 2);
        assert_string_equal(buf, r);
    }
    void *q = zsock(&f, ZMQ_REQ);
    assert_int_equal(zmq_send(q, "ask", 3, 0), 3);
    wait_msgs(&f, 4);
    assert_true(f.msgs[3].delim);
    assert_string_equal(f.msgs[3].body, "ask");
    assert_true(f.msgs[3].conn != f.msgs[0].conn);
    assert_int_equal(ctl_listener_send(f.l, f.msgs[3].conn, true, "answer", 6), 0);
    assert_int_equal(zrecv_driven(&f, q, buf, sizeof buf), 6); /* a REQ takes it: delimiter ok */
    assert_string_equal(buf, "answer");
    zmq_close(q);
    zmq_close(d);
    fx_close(&f);
}

/* Several body frames are flagged; a reply to a peer that went away is
 * ECT_ENOTFOUND; a message over max_msg closes only its own connection. */
static void test_multi_gone_oversize(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 64);
    void *d = zsock(&f, ZMQ_DEALER);
    void *big = zsock(&f, ZMQ_DEALER);
    assert_int_equal(zmq_send(d, "a", 1, ZMQ_SNDMORE), 1);
    assert_int_equal(zmq_send(d, "b", 1, 0), 1);
    wait_msgs(&f, 1);
    assert_true(f.msgs[0].multi);
    assert_string_equal(f.msgs[0].body, "a");
    uint64_t gone = f.msgs[0].conn;
    wait_conns(&f, 2); /* big's connection is in */
    char huge[65];
    memset(huge, 'x', sizeof huge);
    assert_int_equal(zmq_send(big, huge, sizeof huge, 0), (int)sizeof huge);
    wait_conns(&f, 1); /* the over-size message closed big's connection */
    assert_int_equal(f.n, 1);
    assert_int_equal(ctl_listener_send(f.l, gone, false, "ok", 2), 0); /* d is still there */
    char buf[16];
    assert_int_equal(zrecv_driven(&f, d, buf, sizeof buf), 2);
    zmq_close(d);
    wait_conns(&f, 0);
    assert_int_equal(ctl_listener_send(f.l, gone, false, "late", 4), ECT_ENOTFOUND);
    assert_int_equal(ctl_listener_send(f.l, 12345, false, "x", 1), ECT_ENOTFOUND);
    zmq_close(big);
    fx_close(&f);
}

/* The kernel's most for one socket's send buffer (tcp_wmem's max). */
static uint64_t wmem_max(void) {
    unsigned long long lo = 0, def = 0, max = 4ull << 20;
    FILE *fp = fopen("/proc/sys/net/ipv4/tcp_wmem", "r");
    if (fp) {
        if (fscanf(fp, "%llu %llu %llu", &lo, &def, &max) != 3) max = 4ull << 20;
        fclose(fp);
    }
    return max;
}

/* A raw ZMTP DEALER with a small receive window, handshake sent. */
static int raw_dealer(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    uint8_t hello[64 + 30] = {0xff, [9] = 0x7f, [10] = 3, [11] = 1, [12] = 'N', 'U', 'L', 'L'};
    static const uint8_t ready[30] = "\x04\x1c\x05READY\x0bSocket-Type\0\0\0\x06"
                                     "DEALER";
    memcpy(hello + 64, ready, sizeof ready);
    assert_int_equal(send(fd, hello, sizeof hello, 0), (ssize_t)sizeof hello);
    return fd;
}

/* A peer pipelines many messages and reads nothing: the listener hands on
 * only as many as fill the reply bound and the kernel's buffers, however
 * many passes run (it waits for POLLOUT instead); once the peer reads,
 * every message is handed on and every reply arrives whole. */
static void test_pause_while_replies_wait(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 64);
    f.reply_len = 256u << 10;
    f.reply = calloc(1, f.reply_len);
    uint64_t room = CTL_LISTENER_OUT_PAUSE + wmem_max() + (1u << 20);
    int m = (int)(room / f.reply_len) * 2 + CTL_LISTENER_BURST;
    int fd = raw_dealer(f.port);
    uint8_t *msgs = malloc((size_t)m * 3);
    for (int i = 0; i < m; i++) memcpy(msgs + 3 * i, "\x00\x01x", 3);
    assert_int_equal(send(fd, msgs, (size_t)m * 3, 0), (ssize_t)m * 3);
    free(msgs);
    uint64_t end = ect_now_ms() + DEADLINE_MS;
    while (f.n == 0 && ect_now_ms() < end) ctl_listener_pass(f.l, 10); /* the first burst */
    assert_true(f.n > 0);
    for (int i = 0; i < 4 * m; i++) ctl_listener_pass(f.l, 0); /* far more than m needs */
    assert_true(f.n < m);
    assert_true((uint64_t)f.n * f.reply_len <= room);
    /* the peer reads: everything comes, whole */
    uint64_t want = 64 + 43 + (uint64_t)m * (9 + f.reply_len), got_bytes = 0;
    uint8_t *buf = malloc(1u << 20);
    end = ect_now_ms() + DEADLINE_MS;
    while (got_bytes < want && ect_now_ms() < end) {
        ssize_t r = recv(fd, buf, 1u << 20, MSG_DONTWAIT);
        if (r > 0) got_bytes += (uint64_t)r;
        assert_true(r > 0 || errno == EAGAIN || errno == EWOULDBLOCK);
        ctl_listener_pass(f.l, r > 0 ? 0 : 1); /* no wait while the peer is reading */
    }
    assert_int_equal(got_bytes, want);
    assert_int_equal(f.n, m);
    free(buf);
    close(fd);
    free(f.reply);
    fx_close(&f);
}

/* The watched fd is reported when readable, not otherwise. */
static void test_watch_fd(void **state) {
    (void)state;
    fx f;
    fx_open(&f, 64);
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    assert_true(efd >= 0);
    assert_false(ctl_listener_pass(f.l, 0)); /* nothing watched */
    ctl_listener_watch(f.l, efd);
    assert_false(ctl_listener_pass(f.l, 0));
    uint64_t one = 1;
    assert_int_equal(write(efd, &one, sizeof one), (ssize_t)sizeof one);
    assert_true(ctl_listener_pass(f.l, DEADLINE_MS));
    close(efd);
    fx_close(&f);
}

static const char *rep_fn(void *ctx, const char *peer, const void *body, size_t len, bool multi,
                          char **owned) {
    (void)ctx, (void)peer, (void)body, (void)len, (void)multi, (void)owned;
    return "{}";
}

/* REP mode has no ctl_listener_send; bad options are refused. */
static void test_rep_mode_refuses_send(void **state) {
    (void)state;
    ctl_listener_opts o = {.ip = "127.0.0.1", .max_msg = 64, .fn = rep_fn};
    ctl_listener *l = NULL;
    assert_int_equal(ctl_listener_open(&o, &l), 0);
    assert_int_equal(ctl_listener_send(l, 1, false, "x", 1), ECT_EINVAL);
    ctl_listener_close(l);
    o.fn = NULL; /* neither fn nor on_msg */
    assert_int_equal(ctl_listener_open(&o, &l), ECT_EINVAL);
    assert_null(l);
    o.on_msg = on_msg;
    o.ip = "no-such-host.invalid";
    o.what = "pull producer ROUTER";
    assert_int_equal(ctl_listener_open(&o, &l), ECT_EINVAL);
    assert_non_null(strstr(ect_last_error(), "pull producer ROUTER ip"));
}

/* The pull ROUTER's limits docs/PROTOCOL.md states are the code's. */
static void test_doc_limits(void **state) {
    (void)state;
    const char *md = test_protocol_md();
    assert_int_equal(ECT_PULL_MAX_MSG_BYTES, 4194304);
    assert_non_null(strstr(md, "frames total more than **4,194,304** bytes"));
    assert_int_equal(CTL_LISTENER_OUT_PAUSE, 1048576);
    assert_non_null(strstr(md, "more than **1,048,576** bytes of replies"));
    assert_int_equal(CTL_LISTENER_BURST, 64);
    assert_non_null(strstr(md, "up to 64 messages per connection per pass"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipelined_and_later_replies),
        cmocka_unit_test(test_multi_gone_oversize),
        cmocka_unit_test(test_pause_while_replies_wait),
        cmocka_unit_test(test_watch_fd),
        cmocka_unit_test(test_rep_mode_refuses_send),
        cmocka_unit_test(test_doc_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
