/*
 * Tests for util/keys and ect_keygen: a generated directory loads once a
 * peer is accepted; every way a directory can be wrong (no accepted key, a
 * secret others may read, a public key of another pair, text that is not
 * Z85, a missing file) is refused with the file named; keygen never replaces
 * a pair.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "util/keys.h"
#include "util/util.h"

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void copy_pub(const char *from_dir, const char *to_dir, const char *name) {
    char src[512], dst[512], buf[64] = {0};
    snprintf(src, sizeof src, "%s/self.public", from_dir);
    snprintf(dst, sizeof dst, "%s/accept/%s.public", to_dir, name);
    FILE *f = fopen(src, "r");
    assert_non_null(f);
    assert_true(fread(buf, 1, sizeof buf - 1, f) > 0);
    fclose(f);
    put(dst, buf);
}

static void expect_refused(const char *dir, const char *needle) {
    ect_keyset *ks = (ect_keyset *)1;
    assert_int_equal(ect_keys_load(dir, &ks), ECT_EINVAL);
    assert_null(ks);
    if (!strstr(ect_last_error(), needle)) fail_msg("'%s' lacks '%s'", ect_last_error(), needle);
}

static void test_keygen_and_load(void **state) {
    (void)state;
    char root[] = "/tmp/ect-keys-XXXXXX";
    assert_non_null(mkdtemp(root));
    char a[300], b[300], path[400];
    snprintf(a, sizeof a, "%s/a", root);
    snprintf(b, sizeof b, "%s/b", root);
    char pa[41], pb[41];
    assert_int_equal(ect_keygen(a, pa), 0);
    assert_int_equal(ect_keygen(b, pb), 0);
    assert_int_equal(strlen(pa), 40);
    assert_string_not_equal(pa, pb);

    /* the secret is 0600, and a second keygen never replaces the pair */
    struct stat st;
    snprintf(path, sizeof path, "%s/self.secret", a);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    char again[41];
    assert_int_equal(ect_keygen(a, again), ECT_EEXIST);
    assert_non_null(strstr(ect_last_error(), "already there"));

    /* no accepted peer yet: refused, saying so */
    expect_refused(a, "accept/ holds no NAME.public");

    copy_pub(b, a, "bee");
    put(strcat(strcpy(path, a), "/accept/README"), "not a key, ignored\n");
    ect_keyset *ks = NULL;
    assert_int_equal(ect_keys_load(a, &ks), 0);
    assert_string_equal(ks->pub_z85, pa);
    assert_int_equal(ks->n_accept, 1);
    assert_string_equal(ks->accept_names[0], "bee");
    assert_string_equal(ks->accept_z85[0], pb);
    ect_keyset *kb = NULL;
    copy_pub(a, b, "ay");
    assert_int_equal(ect_keys_load(b, &kb), 0);
    assert_true(ect_keys_accepts(ks, kb->pub));
    assert_true(ect_keys_accepts(kb, ks->pub));
    assert_false(ect_keys_accepts(ks, ks->pub)); /* itself is not accepted unless copied */
    char z[41];
    ect_key_z85(kb->pub, z);
    assert_string_equal(z, pb);
    ect_keys_free(kb);

    /* a secret group or others may read is refused */
    snprintf(path, sizeof path, "%s/self.secret", a);
    assert_int_equal(chmod(path, 0644), 0);
    expect_refused(a, "chmod 600");
    assert_int_equal(chmod(path, 0600), 0);

    /* self.public of another pair */
    char pubpath[400];
    snprintf(pubpath, sizeof pubpath, "%s/self.public", a);
    put(pubpath, pb);
    expect_refused(a, "is not the public key of self.secret");
    put(pubpath, pa);

    /* an accepted key that is not Z85, or too short */
    snprintf(path, sizeof path, "%s/accept/bad.public", a);
    put(path, "~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~\n");
    expect_refused(a, "not Z85");
    put(path, "short\n");
    expect_refused(a, "expected 40 characters");
    unlink(path);

    /* a missing directory or secret names the file */
    snprintf(path, sizeof path, "%s/nowhere", root);
    expect_refused(path, "self.secret");
    ect_keys_free(ks);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keygen_and_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
