/* Tests for util: error codes and detail, ids, clock, checked arithmetic, logging level. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>

#include "testutil.h"
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strerror_covers_every_code),
        cmocka_unit_test(test_last_error_is_per_call_and_thread_local),
        cmocka_unit_test(test_random_ids_are_32_hex_and_distinct),
        cmocka_unit_test(test_clock_is_monotonic),
        cmocka_unit_test(test_checked_arithmetic),
        cmocka_unit_test(test_log_level_from_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
