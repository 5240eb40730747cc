/*
 * Tests for peer_guard: who may act on a reservation made by another peer
 * (owner only for complete and reserve; owner or a trusted address for
 * cancel and status), the trusted list's parsing and its default (this
 * host's exact interface addresses), and the canonical peer form.
 */
#include "testutil.h"
#include "push/peer_guard.h"

static void test_owner_and_trusted(void **state) {
    (void)state;
    peer_guard *g;
    assert_int_equal(pg_open("10.0.0.9, ::1", &g), 0);
    /* The owner may do everything. */
    for (int a = 0; a < PG_N; a++) assert_true(pg_allow(g, (pg_act)a, "10.0.0.1", "10.0.0.1", "t"));
    /* A trusted address may cancel and read status, never complete or reserve. */
    assert_true(pg_allow(g, PG_CANCEL, "10.0.0.9", "10.0.0.1", "t"));
    assert_true(pg_allow(g, PG_STATUS, "::1", "10.0.0.1", "t"));
    assert_false(pg_allow(g, PG_COMPLETE, "10.0.0.9", "10.0.0.1", "t"));
    assert_false(pg_allow(g, PG_RESERVE, "10.0.0.9", "10.0.0.1", "t"));
    /* Anyone else nothing. */
    for (int a = 0; a < PG_N; a++)
        assert_false(pg_allow(g, (pg_act)a, "10.0.0.2", "10.0.0.1", "t"));
    /* No address on both sides (detached, non-tcp): equals, as before. */
    assert_true(pg_allow(g, PG_COMPLETE, "", "", "t"));
    assert_false(pg_allow(g, PG_CANCEL, "", "10.0.0.1", "t"));
    assert_int_equal(pg_refused(g, PG_COMPLETE), 2);
    assert_int_equal(pg_refused(g, PG_CANCEL), 2);
    assert_int_equal(pg_refused(g, PG_STATUS), 1);
    assert_int_equal(pg_refused(g, PG_RESERVE), 2);
    pg_close(g);
}

static void test_lists_and_defaults(void **state) {
    (void)state;
    peer_guard *g = NULL;
    assert_err(pg_open("10.0.0.1,host.example", &g), ECT_EINVAL, "host.example");
    assert_null(g);
    assert_err(pg_open("10.0.0.1,,10.0.0.2", &g), ECT_EINVAL, "bad entry");
    assert_int_equal(pg_open("*", &g), 0); /* everyone trusted; complete still the owner's */
    assert_true(pg_allow(g, PG_CANCEL, "192.0.2.7", "10.0.0.1", "t"));
    assert_false(pg_allow(g, PG_COMPLETE, "192.0.2.7", "10.0.0.1", "t"));
    pg_close(g);
    assert_int_equal(pg_open(NULL, &g), 0); /* this host: 127.0.0.1 yes, 127.0.0.2 no */
    assert_true(pg_allow(g, PG_CANCEL, "127.0.0.1", "10.0.0.1", "t"));
    assert_false(pg_allow(g, PG_CANCEL, "127.0.0.2", "10.0.0.1", "t"));
    pg_close(g);
    pg_close(NULL);
}

static void test_canon(void **state) {
    (void)state;
    char b[64];
    pg_canon("::ffff:127.0.0.1", b, sizeof b);
    assert_string_equal(b, "127.0.0.1");
    pg_canon("::ffff:abcd::1", b, sizeof b); /* not a mapped IPv4: kept */
    assert_string_equal(b, "::ffff:abcd::1");
    pg_canon(NULL, b, sizeof b);
    assert_string_equal(b, "");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_owner_and_trusted),
        cmocka_unit_test(test_lists_and_defaults),
        cmocka_unit_test(test_canon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
