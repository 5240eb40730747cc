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

#endif
