/* hostport — see hostport.h. */
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/hostport.h"
#include "util/util.h"

int ect_hostport_parse(const char *what, const char *s, int min_port, int max_port, char *host,
                       size_t cap, int *port) {
    const char *h = s, *colon = NULL;
    size_t hl = 0;
    if (!s) goto bad;
    if (s[0] == '[') {
        const char *rb = strchr(s, ']');
        if (!rb || rb[1] != ':') goto bad;
        h = s + 1;
        hl = (size_t)(rb - h);
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || memchr(s, ':', (size_t)(colon - s))) goto bad; /* v6 needs brackets */
        hl = (size_t)(colon - s);
    }
    if (hl == 0 || hl >= cap) goto bad;
    long p = 0;
    const char *d = colon + 1;
    if (!*d) goto bad;
    for (; *d; d++) {
        if (*d < '0' || *d > '9') goto bad;
        p = p * 10 + (*d - '0');
        if (p > max_port) goto bad;
    }
    if (p < min_port) goto bad;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return 0;
bad:
    return ect_set_error(ECT_EINVAL, "%s '%.100s' is not HOST:PORT (port %d..%d)", what,
                         s ? s : "(null)", min_port, max_port);
}

/* "host:port" ("[host]:port" for an IPv6 literal) with no format machinery:
 * built per item by the push producer (its control lanes' keys). */
int ect_hostport_format(const char *host, int port, char *buf, size_t cap) {
    bool v6 = strchr(host, ':') != NULL;
    if (port < 0 || cap == 0) return snprintf(buf, cap, v6 ? "[%s]:%d" : "%s:%d", host, port);
    char num[16];
    size_t nd = 0;
    do {
        num[sizeof num - 1 - nd++] = (char)('0' + port % 10);
        port /= 10;
    } while (port);
    char tail[sizeof num + 2] = "]:";
    memcpy(tail + 2, num + sizeof num - nd, nd);
    tail[2 + nd] = '\0';
    ect_strcpy_cut(buf, cap, v6 ? "[" : "");
    ect_strcat_cut(buf, cap, host);
    ect_strcat_cut(buf, cap, v6 ? tail : tail + 1);
    return (int)((v6 ? 2 : 0) + strlen(host) + 1 + nd);
}

int ect_tcp_endpoint_port(const char *endpoint) {
    char host[256];
    int port = 0;
    if (strncmp(endpoint, "tcp://", 6) ||
        ect_hostport_parse("endpoint", endpoint + 6, 1, 65535, host, sizeof host, &port))
        return 0;
    return port;
}

int ect_tcp_endpoint(const char *host, int port, char *buf, size_t cap) {
    bool v6 = strchr(host, ':') != NULL;
    char ps[16] = "*";
    if (port) snprintf(ps, sizeof ps, "%d", port);
    return snprintf(buf, cap, v6 ? "tcp://[%s]:%s" : "tcp://%s:%s", host, ps);
}

int ect_host_is_wildcard(const char *host) {
    return !host || !*host || strcmp(host, "*") == 0 || strcmp(host, "0.0.0.0") == 0 ||
           strcmp(host, "::") == 0 || strcmp(host, "[::]") == 0 || strcmp(host, "::0") == 0;
}

int ect_route_source(const char *peer, char *out, size_t cap) {
    char ph[256];
    size_t pl = peer ? strlen(peer) : 0;
    if (pl >= 2 && peer[0] == '[' && peer[pl - 1] == ']') { /* "[v6]" */
        snprintf(ph, sizeof ph, "%.*s", (int)(pl - 2), peer + 1);
    } else {
        snprintf(ph, sizeof ph, "%s", peer ? peer : "");
    }
    if (!*ph || ect_host_is_wildcard(ph))
        return ect_set_error(ECT_EINVAL, "route source: no peer address");
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    int g = getaddrinfo(ph, "9", &hints, &res);
    if (g != 0 || !res)
        return ect_set_error(ECT_EINVAL, "route source: cannot resolve '%.100s': %s", ph,
                             gai_strerror(g));
    int rc = ECT_EIO;
    for (struct addrinfo *a = res; a && rc; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        char h[NI_MAXHOST];
        /* A UDP connect sends nothing: it only picks the route and its source. */
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
            getnameinfo((struct sockaddr *)&ss, sl, h, sizeof h, NULL, 0, NI_NUMERICHOST) == 0) {
            const char *p = h;
            if (strncmp(p, "::ffff:", 7) == 0 && strchr(p + 7, '.')) p += 7; /* v4-mapped */
            if (strlen(p) < cap) {
                snprintf(out, cap, "%s", p);
                rc = 0;
            }
        }
        close(fd);
    }
    freeaddrinfo(res);
    if (rc) return ect_set_error(ECT_EIO, "route source: no route to '%.100s'", ph);
    return 0;
}

int ect_session_advertise(const char *session, const char *advertise, const char *peer, char *out,
                          size_t cap) {
    const char *prefix = "", *hp = session;
    if (strncmp(session, "ucx:", 4) == 0) {
        prefix = "ucx:";
        hp = session + 4;
    }
    char host[256];
    int port;
    if (strncmp(session, "shm:", 4) == 0 ||
        ect_hostport_parse("session", hp, 0, 65535, host, sizeof host, &port) != 0) {
        ect_clear_error();
        snprintf(out, cap, "%s", session); /* not an address: said as it is */
        return 0;
    }
    char h[NI_MAXHOST];
    if (advertise && *advertise) {
        snprintf(h, sizeof h, "%s", advertise);
    } else if (ect_host_is_wildcard(host)) {
        if (!peer || ect_route_source(peer, h, sizeof h) != 0) {
            ect_clear_error();
            /* No peer to route to (a detached server, a non-TCP peer): only
             * this host can be meant, so loopback of the bound family. */
            snprintf(h, sizeof h, "%s", strchr(host, ':') ? "::1" : "127.0.0.1");
        }
    } else {
        snprintf(out, cap, "%s", session);
        return 0;
    }
    char hpbuf[NI_MAXHOST + 16];
    ect_hostport_format(h, port, hpbuf, sizeof hpbuf);
    int n = snprintf(out, cap, "%s%s", prefix, hpbuf);
    if (n < 0 || (size_t)n >= cap)
        return ect_set_error(ECT_EINVAL, "advertised session '%s%s' too long", prefix, hpbuf);
    return 0;
}
