/* `ect demo`'s reading of its children's JSON lines (src/cli/demo_line.c,
 * compiled in here): every field reads as jansson reads it, whether the line
 * was read in place or went to json_loads, and a line that is not one JSON
 * object is refused and left as it was. */
#include <string.h>

#include "testutil.h"

#include "cli/cli.h"
#include "cli/demo_line.c"

static const char *const keys[] = {"transfer_id", "mm_hash", "nbytes", "checksum", "status",
                                   "latency_ms",  "retries", "shape",  "event",    "port",
                                   "absent",      "e",       "neg"};

/* Every key of `keys` reads from l as jansson reads it from text. */
static void same_as_jansson(const char *text, const demo_line *l) {
    json_t *o = json_loads(text, 0, NULL);
    assert_non_null(o);
    for (size_t i = 0; i < CLI_ARRAY_LEN(keys); i++) {
        json_t *v = json_object_get(o, keys[i]);
        const char *s = json_string_value(v);
        assert_string_equal(demo_line_str(l, keys[i]), s ? s : "");
        assert_true(demo_line_num(l, keys[i]) == json_number_value(v));
        assert_int_equal(demo_line_int(l, keys[i]), json_integer_value(v));
    }
    json_decref(o);
}

static void test_lines_read_as_jansson_reads_them(void **state) {
    (void)state;
    const char *lines[] = {
        /* ect push, ect push-consumer, the ready event: read in place */
        ("{\"transfer_id\":\"push-1-ab-7\",\"mm_hash\":\"xxh3-00ff-bfloat16-16x4096\","
         "\"nbytes\":131072,\"checksum\":\"0123456789abcdef\",\"status\":\"ok\",\"state\":"
         "\"done\",\"latency_ms\":3.25,\"shards\":1,\"transport\":\"tcp\",\"retries\":0}"),
        ("{\"transfer_id\":\"t\",\"nbytes\":1,\"shape\":[16,4096],\"dtype\":\"bfloat16\","
         "\"checksum\":\"00\",\"status\":\"ok\"}"),
        "{\"event\":\"ready\",\"port\":5555,\"data_ports\":[],\"ok\":true,\"x\":null}",
        " { \"retries\" : 2 , \"latency_ms\" : -1.5e2, \"e\": 0, \"neg\": -7 } ",
        "{}",
        /* escapes and nested objects: through json_loads */
        "{\"status\":\"pool \\\"full\\\"\\n\",\"transfer_id\":\"\\u00e9\",\"retries\":3}",
        "{\"shape\":{\"a\":1},\"nbytes\":5,\"latency_ms\":2}",
        "{\"shape\":[[1],2],\"port\":1e3}",
    };
    for (size_t i = 0; i < CLI_ARRAY_LEN(lines); i++) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", lines[i]);
        demo_line l;
        assert_true(demo_line_parse(buf, &l));
        same_as_jansson(lines[i], &l);
        assert_true((l.o == NULL) == (i < 5)); /* the common lines allocate nothing */
        demo_line_free(&l);
    }
}

/* `ect push` prints latency_ms through jansson, which writes a real with 17
 * significant digits: such a line is read in place (it went to json_loads
 * before, one line in two of the demo's), to the same double; an integer
 * longer than 15 digits still goes to json_loads. */
static void test_jansson_reals_read_in_place(void **state) {
    (void)state;
    const double vals[] = {3.891234, 0.0012345678901234567, 123456.78901234567, 1e-7, -2.5e17,
                           1.0 / 3.0};
    for (size_t i = 0; i < CLI_ARRAY_LEN(vals); i++) {
        json_t *o = json_object();
        json_object_set_new(o, "latency_ms", json_real(vals[i]));
        json_object_set_new(o, "retries", json_integer(1));
        char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(o);
        assert_non_null(text);
        char buf[128];
        snprintf(buf, sizeof buf, "%s", text);
        demo_line l;
        assert_true(demo_line_parse(buf, &l));
        if (l.o) fail_msg("'%s' went to json_loads", text);
        same_as_jansson(text, &l);
        assert_true(demo_line_num(&l, "latency_ms") == vals[i]);
        demo_line_free(&l);
        free(text);
    }
    char big[] = "{\"nbytes\":1234567890123456}"; /* 16 digits: jansson's integer */
    demo_line l;
    assert_true(demo_line_parse(big, &l));
    assert_non_null(l.o);
    assert_int_equal(demo_line_int(&l, "nbytes"), 1234567890123456);
    demo_line_free(&l);
}

static void test_other_lines_are_refused_untouched(void **state) {
    (void)state;
    const char *lines[] = {"",           "{",           "{\"a\":1",    "{\"a\":1}x", "{\"a\":01}",
                           "{\"a\":1.}", "{\"a\":-}",   "{\"a\" 1}",   "{\"a\":1,}", "[1,2]",
                           "\"s\"",      "{\"a\":tru}", "{\"a\":\"b}", "plain text", "{\"a\":[1,}"};
    for (size_t i = 0; i < CLI_ARRAY_LEN(lines); i++) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", lines[i]);
        demo_line l;
        if (demo_line_parse(buf, &l)) fail_msg("accepted '%s'", lines[i]);
        assert_string_equal(buf, lines[i]); /* printed as it came */
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_lines_read_as_jansson_reads_them),
                                       cmocka_unit_test(test_jansson_reals_read_in_place),
                                       cmocka_unit_test(test_other_lines_are_refused_untouched)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
