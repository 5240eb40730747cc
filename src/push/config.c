/*
 * config — JSON configurations of the three push roles. Each role lists the
 * keys it reads; jc_parse refuses the rest (shared keys excepted) and checks
 * types and ranges; the mapping below then fills the role's options struct,
 * whose own validation at open covers the finer rules.
 *
 * Names follow upstream where it has one: ec_buffer_size is the pool a role
 * registers (the consumer's receive pool, the producer's staging pool);
 * control_timeout_s and push_wait_timeout_s are seconds converted to
 * milliseconds the way upstream does (max(1, ceil(s x 1000))).
 */
#include "push/config.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "util/jconf.h"
#include "util/util.h"

static const jc_key consumer_keys[] = {
    JC_XPORT_LISTEN, JC_TTL_MS,         JC_PENDING_GRACE_MS,   JC_REAP_INTERVAL_MS,
    JC_MAX_EVENTS,   JC_MAX_TOMBSTONES, JC_POOL_MEMORY,        JC_ADVERTISE,
    JC_DATA_PORT,    JC_MAX_CONNS,      JC_MAX_CONNS_PER_PEER, JC_TRUSTED_PEERS,
    JC_CURVE_KEYS,   JC_EVENT_AUTH,
};
static const jc_role consumer_role = {"push consumer", consumer_keys, ECT_ARRAY_LEN(consumer_keys)};

static const jc_key scheduler_keys[] = {
    JC_TTL_MS,     JC_MAX_TOMBSTONES, JC_CANCEL_ATTEMPTS, JC_MIN_DRAIN_INTERVAL_MS,
    JC_ACCEPT_ANY, JC_RECHECK_MS,     JC_CURVE_KEYS,
};
static const jc_role scheduler_role = {"push scheduler", scheduler_keys,
                                       ECT_ARRAY_LEN(scheduler_keys)};

static const jc_key producer_keys[] = {
    JC_REFRESH_AFTER_MS,    JC_INPUT_WAIT_MS,   JC_TTL_MS,        JC_MAX_TOMBSTONES,
    JC_CONNECT_TIMEOUT_MS,  JC_IO_TIMEOUT_MS,   JC_LISTEN_HOST,   JC_DOWN_BACKOFF_MS,
    JC_DOWN_BACKOFF_MAX_MS, JC_STAGING_WAIT_MS, JC_EXPECT_SHARDS, JC_CURVE_KEYS,
};
static const jc_role producer_role = {"push producer", producer_keys, ECT_ARRAY_LEN(producer_keys)};

int push_consumer_config(const char *json, ect_push_consumer_opts *o, json_t **root) {
    ect_push_consumer_opts_init(o);
    jc_val v[JC_NKEYS];
    int rc = jc_parse(json, &consumer_role, v, root);
    if (rc) return rc;
    if (v[JC_EC_IP].set) o->ec_ip = v[JC_EC_IP].s;
    if (v[JC_EC_PORT].set) o->ec_port = v[JC_EC_PORT].i;
    if (v[JC_TP_SIZE].set) o->tp_size = v[JC_TP_SIZE].i;
    if (v[JC_TP_RANK].set) o->tp_rank = v[JC_TP_RANK].i;
    if (v[JC_DP_INDEX].set) o->dp_index = v[JC_DP_INDEX].i;
    if (v[JC_EC_BUFFER_SIZE].set) {
        if (!v[JC_EC_BUFFER_SIZE].u)
            return ect_set_error(ECT_EINVAL,
                                 "push consumer config: key 'ec_buffer_size' must be > 0");
        o->pool_size = v[JC_EC_BUFFER_SIZE].u;
    }
    if (v[JC_TRANSPORT].set) o->transport = v[JC_TRANSPORT].s;
    if (v[JC_EC_BUFFER_DEVICE].set) o->pool_device = v[JC_EC_BUFFER_DEVICE].s;
    if (v[JC_XPORT_LISTEN].set) o->xport_listen = v[JC_XPORT_LISTEN].s;
    if (v[JC_TTL_MS].set) o->ttl_ms = v[JC_TTL_MS].u;
    if (v[JC_PENDING_GRACE_MS].set) o->pending_grace_ms = v[JC_PENDING_GRACE_MS].u;
    if (v[JC_REAP_INTERVAL_MS].set) o->reap_interval_ms = v[JC_REAP_INTERVAL_MS].i;
    if (v[JC_MAX_EVENTS].set) o->max_events = (size_t)v[JC_MAX_EVENTS].u;
    if (v[JC_MAX_TOMBSTONES].set) o->max_tombstones = (size_t)v[JC_MAX_TOMBSTONES].u;
    if (v[JC_POOL_MEMORY].set) o->pool_memory = (void *)(uintptr_t)v[JC_POOL_MEMORY].u;
    if (v[JC_ADVERTISE].set) o->advertise = v[JC_ADVERTISE].s;
    if (v[JC_DATA_PORT].set) o->data_port = v[JC_DATA_PORT].i;
    if (v[JC_CURVE_KEYS].set) o->curve_keys = v[JC_CURVE_KEYS].s;
    if (v[JC_EVENT_AUTH].set) {
        const char *e = v[JC_EVENT_AUTH].s;
        if (strcmp(e, "none") != 0 && strcmp(e, "secret") != 0)
            return ect_set_error(ECT_EINVAL,
                                 "push consumer config: key 'event_auth' must be \"secret\" "
                                 "(the default) or \"none\" (for an upstream scheduler), not "
                                 "'%.15s'",
                                 e);
        o->event_auth_off = strcmp(e, "none") == 0;
    }
    if (v[JC_TRUSTED_PEERS].set) o->trusted_peers = v[JC_TRUSTED_PEERS].s;
    if (v[JC_MAX_CONNS].set) o->max_conns = v[JC_MAX_CONNS].i;
    if (v[JC_MAX_CONNS_PER_PEER].set) o->max_conns_per_peer = v[JC_MAX_CONNS_PER_PEER].i;
    return 0;
}

int push_scheduler_config(const char *json, ect_push_scheduler_opts *o, json_t **root) {
    ect_push_scheduler_opts_init(o);
    jc_val v[JC_NKEYS];
    int rc = jc_parse(json, &scheduler_role, v, root);
    if (rc) return rc;
    if (v[JC_EC_IP].set) o->consumer_host = v[JC_EC_IP].s;
    if (v[JC_TP_SIZE].set) o->tp_size = v[JC_TP_SIZE].i;
    int port = v[JC_EC_PORT].set ? v[JC_EC_PORT].i : o->consumer_port;
    int dp = v[JC_DP_INDEX].set ? v[JC_DP_INDEX].i : 0;
    long long first = (long long)port + (long long)dp * o->tp_size;
    if (port < 1 || first > 65535)
        return ect_set_error(ECT_EINVAL,
                             "push scheduler config: keys 'ec_port' %d + 'dp_index' %d x 'tp_size' "
                             "%d must name a port 1..65535",
                             port, dp, o->tp_size);
    o->consumer_port = (int)first;
    if (v[JC_PUSH_WAIT_TIMEOUT_S].set)
        o->push_wait_ms = (uint64_t)jc_seconds_to_ms(v[JC_PUSH_WAIT_TIMEOUT_S].d);
    if (v[JC_CONTROL_TIMEOUT_S].set) o->control_timeout_s = v[JC_CONTROL_TIMEOUT_S].d;
    if (v[JC_TTL_MS].set) o->ttl_ms = v[JC_TTL_MS].u;
    if (v[JC_MAX_TOMBSTONES].set) o->max_tombstones = (size_t)v[JC_MAX_TOMBSTONES].u;
    if (v[JC_CANCEL_ATTEMPTS].set) o->cancel_attempts = (unsigned)v[JC_CANCEL_ATTEMPTS].u;
    if (v[JC_MIN_DRAIN_INTERVAL_MS].set) o->min_drain_interval_ms = v[JC_MIN_DRAIN_INTERVAL_MS].u;
    if (v[JC_ACCEPT_ANY].set) o->accept_any = v[JC_ACCEPT_ANY].b;
    if (v[JC_CURVE_KEYS].set) o->curve_keys = v[JC_CURVE_KEYS].s;
    if (v[JC_RECHECK_MS].set) o->recheck_ms = v[JC_RECHECK_MS].u;
    return 0;
}

int push_producer_config(const char *json, ect_push_producer_opts *o, json_t **root) {
    ect_push_producer_opts_init(o);
    jc_val v[JC_NKEYS];
    int rc = jc_parse(json, &producer_role, v, root);
    if (rc) return rc;
    if (v[JC_EC_BUFFER_SIZE].set) o->staging_size = v[JC_EC_BUFFER_SIZE].u;
    if (v[JC_CONTROL_TIMEOUT_S].set)
        o->control_timeout_ms = jc_seconds_to_ms(v[JC_CONTROL_TIMEOUT_S].d);
    if (v[JC_TRANSPORT].set) o->transport = v[JC_TRANSPORT].s;
    if (v[JC_REFRESH_AFTER_MS].set) o->refresh_after_ms = v[JC_REFRESH_AFTER_MS].u;
    if (v[JC_INPUT_WAIT_MS].set) o->input_wait_ms = v[JC_INPUT_WAIT_MS].u;
    if (v[JC_TTL_MS].set) o->ttl_ms = v[JC_TTL_MS].u;
    if (v[JC_MAX_TOMBSTONES].set) o->max_tombstones = (size_t)v[JC_MAX_TOMBSTONES].u;
    if (v[JC_CONNECT_TIMEOUT_MS].set) o->connect_timeout_ms = v[JC_CONNECT_TIMEOUT_MS].i;
    if (v[JC_IO_TIMEOUT_MS].set) o->io_timeout_ms = v[JC_IO_TIMEOUT_MS].i;
    if (v[JC_LISTEN_HOST].set) o->listen_host = v[JC_LISTEN_HOST].s;
    if (v[JC_DOWN_BACKOFF_MS].set) o->down_backoff_ms = v[JC_DOWN_BACKOFF_MS].i;
    if (v[JC_DOWN_BACKOFF_MAX_MS].set) o->down_backoff_max_ms = v[JC_DOWN_BACKOFF_MAX_MS].i;
    if (v[JC_PUSH_WAIT_TIMEOUT_S].set)
        o->push_wait_ms = (uint64_t)jc_seconds_to_ms(v[JC_PUSH_WAIT_TIMEOUT_S].d);
    if (v[JC_STAGING_WAIT_MS].set) o->staging_wait_ms = v[JC_STAGING_WAIT_MS].u;
    if (v[JC_EXPECT_SHARDS].set) o->expect_shards = (uint32_t)v[JC_EXPECT_SHARDS].u;
    if (v[JC_CURVE_KEYS].set) o->curve_keys = v[JC_CURVE_KEYS].s;
    return 0;
}

/* Opens through `open` with the options decoded from json, keeping the
 * tree (its strings) alive until the open call copied them. */
#define OPEN_CONFIG(fn, cfg, opts_t, open, out_t)                                                  \
    int fn(const char *json, out_t **out) {                                                        \
        if (out) *out = NULL;                                                                      \
        if (!out) return ect_set_error(ECT_EINVAL, #fn ": out is NULL");                           \
        opts_t o;                                                                                  \
        json_t *root = NULL;                                                                       \
        int rc = cfg(json, &o, &root);                                                             \
        if (!rc) rc = open(&o, out);                                                               \
        json_decref(root);                                                                         \
        return rc;                                                                                 \
    }

OPEN_CONFIG(ect_push_consumer_open_config, push_consumer_config, ect_push_consumer_opts,
            ect_push_consumer_open, ect_push_consumer)
OPEN_CONFIG(ect_push_scheduler_open_config, push_scheduler_config, ect_push_scheduler_opts,
            ect_push_scheduler_open, ect_push_scheduler)
OPEN_CONFIG(ect_push_producer_open_config, push_producer_config, ect_push_producer_opts,
            ect_push_producer_open, ect_push_producer)
