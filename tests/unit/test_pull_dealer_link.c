/*
 * Tests for the pull consumer's own DEALER (src/pull/dealer_link.c) against
 * a real libzmq ROUTER and raw TCP peers: messages both ways, a message
 * queued before the producer listens going out once it does (refused
 * connects retried), CONNECTED / DISCONNECTED as the socket monitor gave
 * them, the reconnect after the producer comes back on its port, heartbeats
 * (PING sent; a peer that goes silent after its handshake is dropped), a
 * message over the bound dropping the connection, an unknown host. Every
 * wait is for an event (poll inside dl_pump); none is timed.
 */
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.h>

#include "pull/dealer_link.h"
#include "testutil.h"
#include "util/util.h"

#define MAXMSG 4096
#define WAIT_MS 60000

static void *router_on(void *z, int port) {
    void *r = zmq_socket(z, ZMQ_ROUTER);
    int zero = 0, wait = WAIT_MS;
    zmq_setsockopt(r, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(r, ZMQ_RCVTIMEO, &wait, sizeof wait);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    assert_int_equal(zmq_bind(r, ep), 0);
    return r;
}

/* A port free on 127.0.0.1 now, below the kernel's ephemeral range: the
 * link connects to it before anything listens, and a port from that range
 * could meanwhile be some connection's source port (or the link's own: a
 * loopback connect may then connect to itself), so the later bind would
 * fail. */
static int free_port(void) {
    int lo = 32768;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d", &lo) != 1) lo = 32768;
        fclose(f);
    }
    if (lo < 20001) lo = 32768;
    for (int i = 0; i < 200; i++) {
        int port = 20000 + (int)(ect_random_u64() % (uint64_t)(lo - 20000));
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        assert_true(fd >= 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int rc = bind(fd, (struct sockaddr *)&a, sizeof a);
        close(fd);
        if (rc == 0) return port;
    }
    fail_msg("no free port below the ephemeral range");
    return -1;
}

static dealer_link *open_link(int port, int ivl, int timeout, uint64_t max_msg) {
    dealer_link_opts o = {.host = "127.0.0.1",
                          .port = port,
                          .max_msg = max_msg,
                          .heartbeat_ivl_ms = ivl,
                          .heartbeat_timeout_ms = timeout};
    dealer_link *l = NULL;
    assert_int_equal(dl_open(&o, &l), 0);
    return l;
}

/* Drives l until an event in `want` happens; returns all events seen. */
static int pump_until_event(dealer_link *l, int want) {
    int seen = 0;
    while (!(seen & want)) {
        int ev = dl_pump(l, 50);
        assert_true(ev >= 0);
        seen |= ev;
    }
    return seen;
}

/* Drives l until the ROUTER has a message; returns its body's length. */
static int router_recv(dealer_link *l, void *router, char *id, int *idl, char *buf, size_t cap) {
    for (;;) {
        dl_pump(l, 5);
        zmq_pollitem_t it = {router, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 5) == 1) break;
    }
    *idl = zmq_recv(router, id, 256, 0);
    assert_true(*idl > 0);
    return zmq_recv(router, buf, cap, 0);
}

static zmtp_msg link_recv(dealer_link *l) {
    zmtp_msg m;
    while (dl_next(l, &m) != 1) assert_true(dl_pump(l, 50) >= 0);
    return m;
}

/* A message both ways, the message sent while the connect was refused
 * going out once the producer listens. */
static void exchange(dealer_link *l, void *router, const char *say) {
    assert_int_equal(dl_send(l, say, strlen(say)), 0);
    char id[256], buf[64];
    int idl;
    assert_int_equal(router_recv(l, router, id, &idl, buf, sizeof buf), (int)strlen(say));
    assert_memory_equal(buf, say, strlen(say));
    assert_int_equal(zmq_send(router, id, (size_t)idl, ZMQ_SNDMORE), idl);
    assert_int_equal(zmq_send(router, "back", 4, 0), 4);
    zmtp_msg m = link_recv(l);
    assert_int_equal(m.body_len, 4);
    assert_memory_equal(m.body, "back", 4);
    assert_false(m.multi);
}

static void test_refused_then_served_lost_and_back(void **st) {
    (void)st;
    int port = free_port();
    dealer_link *l = open_link(port, 0, 0, MAXMSG);
    assert_int_equal(dl_send(l, "early", 5), 0); /* nobody listens yet */
    assert_int_equal(dl_pump(l, 0), 0);          /* a refused connect is no event */
    void *z = zmq_ctx_new();
    void *router = router_on(z, port);
    char id[256], buf[64];
    int idl;
    assert_int_equal(router_recv(l, router, id, &idl, buf, sizeof buf), 5);
    assert_memory_equal(buf, "early", 5);
    exchange(l, router, "hello");
    zmq_close(router); /* the producer goes away: DISCONNECTED, with why */
    assert_true(pump_until_event(l, DL_DISCONNECTED) & DL_DISCONNECTED);
    assert_non_null(strstr(dl_lost_reason(l), "closed"));
    router = router_on(z, port); /* and comes back on its port */
    assert_true(pump_until_event(l, DL_CONNECTED) & DL_CONNECTED);
    exchange(l, router, "again");
    dl_close(l);
    zmq_close(router);
    zmq_ctx_term(z);
}

/* A raw TCP listener playing the producer (accept_and_greet: the accepted
 * connection, after a ROUTER's handshake sent by hand); returns its port. */
static int raw_router(int *lfd) {
    int port;
    *lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(*lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(*lfd, 4), 0);
    assert_int_equal(getsockname(*lfd, (struct sockaddr *)&a, &len), 0);
    port = ntohs(a.sin_port);
    return port;
}

static int accept_and_greet(dealer_link *l, int lfd) {
    pump_until_event(l, DL_CONNECTED);
    int fd = accept(lfd, NULL, NULL);
    assert_true(fd >= 0);
    zmtp_conn *r = NULL;
    assert_int_equal(zmtp_conn_new(ZMTP_ROUTER, MAXMSG, &r), 0);
    size_t n;
    const uint8_t *p = zmtp_conn_out(r, &n);
    assert_int_equal(write(fd, p, n), (ssize_t)n);
    zmtp_conn_free(r);
    return fd;
}

/* Reads what fd has (nonblocking) into *got. */
static void read_some(int fd, uint8_t *got, size_t cap, size_t *len) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (*len < cap && poll(&p, 1, 0) == 1) {
        ssize_t r = read(fd, got + *len, cap - *len);
        if (r <= 0) return;
        *len += (size_t)r;
    }
}

/* Heartbeats: PINGs go out; a peer silent after its handshake is dropped. */
static void test_heartbeat_timeout(void **st) {
    (void)st;
    int lfd;
    int port = raw_router(&lfd);
    dealer_link *l = open_link(port, 1, 20, MAXMSG);
    int fd = accept_and_greet(l, lfd);
    static const uint8_t ping[] = {4, 7, 4, 'P', 'I', 'N', 'G', 0, 0};
    uint8_t got[4096];
    size_t len = 0;
    int ev = 0;
    while (!(ev & DL_DISCONNECTED)) {
        ev |= dl_pump(l, 50);
        read_some(fd, got, sizeof got, &len);
    }
    read_some(fd, got, sizeof got, &len);
    assert_non_null(memmem(got, len, ping, sizeof ping));
    assert_non_null(strstr(dl_lost_reason(l), "heartbeat"));
    dl_close(l);
    close(fd);
    close(lfd);
}

/* A message over max_msg ends the connection at its header. */
static void test_message_over_bound(void **st) {
    (void)st;
    int lfd;
    int port = raw_router(&lfd);
    dealer_link *l = open_link(port, 0, 0, 100);
    int fd = accept_and_greet(l, lfd);
    static const uint8_t big[] = {2, 0, 0, 0, 0, 0, 0, 0x10, 0}; /* 4096 bytes announced */
    assert_int_equal(write(fd, big, sizeof big), (ssize_t)sizeof big);
    pump_until_event(l, DL_DISCONNECTED);
    assert_non_null(strstr(dl_lost_reason(l), "more than 100 bytes"));
    zmtp_msg m;
    assert_int_equal(dl_next(l, &m), 0);
    dl_close(l);
    close(fd);
    close(lfd);
}

static void test_unknown_host(void **st) {
    (void)st;
    dealer_link_opts o = {.host = "no-such-host.invalid", .port = 1, .max_msg = 1};
    dealer_link *l = (dealer_link *)1;
    assert_err(dl_open(&o, &l), ECT_EINVAL, "cannot resolve");
    assert_null(l);
    dl_close(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_then_served_lost_and_back),
        cmocka_unit_test(test_heartbeat_timeout),
        cmocka_unit_test(test_message_over_bound),
        cmocka_unit_test(test_unknown_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
