/* hostport — see hostport.h. */
#include <stdio.h>
#include <string.h>

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

int ect_hostport_format(const char *host, int port, char *buf, size_t cap) {
    bool v6 = strchr(host, ':') != NULL;
    return snprintf(buf, cap, v6 ? "[%s]:%d" : "%s:%d", host, port);
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
