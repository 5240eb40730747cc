/* Tests for util/metrics (registry, exposition format 0.0.4), util/httpreq
 * (the metrics endpoint's request parser) and ect_metrics_serve over a real
 * loopback socket, plus a push consumer's series as ect_metrics_text shows them. */
#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "testutil.h"
#include "util/httpreq.h"
#include "util/metrics.h"
#include "util/util.h"

typedef struct fake {
    met_counter c;
    met_hist h;
    double g;
    const char *weird;
} fake;

static void collect_fake(void *ctx, met_out *o) {
    fake *f = ctx;
    char l[128];
    met_out_counter(o, "ectransfer_test_total", "A test counter.",
                    met_labels(l, sizeof l, "transport", "tcp", (const char *)NULL),
                    met_get(&f->c));
    met_out_gauge(o, "ectransfer_test_gauge", "A test gauge.", NULL, f->g);
    met_out_hist(o, "ectransfer_test_seconds", "A test histogram.", NULL, &f->h);
    if (f->weird)
        met_out_gauge(o, "ectransfer_test_gauge", "A test gauge.",
                      met_labels(l, sizeof l, "reason", f->weird, (const char *)NULL), 1);
}

static int count_of(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

/* Every line is a comment or "name{labels} value" with a known name. */
static void assert_exposition(const char *text) {
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        assert_non_null(nl); /* every line ends in \n */
        if (*p != '#') {
            const char *q = p;
            while (q < nl && (isalnum((unsigned char)*q) || *q == '_' || *q == ':')) q++;
            assert_true(q > p);
            if (*q == '{') {
                bool in = false;
                for (q++; q < nl && (in || *q != '}'); q++) {
                    if (*q == '\\' && in)
                        q++;
                    else if (*q == '"')
                        in = !in;
                }
                assert_true(q < nl);
                q++;
            }
            assert_true(*q == ' ');
            char *end;
            strtod(q + 1, &end);
            assert_ptr_equal(end, nl);
        }
        p = nl + 1;
    }
}

static void test_render_format(void **state) {
    (void)state;
    fake a = {.g = 2.5}, b = {.g = 7};
    met_add(&a.c, 3);
    met_add(&b.c, 40);
    met_observe_ns(&a.h, 50000);         /* 50 us: the first bucket */
    met_observe_ns(&a.h, 3000000);       /* 3 ms: le=0.005 */
    met_observe_ns(&a.h, 120000000000u); /* 120 s: only +Inf */
    b.weird = "a\"b\\c\nd";
    met_source *sa, *sb;
    assert_int_equal(met_source_add("push_consumer", "0", collect_fake, &a, &sa), 0);
    assert_int_equal(met_source_add("push_consumer", "1", collect_fake, &b, &sb), 0);
    char *t = ect_metrics_text();
    assert_non_null(t);
    assert_exposition(t);
    /* one HELP and TYPE per name even with two sources */
    assert_int_equal(count_of(t, "# TYPE ectransfer_test_total counter\n"), 1);
    assert_int_equal(count_of(t, "# HELP ectransfer_test_total A test counter.\n"), 1);
    assert_int_equal(count_of(t, "# TYPE ectransfer_test_gauge gauge\n"), 1);
    assert_int_equal(count_of(t, "# TYPE ectransfer_test_seconds histogram\n"), 1);
    assert_non_null(strstr(
        t, "ectransfer_test_total{role=\"push_consumer\",shard=\"0\",transport=\"tcp\"} 3\n"));
    assert_non_null(strstr(
        t, "ectransfer_test_total{role=\"push_consumer\",shard=\"1\",transport=\"tcp\"} 40\n"));
    assert_non_null(strstr(t, "ectransfer_test_gauge{role=\"push_consumer\",shard=\"0\"} 2.5\n"));
    /* label values escaped */
    assert_non_null(strstr(t, "reason=\"a\\\"b\\\\c\\nd\"} 1\n"));
    /* histogram: cumulative buckets, +Inf == count, sum in seconds */
    assert_non_null(strstr(
        t, "ectransfer_test_seconds_bucket{role=\"push_consumer\",shard=\"0\",le=\"0.0001\"} 1\n"));
    assert_non_null(strstr(
        t, "ectransfer_test_seconds_bucket{role=\"push_consumer\",shard=\"0\",le=\"0.0025\"} 1\n"));
    assert_non_null(strstr(
        t, "ectransfer_test_seconds_bucket{role=\"push_consumer\",shard=\"0\",le=\"0.005\"} 2\n"));
    assert_non_null(strstr(
        t, "ectransfer_test_seconds_bucket{role=\"push_consumer\",shard=\"0\",le=\"60\"} 2\n"));
    assert_non_null(strstr(
        t, "ectransfer_test_seconds_bucket{role=\"push_consumer\",shard=\"0\",le=\"+Inf\"} 3\n"));
    assert_non_null(
        strstr(t, "ectransfer_test_seconds_count{role=\"push_consumer\",shard=\"0\"} 3\n"));
    assert_non_null(
        strstr(t, "ectransfer_test_seconds_sum{role=\"push_consumer\",shard=\"0\"} 120.00305\n"));
    /* a family's samples are contiguous */
    const char *first = strstr(t, "ectransfer_test_total{"),
               *last = strstr(t, "shard=\"1\",transport");
    assert_true(first && last);
    const char *next = strstr(first, "# TYPE");
    assert_true(!next || next > last);
    free(t);
    met_source_remove(sb);
    t = ect_metrics_text();
    assert_null(strstr(t, "shard=\"1\""));
    assert_non_null(strstr(t, "shard=\"0\""));
    free(t);
    met_source_remove(sa);
    t = ect_metrics_text();
    assert_null(strstr(t, "ectransfer_test_total"));
    free(t);
    met_source_remove(NULL);
}

typedef struct adder {
    met_counter *c;
    met_hist *h;
} adder;

static void *add_many(void *arg) {
    adder *a = arg;
    for (int i = 0; i < 100000; i++) {
        met_add(a->c, 1);
        met_observe_ns(a->h, (uint64_t)i * 1000);
    }
    return NULL;
}

static void test_updates_are_exact_under_threads(void **state) {
    (void)state;
    fake f = {0};
    met_source *s;
    assert_int_equal(met_source_add("pull_producer", NULL, collect_fake, &f, &s), 0);
    pthread_t th[4];
    adder a = {&f.c, &f.h};
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, add_many, &a), 0);
    for (int k = 0; k < 20; k++) { /* renders while the counters move */
        char *t = ect_metrics_text();
        assert_non_null(t);
        assert_exposition(t);
        free(t);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    char *t = ect_metrics_text();
    assert_non_null(
        strstr(t, "ectransfer_test_total{role=\"pull_producer\",transport=\"tcp\"} 400000\n"));
    assert_non_null(strstr(t, "ectransfer_test_seconds_count{role=\"pull_producer\"} 400000\n"));
    free(t);
    met_source_remove(s);
}

static http_parse_rc parse(const char *s, http_request *r) {
    return http_parse_request(s, strlen(s), r);
}

static void test_http_request_parser(void **state) {
    (void)state;
    http_request r;
    assert_int_equal(parse("GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n", &r),
                     HTTP_DONE);
    assert_string_equal(r.method, "GET");
    assert_string_equal(r.path, "/metrics");
    assert_int_equal(r.minor, 1);
    assert_int_equal(parse("HEAD /metrics?x=1 HTTP/1.0\n\n", &r), HTTP_DONE); /* bare LF, query */
    assert_string_equal(r.path, "/metrics");
    assert_int_equal(r.minor, 0);
    assert_int_equal(parse("GET /metrics HTTP/1.1\r\nHost: x\r\n", &r), HTTP_INCOMPLETE);
    assert_int_equal(parse("GET /metr", &r), HTTP_INCOMPLETE);
    assert_int_equal(parse("", &r), HTTP_INCOMPLETE);
    assert_int_equal(parse("GET /metrics HTTP/2.0\r\n\r\n", &r), HTTP_BAD);
    assert_int_equal(parse("GET metrics HTTP/1.1\r\n\r\n", &r), HTTP_BAD);
    assert_int_equal(parse("G(T /metrics HTTP/1.1\r\n\r\n", &r), HTTP_BAD);
    assert_int_equal(parse("GET  /metrics HTTP/1.1\r\n\r\n", &r), HTTP_BAD);
    assert_int_equal(parse("GET /metrics HTTP/1.1\r\nno colon\r\n\r\n", &r), HTTP_BAD);
    assert_int_equal(parse("GET /metrics HTTP/1.1\r\nX: a\x01"
                           "b\r\n\r\n",
                           &r),
                     HTTP_BAD);
    assert_int_equal(parse("\r\n\r\n", &r), HTTP_BAD);
    assert_non_null(r.why[0] ? r.why : NULL);
    /* over the bound without an end of head */
    size_t n = HTTP_MAX_REQUEST + 10;
    char *big = malloc(n);
    memcpy(big, "GET /metrics HTTP/1.1\r\nX: ", 26);
    memset(big + 26, 'a', n - 26);
    assert_int_equal(http_parse_request(big, n, &r), HTTP_TOO_LARGE);
    assert_int_equal(http_parse_request(big, HTTP_MAX_REQUEST - 1, &r), HTTP_INCOMPLETE);
    memset(big, 'A', n); /* a request line that never ends */
    assert_int_equal(http_parse_request(big, n, &r), HTTP_TOO_LARGE);
    free(big);
}

/* One exchange with the server: sends req, returns the whole answer. */
static char *exchange(int port, const char *req) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t r;
    while ((r = recv(fd, buf + len, cap - len - 1, 0)) > 0) {
        len += (size_t)r;
        if (len + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    buf[len] = '\0';
    close(fd);
    return buf;
}

static void test_metrics_server(void **state) {
    (void)state;
    fake f = {.g = 1};
    met_add(&f.c, 5);
    met_source *s;
    assert_int_equal(met_source_add("pull_producer", NULL, collect_fake, &f, &s), 0);
    ect_metrics_server *m = NULL;
    assert_err(ect_metrics_serve("127.0.0.1", 70000, &m), ECT_EINVAL, "port");
    assert_null(m);
    assert_err(ect_metrics_serve("not-an-address.invalid.", 0, &m), ECT_EINVAL, "metrics server");
    assert_int_equal(ect_metrics_serve("127.0.0.1", 0, &m), 0);
    int port = ect_metrics_server_port(m);
    assert_true(port > 0);
    ect_metrics_server *m2 = NULL;
    assert_err(ect_metrics_serve("127.0.0.1", port, &m2), ECT_EEXIST, "address in use");
    char *a = exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_true(strncmp(a, "HTTP/1.1 200 OK\r\n", 17) == 0);
    assert_non_null(strstr(a, "Content-Type: text/plain; version=0.0.4"));
    assert_non_null(
        strstr(a, "ectransfer_test_total{role=\"pull_producer\",transport=\"tcp\"} 5\n"));
    free(a);
    a = exchange(port, "GET /other HTTP/1.0\r\n\r\n");
    assert_true(strncmp(a, "HTTP/1.1 404 ", 13) == 0);
    free(a);
    a = exchange(port, "POST /metrics HTTP/1.1\r\n\r\n");
    assert_true(strncmp(a, "HTTP/1.1 405 ", 13) == 0);
    free(a);
    a = exchange(port, "\x16\x03\x01 garbage\r\n\r\n");
    assert_true(strncmp(a, "HTTP/1.1 400 ", 13) == 0);
    free(a);
    a = exchange(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
    assert_true(strncmp(a, "HTTP/1.1 200 ", 13) == 0);
    assert_null(strstr(a, "ectransfer_test_total")); /* no body for HEAD */
    free(a);
    ect_metrics_server_close(m);
    ect_metrics_server_close(NULL);
    met_source_remove(s);
}

static void test_push_consumer_series(void **state) {
    (void)state;
    ect_push_consumer_opts o;
    ect_push_consumer_opts_init(&o);
    o.ec_port = 0;
    o.pool_size = 1 << 20;
    ect_push_consumer *c = NULL;
    assert_int_equal(ect_push_consumer_open(&o, &c), 0);
    char *t = ect_metrics_text();
    assert_exposition(t);
    assert_non_null(
        strstr(t, "ectransfer_pool_capacity_bytes{role=\"push_consumer\",shard=\"0\"} 1048576\n"));
    assert_non_null(
        strstr(t, "ectransfer_pool_used_bytes{role=\"push_consumer\",shard=\"0\"} 0\n"));
    assert_non_null(strstr(t, "ectransfer_bytes_total{role=\"push_consumer\",shard=\"0\",transport="
                              "\"tcp\",direction=\"in\"} 0\n"));
    assert_non_null(strstr(
        t, "ectransfer_reservations{role=\"push_consumer\",shard=\"0\",state=\"WRITING\"} 0\n"));
    assert_non_null(strstr(
        t, "ectransfer_refusals_total{role=\"push_consumer\",shard=\"0\",reason=\"full\"} 0\n"));
    free(t);
    ect_push_consumer_close(c);
    t = ect_metrics_text();
    assert_null(strstr(t, "push_consumer"));
    free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_format),
        cmocka_unit_test(test_updates_are_exact_under_threads),
        cmocka_unit_test(test_http_request_parser),
        cmocka_unit_test(test_metrics_server),
        cmocka_unit_test(test_push_consumer_series),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
