/*
 * dtype — the torch dtype table. Names are accepted with or without the
 * "torch." prefix, because upstream code writes both. The table covers every
 * dtype torch can put in an encoder output, float8 variants included, and the
 * aliases torch accepts as attribute names (half, chalf, cfloat, ...).
 */
#include <inttypes.h>
#include <string.h>

#include "util/util.h"
#include "wire/dtype.h"

/* clang-format off */
static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    {"bfloat16", 2},     {"float16", 2},          {"half", 2},
    {"float32", 4},      {"float", 4},            {"float64", 8},
    {"double", 8},       {"float8_e4m3fn", 1},    {"float8_e4m3fnuz", 1},
    {"float8_e5m2", 1},  {"float8_e5m2fnuz", 1},  {"float8_e8m0fnu", 1},
    {"int8", 1},         {"uint8", 1},            {"int16", 2},
    {"short", 2},        {"uint16", 2},           {"int32", 4},
    {"int", 4},          {"uint32", 4},           {"int64", 8},
    {"long", 8},         {"uint64", 8},           {"bool", 1},
    {"complex64", 8},    {"complex128", 16},      {"complex32", 4},
    {"chalf", 4},        {"cfloat", 8},           {"cdouble", 16},
    {"float4_e2m1fn_x2", 1},
};
/* clang-format on */

static const char *strip_prefix(const char *name) {
    return strncmp(name, "torch.", 6) == 0 ? name + 6 : name;
}

const char *wire_dtype_canonical(const char *name) {
    if (!name) return NULL;
    const char *n = strip_prefix(name);
    for (size_t i = 0; i < ECT_ARRAY_LEN(dtypes); i++)
        if (strcmp(n, dtypes[i].name) == 0) return dtypes[i].name;
    return NULL;
}

size_t ect_dtype_size(const char *name) {
    if (!name) return 0;
    const char *n = strip_prefix(name);
    for (size_t i = 0; i < ECT_ARRAY_LEN(dtypes); i++)
        if (strcmp(n, dtypes[i].name) == 0) return dtypes[i].size;
    return 0;
}

int wire_shape_nbytes(const char *dtype, const uint64_t *shape, size_t ndim, uint64_t *nbytes,
                      const char *field) {
    size_t esize = ect_dtype_size(dtype);
    if (esize == 0)
        return ect_set_error(ECT_EINVAL, "%s: Unsupported torch dtype string '%.64s'", field,
                             dtype ? dtype : "(null)");
    if (ndim > WIRE_MAX_NDIM)
        return ect_set_error(ECT_EINVAL, "%s: shape has %zu dimensions, at most %d allowed", field,
                             ndim, WIRE_MAX_NDIM);
    uint64_t n = esize;
    for (size_t i = 0; i < ndim; i++)
        if (!ect_mul_u64(n, shape[i], &n))
            return ect_set_error(ECT_EOVERFLOW, "%s: shape product overflows 64 bits", field);
    *nbytes = n;
    return 0;
}

int wire_check_nbytes(const char *dtype, const uint64_t *shape, size_t ndim, uint64_t nbytes,
                      const char *field) {
    uint64_t want = 0;
    int rc = wire_shape_nbytes(dtype, shape, ndim, &want, field);
    if (rc) return rc;
    if (want != nbytes)
        return ect_set_error(ECT_EINVAL,
                             "%s: shape and dtype do not match nbytes (%" PRIu64
                             " given, shape x dtype gives %" PRIu64 ")",
                             field, nbytes, want);
    return 0;
}
