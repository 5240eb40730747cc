/*
 * Tests for downs (the push producer's unreachable-consumer backoff), against
 * a reference model: per address, the backoff the spec of downs.h gives after
 * k consecutive failures (initial * 2^(k-1), capped), and the time it ends.
 */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "push/downs.h"

static void test_backoff_doubles_and_caps(void **st) {
    (void)st;
    down_table *t = NULL;
    assert_int_equal(down_open(1000, 30000, &t), 0);
    char why[256];
    assert_false(down_blocked(t, "h:1", 0, why, sizeof why));
    uint64_t expect[] = {1000, 2000, 4000, 8000, 16000, 30000, 30000};
    uint64_t now = 5000;
    for (size_t i = 0; i < sizeof expect / sizeof *expect; i++) {
        assert_int_equal(down_fail(t, "h:1", "control h:1: connection refused", now), expect[i]);
        assert_true(down_blocked(t, "h:1", now, why, sizeof why));
        assert_non_null(strstr(why, "consumer h:1 unreachable: control h:1: connection refused"));
        assert_true(down_blocked(t, "h:1", now + expect[i] - 1, NULL, 0));
        assert_false(down_blocked(t, "h:1", now + expect[i], why, sizeof why)); /* the probe */
        now += expect[i];
    }
    assert_false(down_blocked(t, "h:2", now - 1, why, sizeof why)); /* others unaffected */
    assert_int_equal(down_count(t), 1);
    down_ok(t, "h:1");
    assert_int_equal(down_count(t), 0);
    assert_false(down_blocked(t, "h:1", now, why, sizeof why));
    assert_int_equal(down_fail(t, "h:1", "", now), 1000); /* reset by the success */
    assert_true(down_blocked(t, "h:1", now, why, sizeof why));
    assert_non_null(strstr(why, "(no detail)"));
    down_ok(t, "never-down");
    down_close(t);
    down_close(NULL);
}

/* Random operations against the model. */
static void test_model(void **st) {
    (void)st;
    down_table *t = NULL;
    assert_int_equal(down_open(7, 100, &t), 0);
    enum { A = 5 };
    uint64_t seed = 42;
    uint64_t backoff[A] = {0}, until[A] = {0};
    uint64_t now = 0;
    for (int step = 0; step < 20000; step++) {
        int a = (int)(test_rand(&seed) % A);
        char addr[16];
        snprintf(addr, sizeof addr, "a:%d", a);
        now += test_rand(&seed) % 20;
        switch (test_rand(&seed) % 3) {
        case 0:
            backoff[a] = backoff[a] ? (backoff[a] * 2 > 100 ? 100 : backoff[a] * 2) : 7;
            until[a] = now + backoff[a];
            assert_int_equal(down_fail(t, addr, "x", now), backoff[a]);
            break;
        case 1:
            backoff[a] = until[a] = 0;
            down_ok(t, addr);
            break;
        default:
            assert_int_equal(down_blocked(t, addr, now, NULL, 0), backoff[a] && now < until[a]);
        }
        size_t n = 0;
        for (int i = 0; i < A; i++) n += backoff[i] != 0;
        assert_int_equal(down_count(t), n);
    }
    down_close(t);
}

static void test_bad_args(void **st) {
    (void)st;
    down_table *t = (down_table *)&t;
    assert_err(down_open(0, 10, &t), ECT_EINVAL, "initial");
    assert_null(t);
    assert_err(down_open(10, 9, &t), ECT_EINVAL, "max");
    assert_int_equal(down_fail(NULL, "a", "b", 0), 0);
    assert_false(down_blocked(NULL, "a", 0, NULL, 0));
    assert_int_equal(down_count(NULL), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backoff_doubles_and_caps),
        cmocka_unit_test(test_model),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
