/*
 * test_cli_args — the CLI's flag value parsers (src/cli/args.c, compiled in
 * here): durations with units and each flag's bare unit, sizes, integers,
 * and that every error names the command and the flag.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../src/cli/args.c"

static void test_duration(void **state) {
    (void)state;
    double ms;
    assert_int_equal(cli_duration_ms("500ms", 1000, &ms), 0);
    assert_true(ms == 500);
    assert_int_equal(cli_duration_ms("30s", 1, &ms), 0);
    assert_true(ms == 30000);
    assert_int_equal(cli_duration_ms("2m", 1, &ms), 0);
    assert_true(ms == 120000);
    assert_int_equal(cli_duration_ms("1h", 1, &ms), 0);
    assert_true(ms == 3600000);
    assert_int_equal(cli_duration_ms("1.5s", 1, &ms), 0);
    assert_true(ms == 1500);
    assert_int_equal(cli_duration_ms("250us", 1, &ms), 0);
    assert_true(ms == 0.25);
    /* a bare number keeps the flag's unit */
    assert_int_equal(cli_duration_ms("300", 1000, &ms), 0);
    assert_true(ms == 300000);
    assert_int_equal(cli_duration_ms("300", 1, &ms), 0);
    assert_true(ms == 300);
    assert_int_equal(cli_duration_ms("0.05", 1000, &ms), 0);
    assert_true(ms == 50);
    /* not durations */
    const char *bad[] = {"", "s", "5x", "5 s", "-1s", "1e999", "nan", "5sec", "ms5", "inf"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(cli_duration_ms(bad[i], 1, &ms), -1);
    assert_int_equal(cli_duration_ms(NULL, 1, &ms), -1);
    uint64_t u;
    assert_true(cli_parse_duration_u64("--ttl", "5m", 1000, 1, 86400000, &u));
    assert_int_equal(u, 300000);
    assert_true(cli_parse_duration_u64("--ttl", "300", 1000, 1, 86400000, &u));
    assert_int_equal(u, 300000);
    assert_false(cli_parse_duration_u64("--ttl", "2d", 1000, 1, 86400000, &u));
    assert_false(cli_parse_duration_u64("--ttl", "25h", 1000, 1, 86400000, &u));
    assert_false(cli_parse_duration_u64("--ttl", "0", 1000, 1, 86400000, &u));
    double secs;
    assert_true(cli_parse_seconds("bench xport", "250ms", 0.05, 60, &secs));
    assert_true(secs == 0.25);
    assert_true(cli_parse_seconds("bench xport", "0.5", 0.05, 60, &secs));
    assert_true(secs == 0.5);
    assert_false(cli_parse_seconds("bench xport", "2m", 0.05, 60, &secs));
}

static void test_size_and_int(void **state) {
    (void)state;
    uint64_t v;
    assert_true(cli_parse_size("--pool-size", "64MiB", &v));
    assert_int_equal(v, 64u << 20);
    assert_true(cli_parse_size("--pool-size", "4096", &v));
    assert_int_equal(v, 4096);
    assert_true(cli_parse_size("--pool-size", "2GB", &v));
    assert_int_equal(v, 2000000000ull);
    assert_false(cli_parse_size("--pool-size", "1.5B", &v));
    assert_false(cli_parse_size("--pool-size", "lots", &v));
    assert_true(cli_parse_u64("--tp", "4", 1, 64, &v));
    assert_int_equal(v, 4);
    assert_false(cli_parse_u64("--tp", "65", 1, 64, &v));
    assert_false(cli_parse_u64("--tp", "-1", 1, 64, &v));
    assert_false(cli_parse_u64("--tp", "4k", 1, 64, &v));
}

/* Runs fn with stderr captured; returns what it wrote. */
static char captured[4096];
static void capture(bool (*fn)(void)) {
    fflush(stderr);
    int saved = dup(2);
    char path[] = "/tmp/ect-test-cli-args-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    dup2(fd, 2);
    assert_false(fn());
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, captured, sizeof captured - 1);
    captured[n > 0 ? n : 0] = '\0';
    close(fd);
}
static bool bad_duration(void) {
    uint64_t v;
    return cli_parse_duration_u64("--ttl", "soon", 1000, 1, 1000, &v);
}
static bool bad_range(void) {
    uint64_t v;
    return cli_parse_duration_u64("--timeout", "2h", 1, 1, 3600000, &v);
}
static bool bad_int(void) {
    uint64_t v;
    return cli_parse_u64("--count", "x", 1, 10, &v);
}
static bool bad_size(void) {
    uint64_t v;
    return cli_parse_size("--pool-size", "big", &v);
}

static void test_errors_name_command_and_flag(void **state) {
    (void)state;
    cli_set_command("push-consumer");
    capture(bad_duration);
    assert_non_null(strstr(captured, "ect push-consumer: --ttl: 'soon' is not a duration"));
    assert_non_null(strstr(captured, "bare number is seconds"));
    cli_set_command("pull");
    capture(bad_range);
    assert_non_null(strstr(captured, "ect pull: --timeout: '2h' is outside 1ms..3600s"));
    cli_set_command("bench xport");
    capture(bad_int);
    assert_non_null(strstr(captured, "ect bench xport: --count: 'x' is not an integer in [1, 10]"));
    capture(bad_size);
    assert_non_null(strstr(captured, "ect bench xport: --pool-size: 'big' is not a size"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duration),
        cmocka_unit_test(test_size_and_int),
        cmocka_unit_test(test_errors_name_command_and_flag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
