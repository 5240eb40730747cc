/*
 * peer_guard — see peer_guard.h. The trusted set is a small array of
 * canonical address strings, read once at open (getifaddrs when no list is
 * given), so a check is a few string compares and never a system call.
 */
#include "push/peer_guard.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

#define MOD "ctlsrv"
#define PG_ADDR_MAX 64
#define PG_LOG_EVERY_MS 1000

struct peer_guard {
    bool any; /* "*": every peer is trusted */
    char (*trusted)[PG_ADDR_MAX];
    size_t n;
    atomic_uint_fast64_t refused[PG_N];
    uint64_t window, last_log_ms; /* handling thread only */
};

static const char *const act_name[PG_N] = {"complete", "cancel", "status", "reserve", "ready"};

void pg_canon(const char *peer, char *out, size_t size) {
    if (!peer) peer = "";
    if (strncmp(peer, "::ffff:", 7) == 0 && strchr(peer + 7, '.')) peer += 7;
    snprintf(out, size, "%s", peer);
}

static int add(peer_guard *g, const char *addr) {
    char(*v)[PG_ADDR_MAX] = realloc(g->trusted, (g->n + 1) * sizeof *v);
    if (!v) return ect_set_error(ECT_ENOMEM, "peer guard: out of memory");
    g->trusted = v;
    pg_canon(addr, g->trusted[g->n++], PG_ADDR_MAX);
    return 0;
}

static int add_host_addresses(peer_guard *g) {
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) { /* nothing trusted but loopback */
        ECT_LOGW(MOD, "getifaddrs failed: only 127.0.0.1 and ::1 are trusted to cancel");
        int rc = add(g, "127.0.0.1");
        return rc ? rc : add(g, "::1");
    }
    int rc = 0;
    for (struct ifaddrs *i = ifs; i && !rc; i = i->ifa_next) {
        if (!i->ifa_addr) continue;
        char buf[INET6_ADDRSTRLEN];
        if (i->ifa_addr->sa_family == AF_INET) {
            const struct sockaddr_in *a = (const void *)i->ifa_addr;
            if (inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf)) rc = add(g, buf);
        } else if (i->ifa_addr->sa_family == AF_INET6) {
            const struct sockaddr_in6 *a = (const void *)i->ifa_addr;
            if (inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf)) rc = add(g, buf);
        }
    }
    freeifaddrs(ifs);
    return rc;
}

static int add_list(peer_guard *g, const char *list) {
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        char a[PG_ADDR_MAX];
        while (len && (*p == ' ')) p++, len--;
        while (len && p[len - 1] == ' ') len--;
        if (len == 0 || len >= sizeof a)
            return ect_set_error(ECT_EINVAL, "trusted peers: bad entry in '%.200s'", list);
        memcpy(a, p, len);
        a[len] = 0;
        unsigned char bin[sizeof(struct in6_addr)];
        if (inet_pton(AF_INET, a, bin) != 1 && inet_pton(AF_INET6, a, bin) != 1)
            return ect_set_error(ECT_EINVAL, "trusted peers: '%s' is not an IPv4 or IPv6 address",
                                 a);
        int rc = add(g, a);
        if (rc) return rc;
        p += strcspn(p, ",");
        if (*p == ',') p++;
    }
    return 0;
}

int pg_open(const char *trusted, peer_guard **out) {
    *out = NULL;
    peer_guard *g = calloc(1, sizeof *g);
    if (!g) return ect_set_error(ECT_ENOMEM, "peer guard: out of memory");
    int rc = 0;
    if (trusted && strcmp(trusted, "*") == 0)
        g->any = true;
    else
        rc = trusted ? add_list(g, trusted) : add_host_addresses(g);
    if (rc) {
        pg_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

void pg_close(peer_guard *g) {
    if (!g) return;
    free(g->trusted);
    free(g);
}

static bool trusted(const peer_guard *g, const char *peer) {
    if (g->any) return true;
    if (!*peer) return false;
    for (size_t i = 0; i < g->n; i++)
        if (strcmp(g->trusted[i], peer) == 0) return true;
    return false;
}

bool pg_allow(peer_guard *g, pg_act act, const char *peer, const char *owner,
              const char *transfer_id) {
    if (!peer) peer = "";
    if (!owner) owner = "";
    if (strcmp(peer, owner) == 0) return true;
    if ((act == PG_CANCEL || act == PG_STATUS || act == PG_READY) && trusted(g, peer)) return true;
    atomic_fetch_add(&g->refused[act], 1);
    g->window++;
    uint64_t now = ect_now_ms();
    if (now - g->last_log_ms >= PG_LOG_EVERY_MS) {
        ECT_LOGW(MOD,
                 "refused %" PRIu64 " request(s) for reservations of other peers; latest: %s "
                 "of transfer_id '%.64s' from %s (reserved by %s)",
                 g->window, act_name[act], transfer_id ? transfer_id : "", *peer ? peer : "?",
                 *owner ? owner : "?");
        g->window = 0;
        g->last_log_ms = now;
    }
    return false;
}

uint64_t pg_refused(peer_guard *g, pg_act act) {
    return atomic_load(&g->refused[act]);
}
