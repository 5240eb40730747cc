/*
 * test_xport_keys — the data plane's handshake (issue 15, docs/PROTOCOL.md
 * "Data-plane handshake"), over tcp and shm. Four key directories made with
 * ect_keygen: A (a target; accepts B), B (accepts A), C (accepts A; A does
 * not accept C), D (a target; accepts B, but B does not accept D). With keys
 * on both sides and accepted, writes land; an initiator whose key the
 * target does not accept, a target whose key the initiator does not accept,
 * and keys on one side only are refused with ECT_EACCES and a message that
 * says which, with not one byte landing; hostile peers that speak the hello
 * and then send garbage, a truncated frame, a forged proof for an accepted
 * key, or nothing, are dropped, counted, and the target goes on serving a
 * legitimate initiator. The frame's bytes are checked against the layout
 * documented in docs/PROTOCOL.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#include "pull/pull_internal.h"
#include "util/keys.h"
#include "util/util.h"
#include "xport/auth.h"
#include "xport/shm.h"
#include "xport/tcp_frame.h"
#include "xport/xport.h"

static char root[] = "/tmp/ect-xkeys-XXXXXX";
static char dir_a[64], dir_b[64], dir_c[64], dir_d[64];

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int setup_keys(void **state) {
    (void)state;
    if (!mkdtemp(root)) return -1;
    snprintf(dir_a, sizeof dir_a, "%s/a", root);
    snprintf(dir_b, sizeof dir_b, "%s/b", root);
    snprintf(dir_c, sizeof dir_c, "%s/c", root);
    snprintf(dir_d, sizeof dir_d, "%s/d", root);
    const char *dirs[] = {dir_a, dir_b, dir_c, dir_d};
    for (int i = 0; i < 4; i++)
        if (ect_keygen(dirs[i], NULL) != 0) return -1;
    test_accept_key(dir_a, "b", dir_b);
    test_accept_key(dir_b, "a", dir_a);
    test_accept_key(dir_c, "a", dir_a);
    test_accept_key(dir_d, "b", dir_b);
    return 0;
}

static int teardown_keys(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

static ect_xport *open_x(const char *kind, const char *keys, int io_timeout_ms) {
    ect_xport_opts o;
    ect_xport_opts_init(&o);
    o.io_timeout_ms = io_timeout_ms;
    o.curve_keys = keys;
    ect_xport *x = NULL;
    int rc = ect_xport_open(kind, &o, &x);
    if (rc) fail_msg("open %s with keys %s: %s", kind, keys ? keys : "(none)", ect_last_error());
    return x;
}

typedef test_region region;

static bool all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

#define RLEN (256 * 1024)

/* One write of the whole region with pattern seed; returns its status. */
static int write_all(ect_xport *i, ect_xport *t, region *r, uint8_t *src, uint64_t seed) {
    test_fill_pattern(src, RLEN, seed);
    ect_write w = {
        .src = src, .dst_addr = (uint64_t)(uintptr_t)r->addr, .len = RLEN, .dst_key = r->key};
    int st = 1;
    int rc = ect_xport_write_batch(i, ect_xport_session(t), &w, 1, &st);
    assert_int_equal(rc, st);
    return rc;
}

/* A fresh initiator with B's keys writes region r of target t whole with
 * pattern seed: the write succeeds and the bytes land. */
static void b_write_lands(const char *kind, ect_xport *t, region *r, uint64_t seed) {
    ect_xport *i = open_x(kind, dir_b, 10000);
    uint8_t *src = malloc(RLEN);
    assert_int_equal(write_all(i, t, r, src, seed), 0);
    assert_true(test_check_pattern(r->addr, RLEN, seed));
    free(src);
    ect_xport_close(i);
}

/* Waits (by polling the counter, no time bound but the test's) until the
 * target counted at least n refused handshakes. */
static void wait_refused(ect_xport *t, uint64_t n) {
    for (int k = 0; k < 60000 && xp_auth_refused(t) < n; k++) nap_ms(1);
    assert_true(xp_auth_refused(t) >= n);
}

/* ---- tests; state is the kind name */

static void t_accepted(void **state) {
    const char *kind = *state;
    ect_xport *t = open_x(kind, dir_a, 10000), *i = open_x(kind, dir_b, 10000);
    region r;
    test_region_open(t, RLEN, &r);
    uint8_t *src = malloc(RLEN);
    assert_int_equal(write_all(i, t, &r, src, 1), 0);
    assert_true(test_check_pattern(r.addr, RLEN, 1));
    /* the second batch rides the cached, already authenticated connection */
    assert_int_equal(write_all(i, t, &r, src, 2), 0);
    assert_true(test_check_pattern(r.addr, RLEN, 2));
    assert_int_equal(xp_auth_refused(t), 0);
    free(src);
    ect_xport_close(i);
    test_region_close(t, &r);
    ect_xport_close(t);
}

/* Opens target (keys tk) and initiator (keys ik), writes, expects ECT_EACCES
 * with msg in the error, and no byte in the region. */
static void refused_case(const char *kind, const char *tk, const char *ik, const char *msg) {
    ect_xport *t = open_x(kind, tk, 10000), *i = open_x(kind, ik, 10000);
    region r;
    test_region_open(t, RLEN, &r);
    uint8_t *src = malloc(RLEN);
    for (int k = 0; k < 3; k++) { /* again and again: never a plain fallback */
        int rc = write_all(i, t, &r, src, 7);
        assert_err(rc, ECT_EACCES, msg);
    }
    assert_true(all_zero(r.addr, RLEN));
    if (tk) wait_refused(t, 3);
    free(src);
    ect_xport_close(i);
    test_region_close(t, &r);
    ect_xport_close(t);
}

static void t_initiator_not_accepted(void **state) {
    refused_case(*state, dir_a, dir_c, "does not accept our key");
}

static void t_target_not_accepted(void **state) {
    refused_case(*state, dir_d, dir_b, "the target's key is not accepted");
}

static void t_keys_on_target_only(void **state) {
    refused_case(*state, dir_a, NULL, "requires data-plane keys");
}

static void t_keys_on_initiator_only(void **state) {
    refused_case(*state, NULL, dir_b, "no data-plane keys");
}

/* ---- hostile peers speaking the raw protocol */

typedef struct raw {
    int fd;
    bool shm;
} raw;

/* Connects and sends the hello asking for the handshake; returns the
 * target's challenge in ch (false when the target sent none). */
static raw raw_open(ect_xport *t, bool shm, xp_auth_frame *ch) {
    raw c = {-1, shm};
    const char *s = ect_xport_session(t);
    uint8_t b[XP_AUTH_LEN];
    if (shm) {
        struct sockaddr_un sa;
        socklen_t sl;
        assert_int_equal(shm_make_addr(s + 5, &sa, &sl), 0); /* "shm:@NAME" */
        c.fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        assert_int_equal(connect(c.fd, (struct sockaddr *)&sa, sl), 0);
        shm_hello_encode(b);
        xp_put_u16(b + 6, SHM_HELLO_AUTH);
        assert_int_equal(shm_msg_send(c.fd, b, SHM_HELLO_LEN, NULL, 0, 10000), 0);
        shm_set_timeouts(c.fd, 60000);
        size_t len;
        assert_int_equal(shm_msg_recv(c.fd, b, sizeof b, &len, NULL, 0, NULL, false, 60000), 0);
        assert_int_equal(xp_auth_decode(b, len, ch), 0);
    } else {
        char host[256];
        int port;
        assert_int_equal(xp_parse_hostport("s", s, host, sizeof host, &port), 0);
        assert_int_equal(xp_tcp_connect(host, port, 10000, &c.fd), 0);
        tcp_encode_hello(b, TCP_ROLE_INITIATOR);
        xp_put_u32(b + 8, TCP_HELLO_AUTH);
        assert_int_equal(xp_send_all(c.fd, b, TCP_HELLO_LEN, 10000), 0);
        assert_int_equal(xp_recv_all(c.fd, b, TCP_HELLO_LEN, 60000), 0);
        assert_int_equal(tcp_decode_hello(b, TCP_ROLE_TARGET), 0);
        assert_true(tcp_hello_flags(b) & TCP_HELLO_AUTH);
        assert_int_equal(xp_recv_all(c.fd, b, XP_AUTH_LEN, 60000), 0);
        assert_int_equal(xp_auth_decode(b, XP_AUTH_LEN, ch), 0);
    }
    assert_int_equal(ch->type, XP_AUTH_CHALLENGE);
    return c;
}

static void raw_send(raw *c, const uint8_t *b, size_t n) {
    if (c->shm)
        assert_int_equal(shm_msg_send(c->fd, b, n, NULL, 0, 10000), 0);
    else
        assert_int_equal(xp_send_all(c->fd, b, n, 10000), 0);
}

/* Reads until the target closes; returns what came before EOF (at most cap
 * bytes). */
static size_t raw_until_eof(raw *c, uint8_t *buf, size_t cap) {
    size_t have = 0;
    for (;;) {
        struct pollfd p = {c->fd, POLLIN, 0};
        int pr = poll(&p, 1, 120000);
        assert_true(pr == 1);
        uint8_t tmp[256];
        ssize_t k = recv(c->fd, tmp, sizeof tmp, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        size_t take = (size_t)k < cap - have ? (size_t)k : cap - have;
        memcpy(buf + have, tmp, take);
        have += take;
    }
    close(c->fd);
    return have;
}

static void t_hostile_handshakes(void **state) {
    const char *kind = *state;
    bool shm = strcmp(kind, "shm") == 0;
    /* A short io timeout, so the silent peer is dropped quickly. */
    ect_xport *t = open_x(kind, dir_a, 300);
    region r;
    test_region_open(t, RLEN, &r);
    xp_auth_frame ch, f;
    uint8_t b[XP_AUTH_LEN], got[512];
    uint64_t seed = 42;

    /* garbage where the RESPONSE is due */
    raw c = raw_open(t, shm, &ch);
    for (size_t k = 0; k < sizeof b; k++) b[k] = (uint8_t)test_rand(&seed);
    raw_send(&c, b, sizeof b);
    raw_until_eof(&c, got, sizeof got);

    /* a truncated RESPONSE, then the peer hangs up */
    c = raw_open(t, shm, &ch);
    raw_send(&c, b, 50);
    if (!shm) shutdown(c.fd, SHUT_WR);
    raw_until_eof(&c, got, sizeof got);

    /* a well-formed RESPONSE with an accepted public key (B's) but a forged
     * proof: refused with verdict BAD_PROOF */
    ect_keyset *kb = NULL;
    assert_int_equal(ect_keys_load(dir_b, &kb), 0);
    c = raw_open(t, shm, &ch);
    f = (xp_auth_frame){.type = XP_AUTH_RESPONSE};
    memcpy(f.key, kb->pub, ECT_KEY_BYTES);
    memset(f.nonce, 0x5a, sizeof f.nonce);
    memset(f.proof, 0xa5, sizeof f.proof);
    xp_auth_encode(b, &f);
    raw_send(&c, b, sizeof b);
    size_t n = raw_until_eof(&c, got, sizeof got);
    assert_int_equal(n, XP_AUTH_LEN);
    assert_int_equal(xp_auth_decode(got, n, &f), 0);
    assert_int_equal(f.type, XP_AUTH_RESULT);
    assert_int_equal(f.verdict, XP_AUTH_BAD_PROOF);
    ect_keys_free(kb);

    /* a replayed challenge: the target's own frame sent back */
    c = raw_open(t, shm, &ch);
    xp_auth_encode(b, &ch);
    raw_send(&c, b, sizeof b);
    raw_until_eof(&c, got, sizeof got);

    /* silence after the hello: dropped after the io timeout */
    c = raw_open(t, shm, &ch);
    raw_until_eof(&c, got, sizeof got);

    wait_refused(t, 5);
    assert_true(all_zero(r.addr, RLEN));

    /* the target still serves a legitimate initiator */
    b_write_lands(kind, t, &r, 9);
    test_region_close(t, &r);
    ect_xport_close(t);
}

static void t_open_errors(void **state) {
    (void)state;
    ect_xport_opts o;
    ect_xport_opts_init(&o);
    ect_xport *x = (ect_xport *)1;
    char missing[128];
    snprintf(missing, sizeof missing, "%s/none", root);
    o.curve_keys = missing;
    assert_err(ect_xport_open("tcp", &o, &x), ECT_EINVAL, "curve_keys");
    assert_null(x);
    assert_err(ect_xport_open("shm", &o, &x), ECT_EINVAL, "self.secret");
    o.curve_keys = dir_a;
    assert_int_equal(ect_xport_open("ucx", &o, &x), ECT_ENOTSUP);
    assert_null(x);
}

/* The frame's bytes, as docs/PROTOCOL.md shows them. */
static void t_frame_bytes(void **state) {
    (void)state;
    xp_auth_frame f = {.type = XP_AUTH_RESULT, .verdict = XP_AUTH_UNKNOWN_KEY};
    for (int k = 0; k < 32; k++) {
        f.key[k] = (uint8_t)k;
        f.nonce[k] = (uint8_t)(0x40 + k);
        f.proof[k] = (uint8_t)(0x80 + k);
    }
    uint8_t b[XP_AUTH_LEN];
    xp_auth_encode(b, &f);
    char hex[2 * 16 + 1];
    for (int k = 0; k < 16; k++) snprintf(hex + 2 * k, 3, "%02x", b[k]);
    assert_string_equal(hex, "4543544b030001000100000000000000");
    if (!strstr(test_protocol_md(), "45 43 54 4b 03 00 01 00 01 00 00 00 00 00 00 00"))
        fail_msg("docs/PROTOCOL.md lacks the RESULT frame's header bytes");
    assert_int_equal(b[16], 0);
    assert_int_equal(b[48], 0x40);
    assert_int_equal(b[80], 0x80);
    xp_auth_frame g;
    assert_int_equal(xp_auth_decode(b, sizeof b, &g), 0);
    assert_memory_equal(&g.key, &f.key, 96);
    assert_err(xp_auth_decode(b, sizeof b - 1, &g), ECT_EPROTO, "bytes");
    b[6] = 2;
    assert_err(xp_auth_decode(b, sizeof b, &g), ECT_EPROTO, "version");
    b[6] = 1;
    b[8] = 9;
    assert_err(xp_auth_decode(b, sizeof b, &g), ECT_EPROTO, "verdict");
    b[8] = 1;
    b[4] = 7;
    assert_err(xp_auth_decode(b, sizeof b, &g), ECT_EPROTO, "type");
    b[0] = 0;
    assert_err(xp_auth_decode(b, sizeof b, &g), ECT_EPROTO, "magic");
    /* the hellos' auth flags sit where the reserved bytes were */
    uint8_t h[TCP_HELLO_LEN];
    tcp_encode_hello(h, TCP_ROLE_INITIATOR);
    assert_int_equal(tcp_hello_flags(h), 0);
}

#define BOTH(fn) cmocka_unit_test_prestate(fn, "tcp"), cmocka_unit_test_prestate(fn, "shm")

/* Copies key directory from into to (made if missing): a rotation by an
 * operator, the files replaced in place. */
static void copy_keys(const char *from, const char *to) {
    char cmd[1024]; /* 7 paths of < 64 bytes and the commands */
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/accept' && rm -f '%s'/accept/* && cp '%s'/self.* '%s'/ && "
             "cp '%s'/accept/* '%s'/accept/ && chmod 600 '%s'/self.secret",
             to, to, from, to, from, to, to);
    assert_int_equal(system(cmd), 0);
}

/* issue 15's leftover: a role reads its key directory once and its
 * transport uses that very set (xp_open_keyed), not a second read that a
 * rotation in between could make differ. The transport holds its own
 * reference: the caller may drop its one first. */
static void t_open_keyed_shares_set(void **state) {
    const char *kind = *state;
    char rot[128];
    snprintf(rot, sizeof rot, "%s/rot-%s", root, kind);
    copy_keys(dir_a, rot);
    ect_keyset *ks = NULL, *a = NULL;
    assert_int_equal(ect_keys_load(rot, &ks), 0);
    assert_int_equal(ect_keys_load(dir_a, &a), 0);
    copy_keys(dir_c, rot); /* rotated after the role read it */
    ect_xport_opts o;
    ect_xport_opts_init(&o);
    o.io_timeout_ms = 10000;
    o.curve_keys = dir_d; /* ignored: the set given is the transport's */
    uint64_t loads = ect_keys_load_count();
    ect_xport *t = NULL;
    assert_int_equal(xp_open_keyed(kind, &o, ks, &t), 0);
    assert_int_equal(ect_keys_load_count(), loads); /* not read again */
    assert_ptr_equal(t->keys, ks);
    assert_string_equal(t->opts.curve_keys, rot);
    assert_memory_equal(t->keys->pub, a->pub, ECT_KEY_BYTES); /* A's, not the rotated C's */
    /* the public open reads the directory as it is now: C */
    ect_xport *now = open_x(kind, rot, 10000);
    assert_memory_not_equal(now->keys->pub, a->pub, ECT_KEY_BYTES);
    ect_xport_close(now);
    ect_keys_free(ks); /* the role's reference gone: the transport's remains */
    ect_keys_free(a);
    /* B accepts A (the set the transport holds), not C: the write lands */
    region r;
    test_region_open(t, RLEN, &r);
    b_write_lands(kind, t, &r, 3);
    test_region_close(t, &r);
    ect_xport_close(t); /* frees the set (ASan: no leak, no use after free) */
}

/* A failed xp_open_keyed leaves the caller's set as it was: one reference,
 * freed once by the caller (ASan: no leak, no double free). */
static void t_open_keyed_errors(void **state) {
    (void)state;
    ect_keyset *ks = NULL;
    assert_int_equal(ect_keys_load(dir_a, &ks), 0);
    ect_xport *x = (ect_xport *)1;
    assert_int_equal(xp_open_keyed("ucx", NULL, ks, &x), ECT_ENOTSUP); /* before a reference */
    assert_null(x);
    ect_xport_opts o;
    ect_xport_opts_init(&o);
    o.listen = "no-such-host.invalid:1"; /* the back end's open fails after the reference */
    x = (ect_xport *)1;
    assert_true(xp_open_keyed("tcp", &o, ks, &x) < 0);
    assert_null(x);
    assert_int_equal(atomic_load(&ks->extra_refs), 0);
    assert_int_equal(xp_open_keyed("tcp", NULL, NULL, &x), 0); /* no keys: off */
    assert_null(x->keys);
    ect_xport_close(x);
    ect_keys_free(ks);
}

/* Every role that opens a transport reads its key directory once: the load
 * counter moves by one per role open (it moved by two while the transport
 * read the directory again). */
static void t_roles_read_keys_once(void **state) {
    (void)state;
    ect_pull_producer_opts po;
    ect_pull_producer_opts_init(&po);
    po.port = 0;
    po.pool_size = 1u << 20;
    po.curve_keys = dir_a;
    ect_pull_producer *p = NULL;
    uint64_t n0 = ect_keys_load_count();
    assert_int_equal(ect_pull_producer_open(&po, &p), 0);
    assert_int_equal(ect_keys_load_count() - n0, 1);
    assert_non_null(pull_producer_xport(p)->keys);
    assert_string_equal(pull_producer_xport(p)->opts.curve_keys, dir_a);

    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ect_pull_producer_port(p));
    ect_pull_consumer_opts co;
    ect_pull_consumer_opts_init(&co);
    co.producer = addr;
    co.pool_size = 1u << 20;
    co.curve_keys = dir_b;
    ect_pull_consumer *c = NULL;
    n0 = ect_keys_load_count();
    assert_int_equal(ect_pull_consumer_open(&co, &c), 0);
    assert_int_equal(ect_keys_load_count() - n0, 1);
    ect_pull_consumer_close(c);
    ect_pull_producer_close(p);

    ect_push_consumer_opts uo;
    ect_push_consumer_opts_init(&uo);
    uo.ec_port = 0;
    uo.pool_size = 1u << 20;
    uo.curve_keys = dir_a;
    ect_push_consumer *u = NULL;
    n0 = ect_keys_load_count();
    assert_int_equal(ect_push_consumer_open(&uo, &u), 0);
    assert_int_equal(ect_keys_load_count() - n0, 1);

    /* the push producer opens its transport at its first write: one read in
     * all, and the keyed write lands (the consumer requires keys) */
    ect_push_producer_opts ro;
    ect_push_producer_opts_init(&ro);
    ro.staging_size = 1u << 20;
    ro.curve_keys = dir_b;
    ect_push_producer *pr = NULL;
    n0 = ect_keys_load_count();
    assert_int_equal(ect_push_producer_open(&ro, &pr), 0);
    char to[64];
    snprintf(to, sizeof to, "127.0.0.1:%d", ect_push_consumer_port(u));
    uint8_t data[4096];
    test_fill_pattern(data, sizeof data, 9);
    uint64_t shape[1] = {sizeof data / 2};
    ect_push_item it = {.transfer_id = "keys-once",
                        .consumer = to,
                        .mm_hash = "h-keys-once",
                        .shape = shape,
                        .ndim = 1,
                        .dtype = "bfloat16",
                        .nbytes = sizeof data,
                        .data = data};
    assert_int_equal(ect_push_producer_reserve(pr, &it), 0);
    assert_int_equal(ect_push_producer_flush(pr), 1);
    ect_push_result r;
    while (ect_push_producer_poll(pr, &r, 1, 1000) == 0) {
    }
    assert_int_equal(r.status, 0);
    assert_int_equal(ect_keys_load_count() - n0, 1);
    ect_push_producer_close(pr);
    ect_push_consumer_close(u);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        BOTH(t_accepted),
        BOTH(t_initiator_not_accepted),
        BOTH(t_target_not_accepted),
        BOTH(t_keys_on_target_only),
        BOTH(t_keys_on_initiator_only),
        BOTH(t_hostile_handshakes),
        BOTH(t_open_keyed_shares_set),
        cmocka_unit_test(t_open_keyed_errors),
        cmocka_unit_test(t_roles_read_keys_once),
        cmocka_unit_test(t_open_errors),
        cmocka_unit_test(t_frame_bytes),
    };
    return cmocka_run_group_tests(tests, setup_keys, teardown_keys);
}
