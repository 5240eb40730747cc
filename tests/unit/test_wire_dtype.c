/* Tests for wire/dtype: the torch dtype table, both name forms, and the nbytes check. */
#include <stdio.h>

#include "testutil.h"
#include "util/util.h"
#include "wire/dtype.h"

static void test_sizes_in_both_forms(void **state) {
    (void)state;
    static const struct {
        const char *name;
        size_t size;
    } want[] = {
        {"bfloat16", 2},
        {"float16", 2},
        {"half", 2},
        {"float32", 4},
        {"float", 4},
        {"float64", 8},
        {"double", 8},
        {"float8_e4m3fn", 1},
        {"float8_e4m3fnuz", 1},
        {"float8_e5m2", 1},
        {"float8_e5m2fnuz", 1},
        {"float8_e8m0fnu", 1},
        {"int8", 1},
        {"uint8", 1},
        {"int16", 2},
        {"uint16", 2},
        {"int32", 4},
        {"uint32", 4},
        {"int64", 8},
        {"uint64", 8},
        {"bool", 1},
        {"complex64", 8},
        {"complex128", 16},
        {"complex32", 4},
        {"float4_e2m1fn_x2", 1},
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(want); i++) {
        char prefixed[64];
        snprintf(prefixed, sizeof prefixed, "torch.%s", want[i].name);
        assert_int_equal(ect_dtype_size(want[i].name), want[i].size);
        assert_int_equal(ect_dtype_size(prefixed), want[i].size);
        assert_string_equal(wire_dtype_canonical(prefixed), want[i].name);
    }
}

static void test_unknown_names(void **state) {
    (void)state;
    const char *bad[] = {"",         "torch.",    "torch.torch.bfloat16",
                         "BFloat16", "bfloat16 ", "Torch.bfloat16",
                         "float8",   "qint8",     "torch"};
    for (size_t i = 0; i < ECT_ARRAY_LEN(bad); i++) {
        assert_int_equal(ect_dtype_size(bad[i]), 0);
        assert_null(wire_dtype_canonical(bad[i]));
    }
    assert_int_equal(ect_dtype_size(NULL), 0);
    assert_null(wire_dtype_canonical(NULL));
}

static void test_shape_nbytes(void **state) {
    (void)state;
    uint64_t n;
    uint64_t llava[] = {576, 4096};
    assert_int_equal(wire_shape_nbytes("torch.bfloat16", llava, 2, &n, "x"), 0);
    assert_int_equal(n, 4718592);
    /* A scalar is one element; a zero dimension is zero bytes. */
    assert_int_equal(wire_shape_nbytes("float32", NULL, 0, &n, "x"), 0);
    assert_int_equal(n, 4);
    uint64_t empty[] = {3, 0, 5};
    assert_int_equal(wire_shape_nbytes("float64", empty, 3, &n, "x"), 0);
    assert_int_equal(n, 0);
    assert_err(wire_shape_nbytes("bfloat17", llava, 2, &n, "items[2].dtype"), ECT_EINVAL,
               "items[2].dtype: Unsupported torch dtype string");
}

static void test_overflow_is_caught(void **state) {
    (void)state;
    uint64_t n = 7;
    uint64_t big[] = {1ull << 32, 1ull << 31}; /* 2^63 elements: x2 bytes overflows */
    assert_err(wire_shape_nbytes("bfloat16", big, 2, &n, "nbytes"), ECT_EOVERFLOW, "overflows");
    assert_int_equal(n, 7);
    assert_int_equal(wire_shape_nbytes("uint8", big, 2, &n, "nbytes"), 0);
    assert_int_equal(n, 1ull << 63);
    uint64_t wrap[] = {UINT64_MAX, 2};
    assert_err(wire_check_nbytes("int8", wrap, 2, UINT64_MAX - 1, "nbytes"), ECT_EOVERFLOW,
               "nbytes");
    uint64_t dims[WIRE_MAX_NDIM + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    assert_int_equal(wire_shape_nbytes("int8", dims, WIRE_MAX_NDIM, &n, "shape"), 0);
    assert_err(wire_shape_nbytes("int8", dims, WIRE_MAX_NDIM + 1, &n, "shape"), ECT_EINVAL,
               "dimensions");
}

static void test_check_nbytes(void **state) {
    (void)state;
    uint64_t shape[] = {2, 3};
    assert_int_equal(wire_check_nbytes("torch.float8_e5m2", shape, 2, 6, "nbytes"), 0);
    assert_int_equal(wire_check_nbytes("complex128", shape, 2, 96, "nbytes"), 0);
    assert_err(wire_check_nbytes("float16", shape, 2, 6, "nbytes"), ECT_EINVAL,
               "nbytes: shape and dtype do not match nbytes");
    assert_err(wire_check_nbytes("nope", shape, 2, 6, "dtype"), ECT_EINVAL,
               "Unsupported torch dtype string");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes_in_both_forms), cmocka_unit_test(test_unknown_names),
        cmocka_unit_test(test_shape_nbytes),        cmocka_unit_test(test_overflow_is_caught),
        cmocka_unit_test(test_check_nbytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
