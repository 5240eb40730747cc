/* conncache — see conncache.h. Each peer's idle list is an array of
 * max_idle slots allocated with the peer, so giving a connection back
 * allocates nothing. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "util/util.h"
#include "xport/conncache.h"

void xp_cache_init(xp_conncache *c, const xp_conn_ops *ops, int max_idle) {
    memset(c, 0, sizeof *c);
    c->ops = ops;
    c->max_idle = max_idle > 0 ? max_idle : 1;
    pthread_mutex_init(&c->mu, NULL);
}

static void peer_free(xp_conncache *c, xp_peer *p) {
    for (int i = 0; i < p->nidle; i++) c->ops->close(p->idle[i]);
    free(p->idle);
    free(p->addr);
    free(p);
}

void xp_cache_fini(xp_conncache *c) {
    xp_peer *p, *tmp;
    HASH_ITER(hh, c->peers, p, tmp) {
        HASH_DEL(c->peers, p);
        peer_free(c, p);
    }
    pthread_mutex_destroy(&c->mu);
}

int xp_cache_peer(xp_conncache *c, const char *session, xp_peer **out) {
    xp_peer *p = NULL;
    pthread_mutex_lock(&c->mu);
    HASH_FIND_STR(c->peers, session, p);
    pthread_mutex_unlock(&c->mu);
    if (p) {
        *out = p;
        return 0;
    }
    if (strlen(session) >= sizeof p->session)
        return ect_set_error(ECT_EINVAL, "peer_session '%.100s...' is too long", session);
    p = calloc(1, sizeof *p);
    if (!p || !(p->idle = calloc((size_t)c->max_idle, sizeof *p->idle))) {
        free(p);
        return ect_set_error(ECT_ENOMEM, "peer");
    }
    int rc = c->ops->parse(session, &p->addr);
    if (rc) {
        free(p->idle);
        free(p);
        return rc;
    }
    snprintf(p->session, sizeof p->session, "%s", session);
    /* Parsed outside the lock; a racing thread may have added it meanwhile. */
    xp_peer *q;
    pthread_mutex_lock(&c->mu);
    HASH_FIND_STR(c->peers, session, q);
    if (!q) HASH_ADD_STR(c->peers, session, p);
    pthread_mutex_unlock(&c->mu);
    if (q) peer_free(c, p);
    *out = q ? q : p;
    return 0;
}

bool xp_fd_quiet(int fd) {
    char b;
    ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

bool xp_cache_take(xp_conncache *c, xp_peer *p, xp_conn *out) {
    for (;;) {
        bool got = false;
        pthread_mutex_lock(&c->mu);
        if (p->nidle > 0) {
            *out = p->idle[--p->nidle];
            got = true;
        }
        pthread_mutex_unlock(&c->mu);
        if (!got) return false;
        if (c->ops->alive ? c->ops->alive(*out) : xp_fd_quiet(out->fd)) return true;
        c->ops->close(*out);
    }
}

void xp_cache_give(xp_conncache *c, xp_peer *p, xp_conn conn) {
    bool kept = false;
    pthread_mutex_lock(&c->mu);
    if (p->nidle < c->max_idle) {
        p->idle[p->nidle++] = conn;
        kept = true;
    }
    pthread_mutex_unlock(&c->mu);
    if (!kept) c->ops->close(conn);
}
