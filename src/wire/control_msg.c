/*
 * control_msg — the shared half of the push control codec: the frame check
 * that runs before jansson, the strict field getters every decoder uses, the
 * encoder helpers, and the op names. The requests live in control_req.c, the
 * replies in control_reply.c, the events in control_event.c.
 *
 * Why a pre-scan: jansson refuses an integer beyond int64 as a parse error
 * ("too big integer") that names no field, and only limits nesting at 2048
 * levels. One linear pass over the bytes bounds the nesting at
 * WIRE_CTL_MAX_DEPTH, refuses raw NUL bytes, and finds an out-of-range
 * integer together with its path ("items[3].nbytes"), so the error text can
 * name the field as it does for every other bad value. It does not validate
 * the grammar; jansson does that next.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"
#include "wire/control_msg.h"

static const char *const op_names[] = {
    [WIRE_OP_RESERVE] = "reserve",
    [WIRE_OP_RESERVE_BATCH] = "reserve_batch",
    [WIRE_OP_STATUS] = "status",
    [WIRE_OP_EVENT_PORT] = "event_port",
    [WIRE_OP_PEERS] = "peers",
    [WIRE_OP_COMPLETE] = "complete",
    [WIRE_OP_COMPLETE_BATCH] = "complete_batch",
    [WIRE_OP_CANCEL] = "cancel",
    [WIRE_OP_ECT_STATUS] = "ect_status",
    [WIRE_OP_ECT_PUT] = "ect_put",
    [WIRE_OP_ECT_READY] = "ect_ready",
};

const char *wire_ctl_op_name(wire_ctl_op op) {
    if ((int)op <= 0 || (size_t)op >= ECT_ARRAY_LEN(op_names)) return NULL;
    return op_names[op];
}

/* ------------------------------------------------------------ pre-scan */

#define SCAN_KEY_MAX 48

typedef struct {
    bool array;
    bool want_key; /* object: the next string is a key */
    size_t index;  /* array: index of the current element */
    char key[SCAN_KEY_MAX + 1];
} scan_frame;

/* Writes the path of the value being scanned ("items[3].nbytes"). */
static void scan_path(const scan_frame *st, int depth, char *out, size_t cap) {
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < depth && n < cap; i++) {
        int w;
        if (st[i].array)
            w = snprintf(out + n, cap - n, "[%zu]", st[i].index);
        else
            w = snprintf(out + n, cap - n, "%s%s", n ? "." : "", st[i].key);
        if (w < 0) break;
        n += (size_t)w;
    }
    if (n == 0) snprintf(out, cap, "(top level)");
}

/* Parses the integer literal p[0..n) (optional '-', digits) and reports
 * whether it fits json_int_t (int64). */
static bool int_fits(const char *p, size_t n) {
    bool neg = n > 0 && p[0] == '-';
    uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (size_t i = neg ? 1 : 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return true; /* not an integer: jansson judges it */
        uint64_t d = (uint64_t)(p[i] - '0');
        if (v > (lim - d) / 10) return false;
        v = v * 10 + d;
    }
    return true;
}

static int prescan(const char *p, size_t len) {
    scan_frame st[WIRE_CTL_MAX_DEPTH];
    int depth = 0;
    for (size_t i = 0; i < len; i++) {
        char c = p[i];
        if (c == '\0') return ect_set_error(ECT_EPROTO, "NUL byte at offset %zu", i);
        if (c == '"') {
            bool is_key = depth > 0 && !st[depth - 1].array && st[depth - 1].want_key;
            size_t k = 0, j = i + 1;
            for (; j < len && p[j] != '"'; j++) {
                if (p[j] == '\0') return ect_set_error(ECT_EPROTO, "NUL byte at offset %zu", j);
                if (p[j] == '\\' && j + 1 < len) {
                    if (p[j + 1] == '\0')
                        return ect_set_error(ECT_EPROTO, "NUL byte at offset %zu", j + 1);
                    if (is_key && k + 2 <= SCAN_KEY_MAX) {
                        st[depth - 1].key[k++] = p[j];
                        st[depth - 1].key[k++] = p[j + 1];
                    }
                    j++;
                    continue;
                }
                if (is_key && k < SCAN_KEY_MAX) st[depth - 1].key[k++] = p[j];
            }
            if (is_key) {
                st[depth - 1].key[k] = '\0';
                st[depth - 1].want_key = false;
            }
            i = j; /* at the closing quote, or len when unterminated */
            continue;
        }
        switch (c) {
        case '{':
        case '[':
            if (depth == WIRE_CTL_MAX_DEPTH)
                return ect_set_error(ECT_EPROTO, "nesting deeper than %d levels",
                                     WIRE_CTL_MAX_DEPTH);
            st[depth].array = c == '[';
            st[depth].want_key = c == '{';
            st[depth].index = 0;
            st[depth].key[0] = '\0';
            depth++;
            break;
        case '}':
        case ']':
            if (depth > 0) depth--;
            break;
        case ',':
            if (depth > 0) {
                if (st[depth - 1].array)
                    st[depth - 1].index++;
                else
                    st[depth - 1].want_key = true;
            }
            break;
        default:
            if (c == '-' || (c >= '0' && c <= '9')) {
                size_t j = i;
                while (j < len && (p[j] == '-' || p[j] == '+' || p[j] == '.' || p[j] == 'e' ||
                                   p[j] == 'E' || (p[j] >= '0' && p[j] <= '9')))
                    j++;
                if (!int_fits(p + i, j - i)) {
                    char path[256];
                    scan_path(st, depth, path, sizeof path);
                    return ect_set_error(ECT_EINVAL,
                                         "%s: integer out of range (beyond 64-bit signed)", path);
                }
                i = j - 1;
            }
            break;
        }
    }
    return 0;
}

int wctl_load(const void *buf, size_t len, json_t **out) {
    *out = NULL;
    if (!buf && len) return ect_set_error(ECT_EINVAL, "NULL buffer");
    if (len > WIRE_CTL_MAX_FRAME)
        return ect_set_error(ECT_EPROTO, "frame of %zu bytes exceeds %u", len,
                             (unsigned)WIRE_CTL_MAX_FRAME);
    int rc = prescan(buf, len);
    if (rc) return rc;
    json_error_t jerr;
    json_t *root = json_loadb(len ? buf : "", len, JSON_REJECT_DUPLICATES, &jerr);
    /* jansson leaves the text empty when its lexer's first buffer cannot be
     * allocated, and says "out of memory" for later allocations. */
    if (!root && (json_error_code(&jerr) == json_error_out_of_memory || jerr.text[0] == '\0'))
        return ect_set_error(ECT_ENOMEM, "out of memory parsing JSON");
    if (!root)
        return ect_set_error(ECT_EPROTO, "not JSON: %s at byte %d", jerr.text, jerr.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return ect_set_error(ECT_EPROTO, "not a JSON object");
    }
    *out = root;
    return 0;
}

int wctl_dump(json_t *root, char **out) {
    *out = NULL;
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!s) return ect_set_error(ECT_ENOMEM, "out of memory encoding JSON");
    *out = s;
    return 0;
}

const char *wctl_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "real";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* ------------------------------------------------------------- getters */

/* Looks up key; a missing required key is an error, a missing optional one
 * leaves *v NULL. */
static int lookup(const json_t *obj, const char *pfx, const char *key, bool required, json_t **v) {
    *v = json_object_get(obj, key);
    if (!*v && required) return ect_set_error(ECT_EINVAL, "%s%s: missing", pfx, key);
    return 0;
}

static int str_value(const json_t *v, const char *pfx, const char *key, bool nonempty, size_t max,
                     size_t *lenp) {
    if (!json_is_string(v))
        return ect_set_error(ECT_EINVAL, "%s%s: expected a string, got %s", pfx, key,
                             wctl_type_name(v));
    size_t n = json_string_length(v);
    if (n > max)
        return ect_set_error(ECT_EINVAL, "%s%s: %zu bytes, longer than the %zu allowed", pfx, key,
                             n, max);
    if (nonempty && n == 0) return ect_set_error(ECT_EINVAL, "%s%s: must not be empty", pfx, key);
    *lenp = n;
    return 0;
}

int wctl_get_str(const json_t *obj, const char *pfx, const char *key, bool required, bool nonempty,
                 size_t max, char *dst) {
    json_t *v;
    size_t n = 0;
    dst[0] = '\0';
    int rc = lookup(obj, pfx, key, required, &v);
    if (rc || !v) return rc;
    if ((rc = str_value(v, pfx, key, nonempty, max, &n))) return rc;
    memcpy(dst, json_string_value(v), n + 1);
    return 0;
}

int wctl_get_str_dup(const json_t *obj, const char *pfx, const char *key, bool required, size_t max,
                     char **dst) {
    json_t *v;
    size_t n = 0;
    *dst = NULL;
    int rc = lookup(obj, pfx, key, required, &v);
    if (rc || !v) return rc;
    if ((rc = str_value(v, pfx, key, false, max, &n))) return rc;
    char *s = malloc(n + 1);
    if (!s) return ect_set_error(ECT_ENOMEM, "%s%s: out of memory", pfx, key);
    memcpy(s, json_string_value(v), n + 1);
    *dst = s;
    return 0;
}

static int u64_value(const json_t *v, const char *pfx, const char *name, uint64_t *dst) {
    if (!json_is_integer(v))
        return ect_set_error(ECT_EINVAL, "%s%s: expected a non-negative integer, got %s", pfx, name,
                             wctl_type_name(v));
    json_int_t i = json_integer_value(v);
    if (i < 0)
        return ect_set_error(ECT_EINVAL,
                             "%s%s: expected a non-negative integer, got %" JSON_INTEGER_FORMAT,
                             pfx, name, i);
    *dst = (uint64_t)i;
    return 0;
}

int wctl_get_u64(const json_t *obj, const char *pfx, const char *key, bool required,
                 uint64_t *dst) {
    json_t *v;
    *dst = 0;
    int rc = lookup(obj, pfx, key, required, &v);
    if (rc || !v) return rc;
    return u64_value(v, pfx, key, dst);
}

int wctl_get_bool(const json_t *obj, const char *pfx, const char *key, bool required, bool *dst) {
    json_t *v;
    *dst = false;
    int rc = lookup(obj, pfx, key, required, &v);
    if (rc || !v) return rc;
    if (!json_is_boolean(v))
        return ect_set_error(ECT_EINVAL, "%s%s: expected a boolean, got %s", pfx, key,
                             wctl_type_name(v));
    *dst = json_is_true(v);
    return 0;
}

int wctl_port_value(const json_t *v, const char *pfx, const char *name, uint16_t *dst) {
    if (!json_is_integer(v))
        return ect_set_error(ECT_EINVAL, "%s%s: expected a port number, got %s", pfx, name,
                             wctl_type_name(v));
    json_int_t i = json_integer_value(v);
    if (i < 1 || i > 65535)
        return ect_set_error(ECT_EINVAL, "%s%s: port %" JSON_INTEGER_FORMAT " outside 1..65535",
                             pfx, name, i);
    *dst = (uint16_t)i;
    return 0;
}

int wctl_get_port(const json_t *obj, const char *pfx, const char *key, uint16_t *dst) {
    json_t *v;
    *dst = 0;
    int rc = lookup(obj, pfx, key, true, &v);
    if (rc) return rc;
    return wctl_port_value(v, pfx, key, dst);
}

/* nbytes, shape and dtype, then the check that they agree. */
int wctl_get_tensor(const json_t *obj, const char *pfx, wire_tensor *t) {
    memset(t, 0, sizeof *t);
    int rc = wctl_get_u64(obj, pfx, "nbytes", true, &t->nbytes);
    if (rc) return rc;
    json_t *shape;
    if ((rc = lookup(obj, pfx, "shape", true, &shape))) return rc;
    if (!json_is_array(shape))
        return ect_set_error(ECT_EINVAL, "%sshape: expected an array, got %s", pfx,
                             wctl_type_name(shape));
    size_t ndim = json_array_size(shape);
    if (ndim > WIRE_MAX_NDIM)
        return ect_set_error(ECT_EINVAL, "%sshape: %zu dimensions, at most %d allowed", pfx, ndim,
                             WIRE_MAX_NDIM);
    for (size_t i = 0; i < ndim; i++) {
        char name[32];
        snprintf(name, sizeof name, "shape[%zu]", i);
        if ((rc = u64_value(json_array_get(shape, i), pfx, name, &t->shape[i]))) return rc;
    }
    t->ndim = (uint32_t)ndim;
    if ((rc = wctl_get_str(obj, pfx, "dtype", true, true, WIRE_DTYPE_MAX, t->dtype))) return rc;
    char field[WIRE_ITEM_ERROR_MAX];
    snprintf(field, sizeof field, "%sdtype", pfx);
    if (!wire_dtype_canonical(t->dtype))
        return ect_set_error(ECT_EINVAL, "%s: Unsupported torch dtype string '%s'", field,
                             t->dtype);
    snprintf(field, sizeof field, "%snbytes", pfx);
    return wire_check_nbytes(t->dtype, t->shape, t->ndim, t->nbytes, field);
}

/* ------------------------------------------------------------- putters */

void wctl_put_new(json_t *obj, const char *key, json_t *v, int *rc) {
    if (*rc) {
        json_decref(v);
        return;
    }
    /* json_object_set_new releases v itself when it fails. */
    if (!v || json_object_set_new(obj, key, v))
        *rc = ect_set_error(ECT_ENOMEM, "%s: out of memory encoding JSON", key);
}

/* Length of the valid UTF-8 sequence at p (jansson's rules: no overlongs,
 * surrogates or code points above U+10FFFF), or 0 if it is not one. */
size_t wctl_utf8_seq(const unsigned char *p) {
    unsigned char c = p[0];
    size_t k = c < 0x80                 ? 1
               : c >= 0xC2 && c <= 0xDF ? 2
               : c >= 0xE0 && c <= 0xEF ? 3
               : c >= 0xF0 && c <= 0xF4 ? 4
                                        : 0;
    for (size_t j = 1; j < k; j++)
        if ((p[j] & 0xC0) != 0x80) return 0;
    if (k >= 3) {
        unsigned char d = p[1];
        if ((c == 0xE0 && d < 0xA0) || (c == 0xED && d >= 0xA0) || (c == 0xF0 && d < 0x90) ||
            (c == 0xF4 && d >= 0x90))
            return 0;
    }
    return k;
}

static bool utf8_valid(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        size_t k = wctl_utf8_seq(p);
        if (!k) return false;
        p += k;
    }
    return true;
}

/* Copies the longest prefix of s (at most cap - 1 bytes) that ends on a
 * character boundary, each invalid UTF-8 byte replaced by '?'. */
static void utf8_clean(const char *s, char *out, size_t cap) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (p[i] && o + 1 < cap) {
        size_t k = wctl_utf8_seq(p + i);
        if (!k) {
            out[o++] = '?';
            i++;
            continue;
        }
        if (o + k >= cap) break;
        memcpy(out + o, p + i, k);
        o += k;
        i += k;
    }
    out[o] = '\0';
}

void wctl_put_str(json_t *obj, const char *key, const char *s, size_t max, bool nonempty, int *rc) {
    if (*rc) return;
    if (!s) s = "";
    size_t n = strnlen(s, max + 1);
    if (n > max) {
        *rc = ect_set_error(ECT_EINVAL, "%s: longer than the %zu bytes allowed", key, max);
        return;
    }
    if (nonempty && n == 0) {
        *rc = ect_set_error(ECT_EINVAL, "%s: must not be empty", key);
        return;
    }
    json_t *v = json_stringn(s, n);
    if (!v) {
        *rc = utf8_valid(s) ? ect_set_error(ECT_ENOMEM, "%s: out of memory encoding JSON", key)
                            : ect_set_error(ECT_EINVAL, "%s: not valid UTF-8", key);
        return;
    }
    wctl_put_new(obj, key, v, rc);
}

void wctl_put_text(json_t *obj, const char *key, const char *s, int *rc) {
    if (*rc) return;
    char *clean = malloc(WIRE_ERROR_MAX + 1);
    if (!clean) {
        *rc = ect_set_error(ECT_ENOMEM, "%s: out of memory encoding JSON", key);
        return;
    }
    utf8_clean(s ? s : "", clean, WIRE_ERROR_MAX + 1);
    wctl_put_new(obj, key, json_string(clean), rc);
    free(clean);
}

void wctl_put_u64(json_t *obj, const char *key, uint64_t v, int *rc) {
    if (*rc) return;
    if (v > (uint64_t)INT64_MAX) {
        *rc = ect_set_error(ECT_ERANGE, "%s: %" PRIu64 " exceeds the JSON integer range", key, v);
        return;
    }
    wctl_put_new(obj, key, json_integer((json_int_t)v), rc);
}

void wctl_put_bool(json_t *obj, const char *key, bool v, int *rc) {
    if (*rc) return;
    wctl_put_new(obj, key, json_boolean(v), rc);
}

void wctl_put_tensor(json_t *obj, const wire_tensor *t, int *rc) {
    if (*rc) return;
    if (t->ndim > WIRE_MAX_NDIM) {
        *rc = ect_set_error(ECT_EINVAL, "shape: %u dimensions, at most %d allowed",
                            (unsigned)t->ndim, WIRE_MAX_NDIM);
        return;
    }
    if (!wire_dtype_canonical(t->dtype)) {
        *rc = ect_set_error(ECT_EINVAL, "dtype: Unsupported torch dtype string '%.64s'", t->dtype);
        return;
    }
    if ((*rc = wire_check_nbytes(t->dtype, t->shape, t->ndim, t->nbytes, "nbytes"))) return;
    wctl_put_u64(obj, "nbytes", t->nbytes, rc);
    json_t *shape = json_array();
    for (uint32_t i = 0; shape && i < t->ndim && !*rc; i++) {
        if (t->shape[i] > (uint64_t)INT64_MAX)
            *rc =
                ect_set_error(ECT_ERANGE, "shape[%u]: exceeds the JSON integer range", (unsigned)i);
        else if (json_array_append_new(shape, json_integer((json_int_t)t->shape[i])))
            *rc = ect_set_error(ECT_ENOMEM, "shape: out of memory encoding JSON");
    }
    wctl_put_new(obj, "shape", shape, rc);
    wctl_put_str(obj, "dtype", t->dtype, WIRE_DTYPE_MAX, true, rc);
}

/* ------------------------------------------------------ error replies */

int wire_ctl_encode_error(const char *text, char **out) {
    *out = NULL;
    json_t *o = json_object();
    if (!o) return ect_set_error(ECT_ENOMEM, "out of memory encoding JSON");
    int rc = 0;
    wctl_put_bool(o, "ok", false, &rc);
    wctl_put_text(o, "error", text, &rc);
    if (rc) {
        json_decref(o);
        return rc;
    }
    return wctl_dump(o, out);
}

int wire_ctl_encode_decode_failure(int rc, char **out) {
    if (rc == ECT_EPROTO || rc == 0) return wire_ctl_encode_error(WIRE_CTL_MALFORMED, out);
    /* Copy first: encoding may itself set a new detail. */
    char text[WIRE_ERROR_MAX];
    snprintf(text, sizeof text, "%s", ect_last_error());
    return wire_ctl_encode_error(text, out);
}
