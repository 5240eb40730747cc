/*
 * config — JSON configurations of the three pull roles (see util/jconf.h
 * for the vocabulary). In generation 1 both instances name the producer's
 * ROUTER with the same ec_ip / ec_port: the producer binds there and the
 * consumer side's scheduler and worker connect there, so ec_ip / ec_port
 * become the `producer` address "HOST:PORT" of those two.
 */
#include "pull/config.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "util/jconf.h"
#include "util/util.h"

static const jc_key producer_keys[] = {
    JC_XPORT_LISTEN,       JC_ALIGNMENT,  JC_CONNECT_TIMEOUT_MS, JC_IO_TIMEOUT_MS,
    JC_MAX_LANES,          JC_PAGE_ITEMS, JC_MAX_QUEUED_BYTES,   JC_CONNECT_ALLOW,
    JC_MAX_LANES_PER_PEER, JC_CURVE_KEYS,
};
static const jc_role producer_role = {"pull producer", producer_keys, ECT_ARRAY_LEN(producer_keys)};

static const jc_key scheduler_keys[] = {JC_REQUEST_RETRY_MS, JC_CURVE_KEYS};
static const jc_role scheduler_role = {"pull scheduler", scheduler_keys,
                                       ECT_ARRAY_LEN(scheduler_keys)};

static const jc_key consumer_keys[] = {
    JC_XPORT_LISTEN, JC_ALIGNMENT, JC_TIMEOUT_MS, JC_QUARANTINE_MS,      JC_POOL_MEMORY,
    JC_ADVERTISE,    JC_DATA_PORT, JC_MAX_CONNS,  JC_MAX_CONNS_PER_PEER, JC_CURVE_KEYS,
};
static const jc_role consumer_role = {"pull consumer", consumer_keys, ECT_ARRAY_LEN(consumer_keys)};

/* "ec_ip:ec_port" (brackets around an IPv6 address); defaults 127.0.0.1
 * and 14579 as upstream's; port 0 has no meaning for a peer. */
static int producer_addr(const char *role, const jc_val *v, char addr[PULL_CONFIG_ADDR_MAX]) {
    const char *ip = v[JC_EC_IP].set ? v[JC_EC_IP].s : "127.0.0.1";
    int port = v[JC_EC_PORT].set ? v[JC_EC_PORT].i : 14579;
    if (port < 1)
        return ect_set_error(ECT_EINVAL,
                             "%s config: key 'ec_port' must be 1..65535 (the "
                             "producer's port)",
                             role);
    bool v6 = strchr(ip, ':') && ip[0] != '[';
    snprintf(addr, PULL_CONFIG_ADDR_MAX, v6 ? "[%s]:%d" : "%s:%d", ip, port);
    return 0;
}

int pull_producer_config(const char *json, ect_pull_producer_opts *o, json_t **root) {
    ect_pull_producer_opts_init(o);
    jc_val v[JC_NKEYS];
    int rc = jc_parse(json, &producer_role, v, root);
    if (rc) return rc;
    if (v[JC_EC_IP].set) o->host = v[JC_EC_IP].s;
    if (v[JC_EC_PORT].set) o->port = v[JC_EC_PORT].i;
    if (v[JC_EC_BUFFER_SIZE].set) o->pool_size = v[JC_EC_BUFFER_SIZE].u;
    if (v[JC_TRANSPORT].set) o->transport = v[JC_TRANSPORT].s;
    if (v[JC_XPORT_LISTEN].set) o->xport_listen = v[JC_XPORT_LISTEN].s;
    if (v[JC_ALIGNMENT].set) o->alignment = v[JC_ALIGNMENT].u;
    if (v[JC_CONNECT_TIMEOUT_MS].set) o->connect_timeout_ms = v[JC_CONNECT_TIMEOUT_MS].i;
    if (v[JC_IO_TIMEOUT_MS].set) o->io_timeout_ms = v[JC_IO_TIMEOUT_MS].i;
    if (v[JC_MAX_LANES].set) o->max_lanes = (uint32_t)v[JC_MAX_LANES].u;
    if (v[JC_PAGE_ITEMS].set) o->page_items = (uint32_t)v[JC_PAGE_ITEMS].u;
    if (v[JC_MAX_QUEUED_BYTES].set) o->max_queued_bytes = v[JC_MAX_QUEUED_BYTES].u;
    if (v[JC_CURVE_KEYS].set) o->curve_keys = v[JC_CURVE_KEYS].s;
    if (v[JC_CONNECT_ALLOW].set) o->connect_allow = v[JC_CONNECT_ALLOW].s;
    if (v[JC_MAX_LANES_PER_PEER].set) o->max_lanes_per_peer = (uint32_t)v[JC_MAX_LANES_PER_PEER].u;
    return 0;
}

int pull_scheduler_config(const char *json, ect_pull_scheduler_opts *o, json_t **root,
                          char addr[PULL_CONFIG_ADDR_MAX]) {
    ect_pull_scheduler_opts_init(o);
    jc_val v[JC_NKEYS];
    int rc = jc_parse(json, &scheduler_role, v, root);
    if (rc || (rc = producer_addr(scheduler_role.name, v, addr))) return rc;
    o->producer = addr;
    if (v[JC_REQUEST_RETRY_MS].set) o->request_retry_ms = v[JC_REQUEST_RETRY_MS].i;
    if (v[JC_CURVE_KEYS].set) o->curve_keys = v[JC_CURVE_KEYS].s;
    return 0;
}

int pull_consumer_config(const char *json, ect_pull_consumer_opts *o, json_t **root,
                         char addr[PULL_CONFIG_ADDR_MAX]) {
    ect_pull_consumer_opts_init(o);
    jc_val v[JC_NKEYS];
    int rc = jc_parse(json, &consumer_role, v, root);
    if (rc || (rc = producer_addr(consumer_role.name, v, addr))) return rc;
    o->producer = addr;
    if (v[JC_EC_BUFFER_SIZE].set) o->pool_size = v[JC_EC_BUFFER_SIZE].u;
    if (v[JC_TRANSPORT].set) o->transport = v[JC_TRANSPORT].s;
    if (v[JC_XPORT_LISTEN].set) o->xport_listen = v[JC_XPORT_LISTEN].s;
    if (v[JC_ALIGNMENT].set) o->alignment = v[JC_ALIGNMENT].u;
    if (v[JC_TIMEOUT_MS].set) o->timeout_ms = v[JC_TIMEOUT_MS].i;
    if (v[JC_QUARANTINE_MS].set) o->quarantine_ms = v[JC_QUARANTINE_MS].i;
    if (v[JC_EC_BUFFER_DEVICE].set) o->pool_device = v[JC_EC_BUFFER_DEVICE].s;
    if (v[JC_POOL_MEMORY].set) o->pool_memory = (void *)(uintptr_t)v[JC_POOL_MEMORY].u;
    if (v[JC_ADVERTISE].set) o->advertise = v[JC_ADVERTISE].s;
    if (v[JC_DATA_PORT].set) o->data_port = v[JC_DATA_PORT].i;
    if (v[JC_CURVE_KEYS].set) o->curve_keys = v[JC_CURVE_KEYS].s;
    if (v[JC_MAX_CONNS].set) o->max_conns = v[JC_MAX_CONNS].i;
    if (v[JC_MAX_CONNS_PER_PEER].set) o->max_conns_per_peer = v[JC_MAX_CONNS_PER_PEER].i;
    return 0;
}

int ect_pull_producer_open_config(const char *json, ect_pull_producer **out) {
    if (out) *out = NULL;
    if (!out) return ect_set_error(ECT_EINVAL, "ect_pull_producer_open_config: out is NULL");
    ect_pull_producer_opts o;
    json_t *root = NULL;
    int rc = pull_producer_config(json, &o, &root);
    if (!rc) rc = ect_pull_producer_open(&o, out);
    json_decref(root);
    return rc;
}

int ect_pull_scheduler_open_config(const char *json, ect_pull_scheduler **out) {
    if (out) *out = NULL;
    if (!out) return ect_set_error(ECT_EINVAL, "ect_pull_scheduler_open_config: out is NULL");
    ect_pull_scheduler_opts o;
    json_t *root = NULL;
    char addr[PULL_CONFIG_ADDR_MAX];
    int rc = pull_scheduler_config(json, &o, &root, addr);
    if (!rc) rc = ect_pull_scheduler_open(&o, out);
    json_decref(root);
    return rc;
}

int ect_pull_consumer_open_config(const char *json, ect_pull_consumer **out) {
    if (out) *out = NULL;
    if (!out) return ect_set_error(ECT_EINVAL, "ect_pull_consumer_open_config: out is NULL");
    ect_pull_consumer_opts o;
    json_t *root = NULL;
    char addr[PULL_CONFIG_ADDR_MAX];
    int rc = pull_consumer_config(json, &o, &root, addr);
    if (!rc) rc = ect_pull_consumer_open(&o, out);
    json_decref(root);
    return rc;
}
