/*
 * jconf — strict decoding of a role's JSON configuration against the one
 * vocabulary of jconf.h. Every key is checked for its type and a range that
 * its options field can hold; finer rules (ttl_ms > 0, one port above
 * another) stay with each open call's own validation, which names the same
 * key because the options fields carry the same names.
 *
 * jansson decodes with JSON_REJECT_DUPLICATES (two values for one key is a
 * mistake, not "the last wins") and JSON_DISABLE_EOF_CHECK off, so trailing
 * text after the object is refused too.
 */
#include "util/jconf.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "util/util.h"

typedef enum { T_STR, T_INT, T_SECONDS, T_BOOL } jc_type;

typedef struct jc_spec {
    const char *name;
    jc_type type;
    uint64_t min, max; /* T_INT: value range; T_STR: length range; T_SECONDS: max seconds */
} jc_spec;

#define INT_LIM ((uint64_t)INT_MAX)
#define U64_LIM ((uint64_t)INT64_MAX)

static const jc_spec specs[JC_NKEYS] = {
    [JC_EC_IP] = {"ec_ip", T_STR, 1, 255},
    [JC_EC_PORT] = {"ec_port", T_INT, 0, 65535},
    [JC_EC_BUFFER_SIZE] = {"ec_buffer_size", T_INT, 0, 1ull << 62},
    [JC_TP_SIZE] = {"tp_size", T_INT, 1, 64},
    [JC_TP_RANK] = {"tp_rank", T_INT, 0, 63},
    [JC_DP_INDEX] = {"dp_index", T_INT, 0, 65535},
    [JC_CONTROL_TIMEOUT_S] = {"control_timeout_s", T_SECONDS, 0, 3600},
    [JC_PUSH_WAIT_TIMEOUT_S] = {"push_wait_timeout_s", T_SECONDS, 0, 1000000000},
    [JC_EC_BUFFER_DEVICE] = {"ec_buffer_device", T_STR, 1, 31},
    [JC_TRANSPORT] = {"transport", T_STR, 1, 15},
    [JC_XPORT_LISTEN] = {"xport_listen", T_STR, 1, 255},
    [JC_TTL_MS] = {"ttl_ms", T_INT, 0, U64_LIM},
    [JC_PENDING_GRACE_MS] = {"pending_grace_ms", T_INT, 0, U64_LIM},
    [JC_REAP_INTERVAL_MS] = {"reap_interval_ms", T_INT, 0, INT_LIM},
    [JC_MAX_EVENTS] = {"max_events", T_INT, 0, U64_LIM},
    [JC_MAX_TOMBSTONES] = {"max_tombstones", T_INT, 0, U64_LIM},
    [JC_CANCEL_ATTEMPTS] = {"cancel_attempts", T_INT, 0, UINT32_MAX},
    [JC_MIN_DRAIN_INTERVAL_MS] = {"min_drain_interval_ms", T_INT, 0, U64_LIM},
    [JC_ACCEPT_ANY] = {"accept_any", T_BOOL, 0, 0},
    [JC_REFRESH_AFTER_MS] = {"refresh_after_ms", T_INT, 0, U64_LIM},
    [JC_INPUT_WAIT_MS] = {"input_wait_ms", T_INT, 0, U64_LIM},
    [JC_CONNECT_TIMEOUT_MS] = {"connect_timeout_ms", T_INT, 0, INT_LIM},
    [JC_IO_TIMEOUT_MS] = {"io_timeout_ms", T_INT, 0, INT_LIM},
    [JC_LISTEN_HOST] = {"listen_host", T_STR, 1, 255},
    [JC_DOWN_BACKOFF_MS] = {"down_backoff_ms", T_INT, 0, INT_LIM},
    [JC_DOWN_BACKOFF_MAX_MS] = {"down_backoff_max_ms", T_INT, 0, INT_LIM},
    [JC_ALIGNMENT] = {"alignment", T_INT, 0, 1ull << 30},
    [JC_MAX_LANES] = {"max_lanes", T_INT, 0, UINT32_MAX},
    [JC_PAGE_ITEMS] = {"page_items", T_INT, 0, UINT32_MAX},
    [JC_MAX_QUEUED_BYTES] = {"max_queued_bytes", T_INT, 0, U64_LIM},
    [JC_REQUEST_RETRY_MS] = {"request_retry_ms", T_INT, 0, INT_LIM},
    [JC_TIMEOUT_MS] = {"timeout_ms", T_INT, 0, INT_LIM},
    [JC_QUARANTINE_MS] = {"quarantine_ms", T_INT, 0, INT_LIM},
    [JC_STAGING_WAIT_MS] = {"staging_wait_ms", T_INT, 0, U64_LIM},
    [JC_EXPECT_SHARDS] = {"expect_shards", T_INT, 0, 64},
    /* an address: integral reals (doubles) cannot carry one exactly, see decode_value */
    [JC_POOL_MEMORY] = {"pool_memory", T_INT, 1, U64_LIM},
    [JC_ADVERTISE] = {"advertise", T_STR, 1, 255},
    [JC_DATA_PORT] = {"data_port", T_INT, 0, 65535},
    [JC_CURVE_KEYS] = {"curve_keys", T_STR, 1, 4095},
    [JC_EVENT_AUTH] = {"event_auth", T_STR, 1, 15},
    [JC_TRUSTED_PEERS] = {"trusted_peers", T_STR, 1, 4095},
    [JC_RECHECK_MS] = {"recheck_ms", T_INT, 0, U64_LIM},
    /* "*" or IP addresses separated by commas; the producer checks each */
    [JC_CONNECT_ALLOW] = {"connect_allow", T_STR, 1, 4095},
    [JC_MAX_CONNS] = {"max_conns", T_INT, 1, 65536},
    [JC_MAX_CONNS_PER_PEER] = {"max_conns_per_peer", T_INT, 1, 65536},
    [JC_MAX_LANES_PER_PEER] = {"max_lanes_per_peer", T_INT, 1, UINT32_MAX},
};

const char *jc_key_name(jc_key k) { return k < JC_NKEYS ? specs[k].name : "?"; }

int jc_seconds_to_ms(double s) {
    double ms = ceil(s * 1000.0);
    if (!(ms >= 1.0)) return 1; /* also NaN */
    if (ms >= (double)INT32_MAX) return INT32_MAX;
    return (int)ms;
}

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* The role's own keys, for the message that refuses another role's key. */
static void list_keys(const jc_role *role, char *buf, size_t cap) {
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < role->n && off < cap; i++) {
        if (role->keys[i] < JC_NSHARED) continue;
        int n = snprintf(buf + off, cap - off, "%s%s", off ? ", " : "", specs[role->keys[i]].name);
        if (n < 0) break;
        off += (size_t)n;
    }
    if (!buf[0]) snprintf(buf, cap, "none");
}

static int decode_value(const char *role, jc_key k, const json_t *v, jc_val *out) {
    const jc_spec *sp = &specs[k];
    switch (sp->type) {
    case T_STR: {
        if (!json_is_string(v))
            return ect_set_error(ECT_EINVAL, "%s config: key '%s' must be a string, not %s", role,
                                 sp->name, type_name(v));
        size_t len = json_string_length(v);
        if (len < sp->min || len > sp->max || strlen(json_string_value(v)) != len)
            return ect_set_error(ECT_EINVAL,
                                 "%s config: key '%s' must be a string of %llu..%llu bytes "
                                 "without NUL",
                                 role, sp->name, (unsigned long long)sp->min,
                                 (unsigned long long)sp->max);
        out->s = json_string_value(v);
        break;
    }
    case T_INT: {
        uint64_t u;
        if (json_is_integer(v)) {
            json_int_t i = json_integer_value(v);
            if (i < 0 || (uint64_t)i < sp->min || (uint64_t)i > sp->max) goto range;
            u = (uint64_t)i;
        } else if (json_is_real(v) && k != JC_POOL_MEMORY) {
            double d = json_real_value(v);
            if (d != floor(d))
                return ect_set_error(ECT_EINVAL, "%s config: key '%s' must be an integer, not %g",
                                     role, sp->name, d);
            if (d < (double)sp->min || d > (double)sp->max) goto range;
            u = (uint64_t)d;
        } else {
            return ect_set_error(ECT_EINVAL, "%s config: key '%s' must be an integer, not %s", role,
                                 sp->name, type_name(v));
        }
        out->u = u;
        out->i = u <= INT_MAX ? (int)u : INT_MAX;
        break;
    range:
        return ect_set_error(ECT_EINVAL, "%s config: key '%s' must be an integer %llu..%llu", role,
                             sp->name, (unsigned long long)sp->min, (unsigned long long)sp->max);
    }
    case T_SECONDS: {
        if (!json_is_number(v))
            return ect_set_error(ECT_EINVAL,
                                 "%s config: key '%s' must be a number of seconds, not %s", role,
                                 sp->name, type_name(v));
        double d = json_number_value(v);
        if (!(d > 0) || d > (double)sp->max)
            return ect_set_error(ECT_EINVAL,
                                 "%s config: key '%s' must be a number of seconds > 0 and <= %llu",
                                 role, sp->name, (unsigned long long)sp->max);
        out->d = d;
        break;
    }
    case T_BOOL:
        if (!json_is_boolean(v))
            return ect_set_error(ECT_EINVAL, "%s config: key '%s' must be true or false, not %s",
                                 role, sp->name, type_name(v));
        out->b = json_is_true(v);
        break;
    }
    out->set = true;
    return 0;
}

int jc_parse(const char *json, const jc_role *role, jc_val vals[JC_NKEYS], json_t **root) {
    memset(vals, 0, JC_NKEYS * sizeof *vals);
    *root = NULL;
    if (!json) return ect_set_error(ECT_EINVAL, "%s config: NULL text", role->name);
    json_error_t err;
    json_t *obj = json_loads(json, JSON_REJECT_DUPLICATES, &err);
    if (!obj)
        return ect_set_error(ECT_EINVAL, "%s config: not valid JSON (line %d, column %d): %s",
                             role->name, err.line, err.column, err.text);
    *root = obj;
    if (!json_is_object(obj))
        return ect_set_error(ECT_EINVAL, "%s config: must be a JSON object, not %s", role->name,
                             type_name(obj));
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        size_t k = 0;
        while (k < JC_NKEYS && strcmp(specs[k].name, name) != 0) k++;
        if (k == JC_NKEYS)
            return ect_set_error(ECT_EINVAL, "%s config: unknown key '%.64s'", role->name, name);
        bool reads = k < JC_NSHARED;
        for (size_t i = 0; i < role->n && !reads; i++) reads = role->keys[i] == (jc_key)k;
        if (!reads) {
            char own[512];
            list_keys(role, own, sizeof own);
            return ect_set_error(ECT_EINVAL,
                                 "%s config: key '%s' is not an option of the %s (its own keys: "
                                 "%s; and the shared ones)",
                                 role->name, name, role->name, own);
        }
        int rc = decode_value(role->name, (jc_key)k, v, &vals[k]);
        if (rc) return rc;
    }
    return 0;
}
