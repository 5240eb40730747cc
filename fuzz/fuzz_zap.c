/*
 * fuzz_zap — feeds arbitrary ZAP requests (RFC 27 frames; the PLAIN user
 * and password and the CURVE key inside them come from the network) to the
 * ZAP handler's decision (util/zauth.c, zauth_decide) on a detached handler
 * holding a key set with two accepted keys and a PLAIN secret. A request is
 * accepted only when it names CURVE with an accepted key (or the set's own)
 * or PLAIN with user "ect" and the exact secret; nothing else may pass.
 * Input: frame count (first byte, mod 10), then per frame a length byte and
 * that many bytes (short input ends the frames). Seeds: fuzz/corpus/zap/.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/keys.h"
#include "util/util.h"
#include "util/zauth.h"

#define SECRET "0f1e2d3c4b5a69788796a5b4c3d2e1f0"

static ect_keyset ks;
static uint8_t acc[2][ECT_KEY_BYTES];
static char acc_z85[2][ECT_KEY_Z85_LEN + 1];
static char *names[2] = {"a", "b"};
static zauth *za;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!za) {
        ect_log_set_level(ECT_LOG_ERROR);
        memset(ks.pub, 'S', ECT_KEY_BYTES);
        memset(acc[0], 'A', ECT_KEY_BYTES);
        memset(acc[1], 'B', ECT_KEY_BYTES);
        ks.n_accept = 2;
        ks.accept = acc;
        ks.accept_z85 = acc_z85;
        ks.accept_names = names;
        if (zauth_open(NULL, &ks, "fuzz", &za)) abort();
        zauth_set_secret(za, SECRET);
    }
    if (size < 1) return 0;
    int n = data[0] % 10;
    zauth_frame f[10];
    size_t off = 1;
    int k = 0;
    for (; k < n && off < size; k++) {
        size_t len = data[off++];
        if (len > size - off) len = size - off;
        f[k].p = data + off;
        f[k].n = len;
        off += len;
    }
    char user[128];
    bool ok = zauth_decide(za, f, k, user, sizeof user);
    if (ok) {
        /* only the two ways in */
        bool v = k >= 6 && f[0].n == 3 && memcmp(f[0].p, "1.0", 3) == 0;
        bool curve = v && k >= 7 && f[5].n == 5 && memcmp(f[5].p, "CURVE", 5) == 0 &&
                     f[6].n == ECT_KEY_BYTES &&
                     (memcmp(f[6].p, acc[0], ECT_KEY_BYTES) == 0 ||
                      memcmp(f[6].p, acc[1], ECT_KEY_BYTES) == 0 ||
                      memcmp(f[6].p, ks.pub, ECT_KEY_BYTES) == 0);
        bool plain = v && k >= 8 && f[5].n == 5 && memcmp(f[5].p, "PLAIN", 5) == 0 && f[6].n == 3 &&
                     memcmp(f[6].p, "ect", 3) == 0 && f[7].n == strlen(SECRET) &&
                     memcmp(f[7].p, SECRET, strlen(SECRET)) == 0;
        if (!curve && !plain) {
            fprintf(stderr, "fuzz_zap: a request passed that names no accepted credential\n");
            abort();
        }
    }
    return 0;
}
