/* Tests for the JSON configurations of every role (util/jconf, push/config,
 * pull/config, ect_*_open_config), the ABI checks a binding runs at load,
 * and the log handler. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pull/config.h"
#include "push/config.h"
#include "testutil.h"
#include "util/jconf.h"
#include "util/util.h"

static void test_empty_object_gives_the_struct_defaults(void **state) {
    (void)state;
    json_t *root;
    ect_push_consumer_opts c, cd;
    ect_push_consumer_opts_init(&cd);
    assert_int_equal(push_consumer_config("{}", &c, &root), 0);
    json_decref(root);
    assert_memory_equal(&c, &cd, sizeof c);
    ect_push_scheduler_opts s, sd;
    ect_push_scheduler_opts_init(&sd);
    assert_int_equal(push_scheduler_config(" { } ", &s, &root), 0);
    json_decref(root);
    assert_memory_equal(&s, &sd, sizeof s);
    ect_push_producer_opts p, pd;
    ect_push_producer_opts_init(&pd);
    assert_int_equal(push_producer_config("{}", &p, &root), 0);
    json_decref(root);
    assert_memory_equal(&p, &pd, sizeof p);
    ect_pull_producer_opts q, qd;
    ect_pull_producer_opts_init(&qd);
    assert_int_equal(pull_producer_config("{}", &q, &root), 0);
    json_decref(root);
    assert_memory_equal(&q, &qd, sizeof q);
    char addr[PULL_CONFIG_ADDR_MAX];
    ect_pull_consumer_opts r;
    assert_int_equal(pull_consumer_config("{}", &r, &root, addr), 0);
    json_decref(root);
    assert_string_equal(r.producer, "127.0.0.1:14579"); /* upstream's ec_ip / ec_port */
}

static void test_push_consumer_keys_fill_their_fields(void **state) {
    (void)state;
    json_t *root;
    ect_push_consumer_opts o;
    assert_int_equal(
        push_consumer_config("{\"ec_ip\": \"10.0.0.2\", \"ec_port\": 15000, \"tp_size\": 4, "
                             "\"tp_rank\": 3, \"dp_index\": 2, \"ec_buffer_size\": 1e9, "
                             "\"transport\": \"shm\", \"xport_listen\": \"10.0.0.2:7000\", "
                             "\"ttl_ms\": 1234, \"pending_grace_ms\": 99, \"reap_interval_ms\": 5, "
                             "\"max_events\": 7, \"max_tombstones\": 8}",
                             &o, &root),
        0);
    assert_string_equal(o.ec_ip, "10.0.0.2");
    assert_int_equal(o.ec_port, 15000);
    assert_int_equal(o.tp_size, 4);
    assert_int_equal(o.tp_rank, 3);
    assert_int_equal(o.dp_index, 2);
    assert_int_equal(o.pool_size, 1000000000ull);
    assert_string_equal(o.transport, "shm");
    assert_string_equal(o.xport_listen, "10.0.0.2:7000");
    assert_int_equal(o.ttl_ms, 1234);
    assert_int_equal(o.pending_grace_ms, 99);
    assert_int_equal(o.reap_interval_ms, 5);
    assert_int_equal(o.max_events, 7);
    assert_int_equal(o.max_tombstones, 8);
    json_decref(root);
}

/* curve_keys on every role, event_auth on the push consumer; the key
 * directory itself is checked at open (a bad one fails the open). */
static void test_curve_keys_and_event_auth(void **state) {
    (void)state;
    json_t *root;
    char addr[PULL_CONFIG_ADDR_MAX];
    ect_push_consumer_opts c;
    assert_int_equal(
        push_consumer_config("{\"curve_keys\": \"/k/a\", \"event_auth\": \"none\"}", &c, &root), 0);
    assert_string_equal(c.curve_keys, "/k/a");
    assert_int_equal(c.event_auth_off, 1);
    json_decref(root);
    assert_int_equal(push_consumer_config("{\"event_auth\": \"secret\"}", &c, &root), 0);
    assert_int_equal(c.event_auth_off, 0);
    assert_null(c.curve_keys);
    json_decref(root);
    assert_int_equal(push_consumer_config("{\"event_auth\": \"off\"}", &c, &root), ECT_EINVAL);
    assert_non_null(strstr(ect_last_error(), "event_auth"));
    json_decref(root);
    assert_int_equal(push_consumer_config("{\"curve_keys\": \"\"}", &c, &root), ECT_EINVAL);
    assert_non_null(strstr(ect_last_error(), "curve_keys"));
    json_decref(root);
    assert_int_equal(push_consumer_config("{\"curve_keys\": 7}", &c, &root), ECT_EINVAL);
    assert_non_null(strstr(ect_last_error(), "curve_keys"));
    json_decref(root);
    ect_push_scheduler_opts s;
    assert_int_equal(push_scheduler_config("{\"curve_keys\": \"/k/b\"}", &s, &root), 0);
    assert_string_equal(s.curve_keys, "/k/b");
    json_decref(root);
    /* event_auth is the consumer's alone */
    assert_int_equal(push_scheduler_config("{\"event_auth\": \"none\"}", &s, &root), ECT_EINVAL);
    json_decref(root);
    ect_push_producer_opts p;
    assert_int_equal(push_producer_config("{\"curve_keys\": \"/k/c\"}", &p, &root), 0);
    assert_string_equal(p.curve_keys, "/k/c");
    json_decref(root);
    ect_pull_producer_opts q;
    assert_int_equal(pull_producer_config("{\"curve_keys\": \"/k/d\"}", &q, &root), 0);
    assert_string_equal(q.curve_keys, "/k/d");
    json_decref(root);
    ect_pull_scheduler_opts r;
    assert_int_equal(pull_scheduler_config("{\"curve_keys\": \"/k/e\"}", &r, &root, addr), 0);
    assert_string_equal(r.curve_keys, "/k/e");
    json_decref(root);
    ect_pull_consumer_opts t;
    assert_int_equal(pull_consumer_config("{\"curve_keys\": \"/k/f\"}", &t, &root, addr), 0);
    assert_string_equal(t.curve_keys, "/k/f");
    json_decref(root);
    /* a directory that is not a key directory fails the open, naming it */
    ect_push_consumer *pc = NULL;
    assert_int_equal(ect_push_consumer_open_config(
                         "{\"ec_port\": 0, \"curve_keys\": \"/nonexistent-ect-keys\"}", &pc),
                     ECT_EINVAL);
    assert_null(pc);
    assert_non_null(strstr(ect_last_error(), "/nonexistent-ect-keys"));
}

static void test_seconds_convert_as_upstream_does(void **state) {
    (void)state;
    json_t *root;
    ect_push_producer_opts p;
    assert_int_equal(push_producer_config("{\"control_timeout_s\": 2.5}", &p, &root), 0);
    assert_int_equal(p.control_timeout_ms, 2500);
    json_decref(root);
    assert_int_equal(push_producer_config("{\"control_timeout_s\": 0.0001}", &p, &root), 0);
    assert_int_equal(p.control_timeout_ms, 1); /* max(1, ceil(s x 1000)) */
    json_decref(root);
    assert_int_equal(
        push_producer_config("{\"control_timeout_s\": 30, \"ec_buffer_size\": 0}", &p, &root), 0);
    assert_int_equal(p.control_timeout_ms, 30000);
    assert_int_equal(p.staging_size, 0); /* borrow only */
    json_decref(root);
    ect_push_scheduler_opts s;
    assert_int_equal(push_scheduler_config("{\"push_wait_timeout_s\": 1.0005, "
                                           "\"control_timeout_s\": 3, \"accept_any\": true}",
                                           &s, &root),
                     0);
    assert_int_equal(s.push_wait_ms, 1001);
    assert_true(s.control_timeout_s == 3.0);
    assert_int_equal(s.accept_any, 1);
    json_decref(root);
    assert_int_equal(s.recheck_ms, 1000); /* the default */
    assert_int_equal(push_scheduler_config("{\"recheck_ms\": 0}", &s, &root), 0);
    assert_int_equal(s.recheck_ms, 0); /* off */
    json_decref(root);
    ect_push_consumer_opts c;
    assert_int_equal(push_consumer_config("{\"trusted_peers\": \"10.0.0.9,::1\"}", &c, &root), 0);
    assert_string_equal(c.trusted_peers, "10.0.0.9,::1");
    json_decref(root);
    assert_int_equal(jc_seconds_to_ms(1e12), INT32_MAX);
}

static void test_scheduler_port_is_the_replicas_rank_zero(void **state) {
    (void)state;
    json_t *root;
    ect_push_scheduler_opts s;
    assert_int_equal(push_scheduler_config("{\"ec_ip\": \"10.1.1.1\", \"ec_port\": 20000, "
                                           "\"tp_size\": 2, \"tp_rank\": 1, \"dp_index\": 3}",
                                           &s, &root),
                     0);
    assert_string_equal(s.consumer_host, "10.1.1.1");
    assert_int_equal(s.consumer_port, 20006); /* ec_port + dp_index x tp_size; tp_rank unused */
    assert_int_equal(s.tp_size, 2);
    json_decref(root);
    assert_err(push_scheduler_config("{\"ec_port\": 0}", &s, &root), ECT_EINVAL, "'ec_port'");
    json_decref(root);
    assert_err(push_scheduler_config("{\"ec_port\": 65535, \"dp_index\": 1}", &s, &root),
               ECT_EINVAL, "1..65535");
    json_decref(root);
}

static void test_pull_addresses(void **state) {
    (void)state;
    json_t *root;
    char addr[PULL_CONFIG_ADDR_MAX];
    ect_pull_scheduler_opts s;
    assert_int_equal(pull_scheduler_config("{\"ec_ip\": \"::1\", \"ec_port\": 9000, "
                                           "\"request_retry_ms\": 50}",
                                           &s, &root, addr),
                     0);
    assert_string_equal(s.producer, "[::1]:9000");
    assert_int_equal(s.request_retry_ms, 50);
    json_decref(root);
    ect_pull_consumer_opts c;
    assert_err(pull_consumer_config("{\"ec_port\": 0}", &c, &root, addr), ECT_EINVAL, "ec_port");
    json_decref(root);
    ect_pull_producer_opts p;
    assert_int_equal(pull_producer_config("{\"ec_ip\": \"0.0.0.0\", \"ec_port\": 0, "
                                          "\"max_lanes\": 3, \"page_items\": 10}",
                                          &p, &root),
                     0);
    assert_string_equal(p.host, "0.0.0.0");
    assert_int_equal(p.port, 0);
    assert_int_equal(p.max_lanes, 3);
    assert_int_equal(p.page_items, 10);
    json_decref(root);
}

/* Every refusal names the key (or says why the text is not a config). */
static void test_refusals_name_the_key(void **state) {
    (void)state;
    static const struct {
        const char *json, *part;
    } bad[] = {
        {"{\"ec_prot\": 1}", "unknown key 'ec_prot'"},
        {"{\"quarantine_ms\": 1}", "'quarantine_ms' is not an option of the push consumer"},
        {"{\"ec_port\": \"14579\"}", "'ec_port' must be an integer, not a string"},
        {"{\"ec_port\": 14579.5}", "'ec_port' must be an integer"},
        {"{\"ec_port\": -1}", "'ec_port' must be an integer 0..65535"},
        {"{\"ec_port\": 65536}", "'ec_port' must be an integer 0..65535"},
        {"{\"ec_port\": true}", "'ec_port' must be an integer, not a boolean"},
        {"{\"ec_port\": null}", "'ec_port' must be an integer, not null"},
        {"{\"tp_size\": 0}", "'tp_size'"},
        {"{\"tp_size\": 65}", "'tp_size'"},
        {"{\"ec_ip\": 1}", "'ec_ip' must be a string, not an integer"},
        {"{\"ec_ip\": \"\"}", "'ec_ip' must be a string of 1..255 bytes"},
        {"{\"transport\": [\"tcp\"]}", "'transport' must be a string, not an array"},
        {"{\"control_timeout_s\": 0}", "'control_timeout_s' must be a number of seconds > 0"},
        {"{\"control_timeout_s\": \"30\"}", "'control_timeout_s' must be a number of seconds"},
        {"{\"ec_buffer_size\": 0}", "'ec_buffer_size' must be > 0"},
        {"{\"ec_port\": 1, \"ec_port\": 2}", "not valid JSON"},
        {"{\"ec_port\": 1} x", "not valid JSON"},
        {"[1, 2]", "must be a JSON object, not an array"},
        {"", "not valid JSON"},
        {"{\"ec_ip\": \"a\\u0000b\"}", "not valid JSON"}, /* jansson refuses NUL */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ect_push_consumer_opts o;
        json_t *root;
        int rc = push_consumer_config(bad[i].json, &o, &root);
        json_decref(root);
        if (rc != ECT_EINVAL || !strstr(ect_last_error(), bad[i].part))
            fail_msg("%s: rc %d, error '%s', expected '%s'", bad[i].json, rc, ect_last_error(),
                     bad[i].part);
    }
    ect_push_scheduler_opts s;
    json_t *root;
    assert_err(push_scheduler_config("{\"accept_any\": 1}", &s, &root), ECT_EINVAL,
               "'accept_any' must be true or false, not an integer");
    json_decref(root);
    ect_push_producer_opts p;
    assert_err(push_producer_config(NULL, &p, &root), ECT_EINVAL, "NULL");
    json_decref(root);
}

/* Shared keys are accepted (and ignored) by roles that do not use them. */
static void test_shared_keys_pass_every_role(void **state) {
    (void)state;
    const char *shared = "{\"ec_ip\": \"127.0.0.1\", \"ec_port\": 14579, \"ec_buffer_size\": 4096, "
                         "\"tp_size\": 2, \"tp_rank\": 1, \"dp_index\": 0, "
                         "\"control_timeout_s\": 30, \"push_wait_timeout_s\": 60, "
                         "\"transport\": \"tcp\"}";
    json_t *root;
    char addr[PULL_CONFIG_ADDR_MAX];
    ect_push_consumer_opts a;
    ect_push_scheduler_opts b;
    ect_push_producer_opts c;
    ect_pull_producer_opts d;
    ect_pull_scheduler_opts e;
    ect_pull_consumer_opts f;
    assert_int_equal(push_consumer_config(shared, &a, &root), 0);
    json_decref(root);
    assert_int_equal(push_scheduler_config(shared, &b, &root), 0);
    json_decref(root);
    assert_int_equal(push_producer_config(shared, &c, &root), 0);
    json_decref(root);
    assert_int_equal(pull_producer_config(shared, &d, &root), 0);
    json_decref(root);
    assert_int_equal(pull_scheduler_config(shared, &e, &root, addr), 0);
    json_decref(root);
    assert_int_equal(pull_consumer_config(shared, &f, &root, addr), 0);
    json_decref(root);
}

static void test_open_config_opens_every_role(void **state) {
    (void)state;
    ect_push_consumer *c;
    assert_err(ect_push_consumer_open_config("{\"ec_port\": \"x\"}", &c), ECT_EINVAL, "ec_port");
    assert_null(c);
    assert_err(ect_push_consumer_open_config("{}", NULL), ECT_EINVAL, NULL);
    /* a value the config accepts but the open refuses: the open's error */
    assert_err(ect_push_consumer_open_config("{\"ec_port\": 0, \"tp_rank\": 1}", &c), ECT_EINVAL,
               "tp_rank");
    assert_int_equal(
        ect_push_consumer_open_config("{\"ec_port\": 0, \"ec_buffer_size\": 1048576}", &c), 0);
    assert_non_null(ect_push_consumer_pool(c));
    assert_true(ect_pool_fd(ect_push_consumer_pool(c)) >= 0);
    char json[128];
    snprintf(json, sizeof json, "{\"ec_port\": %d, \"push_wait_timeout_s\": 5}",
             ect_push_consumer_port(c));
    ect_push_scheduler *s;
    assert_int_equal(ect_push_scheduler_open_config(json, &s), 0);
    ect_push_producer *p;
    assert_int_equal(ect_push_producer_open_config("{\"ec_buffer_size\": 1048576, "
                                                   "\"control_timeout_s\": 5}",
                                                   &p),
                     0);
    ect_push_producer_close(p);
    ect_push_scheduler_close(s);
    ect_push_consumer_close(c);

    ect_pull_producer *pp;
    assert_int_equal(
        ect_pull_producer_open_config("{\"ec_port\": 0, \"ec_buffer_size\": 1048576}", &pp), 0);
    snprintf(json, sizeof json, "{\"ec_port\": %d, \"ec_buffer_size\": 1048576}",
             ect_pull_producer_port(pp));
    ect_pull_consumer *pc;
    assert_int_equal(ect_pull_consumer_open_config(json, &pc), 0);
    snprintf(json, sizeof json, "{\"ec_port\": %d}", ect_pull_producer_port(pp));
    ect_pull_scheduler *ps;
    assert_int_equal(ect_pull_scheduler_open_config(json, &ps), 0);
    ect_pull_scheduler_close(ps);
    ect_pull_consumer_close(pc);
    ect_pull_producer_close(pp);
}

/* pool_memory: a binding's own memory as the consumers' pools, by address;
 * an integer only, and only for the consumers. */
static void test_pool_memory_is_the_callers(void **state) {
    (void)state;
    enum { N = 1 << 20 };
    void *mem = aligned_alloc(4096, N);
    assert_non_null(mem);
    char json[256];
    snprintf(json, sizeof json, "{\"ec_port\": 0, \"ec_buffer_size\": %d, \"pool_memory\": %llu}",
             N, (unsigned long long)(uintptr_t)mem);
    json_t *root;
    ect_push_consumer_opts o;
    assert_int_equal(push_consumer_config(json, &o, &root), 0);
    json_decref(root);
    assert_ptr_equal(o.pool_memory, mem);
    ect_push_consumer *c;
    assert_int_equal(ect_push_consumer_open_config(json, &c), 0);
    assert_ptr_equal(ect_pool_base(ect_push_consumer_pool(c)), mem);
    ect_push_consumer_close(c); /* never frees the caller's memory */
    ect_pull_producer *pp;
    assert_int_equal(
        ect_pull_producer_open_config("{\"ec_port\": 0, \"ec_buffer_size\": 1048576}", &pp), 0);
    snprintf(json, sizeof json, "{\"ec_port\": %d, \"ec_buffer_size\": %d, \"pool_memory\": %llu}",
             ect_pull_producer_port(pp), N, (unsigned long long)(uintptr_t)mem);
    ect_pull_consumer *pc;
    assert_int_equal(ect_pull_consumer_open_config(json, &pc), 0);
    assert_ptr_equal(ect_pool_base(ect_pull_consumer_pool(pc)), mem);
    ect_pull_consumer_close(pc);
    snprintf(json, sizeof json, "{\"ec_port\": %d, \"transport\": \"shm\", \"pool_memory\": %llu}",
             ect_pull_producer_port(pp), (unsigned long long)(uintptr_t)mem);
    assert_err(ect_pull_consumer_open_config(json, &pc), ECT_EINVAL, "fd-backed");
    ect_pull_producer_close(pp);
    memset(mem, 1, N); /* still ours */
    free(mem);
    assert_err(push_consumer_config("{\"pool_memory\": 4096.0}", &o, &root), ECT_EINVAL,
               "'pool_memory' must be an integer, not a real number");
    json_decref(root);
    assert_err(push_consumer_config("{\"pool_memory\": 0}", &o, &root), ECT_EINVAL,
               "'pool_memory'");
    json_decref(root);
    ect_push_producer_opts p;
    assert_err(push_producer_config("{\"pool_memory\": 4096}", &p, &root), ECT_EINVAL,
               "'pool_memory' is not an option of the push producer");
    json_decref(root);
}

/* The data-plane caps of the two consumers (the transport targets) and the
 * pull producer's connect policy and lanes per peer, as JSON keys. */
static void test_peer_caps_and_connect_allow(void **state) {
    (void)state;
    json_t *root;
    char addr[PULL_CONFIG_ADDR_MAX];
    ect_xport_opts xd;
    ect_xport_opts_init(&xd);
    ect_push_consumer_opts c;
    ect_push_consumer_opts_init(&c); /* the defaults are the transport's */
    assert_int_equal(c.max_conns, xd.max_conns);
    assert_int_equal(c.max_conns_per_peer, xd.max_conns_per_peer);
    assert_int_equal(
        push_consumer_config("{\"max_conns\": 100, \"max_conns_per_peer\": 10}", &c, &root), 0);
    json_decref(root);
    assert_int_equal(c.max_conns, 100);
    assert_int_equal(c.max_conns_per_peer, 10);
    ect_pull_consumer_opts pc;
    ect_pull_consumer_opts_init(&pc);
    assert_int_equal(pc.max_conns, xd.max_conns);
    assert_int_equal(pc.max_conns_per_peer, xd.max_conns_per_peer);
    assert_int_equal(
        pull_consumer_config("{\"max_conns\": 65536, \"max_conns_per_peer\": 1}", &pc, &root, addr),
        0);
    json_decref(root);
    assert_int_equal(pc.max_conns, 65536);
    assert_int_equal(pc.max_conns_per_peer, 1);
    ect_pull_producer_opts pp;
    assert_int_equal(
        pull_producer_config("{\"connect_allow\": \"192.0.2.7, 2001:db8::1\"}", &pp, &root), 0);
    /* the config passes the text; the open checks each address (below) */
    assert_string_equal(pp.connect_allow, "192.0.2.7, 2001:db8::1");
    json_decref(root);
    assert_int_equal(pull_producer_config("{\"connect_allow\": \"192.0.2.7,2001:db8::1\", "
                                          "\"max_lanes_per_peer\": 4}",
                                          &pp, &root),
                     0);
    assert_string_equal(pp.connect_allow, "192.0.2.7,2001:db8::1");
    assert_int_equal(pp.max_lanes_per_peer, 4);
    json_decref(root);

    static const struct {
        int role; /* 0 push consumer, 1 pull consumer, 2 pull producer, 3 push producer */
        const char *json, *part;
    } bad[] = {
        {0, "{\"max_conns\": 0}", "'max_conns' must be an integer 1..65536"},
        {0, "{\"max_conns\": 65537}", "'max_conns' must be an integer 1..65536"},
        {0, "{\"max_conns\": \"512\"}", "'max_conns' must be an integer, not a string"},
        {1, "{\"max_conns_per_peer\": 0}", "'max_conns_per_peer' must be an integer 1..65536"},
        {1, "{\"max_conns_per_peer\": 1.5}", "'max_conns_per_peer' must be an integer"},
        {2, "{\"connect_allow\": \"\"}", "'connect_allow' must be a string of 1..4095 bytes"},
        {2, "{\"connect_allow\": [\"*\"]}", "'connect_allow' must be a string, not an array"},
        {2, "{\"max_lanes_per_peer\": 0}", "'max_lanes_per_peer' must be an integer 1.."},
        {2, "{\"max_conns\": 8}", "'max_conns' is not an option of the pull producer"},
        {3, "{\"max_conns\": 8}", "'max_conns' is not an option of the push producer"},
        {3, "{\"connect_allow\": \"*\"}", "'connect_allow' is not an option of the push producer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ect_push_producer_opts q;
        int rc = bad[i].role == 0   ? push_consumer_config(bad[i].json, &c, &root)
                 : bad[i].role == 1 ? pull_consumer_config(bad[i].json, &pc, &root, addr)
                 : bad[i].role == 2 ? pull_producer_config(bad[i].json, &pp, &root)
                                    : push_producer_config(bad[i].json, &q, &root);
        json_decref(root);
        if (rc != ECT_EINVAL || !strstr(ect_last_error(), bad[i].part))
            fail_msg("%s: rc %d, error '%s', expected '%s'", bad[i].json, rc, ect_last_error(),
                     bad[i].part);
    }

    /* values the config takes but the open refuses, with the open's error */
    ect_push_consumer *cons;
    assert_err(ect_push_consumer_open_config("{\"ec_port\": 0, \"ec_buffer_size\": 1048576, "
                                             "\"max_conns\": 8, \"max_conns_per_peer\": 9}",
                                             &cons),
               ECT_EINVAL, "max_conns_per_peer");
    assert_null(cons);
    ect_pull_producer *prod;
    static const char *bad_allow[] = {
        "{\"ec_port\": 0, \"connect_allow\": \"host.example\"}",
        "{\"ec_port\": 0, \"connect_allow\": \"192.0.2.1,\"}",
        "{\"ec_port\": 0, \"connect_allow\": \"192.0.2.1,,10.0.0.1\"}",
        "{\"ec_port\": 0, \"connect_allow\": \"*,192.0.2.1\"}",
        "{\"ec_port\": 0, \"connect_allow\": \"192.0.2.300\"}",
    };
    for (size_t i = 0; i < sizeof bad_allow / sizeof bad_allow[0]; i++) {
        int rc = ect_pull_producer_open_config(bad_allow[i], &prod);
        if (rc != ECT_EINVAL || !strstr(ect_last_error(), "connect_allow") ||
            !strstr(ect_last_error(), "is not an IP address"))
            fail_msg("%s: rc %d, error '%s'", bad_allow[i], rc, ect_last_error());
        assert_null(prod);
    }
    assert_int_equal(ect_pull_producer_open_config("{\"ec_port\": 0, \"ec_buffer_size\": 1048576, "
                                                   "\"connect_allow\": \"*\"}",
                                                   &prod),
                     0);
    ect_pull_producer_close(prod);
    assert_int_equal(ect_pull_producer_open_config("{\"ec_port\": 0, \"ec_buffer_size\": 1048576, "
                                                   "\"connect_allow\": \"127.0.0.1,::1\"}",
                                                   &prod),
                     0);
    ect_pull_producer_close(prod);
}

/* max_conns from the JSON text reaches the consumer's data plane: with one
 * connection allowed, a second one is closed at once while the first stays. */
static void test_max_conns_reaches_the_data_plane(void **state) {
    (void)state;
    ect_push_consumer *cons;
    assert_int_equal(ect_push_consumer_open_config("{\"ec_port\": 0, \"ec_buffer_size\": 1048576, "
                                                   "\"max_conns\": 1, \"max_conns_per_peer\": 1}",
                                                   &cons),
                     0);
    const char *sess = ect_push_consumer_session(cons);
    const char *colon = strrchr(sess, ':');
    assert_non_null(colon);
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    int fd[2];
    for (int i = 0; i < 2; i++) {
        fd[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fd[i] >= 0);
        assert_int_equal(connect(fd[i], (struct sockaddr *)&dst, sizeof dst), 0);
    }
    /* the first EOF (generous bound: the io timeout, 30 s, would close both) */
    struct pollfd pf[2] = {{.fd = fd[0], .events = POLLIN}, {.fd = fd[1], .events = POLLIN}};
    assert_true(poll(pf, 2, 25000) >= 1);
    int closed = -1;
    char b;
    for (int i = 0; i < 2 && closed < 0; i++)
        if ((pf[i].revents & (POLLIN | POLLHUP)) && recv(fd[i], &b, 1, 0) <= 0) closed = i;
    assert_true(closed >= 0);
    struct pollfd other = {.fd = fd[1 - closed], .events = POLLIN};
    assert_int_equal(poll(&other, 1, 0), 0); /* the other one is still served */
    close(fd[0]);
    close(fd[1]);
    ect_push_consumer_close(cons);
}

static void test_abi_checks(void **state) {
    (void)state;
    assert_int_equal(ect_abi_version(), ECT_ABI_VERSION);
    assert_int_equal(ect_sizeof("ect_push_view"), sizeof(ect_push_view));
    assert_int_equal(ect_sizeof("ect_push_result"), sizeof(ect_push_result));
    assert_int_equal(ect_sizeof("ect_push_producer_stat"), sizeof(ect_push_producer_stat));
    assert_int_equal(ect_sizeof("ect_pull_view"), sizeof(ect_pull_view));
    assert_int_equal(ect_sizeof("ect_push_consumer"), 0); /* opaque */
    assert_int_equal(ect_sizeof("nope"), 0);
    assert_int_equal(ect_sizeof(NULL), 0);
    /* the named lengths are the arrays' sizes */
    ect_push_view v;
    ect_push_result r;
    ect_push_sched_item it;
    ect_pull_meta m;
    assert_int_equal(sizeof v.dtype, ECT_DTYPE_LEN);
    assert_int_equal(sizeof v.mm_hash, ECT_MM_HASH_LEN);
    assert_int_equal(sizeof v.transfer_id, ECT_TRANSFER_ID_LEN);
    assert_int_equal(sizeof r.error, ECT_RESULT_ERROR_LEN);
    assert_int_equal(sizeof r.transport, ECT_TRANSPORT_LEN);
    assert_int_equal(sizeof it.error, ECT_SCHED_ERROR_LEN);
    assert_int_equal(sizeof m.producer_session_id, ECT_SESSION_ID_LEN);
    assert_int_equal(ECT_DTYPE_LEN, ECT_POOL_DTYPE_MAX);
    assert_int_equal(ECT_MM_HASH_LEN, ECT_MM_HASH_MAX + 1);
}

typedef struct seen {
    int calls;
    ect_log_record last;
    char module[32], message[1024];
} seen;

static void handler(void *user, const ect_log_record *rec) {
    seen *s = user;
    s->calls++;
    s->last = *rec;
    snprintf(s->module, sizeof s->module, "%s", rec->module);
    snprintf(s->message, sizeof s->message, "%s", rec->message);
}

static void test_log_handler_receives_lines(void **state) {
    (void)state;
    seen s = {0};
    ect_log_set_level(ECT_LOG_INFO);
    assert_int_equal(ect_log_get_level(), ECT_LOG_INFO);
    ect_log_set_handler(handler, &s);
    ECT_LOGW("unit", "value %d", 42);
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.last.level, ECT_LOG_WARN);
    assert_string_equal(s.module, "unit");
    assert_string_equal(s.message, "value 42");
    assert_true(s.last.realtime_ns > 1600000000ull * 1000000000ull);
    assert_true(s.last.thread_id > 0);
    ECT_LOGD("unit", "below the level");
    assert_int_equal(s.calls, 1);
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ECT_LOGE("unit", "%s", big);
    assert_int_equal(s.calls, 2);
    assert_true(strlen(s.message) <= 1023);
    ect_log_set_handler(NULL, NULL);
    ECT_LOGE("unit", "to stderr again");
    assert_int_equal(s.calls, 2);
    ect_log_set_level(-1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_object_gives_the_struct_defaults),
        cmocka_unit_test(test_push_consumer_keys_fill_their_fields),
        cmocka_unit_test(test_curve_keys_and_event_auth),
        cmocka_unit_test(test_seconds_convert_as_upstream_does),
        cmocka_unit_test(test_scheduler_port_is_the_replicas_rank_zero),
        cmocka_unit_test(test_pull_addresses),
        cmocka_unit_test(test_refusals_name_the_key),
        cmocka_unit_test(test_shared_keys_pass_every_role),
        cmocka_unit_test(test_open_config_opens_every_role),
        cmocka_unit_test(test_pool_memory_is_the_callers),
        cmocka_unit_test(test_peer_caps_and_connect_allow),
        cmocka_unit_test(test_max_conns_reaches_the_data_plane),
        cmocka_unit_test(test_abi_checks),
        cmocka_unit_test(test_log_handler_receives_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
