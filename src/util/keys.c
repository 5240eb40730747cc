/*
 * keys — loading and generating a key directory (keys.h has the layout).
 */
#include "util/keys.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "util/util.h"

void ect_key_z85(const uint8_t key[ECT_KEY_BYTES], char out[ECT_KEY_Z85_LEN + 1]) {
    zmq_z85_encode(out, key, ECT_KEY_BYTES);
}

/* Reads one key file: 40 Z85 characters, then at most one "\n" (or "\r\n").
 * With secret, refuses a file the group or others may read. */
static int read_key(const char *path, bool secret, uint8_t key[ECT_KEY_BYTES],
                    char z85[ECT_KEY_Z85_LEN + 1]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return ect_set_error(errno == ENOENT ? ECT_EINVAL : ECT_EIO, "key file %s: %s", path,
                             strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ect_set_error(ECT_EINVAL, "key file %s: not a regular file", path);
    }
    if (secret && (st.st_mode & 077)) {
        close(fd);
        return ect_set_error(ECT_EINVAL,
                             "key file %s: group or others may access it (mode %03o); "
                             "chmod 600 it",
                             path, (unsigned)(st.st_mode & 0777));
    }
    char buf[ECT_KEY_Z85_LEN + 4];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    if (n < 0) return ect_set_errno(errno, "key file %s", path);
    size_t len = (size_t)n;
    if (len > 0 && buf[len - 1] == '\n') len--;
    if (len > 0 && buf[len - 1] == '\r') len--;
    if (len != ECT_KEY_Z85_LEN)
        return ect_set_error(ECT_EINVAL,
                             "key file %s: expected %d characters of Z85 (as `ect keygen` "
                             "writes), found %zu",
                             path, ECT_KEY_Z85_LEN, (size_t)n);
    memcpy(z85, buf, ECT_KEY_Z85_LEN);
    z85[ECT_KEY_Z85_LEN] = '\0';
    if (!zmq_z85_decode(key, z85))
        return ect_set_error(ECT_EINVAL, "key file %s: not Z85 text", path);
    return 0;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The sorted names NAME of DIR/accept/NAME.public into *names / *n. */
static int list_accept(const char *adir, char ***names, size_t *n) {
    DIR *d = opendir(adir);
    if (!d)
        return ect_set_error(errno == ENOENT ? ECT_EINVAL : ECT_EIO,
                             "key directory: %s: %s (it holds the accepted peers' *.public files)",
                             adir, strerror(errno));
    char **v = NULL;
    size_t cnt = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || len <= 7 || strcmp(e->d_name + len - 7, ".public") != 0)
            continue;
        if (cnt == cap) {
            size_t ncap = cap ? cap * 2 : 8;
            char **nv = realloc(v, ncap * sizeof *nv);
            if (!nv) {
                rc = ect_set_error(ECT_ENOMEM, "key directory: out of memory");
                break;
            }
            v = nv;
            cap = ncap;
        }
        if (!(v[cnt] = strndup(e->d_name, len - 7))) {
            rc = ect_set_error(ECT_ENOMEM, "key directory: out of memory");
            break;
        }
        cnt++;
    }
    closedir(d);
    if (rc != 0) {
        for (size_t i = 0; i < cnt; i++) free(v[i]);
        free(v);
        return rc;
    }
    if (cnt) qsort(v, cnt, sizeof *v, name_cmp);
    *names = v;
    *n = cnt;
    return 0;
}

static _Atomic uint64_t loads;

uint64_t ect_keys_load_count(void) { return atomic_load(&loads); }

ect_keyset *ect_keys_ref(ect_keyset *ks) {
    if (ks) atomic_fetch_add(&ks->extra_refs, 1);
    return ks;
}

void ect_keys_free(ect_keyset *ks) {
    if (!ks) return;
    /* not the last reference: another owner still reads the set */
    unsigned r = atomic_load(&ks->extra_refs);
    while (r > 0 && !atomic_compare_exchange_weak(&ks->extra_refs, &r, r - 1)) {
    }
    if (r > 0) return;
    for (size_t i = 0; i < ks->n_accept; i++) free(ks->accept_names[i]);
    free(ks->accept_names);
    free(ks->accept);
    free(ks->accept_z85);
    free(ks->dir);
    /* the secret does not outlive the set in freed memory */
    volatile uint8_t *p = ks->sec;
    for (size_t i = 0; i < sizeof ks->sec; i++) p[i] = 0;
    volatile char *q = ks->sec_z85;
    for (size_t i = 0; i < sizeof ks->sec_z85; i++) q[i] = 0;
    free(ks);
}

int ect_keys_load(const char *dir, ect_keyset **out) {
    *out = NULL;
    if (!dir || !*dir) return ect_set_error(ECT_EINVAL, "key directory: no path given");
    atomic_fetch_add(&loads, 1);
    ect_keyset *ks = calloc(1, sizeof *ks);
    if (!ks || !(ks->dir = strdup(dir))) {
        free(ks);
        return ect_set_error(ECT_ENOMEM, "key directory: out of memory");
    }
    size_t plen = strlen(dir) + 32;
    char *path = malloc(plen + 256);
    if (!path) {
        ect_keys_free(ks);
        return ect_set_error(ECT_ENOMEM, "key directory: out of memory");
    }
    int rc;
    snprintf(path, plen, "%s/self.secret", dir);
    if ((rc = read_key(path, true, ks->sec, ks->sec_z85)) != 0) goto fail;
    snprintf(path, plen, "%s/self.public", dir);
    if ((rc = read_key(path, false, ks->pub, ks->pub_z85)) != 0) goto fail;
    char derived[ECT_KEY_Z85_LEN + 1];
    if (zmq_curve_public(derived, ks->sec_z85) != 0 || strcmp(derived, ks->pub_z85) != 0) {
        rc = ect_set_error(ECT_EINVAL,
                           "key directory %s: self.public is not the public key of "
                           "self.secret",
                           dir);
        goto fail;
    }
    snprintf(path, plen, "%s/accept", dir);
    if ((rc = list_accept(path, &ks->accept_names, &ks->n_accept)) != 0) goto fail;
    if (ks->n_accept == 0) {
        rc = ect_set_error(ECT_EINVAL,
                           "key directory %s: accept/ holds no NAME.public file: no peer "
                           "could be accepted",
                           dir);
        goto fail;
    }
    ks->accept = calloc(ks->n_accept, sizeof *ks->accept);
    ks->accept_z85 = calloc(ks->n_accept, sizeof *ks->accept_z85);
    if (!ks->accept || !ks->accept_z85) {
        rc = ect_set_error(ECT_ENOMEM, "key directory: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < ks->n_accept; i++) {
        char *p = realloc(path, strlen(dir) + strlen(ks->accept_names[i]) + 32);
        if (!p) {
            rc = ect_set_error(ECT_ENOMEM, "key directory: out of memory");
            goto fail;
        }
        path = p;
        sprintf(path, "%s/accept/%s.public", dir, ks->accept_names[i]);
        if ((rc = read_key(path, false, ks->accept[i], ks->accept_z85[i])) != 0) goto fail;
    }
    free(path);
    *out = ks;
    return 0;
fail:
    free(path);
    ect_keys_free(ks);
    return rc;
}

int ect_keys_find(const ect_keyset *ks, const uint8_t pub[ECT_KEY_BYTES]) {
    for (size_t i = 0; i < ks->n_accept; i++)
        if (memcmp(ks->accept[i], pub, ECT_KEY_BYTES) == 0) return (int)i;
    return -1;
}

/* Writes text + "\n" to path with mode, refusing to replace a file. */
static int write_new(const char *path, const char *text, mode_t mode) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return ect_set_errno(errno, "%s%s", path,
                             errno == EEXIST ? " (a key pair is already there; keygen never "
                                               "replaces one)"
                                             : "");
    size_t len = strlen(text);
    int rc = 0;
    if (write(fd, text, len) != (ssize_t)len || write(fd, "\n", 1) != 1)
        rc = ect_set_errno(errno ? errno : EIO, "writing %s", path);
    if (fchmod(fd, mode) != 0 && rc == 0) rc = ect_set_errno(errno, "chmod %s", path);
    if (close(fd) != 0 && rc == 0) rc = ect_set_errno(errno, "closing %s", path);
    if (rc != 0) unlink(path);
    return rc;
}

int ect_keygen(const char *dir, char public_z85[41]) {
    ect_clear_error();
    if (!dir || !*dir) return ect_set_error(ECT_EINVAL, "keygen: no directory given");
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return ect_set_errno(errno, "creating %s", dir);
    size_t plen = strlen(dir) + 32;
    char *path = malloc(plen);
    if (!path) return ect_set_error(ECT_ENOMEM, "out of memory");
    snprintf(path, plen, "%s/accept", dir);
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        int rc = ect_set_errno(errno, "creating %s", path);
        free(path);
        return rc;
    }
    char pub[ECT_KEY_Z85_LEN + 1], sec[ECT_KEY_Z85_LEN + 1];
    if (zmq_curve_keypair(pub, sec) != 0) {
        free(path);
        return ect_set_error(ECT_ENOTSUP, "keygen: libzmq was built without CURVE support");
    }
    snprintf(path, plen, "%s/self.secret", dir);
    int rc = write_new(path, sec, 0600);
    if (rc == 0) {
        snprintf(path, plen, "%s/self.public", dir);
        rc = write_new(path, pub, 0644);
        if (rc != 0) {
            snprintf(path, plen, "%s/self.secret", dir);
            unlink(path);
        }
    }
    memset(sec, 0, sizeof sec);
    free(path);
    if (rc == 0 && public_z85) memcpy(public_z85, pub, sizeof pub);
    return rc;
}
