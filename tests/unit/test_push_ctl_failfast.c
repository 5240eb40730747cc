/*
 * Tests for the control client's fail-fast mode (ctl_client_fail_fast): a
 * refused connect and a peer that closes the connection while a request waits
 * end the call at once with ECT_ECONNREFUSED; a peer that accepts but never
 * answers is waited for the whole control timeout (ECT_ETIMEDOUT). Without
 * the mode, a refused connect costs the timeout, as before.
 */
#include <netinet/in.h>
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

/* The fail-fast cases use a long timeout, so "at once" is checked with a
 * generous bound (half of it) a loaded machine never reaches, while waiting
 * the timeout out would exceed it; the silent peer really waits, so it gets
 * a short one. */
#define TIMEOUT_MS 30000
#define SILENT_TIMEOUT_MS 2000

/* A loopback TCP socket bound to an ephemeral port, listening when `listen_`
 * (connections then complete in the kernel and nobody answers). */
static int tcp_socket(bool listen_, int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    if (listen_) assert_int_equal(listen(fd, 8), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static int call_peers(ctl_client *c, int port, uint64_t *ms) {
    wire_ctl_request req = {.op = WIRE_OP_PEERS};
    wire_ctl_reply rep;
    uint64_t t0 = ect_now_ms();
    int rc = ctl_call(c, "127.0.0.1", port, &req, &rep);
    *ms = ect_now_ms() - t0;
    wire_ctl_reply_clear(&rep);
    return rc;
}

static void test_refused_at_once(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    ctl_client *c = NULL;
    assert_int_equal(ctl_client_open(z, TIMEOUT_MS, &c), 0);
    ctl_client_fail_fast(c, true);
    int port;
    int fd = tcp_socket(false, &port); /* bound, not listening: refused */
    uint64_t ms;
    assert_err(call_peers(c, port, &ms), ECT_ECONNREFUSED, "connection refused");
    assert_true(ms < TIMEOUT_MS / 2);
    assert_err(call_peers(c, port, &ms), ECT_ECONNREFUSED, "127.0.0.1:");
    assert_true(ms < TIMEOUT_MS / 2);
    close(fd);
    ctl_client_close(c);
    zmq_ctx_term(z);
}

static void test_silent_peer_waits_the_timeout(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    ctl_client *c = NULL;
    assert_int_equal(ctl_client_open(z, SILENT_TIMEOUT_MS, &c), 0);
    ctl_client_fail_fast(c, true);
    int port;
    int fd = tcp_socket(true, &port);
    uint64_t ms;
    assert_err(call_peers(c, port, &ms), ECT_ETIMEDOUT, "within");
    assert_true(ms >= SILENT_TIMEOUT_MS - 50);
    close(fd);
    ctl_client_close(c);
    zmq_ctx_term(z);
}

typedef struct srv {
    void *z;
    atomic_int port;   /* the REP socket's port, set before `bound` */
    atomic_bool bound; /* readiness: the REP socket listens (or failed: port 0) */
    atomic_bool got;   /* a request arrived */
} srv;

/* Receives one request and closes without answering. It binds an ephemeral
 * port itself (reserving one and binding it later races with every other
 * process on the machine), and never blocks for good: a request that does
 * not come within a generous deadline leaves `got` false for the test to
 * report. No assert here: cmocka's failures must happen on its thread. */
static void *drop_one(void *arg) {
    srv *s = arg;
    void *rep = zmq_socket(s->z, ZMQ_REP);
    int zero = 0, wait_ms = 120000;
    zmq_setsockopt(rep, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(rep, ZMQ_RCVTIMEO, &wait_ms, sizeof wait_ms);
    char ep[64];
    size_t len = sizeof ep;
    int port = 0;
    if (zmq_bind(rep, "tcp://127.0.0.1:*") == 0 &&
        zmq_getsockopt(rep, ZMQ_LAST_ENDPOINT, ep, &len) == 0) {
        const char *colon = strrchr(ep, ':');
        port = colon ? atoi(colon + 1) : 0;
    }
    atomic_store(&s->port, port);
    atomic_store(&s->bound, true);
    if (port) {
        char buf[256];
        atomic_store(&s->got, zmq_recv(rep, buf, sizeof buf, 0) > 0);
    }
    zmq_close(rep);
    return NULL;
}

static void test_peer_closes_while_waiting(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    srv s = {.z = zmq_ctx_new()};
    pthread_t th;
    pthread_create(&th, NULL, drop_one, &s);
    while (!atomic_load(&s.bound)) usleep(1000); /* by event, not by a guess */
    int port = atomic_load(&s.port);
    assert_true(port > 0);
    ctl_client *c = NULL;
    assert_int_equal(ctl_client_open(z, TIMEOUT_MS, &c), 0);
    ctl_client_fail_fast(c, true);
    uint64_t ms;
    int rc = call_peers(c, port, &ms);
    pthread_join(th, NULL);
    assert_true(atomic_load(&s.got));
    assert_err(rc, ECT_ECONNREFUSED, "closed the connection");
    assert_true(ms < TIMEOUT_MS / 2);
    assert_err(call_peers(c, port, &ms), ECT_ECONNREFUSED, NULL); /* gone for good */
    assert_true(ms < TIMEOUT_MS / 2);
    ctl_client_close(c);
    zmq_ctx_term(s.z);
    zmq_ctx_term(z);
}

/* The default mode is unchanged: a refused connect costs the timeout. */
static void test_default_mode_waits(void **st) {
    (void)st;
    void *z = zmq_ctx_new();
    ctl_client *c = NULL;
    assert_int_equal(ctl_client_open(z, 300, &c), 0);
    int port;
    int fd = tcp_socket(false, &port);
    uint64_t ms;
    assert_err(call_peers(c, port, &ms), ECT_ETIMEDOUT, NULL);
    assert_true(ms >= 250);
    close(fd);
    ctl_client_fail_fast(NULL, true); /* NULL is fine */
    ctl_client_close(c);
    zmq_ctx_term(z);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_at_once),
        cmocka_unit_test(test_silent_peer_waits_the_timeout),
        cmocka_unit_test(test_peer_closes_while_waiting),
        cmocka_unit_test(test_default_mode_waits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
