/*
 * testutil — helpers shared by the cmocka test programs. Include after
 * <cmocka.h>'s prerequisites; every test file starts with testutil.h.
 */
#ifndef ECT_TESTUTIL_H
#define ECT_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ectransfer.h"

/* Asserts rc == expected and, when msg_part is not NULL, that
 * ect_last_error() contains msg_part (the error names the field). */
#define assert_err(rc, expected, msg_part)                                                         \
    test_assert_err((rc), (expected), (msg_part), __FILE__, __LINE__)
void test_assert_err(int rc, int expected, const char *msg_part, const char *file, int line);

/* Deterministic PRNG for reproducible random tests (splitmix64). */
uint64_t test_rand(uint64_t *state);

/* Fills buf with bytes derived from seed; test_check_pattern verifies them. */
void test_fill_pattern(void *buf, size_t n, uint64_t seed);
int test_check_pattern(const void *buf, size_t n, uint64_t seed);

/* The text of docs/PROTOCOL.md ($ECT_SOURCE_DIR, else found from this
 * source file's path), NUL-terminated; fails the test when unreadable. Static
 * storage: valid until the next call. */
const char *test_protocol_md(void);

/* Makes key directory dir accept the public key of key directory from
 * (made by ect_keygen): copies from/self.public to dir/accept/<name>.public;
 * fails the test when either file cannot be opened or written. */
void test_accept_key(const char *dir, const char *name, const char *from);

/* A memfd-backed region of len bytes, zeroed, registered with the data plane
 * x (its key in key): what the data-plane tests write into. */
typedef struct test_region {
    uint8_t *addr;
    size_t len;
    int fd;
    char key[ECT_XPORT_KEY_MAX];
} test_region;
void test_region_open(ect_xport *x, size_t len, test_region *r);
/* Unregisters r from x (NULL: already unregistered), unmaps and closes it. */
void test_region_close(ect_xport *x, test_region *r);

/* Sleeps ms milliseconds (a poll's pause, never a wait for an event). */
void test_nap_ms(int ms);

/* How many threads of this process are named `name` right now
 * (/proc/self/task/N/comm). */
int test_threads_named(const char *name);

/* ---- push tests: a consumer instance and a producer of raw control calls */

#define TEST_MAXTP 4

typedef struct test_inst {
    ect_push_consumer *c[TEST_MAXTP];
    int tp, base;
} test_inst;

/* Opens tp shards (ranks 0..tp-1 of one instance, tp <= TEST_MAXTP) with the
 * options *tmpl (its ec_port, tp_size and tp_rank are set here) on
 * consecutive control ports from a random base in 20000..49999, trying
 * another base (50 at most) when one of the ports is taken (ECT_EEXIST). Any
 * other error, a shard not on base + rank, or no free range fails the test. */
void test_inst_open(test_inst *in, int tp, const ect_push_consumer_opts *tmpl);

/* Drops every shard's resident items, asserts no pool bytes in use and no
 * live reservation, and closes the shards. */
void test_inst_close_checked(test_inst *in);

struct ctl_client; /* push/control_client.h */

typedef struct test_prod {
    void *zctx;
    struct ctl_client *cli;
    ect_xport *xp;
    int ports[TEST_MAXTP];
    size_t n;
} test_prod;

/* A test producer: a control client (ctl_timeout_ms per call) and a
 * transport of kind transport, with the ports of the n shards of the instance
 * at 127.0.0.1:base discovered. Fails the test on any error. */
void test_prod_open(test_prod *p, int base, const char *transport, int ctl_timeout_ms);
void test_prod_close(test_prod *p);

#endif
