/*
 * Tests for util/spin (the bounded busy-poll before a control waiter
 * sleeps): the budget's parsing, ECT_SPIN_US (read once: each case in a
 * child process), the override, the adaptive skips after misses, and that a
 * control exchange (our REP listener, our REQ link, requests pipelined)
 * hands over every reply exactly once and in order whether the waits spin
 * always (a budget no reply outlasts), almost never find their event (a
 * budget of 1 µs) or never spin (0). No timing is asserted: the budget only
 * decides which path a wait takes.
 */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "push/control_link.h"
#include "push/control_listener.h"
#include "util/spin.h"
#include "util/util.h"

static void test_parse(void **st) {
    (void)st;
    static const struct {
        const char *text;
        uint32_t us;
    } good[] = {{"0", 0}, {"1", 1}, {"50", 50}, {"0999", 999}, {"1000", 1000}};
    for (size_t i = 0; i < ECT_ARRAY_LEN(good); i++) {
        uint32_t us = 12345;
        assert_int_equal(ect_spin_parse("ECT_SPIN_US", good[i].text, &us), 0);
        assert_int_equal(us, good[i].us);
    }
    static const char *bad[] = {"", "-1", "1001", "abc", "50us", " 5", "5 ", "+5", "1e3",
                                "99999999999999999999999"};
    for (size_t i = 0; i < ECT_ARRAY_LEN(bad); i++) {
        uint32_t us = 12345;
        assert_err(ect_spin_parse("ECT_SPIN_US", bad[i], &us), ECT_EINVAL, "ECT_SPIN_US");
        assert_non_null(strstr(ect_last_error(), "0 (off) to 1000"));
        assert_int_equal(us, 12345); /* untouched */
    }
    assert_err(ect_spin_parse("spin", NULL, &(uint32_t){0}), ECT_EINVAL, "spin ''");
}

/* ect_spin_us() in a child whose ECT_SPIN_US is value (NULL: unset). */
static uint32_t env_budget(const char *value) {
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        if (value)
            setenv("ECT_SPIN_US", value, 1);
        else
            unsetenv("ECT_SPIN_US");
        ect_log_set_level(ECT_LOG_ERROR); /* the bad value's warning is expected */
        uint32_t us = ect_spin_us();
        _exit(write(p[1], &us, sizeof us) == (ssize_t)sizeof us ? 0 : 1);
    }
    close(p[1]);
    uint32_t us = UINT32_MAX;
    assert_int_equal(read(p[0], &us, sizeof us), (ssize_t)sizeof us);
    close(p[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return us;
}

static void test_env(void **st) {
    (void)st;
    assert_int_equal(env_budget(NULL), ECT_SPIN_DEFAULT_US);
    assert_int_equal(env_budget(""), ECT_SPIN_DEFAULT_US);
    assert_int_equal(env_budget("0"), 0);
    assert_int_equal(env_budget("7"), 7);
    assert_int_equal(env_budget("1000"), 1000);
    assert_int_equal(env_budget("1001"), 0); /* a bad value: off, with a warning */
    assert_int_equal(env_budget("fast"), 0);
}

static void test_override(void **st) {
    (void)st;
    uint32_t env = ect_spin_us();
    ect_spin_set_us(5000);
    assert_int_equal(ect_spin_us(), ECT_SPIN_MAX_US);
    ect_spin_set_us(0);
    ect_spin s;
    ect_spin_init(&s);
    assert_int_equal(s.us, 0);
    ect_spin_set_us(30);
    ect_spin_init(&s);
    assert_int_equal(s.us, 30);
    assert_int_equal(s.skip, 0);
    assert_false(s.gated); /* a forced budget spins whatever the other CPUs do */
    ect_spin_set_us(-1);
    assert_int_equal(ect_spin_us(), env);
    ect_spin_init(&s);
    assert_true(s.gated); /* the environment's: only while another CPU idles */
}

/* One spin on fd's read side: poll's count. */
static int spin_once(ect_spin *s, int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int rc = ect_spin_poll(s, &p, 1);
    if (rc > 0) assert_true(p.revents & POLLIN);
    return rc;
}

static void test_adaptive(void **st) {
    (void)st;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    ect_spin s = {.us = 1};
    /* misses in a row: the next 1, 3, 7, ... 63 waits sleep at once */
    uint32_t want_skip[] = {1, 3, 7, 15, 31, 63, 63};
    for (size_t m = 0; m < ECT_ARRAY_LEN(want_skip); m++) {
        s.off_until_ns = 0; /* a spin that lost the CPU (a busy machine) also sets it */
        assert_int_equal(spin_once(&s, sv[0]), 0);
        assert_int_equal(s.spins, m + 1);
        assert_int_equal(s.skip, want_skip[m]);
        for (uint32_t k = 0; k < want_skip[m]; k++) assert_int_equal(spin_once(&s, sv[0]), 0);
        assert_int_equal(s.spins, m + 1); /* skipped: no spin */
        assert_int_equal(s.skip, 0);
    }
    /* a spin that finds its event starts over (at its first check: no yield) */
    s.off_until_ns = 0;
    assert_int_equal(write(sv[1], "x", 1), 1);
    assert_int_equal(spin_once(&s, sv[0]), 1);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.misses, 0);
    assert_int_equal(s.skip, 0);
    assert_int_equal(spin_once(&s, sv[0]), 1); /* the byte is still there: no skip */
    assert_int_equal(s.hits, 2);
    /* after a spin that lost the CPU: none until off_until_ns */
    s.off_until_ns = ect_now_ns() + 3600ull * 1000000000ull;
    assert_int_equal(spin_once(&s, sv[0]), 0); /* the byte is there, but no spin */
    assert_int_equal(s.hits, 2);
    s.off_until_ns = 0;
    assert_int_equal(spin_once(&s, sv[0]), 1);
    /* a budget of 0 never spins, even with the event there */
    ect_spin off = {.us = 0};
    assert_int_equal(spin_once(&off, sv[0]), 0);
    assert_int_equal(off.spins, 0);
    close(sv[0]);
    close(sv[1]);
}

/* ------------------------------------------------ a control exchange */

typedef struct echo_srv {
    ctl_listener *l;
    int stop_fd;
    atomic_int answered;
    pthread_t th;
} echo_srv;

/* Each request's reply: "re:" and the request. */
static const char *echo_fn(void *ctx, const char *peer, const void *body, size_t len, bool multi,
                           char **owned) {
    echo_srv *s = ctx;
    (void)peer;
    (void)multi;
    char *r = malloc(len + 4);
    assert_non_null(r);
    memcpy(r, "re:", 3);
    memcpy(r + 3, body, len);
    r[len + 3] = 0;
    *owned = r;
    atomic_fetch_add(&s->answered, 1);
    return r;
}

static void *echo_run(void *arg) {
    echo_srv *s = arg;
    while (!ctl_listener_pass(s->l, 1000)) {
    }
    return NULL;
}

static void echo_start(echo_srv *s) {
    memset(s, 0, sizeof *s);
    ctl_listener_opts o = {.ip = "127.0.0.1", .max_msg = 1 << 20, .fn = echo_fn, .ctx = s};
    assert_int_equal(ctl_listener_open(&o, &s->l), 0);
    s->stop_fd = eventfd(0, EFD_CLOEXEC);
    assert_true(s->stop_fd >= 0);
    ctl_listener_watch(s->l, s->stop_fd);
    assert_int_equal(pthread_create(&s->th, NULL, echo_run, s), 0);
}

static void echo_stop(echo_srv *s) {
    uint64_t one = 1;
    assert_int_equal(write(s->stop_fd, &one, sizeof one), (ssize_t)sizeof one);
    pthread_join(s->th, NULL);
    ctl_listener_close(s->l);
    close(s->stop_fd);
}

#define CALLS 300
#define MAX_PIPE 4

typedef struct got {
    char req[MAX_PIPE][64];
    size_t n;
} got;

/* Each reply in order: the echo of its own request, once. */
static int check_reply(void *ctx, size_t i, const uint8_t *body, size_t len) {
    got *g = ctx;
    assert_int_equal(i, g->n);
    char want[80];
    int wl = snprintf(want, sizeof want, "re:%s", g->req[i]);
    assert_int_equal(len, (size_t)wl);
    assert_memory_equal(body, want, len);
    g->n++;
    return 0;
}

/* CALLS calls of 1..MAX_PIPE pipelined requests on one link to a fresh
 * listener, both made with budget us: every reply comes, once, in order. */
static void exchange_with_budget(int64_t us) {
    ect_spin_set_us(us);
    echo_srv s;
    echo_start(&s);
    char addr[64];
    int port = ctl_listener_port(s.l);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    ctl_link_call_opts o = {.host = "127.0.0.1", .port = port, .addr = addr, .op_name = "echo",
                            .timeout_ms = 60000, .fail_fast = true, .max_msg = 1 << 20,
                            .watch_fd = -1};
    ctl_link *link = NULL;
    size_t sent = 0;
    for (int c = 0; c < CALLS; c++) {
        got g = {.n = 0};
        ctl_link_req reqs[MAX_PIPE];
        size_t n = 1 + (size_t)c % MAX_PIPE;
        for (size_t i = 0; i < n; i++) {
            snprintf(g.req[i], sizeof g.req[i], "call %d req %zu", c, i);
            reqs[i] = (ctl_link_req){.frame = g.req[i], .len = strlen(g.req[i])};
        }
        size_t ndone = 0;
        assert_int_equal(ctl_link_call_many(&link, &o, reqs, n, check_reply, &g, &ndone), 0);
        assert_int_equal(ndone, n);
        assert_int_equal(g.n, n);
        sent += n;
    }
    ctl_link_close(link);
    echo_stop(&s);
    assert_int_equal(atomic_load(&s.answered), (int)sent);
    ect_spin_set_us(-1);
}

static void test_exchange_spin_always(void **st) {
    (void)st;
    exchange_with_budget(ECT_SPIN_MAX_US);
}

static void test_exchange_spin_misses(void **st) {
    (void)st;
    exchange_with_budget(1);
}

static void test_exchange_no_spin(void **st) {
    (void)st;
    exchange_with_budget(0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_env),
        cmocka_unit_test(test_override),
        cmocka_unit_test(test_adaptive),
        cmocka_unit_test(test_exchange_spin_always),
        cmocka_unit_test(test_exchange_spin_misses),
        cmocka_unit_test(test_exchange_no_spin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
