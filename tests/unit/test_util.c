/* Tests for util: error codes and detail, ids, clock, checked arithmetic, logging level,
 * the HOST:PORT parser and the monotonic timed waits. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "util/hostport.h"
#include "util/sync.h"
#include "util/util.h"

static void test_strerror_covers_every_code(void **state) {
    (void)state;
    assert_string_equal(ect_strerror(0), "success");
    assert_string_equal(ect_strerror(ECT_EFULL), "pool is full");
    for (int e = ECT_EOVERFLOW; e < 0; e++)
        assert_string_not_equal(ect_strerror(e), "unknown error");
    assert_string_equal(ect_strerror(-999), "unknown error");
    assert_string_equal(ect_strerror(5), "unknown error");
}

static void test_last_error_is_per_call_and_thread_local(void **state) {
    (void)state;
    ect_clear_error();
    assert_string_equal(ect_last_error(), "");
    assert_int_equal(ect_set_error(ECT_EINVAL, "field '%s' is bad", "mm_hash"), ECT_EINVAL);
    assert_string_equal(ect_last_error(), "field 'mm_hash' is bad");
    assert_int_equal(ect_set_errno(ECONNREFUSED, "connect %s", "127.0.0.1:1"), ECT_ECONNREFUSED);
    assert_non_null(strstr(ect_last_error(), "connect 127.0.0.1:1: "));
    assert_int_equal(ect_set_errno(ENOENT, "open"), ECT_ENOTFOUND);
    assert_int_equal(ect_set_errno(EIO, "read"), ECT_EIO);
}

static void test_random_ids_are_32_hex_and_distinct(void **state) {
    (void)state;
    char a[ECT_ID_LEN + 1], b[ECT_ID_LEN + 1];
    ect_random_id(a);
    ect_random_id(b);
    assert_int_equal(strlen(a), 32);
    for (int i = 0; i < 32; i++)
        assert_true(isxdigit((unsigned char)a[i]) && !isupper((unsigned char)a[i]));
    assert_string_not_equal(a, b);
    assert_true(ect_random_u64() != ect_random_u64());
}

/* Ids come from a per-thread buffer filled in bulk: many draws (several
 * refills) are all distinct, tokens too. */
static void test_random_ids_stay_distinct_across_refills(void **state) {
    (void)state;
    enum { N = 2000 };
    static char ids[N][ECT_ID_LEN + 1];
    static uint64_t toks[N];
    for (int i = 0; i < N; i++) {
        ect_random_id(ids[i]);
        toks[i] = ect_random_u64();
    }
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++) {
            assert_string_not_equal(ids[i], ids[j]);
            assert_true(toks[i] != toks[j]);
        }
}

/* After fork the child must not hand out the ids its parent hands out next
 * (the buffer was copied with the process): both draw the same number of
 * ids after the fork and none may match. */
static void test_random_ids_differ_after_fork(void **state) {
    (void)state;
    enum { N = 8 };
    char first[ECT_ID_LEN + 1];
    ect_random_id(first); /* the buffer now holds bytes the child would inherit */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        char ids[N][ECT_ID_LEN + 1];
        for (int i = 0; i < N; i++) ect_random_id(ids[i]);
        _exit(write(fds[1], ids, sizeof ids) == (ssize_t)sizeof ids ? 0 : 1);
    }
    close(fds[1]);
    char mine[N][ECT_ID_LEN + 1], theirs[N][ECT_ID_LEN + 1];
    for (int i = 0; i < N; i++) ect_random_id(mine[i]);
    size_t got = 0;
    while (got < sizeof theirs) {
        ssize_t r = read(fds[0], (char *)theirs + got, sizeof theirs - got);
        assert_true(r > 0);
        got += (size_t)r;
    }
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) assert_string_not_equal(mine[i], theirs[j]);
}

static void test_clock_is_monotonic(void **state) {
    (void)state;
    uint64_t t0 = ect_now_ns();
    uint64_t t1 = ect_now_ns();
    assert_true(t1 >= t0);
    assert_true(ect_now_ms() >= t0 / 1000000);
}

static void test_checked_arithmetic(void **state) {
    (void)state;
    uint64_t r;
    assert_true(ect_mul_u64(1ull << 31, 1ull << 32, &r));
    assert_int_equal(r, 1ull << 63);
    assert_false(ect_mul_u64(1ull << 32, 1ull << 32, &r));
    assert_false(ect_add_u64(UINT64_MAX, 1, &r));
    assert_true(ect_add_u64(1, 2, &r));
    assert_int_equal(r, 3);
}

static void test_log_level_from_env(void **state) {
    (void)state;
    setenv("ECT_LOG", "debug", 1);
    ect_log_set_level(-1);
    assert_true(ect_log_enabled(ECT_LOG_DEBUG));
    setenv("ECT_LOG", "error", 1);
    ect_log_set_level(-1);
    assert_false(ect_log_enabled(ECT_LOG_WARN));
    assert_true(ect_log_enabled(ECT_LOG_ERROR));
    unsetenv("ECT_LOG");
    ect_log_set_level(-1);
    assert_true(ect_log_enabled(ECT_LOG_WARN));
    assert_false(ect_log_enabled(ECT_LOG_INFO));
}

/* One table of inputs: what each is parsed into, or that it is refused. */
static void test_hostport_parse(void **state) {
    (void)state;
    static const struct {
        const char *in;
        int min, max;
        const char *host; /* NULL: refused */
        int port;
    } cases[] = {
        {"127.0.0.1:14579", 1, 65535, "127.0.0.1", 14579},
        {"host:0", 0, 65535, "host", 0},
        {"host:0", 1, 65535, NULL, 0},
        {"host:65535", 0, 65535, "host", 65535},
        {"host:65535", 1, 65534, NULL, 0},
        {"host:65536", 0, 65535, NULL, 0},
        {"host:99999999999999999999", 0, 65535, NULL, 0},
        {"[::1]:80", 1, 65535, "::1", 80},
        {"[fe80::1%eth0]:9", 1, 65535, "fe80::1%eth0", 9},
        {"::1:80", 1, 65535, NULL, 0}, /* IPv6 needs brackets */
        {"[::1]80", 1, 65535, NULL, 0},
        {"[]:80", 1, 65535, NULL, 0},
        {"[::1:80", 1, 65535, NULL, 0},
        {":80", 1, 65535, NULL, 0},
        {"host:", 1, 65535, NULL, 0},
        {"host", 1, 65535, NULL, 0},
        {"host:8x", 1, 65535, NULL, 0},
        {"host:-1", 0, 65535, NULL, 0},
        {"host: 80", 1, 65535, NULL, 0},
        {"", 1, 65535, NULL, 0},
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(cases); i++) {
        char host[64] = "";
        int port = -1;
        int rc = ect_hostport_parse("addr", cases[i].in, cases[i].min, cases[i].max, host,
                                    sizeof host, &port);
        if (!cases[i].host) {
            assert_int_equal(rc, ECT_EINVAL);
            char want[160];
            snprintf(want, sizeof want, "addr '%s' is not HOST:PORT (port %d..%d)", cases[i].in,
                     cases[i].min, cases[i].max);
            assert_string_equal(ect_last_error(), want);
            continue;
        }
        assert_int_equal(rc, 0);
        assert_string_equal(host, cases[i].host);
        assert_int_equal(port, cases[i].port);
    }
    char small[4];
    int port;
    assert_int_equal(ect_hostport_parse("a", "abcd:1", 1, 9, small, sizeof small, &port),
                     ECT_EINVAL);
    assert_int_equal(ect_hostport_parse("a", NULL, 1, 9, small, sizeof small, &port), ECT_EINVAL);
    char buf[64];
    ect_hostport_format("::1", 80, buf, sizeof buf);
    assert_string_equal(buf, "[::1]:80");
    ect_hostport_format("h", 80, buf, sizeof buf);
    assert_string_equal(buf, "h:80");
    ect_tcp_endpoint("::1", 0, buf, sizeof buf);
    assert_string_equal(buf, "tcp://[::1]:*");
    ect_tcp_endpoint("h", 7, buf, sizeof buf);
    assert_string_equal(buf, "tcp://h:7");
    assert_int_equal(ect_tcp_endpoint_port("tcp://127.0.0.1:5555"), 5555);
    assert_int_equal(ect_tcp_endpoint_port("tcp://[::1]:5556"), 5556);
    assert_int_equal(ect_tcp_endpoint_port("ipc://x"), 0);
}

/* ect_hostport_format (built without snprintf) says what snprintf would,
 * cut or not, and ect_strcat_cut appends within the cap. */
static void test_hostport_format(void **state) {
    (void)state;
    const char *hosts[] = {"127.0.0.1", "::1", "h", "", "fe80::1:2:3:4", "a-long-host.example.org"};
    const int ports[] = {0, 1, 9, 10, 80, 5555, 65535, 123456, -1};
    const size_t caps[] = {1, 2, 5, 9, 12, 64};
    for (size_t h = 0; h < sizeof hosts / sizeof *hosts; h++)
        for (size_t p = 0; p < sizeof ports / sizeof *ports; p++)
            for (size_t c = 0; c < sizeof caps / sizeof *caps; c++) {
                char got[64], want[64];
                memset(got, 'x', sizeof got);
                bool v6 = strchr(hosts[h], ':') != NULL;
                int wn = snprintf(want, caps[c], v6 ? "[%s]:%d" : "%s:%d", hosts[h], ports[p]);
                int gn = ect_hostport_format(hosts[h], ports[p], got, caps[c]);
                assert_int_equal(gn, wn);
                assert_string_equal(got, want);
            }
    char k[8] = "ab";
    ect_strcat_cut(k, sizeof k, "|");
    ect_strcat_cut(k, sizeof k, NULL);
    assert_string_equal(k, "ab|");
    ect_strcat_cut(k, sizeof k, "cdefgh");
    assert_string_equal(k, "ab|cdef");
    ect_strcat_cut(k, sizeof k, "z");
    assert_string_equal(k, "ab|cdef");
}

/* What a peer is told: never a wildcard; --advertise wins; others unchanged. */
static void test_session_advertise(void **state) {
    (void)state;
    assert_true(ect_host_is_wildcard("0.0.0.0"));
    assert_true(ect_host_is_wildcard("::"));
    assert_true(ect_host_is_wildcard("*"));
    assert_true(ect_host_is_wildcard(""));
    assert_false(ect_host_is_wildcard("127.0.0.1"));
    assert_false(ect_host_is_wildcard("::1"));
    char out[128];
    /* a wildcard toward a loopback peer: the loopback interface's address */
    assert_int_equal(ect_session_advertise("0.0.0.0:4000", NULL, "127.0.0.1", out, sizeof out), 0);
    assert_string_equal(out, "127.0.0.1:4000");
    assert_int_equal(ect_session_advertise("ucx:0.0.0.0:4000", NULL, "127.0.0.1", out, sizeof out),
                     0);
    assert_string_equal(out, "ucx:127.0.0.1:4000");
    /* no peer known: loopback of the bound family, never the wildcard */
    assert_int_equal(ect_session_advertise("0.0.0.0:4000", NULL, NULL, out, sizeof out), 0);
    assert_string_equal(out, "127.0.0.1:4000");
    assert_int_equal(ect_session_advertise("[::]:4000", NULL, NULL, out, sizeof out), 0);
    assert_string_equal(out, "[::1]:4000");
    /* advertise replaces any host, IPv6 gets brackets */
    assert_int_equal(
        ect_session_advertise("10.0.0.5:4000", "ec.example", "1.2.3.4", out, sizeof out), 0);
    assert_string_equal(out, "ec.example:4000");
    assert_int_equal(ect_session_advertise("0.0.0.0:4000", "2001:db8::7", NULL, out, sizeof out),
                     0);
    assert_string_equal(out, "[2001:db8::7]:4000");
    /* a concrete host and shm sessions are told as they are */
    assert_int_equal(ect_session_advertise("10.0.0.5:4000", NULL, "1.2.3.4", out, sizeof out), 0);
    assert_string_equal(out, "10.0.0.5:4000");
    assert_int_equal(ect_session_advertise("shm:@ect-1", "h", NULL, out, sizeof out), 0);
    assert_string_equal(out, "shm:@ect-1");
    /* too small an output is an error, not a truncated address */
    char tiny[8];
    assert_int_equal(ect_session_advertise("0.0.0.0:4000", "longhostname", NULL, tiny, sizeof tiny),
                     ECT_EINVAL);
    /* route source: loopback toward loopback; a v4-mapped peer reads as IPv4 */
    assert_int_equal(ect_route_source("127.0.0.1", out, sizeof out), 0);
    assert_string_equal(out, "127.0.0.1");
    assert_int_equal(ect_route_source("0.0.0.0", out, sizeof out), ECT_EINVAL);
    assert_int_equal(ect_route_source(NULL, out, sizeof out), ECT_EINVAL);
}

/* A timed wait ends by itself at a deadline on the monotonic clock, and a
 * signal ends it early; far deadlines saturate instead of wrapping. */
static void test_monotonic_timed_wait(void **state) {
    (void)state;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv;
    assert_int_equal(ect_cond_init(&cv), 0);
    pthread_mutex_lock(&mu);
    uint64_t end = ect_deadline_ns(20);
    while (!ect_cond_wait_until(&cv, &mu, end)) {
    }
    assert_true(ect_now_ns() >= end);
    assert_true(ect_cond_wait_until(&cv, &mu, end)); /* already past: at once */
    pthread_mutex_unlock(&mu);
    pthread_cond_destroy(&cv);
    assert_int_equal(ect_deadline_ns(UINT64_MAX), UINT64_MAX);
    assert_true(ect_deadline_ns(1) > ect_now_ns());
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strerror_covers_every_code),
        cmocka_unit_test(test_last_error_is_per_call_and_thread_local),
        cmocka_unit_test(test_random_ids_are_32_hex_and_distinct),
        cmocka_unit_test(test_random_ids_stay_distinct_across_refills),
        cmocka_unit_test(test_random_ids_differ_after_fork),
        cmocka_unit_test(test_clock_is_monotonic),
        cmocka_unit_test(test_checked_arithmetic),
        cmocka_unit_test(test_log_level_from_env),
        cmocka_unit_test(test_hostport_parse),
        cmocka_unit_test(test_hostport_format),
        cmocka_unit_test(test_session_advertise),
        cmocka_unit_test(test_monotonic_timed_wait),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
